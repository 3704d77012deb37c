"""PyTorch Lightning with horovod_gravac's DDP comm hook, on 2 CPU processes (Gloo):
``Trainer(strategy=DDPStrategy(ddp_comm_state=state, ddp_comm_hook=hg.ddp.gravac_hook),
callbacks=[GravacCallback(state)])``, as README.md says.  tests/parallel/lightning_runs.py
makes every run in one launch (Lightning starts the second process itself); the tests here
read what each process wrote.  Skipped where pytorch-lightning is not installed
(``pip install -e ".[lightning]"``), except under CI, where scripts/setup.sh installs it."""
import csv
import os
import sys

import pytest
import torch

from launcher import PARALLEL, ROOT, run_with_timeout

if os.environ.get("CI") == "true":   # CI installs it (scripts/setup.sh): a skip there would hide a missing install
    import pytorch_lightning  # noqa: F401
else:
    pytest.importorskip("pytorch_lightning")

pytestmark = [pytest.mark.parallel, pytest.mark.slow]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("lightning")
    rc, log = run_with_timeout([sys.executable, str(PARALLEL / "lightning_runs.py"), str(out)], 420, cwd=PARALLEL)
    assert rc == 0, f"lightning_runs.py: exit status {rc} (None: timed out)\n{log[-6000:]}"
    return out


def load(out, name, rank):
    return torch.load(out / f"{name}.rank{rank}.pt")


@pytest.mark.parametrize("plain, hooked", [("plain", "dense"), ("plain_acc", "dense_acc")])
def test_dense_hook_is_bitwise_the_plain_trainer(runs, plain, hooked):
    for rank in (0, 1):
        want, got = load(runs, plain, rank), load(runs, hooked, rank)
        assert torch.equal(got["params"], want["params"]), \
            f"rank {rank}: max difference {(got['params'] - want['params']).abs().max()}"
        assert got["stats"]["cf"] == 1.0 and got["stats"]["step"] == got["global_step"] - 1   # the hook ran


def test_accumulation_runs_the_hook_once_per_optimizer_step(runs):
    """accumulate_grad_batches=2: Lightning's no_sync() on the first micro-batch, so 8
    micro-batches make 4 hook steps, as many as optimizer steps."""
    got = load(runs, "dense_acc", 0)
    assert got["global_step"] == 4 and got["stats"]["step"] == 3


def test_gravac_keeps_ranks_identical_and_its_stats_reach_the_logger(runs):
    r0, r1 = load(runs, "gravac_acc", 0), load(runs, "gravac_acc", 1)
    assert torch.equal(r0["params"], r1["params"]), f"max difference {(r0['params'] - r1['params']).abs().max()}"
    with open(runs / "gravac_acc" / "version_0" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r.get("gravac/cf")]
    assert len(rows) == 4, rows                                   # one row per optimizer step
    assert [int(float(r["gravac/step"])) for r in rows] == [0, 1, 2, 3]
    assert max(float(r["gravac/cf"]) for r in rows) > 1            # it compressed
    assert all(float(r["gravac/bytes_sent"]) > 0 for r in rows)


def test_checkpoint_resume_continues_bitwise(runs):
    """Resumed from the end of epoch 0 with Trainer.fit(ckpt_path=...), each rank ends where
    the uninterrupted run does; without the hook's state (the callback's checkpoint=False)
    it does not, so the checkpoint's residuals and controller are what carries it."""
    for rank in (0, 1):
        full, resumed = load(runs, "full", rank), load(runs, "resumed", rank)
        assert torch.equal(resumed["params"], full["params"]), \
            f"rank {rank}: max difference {(resumed['params'] - full['params']).abs().max()}"
        assert resumed["stats"]["step"] == full["stats"]["step"] == 11
        assert not torch.equal(load(runs, "resumed_without_hook_state", rank)["params"], full["params"])
    ckpt = torch.load(next((runs / "ckpt").glob("epoch=0*.ckpt")), weights_only=True)   # plain data only
    hook = ckpt["callbacks"]["GravacCallback"]
    assert hook["world_size"] == 2 and sorted(hook["ranks"]) == [0, 1]   # both ranks' residuals
    assert [hook["ranks"][r]["meta"]["rank"] for r in (0, 1)] == [0, 1]


def test_example_script_trains_and_logs(tmp_path):
    """launch/lightning_train.py, briefly: 2 CPU processes through the hook."""
    cmd = [sys.executable, str(ROOT / "launch" / "lightning_train.py"), "--devices", "2", "--epochs", "1",
           "--samples", "512", "--width", "32", "--window", "2", "--theta-min", "2", "--log-every", "1", "--out", str(tmp_path)]
    rc, out = run_with_timeout(cmd, 300, cwd=tmp_path)
    assert rc == 0, out[-4000:]
    assert "done: 4 steps on 2 processes" in out, out[-4000:]
    assert (tmp_path / "last.ckpt").exists()
    assert "gravac/cf" in (tmp_path / "lightning_logs" / "version_0" / "metrics.csv").read_text().splitlines()[0]
