"""The training harness end to end: 2-rank horovodrun runs of every model family at toy size,
then the report over them. Plus the argument handling, which needs no Horovod."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from horovod_gravac.harness import train as T
from horovod_gravac.harness.runlog import load_run
from launcher import ROOT, bracketed_runs, horovodrun_cmd, horovodrun_path, run_with_timeout

sys.path.insert(0, str(Path(__file__).parent))
from test_data import write_cifar10, write_cifar100   # noqa: E402


# --------------------------------------------------------------------------- no Horovod needed
def test_preset_fills_and_flags_override():
    a = T.resolve_args(["--preset", "resnet101-cifar10", "--out", "x"])
    assert (a.model, a.dataset, a.batch_size, a.lr, a.momentum, a.weight_decay) == \
        ("resnet101", "cifar10", 32, 0.1, 0.9, 1e-4)
    assert a.lr_milestones == [9000, 14000] and a.lr_gamma == 0.1
    b = T.resolve_args(["--preset", "vgg16-cifar100", "--lr", "0.05", "--out", "x"])
    assert (b.model, b.dataset, b.weight_decay, b.lr, b.lr_milestones) == ("vgg16", "cifar100", 5e-4, 0.05, [])
    c = T.resolve_args(["--preset", "lstm-ptb", "--out", "x"])
    assert (c.model, c.batch_size, c.bptt, c.width, c.weight_decay) == ("lstm", 20, 35, 1500, 1e-4)
    d = T.resolve_args(["--model", "tinylstm", "--out", "x"])
    assert d.dataset == "pydoc" and d.eval_batch_size == 10


def test_model_dataset_mismatch_is_rejected():
    with pytest.raises(SystemExit):
        T.resolve_args(["--model", "lstm", "--dataset", "cifar10"])


def test_lr_schedule_steps_at_milestones():
    s = T.LRSchedule(0.1, [9000, 14000], 0.1)
    assert s.lr_at(0) == pytest.approx(0.1) and s.lr_at(8999) == pytest.approx(0.1)
    assert s.lr_at(9000) == pytest.approx(0.01) and s.lr_at(14000) == pytest.approx(0.001)
    w = T.LRSchedule(0.1, [], 0.1, warmup=4)
    assert [round(w.lr_at(i), 4) for i in range(5)] == [0.025, 0.05, 0.075, 0.1, 0.1]


def test_compressor_names_resolve_lazily():
    a = T.resolve_args(["--compressor", "topk", "--out", "x"])
    assert T.make_compressor(a)(cf=10).cf == 10 and T.make_compressor(a)(cf=10).send_zeros
    a = T.resolve_args(["--compressor", "topk", "--topk-zeros", "skip", "--out", "x"])
    assert T.make_compressor(a)(cf=10).send_zeros is False   # TopKCompressor(send_zeros=False)
    a = T.resolve_args(["--compressor", "randomk", "--out", "x"])
    c1, c2 = T.make_compressor(a)(cf=10), T.make_compressor(a)(cf=10)
    assert c1.seed == c2.seed is not None           # shared indices across ranks
    a = T.resolve_args(["--controller", "accordion", "--compressor", "powersgd", "--powersgd-rank", "4",
                        "--low-cf", "10", "--high-cf", "1000", "--out", "x"])
    f = T.make_compressor(a)
    assert f(10.0).rank == 4 and f(1000.0).rank == 1  # Table 4: rank 4 critical, rank 1 otherwise
    for name, cls in T.COMPRESSORS.items():          # each either imports or says what is missing
        try:
            assert T.compressor_class(name).__name__ == cls
        except SystemExit as e:
            assert cls in str(e)


def test_kde_is_gaussian_in_log10_with_bandwidth_0_1():
    import numpy as np
    from horovod_gravac.harness.report import log_kde
    grid = np.logspace(-1, 4, 4001)
    dens = log_kde([10.0] * 30 + [1000.0] * 10, grid)
    trapezoid = getattr(np, "trapezoid", None) or np.trapz   # (NumPy < 2: trapz)
    assert trapezoid(dens, np.log10(grid)) == pytest.approx(1.0, abs=1e-3)
    peak10 = dens[np.argmin(abs(grid - 10))]
    assert peak10 == pytest.approx(0.75 / (0.1 * np.sqrt(2 * np.pi)), rel=1e-3)  # 3/4 of the mass, sd 0.1


def test_missing_dataset_is_a_clear_error_not_a_traceback(tmp_path):
    pytest.importorskip("horovod.torch")
    proc = subprocess.run([sys.executable, "-m", "horovod_gravac.harness.train",
                           "--preset", "resnet101-cifar10",
                           "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "data_batch_1" in proc.stderr and "missing" in proc.stderr and "Traceback" not in proc.stderr


_SLOW_STATS = """
import sys, time
import horovod_gravac.optimizer as O
from horovod_gravac.harness import train
stats = O._GravacDistributedOptimizer.stats
def slow(self):   # stands in for any wait in reading opt.stats
    time.sleep(0.2)
    return stats.fget(self)
