"""benchmarks/default_ab.py: which tree each run comes from, in which order, and the summary
of a run (no training, no network)."""
import glob
import os
import subprocess

import pytest

from benchmarks import adaptivity as A
from benchmarks import default_ab as D


def fake_run(cfs, accs, step_s=0.1, every=2):
    steps = [{"step": i + 1, "cf": cf, "iter_time": step_s, "step_time": step_s} for i, cf in enumerate(cfs)]
    evals = [{"step": (i + 1) * every, "accuracy": a / 100} for i, a in enumerate(accs)]
    return {"summary": {}, "steps": steps, "evals": evals}


def test_a_run_is_summarised_by_its_first_evaluation_at_the_target():
    r = fake_run([10, 10, 160, 160, 160, 160, 160, 160], [90, 98.5, 99, 99.5])
    s = D.summarise(r, "cnn1d-long", 98.94)
    assert s["steps_to_target"] == 6 and s["tta_s"] == pytest.approx(0.6)
    assert s["theta_min_steps"] == 2 and s["median_cf"] == 160 and s["final"] == pytest.approx(99.5)
    missed = D.summarise(r, "cnn1d-long", 99.9)
    assert missed["steps_to_target"] is None and missed["tta_s"] is None
    with_dense = D.summarise(fake_run([1, 10, 10] + [160] * 5, [90, 99], every=4), "cnn1d-long", 98.94)
    assert with_dense["theta_min_steps"] == 2   # theta_min is the configuration's 10x, not a dense step


def test_report_only_summarises_the_runs_on_disk_without_a_checkout(monkeypatch, tmp_path):
    def no_checkout(sha):
        raise AssertionError("--report-only checked a revision out")
    monkeypatch.setattr(D, "revision_tree", no_checkout)
    monkeypatch.setattr(A, "run", lambda *a, **k: pytest.fail("--report-only trained"))
    assert D.main(["--against", "HEAD", "--workloads", "cnn1d-long", "--seeds", "42", "--target", "99",
                   "--out", str(tmp_path), "--report-only"]) == 0
    assert (tmp_path / "results.md").exists()


def test_each_seed_runs_the_revision_then_this_checkout_each_from_its_own_tree(monkeypatch, tmp_path):
    made = []

    def fake(w, flags, run_dir, rate, *a, **k):
        made.append((os.path.basename(run_dir), os.getcwd(), os.environ["PYTHONPATH"], list(flags)))
    monkeypatch.setattr(A, "run", fake)
    before = os.getcwd()
    assert D.main(["--against", "HEAD", "--workloads", "cnn1d-long", "--seeds", "42,43", "--target", "99",
                   "--out", str(tmp_path)]) == 0
    sha = subprocess.run(["git", "-C", D.ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    assert [m[0] for m in made] == [f"{sha}-42", "this-42", f"{sha}-43", "this-43"]
    rev_tree = made[0][1]
    assert rev_tree != D.ROOT and made[0][2] == rev_tree and os.path.basename(rev_tree).startswith("default_ab-")
    assert made[1][1] == D.ROOT and made[1][2] == D.ROOT
    assert all(m[3] == A.CONFIGS[D.CONFIG][1] for m in made)   # GraVAC() as the adaptivity benchmark runs it
    assert os.getcwd() == before and not os.path.exists(rev_tree)   # the worktree is gone afterwards
    assert (tmp_path / "results.md").exists()


def test_a_workload_without_a_recorded_target_needs_one(monkeypatch, tmp_path):
    monkeypatch.setattr(D, "recorded_target", lambda w, rate: None)
    with pytest.raises(SystemExit):
        D.main(["--against", "HEAD", "--workloads", "cnn1d-long", "--out", str(tmp_path)])


def test_the_revision_tree_gets_this_checkouts_built_kernels_when_their_source_is_the_same(tmp_path):
    """The kernels are an untracked build output: a revision's worktree has none, and would run
    the slower fallback beside this checkout's."""
    if subprocess.run(["git", "-C", D.ROOT, "diff", "--quiet", "HEAD", "--", "horovod_gravac/_native"]).returncode:
        pytest.skip("the kernel source has uncommitted changes")
    built = sorted(os.path.basename(p) for p in glob.glob(os.path.join(D.ROOT, "horovod_gravac", "_kernels*.so")))
    tree = tmp_path / "tree"
    (tree / "horovod_gravac").mkdir(parents=True)
    D.share_kernels("HEAD", str(tree))
    assert sorted(os.listdir(tree / "horovod_gravac")) == built
