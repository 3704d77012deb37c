"""benchmarks/ddp_hooks.py's analysis on synthetic run records (no training, no network)."""
import argparse
import json

import pytest

from benchmarks import ddp_hooks as B


def record(hook, cfs, accs, every=2, step_s=9.0, start=None):
    return {"hook": hook, "workload": "cnn1d-long", "metric": "accuracy", "ranks_identical": True,
            "start_powerSGD_iter": start,
            "steps": [{"time": step_s, "cf": cf} for cf in cfs],
            "evals": [{"step": (i + 1) * every, "accuracy": a / 100} for i, a in enumerate(accs)]}


def timing(kind, step_s):
    return {"hook": kind, "steps": [{"time": step_s, "cf": 1.0}] * (B.WARMUP + 3), "evals": []}


def write(tmp_path, runs, seed=42):
    """Training records go to runs/seed<seed>/, timing runs (``time-``) to runs/."""
    (tmp_path / "runs" / f"seed{seed}").mkdir(parents=True, exist_ok=True)
    for name, rec in runs.items():
        where = tmp_path / "runs" if name.startswith("time-") else tmp_path / "runs" / f"seed{seed}"
        (where / f"{name}.json").write_text(json.dumps(rec))


def args_for(tmp_path, hooks, rates=("1gbit", "100mbit"), seeds=(42,)):
    return argparse.Namespace(out=str(tmp_path), rate=list(rates), hooks=list(hooks), workload="cnn1d-long",
                              seeds=list(seeds), steps=None)


def combined(rows):
    return {(r["rate"], r["hook"]): r for r in rows if r["seed"] is None}


def test_fixed_hooks_are_timed_by_what_each_step_sent_and_gravac_by_its_own_steps(tmp_path):
    write(tmp_path, {
        "allreduce-1gbit": record("allreduce", [1] * 8, [90, 95, 98, 98]),
        # PowerSGD runs vanilla allreduce for its first 4 steps, then rank 1.
        "powersgd1-1gbit": record("powersgd1", [1] * 8, [90, 97.6, 98, 98], start=4),
        "accordion-1gbit": record("accordion", [10, 10, 1000, 1000, 1000, 1000, 10, 10], [97, 97.6, 98, 98]),
        "gravac-1gbit": record("gravac", [10] * 8, [97, 97.6, 98, 98], step_s=0.2),
        "gravac-100mbit": record("gravac", [10, 10, 100, 100, 100, 100, 100, 100], [97, 97.6, 98, 98], step_s=0.3),
        "time-allreduce-1gbit": timing("allreduce", 1.0), "time-allreduce-100mbit": timing("allreduce", 5.0),
        "time-powersgd1-1gbit": timing("powersgd1", 0.5), "time-powersgd1-100mbit": timing("powersgd1", 0.6),
        "time-topk10-1gbit": timing("topk10", 0.7), "time-topk10-100mbit": timing("topk10", 1.5),
        "time-topk1000-1gbit": timing("topk1000", 0.6), "time-topk1000-100mbit": timing("topk1000", 0.4),
    })
    args = args_for(tmp_path, ["allreduce", "powersgd1", "accordion", "gravac"])
    rows = {(r["rate"], r["hook"]): r for r in B.analyse(args) if r["seed"] == 42}
    assert rows[("1gbit", "allreduce")]["target"] == pytest.approx(0.975)
    assert rows[("100mbit", "allreduce")]["tta"] == pytest.approx(6 * 5.0)      # third evaluation
    assert rows[("100mbit", "powersgd1")]["tta"] == pytest.approx(4 * 5.0)      # steps 1-4: allreduce
    assert rows[("100mbit", "powersgd1")]["train_s"] == pytest.approx(4 * 5.0 + 4 * 0.6)
    assert rows[("100mbit", "accordion")]["tta"] == pytest.approx(2 * 1.5 + 2 * 0.4)
    assert rows[("1gbit", "gravac")]["tta"] == pytest.approx(4 * 0.2)          # its own step times
    assert rows[("100mbit", "gravac")]["tta"] == pytest.approx(4 * 0.3)
    text = B.report(B.analyse(args), args)
    # The goal is judged against the fastest built-in hook that reached the target.
    assert "| 100mbit | GraVAC 1.2 s; fastest built-in that reaches: powersgd1 20.0 s | PASS |" in text