O._GravacDistributedOptimizer.stats = property(slow)
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.parallel
def test_iter_time_includes_the_wait_in_opt_stats(tmp_path):
    """Whatever reading opt.stats waits for (until commit 1e4bb89, GraVAC's/Accordion's
    decision broadcast, so the slowest rank's end of the step) is part of some iteration
    (the harness reads a step's stats during the next one, and before an evaluation), or
    the adaptive paths look faster than a static CF that sends the same payload.  Every step is still recorded once, in order."""
    pytest.importorskip("horovod.torch")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", _SLOW_STATS, "--preset", "digits", "--controller", "static",
                           "--cf", "10", "--steps", "5", "--eval-every", "3", "--threads", "1",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = load_run(str(out)).steps
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    # read in steps 2 (step 1's), 3 (step 2's and its own, before the evaluation) and 5 (step 4's and its own)
    assert steps[1]["iter_time"] >= 0.2 and steps[2]["iter_time"] >= 0.4 and steps[4]["iter_time"] >= 0.4
    assert sum(s["iter_time"] for s in steps) >= 5 * 0.2


# --------------------------------------------------------------------------- 2 ranks
# Every rank calls the harness's main once per run, in order, as ``python -m
# horovod_gravac.harness.train ARGS`` would: one launch for all of them, since a launch costs
# more start-up (Python, torch, Horovod's rendezvous) than a toy run.  Rank 0 brackets each
# run's output with RUN_BEGIN/RUN_END lines.
_RUNS = """
import json, sys
import horovod.torch as hvd
from horovod_gravac.harness import train
for k, argv in enumerate(json.loads(sys.argv[1])):
    hvd.init()
    if hvd.rank() == 0:
        print(f"RUN_BEGIN {k}", flush=True)
    rc = train.main(argv)
    if rc:
        sys.exit(rc)
    if hvd.rank() == 0:
        print(f"RUN_END {k}", flush=True)
"""


def launch_all(runs, timeout=480):
    """Each run of ``runs`` ({name: (out_dir, flags)}) in one 2-rank launch; {name: rank 0's
    output of that run}.  Fails the test unless every run ended."""
    argvs = [["--out", str(d), "--threads", "1", *map(str, flags)] for d, flags in runs.values()]
    cmd = horovodrun_cmd(2, [sys.executable, "-c", _RUNS, json.dumps(argvs)])
    rc, out = run_with_timeout(cmd, timeout, cwd=ROOT)
    if rc is None:
        pytest.fail(f"2-rank runs timed out after {timeout}s\n{out[-4000:]}")
    logs = {}
    for name, seg in zip(runs, bracketed_runs(out, len(runs))):
        assert rc == 0 and seg is not None, \
            f"2-rank run {name} failed: {' '.join(map(str, runs[name][1]))}\nrc={rc}\n{out[-6000:]}"
        logs[name] = seg
    return logs


