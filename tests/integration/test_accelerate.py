"""Hugging Face Accelerate with horovod_gravac's DDP comm hook, on 2 CPU processes (Gloo):
``model.register_comm_hook(state, hg.ddp.gravac_hook)`` on the prepared model and
``accelerator.register_for_checkpointing(hg.ddp.AllRanks(state))``, as README.md says.
tests/parallel/accelerate_runs.py makes every run in one ``accelerate launch``; the tests
here read what each process wrote.  Skipped where accelerate is not installed
(``pip install -e ".[accelerate]"``), except under CI, where scripts/setup.sh installs it."""
import json
import os
import sys

import pytest
import torch

from launcher import PARALLEL, ROOT, run_with_timeout

if os.environ.get("CI") == "true":   # CI installs it (scripts/setup.sh): a skip there would hide a missing install
    import accelerate  # noqa: F401
else:
    pytest.importorskip("accelerate")

pytestmark = [pytest.mark.parallel, pytest.mark.slow]

# accelerate launch: several processes only through torchrun (--multi_gpu); ACCELERATE_USE_CPU
# makes them CPU processes on Gloo.  The rest silences the launcher's warnings about defaults.
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
          "--main_process_port", "0"]
CPU = {"ACCELERATE_USE_CPU": "1"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("accelerate")
    rc, log = run_with_timeout(LAUNCH + [str(PARALLEL / "accelerate_runs.py"), str(out)], 420, env=CPU,
                               cwd=PARALLEL)
    assert rc == 0, f"accelerate_runs.py: exit status {rc} (None: timed out)\n{log[-6000:]}"
    return out


def load(out, name, rank):
    return torch.load(out / f"{name}.rank{rank}.pt")


@pytest.mark.parametrize("plain, hooked", [("plain", "dense"), ("plain_acc", "dense_acc")])
def test_dense_hook_is_bitwise_plain_accelerate(runs, plain, hooked):
    for rank in (0, 1):
        want, got = load(runs, plain, rank), load(runs, hooked, rank)
        assert torch.equal(got["params"], want["params"]), \
            f"rank {rank}: max difference {(got['params'] - want['params']).abs().max()}"
        assert got["stats"]["cf"] == 1.0 and got["stats"]["step"] == got["steps"] - 1   # the hook ran


def test_accumulate_runs_the_hook_once_per_optimizer_step(runs):
    """gradient_accumulation_steps=2: accelerator.accumulate() runs the first micro-batch
    under no_sync(), so 8 batches make 4 hook steps."""
    got = load(runs, "dense_acc", 0)
    assert got["steps"] == 4 and got["stats"]["step"] == 3


def test_gravac_keeps_ranks_identical_and_its_stats_reach_accelerator_log(runs):
    r0, r1 = load(runs, "gravac_acc", 0), load(runs, "gravac_acc", 1)
    assert torch.equal(r0["params"], r1["params"]), f"max difference {(r0['params'] - r1['params']).abs().max()}"
    rows = json.loads((runs / "gravac_acc.log.json").read_text())
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert max(r["gravac/cf"] for r in rows) > 1 and all(r["gravac/bytes_sent"] > 0 for r in rows)


def test_save_state_and_load_state_carry_the_hook_state(runs):
    """save_state after 4 of 8 batches; load_state and the last 4 end bitwise where the
    uninterrupted run does, on each rank; with the checkpoint's hook state loaded into a
    state DDP does not use, they do not."""
    for rank in (0, 1):
        full, resumed = load(runs, "full", rank), load(runs, "resumed", rank)
        assert torch.equal(resumed["params"], full["params"]), \
            f"rank {rank}: max difference {(resumed['params'] - full['params']).abs().max()}"
        assert resumed["stats"]["step"] == full["stats"]["step"] == 7 and resumed["steps"] == 4
        assert not torch.equal(load(runs, "resumed_without_hook_state", rank)["params"], full["params"])
    saved = torch.load(runs / "full.ckpt" / "custom_checkpoint_0.pkl", weights_only=False)
    assert saved["world_size"] == 2 and sorted(saved["ranks"]) == [0, 1]   # rank 0 wrote both ranks'


def test_example_script_trains_saves_and_resumes(tmp_path):
    """launch/accelerate_train.py, briefly: 8 steps saving at step 4, then a resume from it."""
    script = [str(ROOT / "launch" / "accelerate_train.py"), "--samples", "1024", "--width", "32", "--window", "2",
              "--theta-min", "2", "--save-every", "4", "--out", str(tmp_path)]
    rc, out = run_with_timeout(LAUNCH + script, 300, env=CPU, cwd=tmp_path)
    assert rc == 0, out[-4000:]
    assert "done: 8 steps on 2 processes" in out, out[-4000:]
    rc, out = run_with_timeout(LAUNCH + script + ["--resume", str(tmp_path / "step_4")], 300, env=CPU, cwd=tmp_path)
    assert rc == 0, out[-4000:]
    assert "done: 8 steps on 2 processes" in out, out[-4000:]