def test_a_hook_that_hung_is_a_failed_row_and_never_the_rival(tmp_path):
    write(tmp_path, {
        "allreduce-1gbit": record("allreduce", [1] * 4, [98, 98]),
        "powersgd2-1gbit": {"hook": "powersgd2", "failed": "timed out after 900 s"},
        "gravac-1gbit": record("gravac", [10] * 4, [90, 90], step_s=0.1),   # never reaches
        "time-allreduce-1gbit": timing("allreduce", 1.0),
    })
    args = args_for(tmp_path, ["allreduce", "powersgd2", "gravac"], rates=["1gbit"])
    rows = B.analyse(args)
    assert [r.get("failed") for r in rows if r["hook"] == "powersgd2"] == ["timed out after 900 s"] * 2
    text = B.report(rows, args)
    assert "| powersgd2 | failed: timed out after 900 s |" in text
    assert "| 1gbit | GraVAC - s; fastest built-in that reaches: allreduce 2.0 s | FAIL |" in text


def test_timing_runs_cover_every_kind_of_step_a_fixed_hook_sends():
    assert B.needs_timing("powersgd4", "allreduce") and B.needs_timing("powersgd4", "powersgd4")
    assert B.needs_timing("accordion", "topk10") and B.needs_timing("accordion", "topk1000")
    assert not any(B.needs_timing("gravac", k) for k in B.TIMED)


def test_over_seeds_the_tta_is_the_median_only_when_every_seed_reached(tmp_path):
    timings = {"time-allreduce-1gbit": timing("allreduce", 1.0), "time-topk10-1gbit": timing("topk10", 0.5)}
    write(tmp_path, dict(timings, **{"allreduce-1gbit": record("allreduce", [1] * 6, [98, 98, 98]),
                                     "topk10-1gbit": record("topk10", [10] * 6, [98, 98, 98]),
                                     "gravac-1gbit": record("gravac", [10] * 6, [98, 98, 98], step_s=0.1)}), seed=1)
    write(tmp_path, {"allreduce-1gbit": record("allreduce", [1] * 6, [90, 98, 98]),
                     "topk10-1gbit": record("topk10", [10] * 6, [90, 90, 98]),
                     "gravac-1gbit": record("gravac", [10] * 6, [90, 90, 90], step_s=0.1)}, seed=2)
    write(tmp_path, {"allreduce-1gbit": record("allreduce", [1] * 6, [90, 90, 98]),
                     "topk10-1gbit": record("topk10", [10] * 6, [90, 98, 98]),
                     "gravac-1gbit": record("gravac", [10] * 6, [98, 98, 98], step_s=0.1)}, seed=3)
    args = args_for(tmp_path, ["allreduce", "topk10", "gravac"], rates=["1gbit"], seeds=(1, 2, 3))
    rows = combined(B.analyse(args))
    assert rows[("1gbit", "allreduce")]["tta"] == pytest.approx(4.0)          # 2, 4, 6 s
    assert rows[("1gbit", "topk10")]["tta"] == pytest.approx(2.0)             # 1, 3, 2 s
    assert rows[("1gbit", "topk10")]["tta_range"] == pytest.approx((1.0, 3.0))
    g = rows[("1gbit", "gravac")]
    assert g["tta"] is None and g["reached"] == 2 and g["tta_range"] == pytest.approx((0.2, 0.2))
    assert "| 1gbit | GraVAC - s; fastest built-in that reaches: allreduce 4.0 s | FAIL |" in B.report(
        B.analyse(args), args)


def test_report_header_names_the_flags_that_shaped_it(tmp_path):
    """A committed summary says how to write it again: the flags that differ from their defaults."""
    args = args_for(tmp_path, ["allreduce", "gravac"], rates=["100mbit"], seeds=(42,))
    assert B.command_line(args) == ("python -m benchmarks.ddp_hooks --rate 100mbit --workload cnn1d-long "
                                    "--hooks allreduce gravac --seeds 42")
    default = argparse.Namespace(rate=list(B.RATES), workload="cnn1d-waves", hooks=list(B.HOOKS), seeds=[42, 43, 44],
                                 steps=None)
    assert B.command_line(default) == "python -m benchmarks.ddp_hooks"
    assert "written by `python -m benchmarks.ddp_hooks --rate 100mbit" in B.report([], args)