def write_text_corpus(root, n_lines=300, seed=0):
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(40)]
    os.makedirs(root, exist_ok=True)
    for name, n in (("ptb.train.txt", n_lines), ("ptb.valid.txt", n_lines // 5), ("ptb.test.txt", n_lines // 5)):
        with open(os.path.join(root, name), "w") as f:
            for _ in range(n):
                f.write(" " + " ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + " \n")


def read_run(d):
    run = load_run(str(d))
    assert run.finished, f"{d}: no summary.json"
    return run.config, run.steps, run.evals, run.summary


RUNS = {
    # name: (flags, steps)
    "tinycnn-digits-gravac": (["--preset", "digits", "--controller", "gravac", "--variant", "paper",
                               "--epsilon", "0.7", "--window", "5",
                               "--steps", "24", "--eval-every", "12"], 24),
    "resnet101-cifar10-static": (["--preset", "resnet101-cifar10", "--data", "{cifar10}", "--width", "2",
                                  "--compressor", "topk", "--controller", "static", "--cf", "20",
                                  "--batch-size", "4", "--steps", "3", "--eval-every", "3",
                                  "--eval-batch-size", "4", "--max-eval-batches", "1", "--lr-milestones", "2"], 3),
    "vgg16-cifar100-dense": (["--preset", "vgg16-cifar100", "--data", "{cifar100}", "--width", "0.0625",
                              "--controller", "dense", "--batch-size", "4", "--steps", "3", "--eval-every", "2"], 3),
    "lstm-ptb-accordion": (["--preset", "lstm-ptb", "--data", "{ptb}", "--width", "16", "--controller", "accordion",
                            "--compressor", "topk", "--low-cf", "4", "--high-cf", "40", "--accordion-interval", "2",
                            "--batch-size", "4", "--bptt", "8", "--steps", "8", "--eval-every", "4",
                            "--clip-norm", "0.5"], 8),
    "tinylstm-pydoc-gravac": (["--model", "tinylstm", "--dataset", "pydoc", "--width", "16", "--controller",
                               "gravac", "--policy", "geometric", "--window", "3", "--steps", "9",
                               "--eval-every", "9", "--batch-size", "8", "--max-eval-batches", "2"], 9),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if horovodrun_path() is None:
        pytest.skip("horovodrun is not installed (run scripts/setup.sh)")
    base = tmp_path_factory.mktemp("e2e")
    paths = {"cifar10": base / "cifar10", "cifar100": base / "cifar100", "ptb": base / "ptb"}
    write_cifar10(str(paths["cifar10"]), per_batch=8, n_test=8)
    write_cifar100(str(paths["cifar100"]), n_train=24, n_test=8)
    write_text_corpus(str(paths["ptb"]))
    runs = {name: (base / "runs" / name, [f.format(**{k: str(v) for k, v in paths.items()}) for f in flags])
            for name, (flags, _) in RUNS.items()}
    logs = launch_all(runs)
    return {name: (runs[name][0], logs[name]) for name in RUNS}


@pytest.mark.parallel
@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_two_rank_run_writes_complete_logs(runs, name):
    run_dir, log = runs[name]
    config, steps, evals, summary = read_run(run_dir)
    n_steps = RUNS[name][1]
    assert config["world_size"] == 2
    assert len(steps) == n_steps and [s["step"] for s in steps] == list(range(1, n_steps + 1))
    for s in steps:   # opt.stats plus the harness's own fields
        for key in ("cf", "level", "floats_sent", "dense_floats", "bytes_sent", "step_time", "loss", "lr",
                    "data_time", "iter_time"):
            assert key in s, f"{key} missing from steps.jsonl of {name}"
        assert s["loss"] is not None and s["loss"] == s["loss"]
    assert evals and evals[-1]["step"] == n_steps
    assert summary["final"] == evals[-1]
    assert 0.0 <= summary["loader_fraction"] < 1.0
    assert "done:" in log and "samples/s" in log               # rank 0's progress line and summary
    if config["task"] == "language_model":
        assert all(e["perplexity"] > 1.0 for e in evals)
    else:
        assert all(0.0 <= e["accuracy"] <= 1.0 for e in evals)


@pytest.mark.parallel
@pytest.mark.slow
def test_controllers_show_in_the_stats(runs):
    _, steps, _, summary = read_run(runs["resnet101-cifar10-static"][0])
    assert {s["cf"] for s in steps} == {20.0}
    assert summary["floats_sent_vs_dense"] == pytest.approx(2 / 20, rel=0.05)   # values + indices
    assert [round(s["lr"], 6) for s in steps] == [0.1, 0.1, 0.01]              # the schedule steps
    _, steps, _, _ = read_run(runs["vgg16-cifar100-dense"][0])
    assert {s["cf"] for s in steps} == {1.0} and all(s["floats_sent"] == s["dense_floats"] for s in steps)
    _, steps, _, _ = read_run(runs["tinycnn-digits-gravac"][0])
    assert steps[0]["level"] == "dense" and "gain_min" in steps[-1] and len({s["candidate_cf"] for s in steps}) > 1


@pytest.mark.parallel
@pytest.mark.slow
def test_report_over_all_runs(runs, tmp_path):
    from horovod_gravac.harness.report import main as report_main
    out = tmp_path / "report"
    assert report_main([str(d) for d, _ in runs.values()] + ["--out", str(out)]) == 0
    for name in ("accuracy.png", "perplexity.png", "loss.png", "cf.png", "gain.png", "cf_kde.png",
                 "compression_throughput.png", "floats_sent.png", "eval.csv", "per_step.csv", "kde.csv",
                 "compression_throughput.csv", "summary.csv", "summary.json", "summary.md"):
        assert (out / name).stat().st_size > 100, name
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reference"] == "vgg16-cifar100-dense" and len(summary["runs"]) == len(RUNS)
