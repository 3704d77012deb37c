"""benchmarks/workloads.py (the workload family) and benchmarks/generalization.py's analysis, on
synthetic run directories (no network; one real 2-rank run of one draw)."""
import csv
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from benchmarks import generalization as G
from benchmarks import workloads as W

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_draw_is_a_pure_function_of_its_seed_and_the_family_is_covered():
    assert W.draw(7) == W.draw(7)
    draws = [W.draw(s) for s in range(60)]
    assert {d.family for d in draws} == set(W.FAMILIES)
    assert {d.optimizer for d in draws} == {"sgd", "adam", "adamw"}
    assert {d.schedule for d in draws} == set(W.SCHEDULES)
    for d in draws:
        assert d.window == max(10, d.steps // 12)
        assert d.metric == ("perplexity" if d.family in ("rnn", "transformer") else "accuracy")
        assert 32 <= d.batch_size <= 256
        assert d.family != "transformer" or d.optimizer != "sgd"


@pytest.mark.parametrize("schedule", W.SCHEDULES)
def test_learning_rate_schedules(schedule):
    w = W.Workload(seed=0, family="mlp", data="waves", arch={}, batch_size=32, seq_len=None, optimizer="sgd",
                   lr=0.1, momentum=0.9, weight_decay=0.0, schedule=schedule, steps=400)
    lrs = [w.lr_at(s) for s in range(400)]
    assert max(lrs) <= 0.1 + 1e-12 and min(lrs) >= 0.0
    if schedule == "constant":
        assert set(lrs) == {0.1}
    if schedule == "step":
        assert lrs[299] == 0.1 and lrs[300] == pytest.approx(0.01)
    if schedule in ("cosine", "warmup-cosine"):
        assert lrs[-1] < 0.001
    if schedule == "warmup-cosine":
        assert lrs[0] < lrs[19] == pytest.approx(0.1)


@pytest.mark.parametrize("family", W.FAMILIES)
def test_every_family_builds_and_takes_a_step(family):
    seed = next(s for s in range(200) if W.draw(s).family == family)
    w = W.draw(seed)
    torch.manual_seed(0)
    data = W.Data(w, rank=0, size=2)
    model = data.model()
    opt = W.make_base_optimizer(w, model.parameters())
    before = [p.detach().clone() for p in model.parameters()]
    loss = data.loss(model)
    loss.backward()
    opt.step()
    assert math.isfinite(loss.item())
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    result = data.evaluate(model, lambda t: t)
    assert 0.0 <= result["accuracy"] <= 1.0
    if w.metric == "perplexity":
        assert result["perplexity"] > 1.0


def test_controller_specs():
    w = W.draw(3)
    import horovod_gravac as hg
    assert isinstance(W.make_controller("dense", w), hg.Dense)
    assert W.make_controller("topk:100", w).cf == 100
    acc = W.make_controller("accordion", w)
    assert (acc.low_cf, acc.high_cf, acc.interval) == (10, 1000, w.window)
    g = W.make_controller("gravac", w)
    assert isinstance(g, hg.GraVAC) and g.window == w.window and g.variant == "predictive"
    p = W.make_controller("gravac:variant=paper,epsilon=0.7", w)
    assert p.variant == "paper" and p.epsilon == 0.7
    with pytest.raises(ValueError):
        W.make_controller("powersgd", w)


# --------------------------------------------------------------------------- the analysis
def write_run(path, cfs, scores, metric="accuracy", step_s=0.1, every=2, comm=None):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "steps.jsonl"), "w") as f:
        for i, cf in enumerate(cfs):
            rec = {"step": i + 1, "cf": cf, "iter_time": step_s, "step_time": step_s}
            if comm is not None:
                rec["comm_time"] = comm * step_s
            f.write(json.dumps(rec) + "\n")
    with open(os.path.join(path, "eval.jsonl"), "w") as f:
        for i, v in enumerate(scores):
            e = {"step": (i + 1) * every}
            e.update({"perplexity": v} if metric == "perplexity" else {"accuracy": v / 100})
            f.write(json.dumps(e) + "\n")
    with open(os.path.join(path, "summary.json"), "w") as f:
        json.dump({"ranks_identical": True}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({}, f)


def accuracy_seed():
    return next(s for s in range(100) if W.draw(s).metric == "accuracy")


def test_fixed_runs_are_timed_by_the_timing_runs_and_the_default_by_its_own_steps(tmp_path):
    seed = accuracy_seed()
    runs = tmp_path / "runs" / f"seed{seed}"
    write_run(runs / "dense", [1] * 8, [90, 95, 98, 98])                       # target 97.5
    write_run(runs / "topk10", [10] * 8, [90, 97.6, 98, 98])                   # at step 4
    write_run(runs / "topk100", [100] * 8, [90, 96, 97.7, 98])                 # at step 6
    write_run(runs / "topk1000", [1000] * 8, [90, 96, 97, 97])                 # never
    write_run(runs / "accordion", [10, 10, 1000, 1000, 1000, 1000, 10, 10], [90, 96, 97.6, 98])   # at 6
    write_run(runs / "gravac", [10, 10, 100, 100, 100, 100, 100, 100], [90, 97.6, 98, 98], step_s=0.05)
    write_run(runs / "time-dense", [1] * 10, [], step_s=1.0)
    write_run(runs / "time-topk10", [10] * 10, [], step_s=0.4, comm=0.75)
    write_run(runs / "time-topk100", [100] * 10, [], step_s=0.2)
    write_run(runs / "time-topk1000", [1000] * 10, [], step_s=0.1)
    d = G.analyse_draw(seed, str(tmp_path), ddp=False)
    rows = d["rows"]
    assert d["target"] == pytest.approx(97.5) and d["comm_share"] == pytest.approx(0.75)
    assert rows["topk10"]["tta_s"] == pytest.approx(4 * 0.4)
    assert rows["topk100"]["tta_s"] == pytest.approx(6 * 0.2)
    assert rows["topk1000"]["tta_s"] is None
    assert rows["accordion"]["tta_s"] == pytest.approx(0.4 + 0.4 + 4 * 0.1)
    assert rows["gravac"]["tta_s"] == pytest.approx(4 * 0.05)                  # its own periods
    assert d["best_static"] == "topk100"
    assert rows["dense"]["tta_s"] == pytest.approx(6 * 1.0)
    G.report([d], str(tmp_path), ddp=False, seeds=[seed], goals_from=seed)
    text = (tmp_path / "results.md").read_text()
    assert f"### The same goals over draws {seed} only" in text and text.count("| goal | measured | result |") == 2
    assert f"--seeds {seed} --goals-from {seed}`" in text   # the command that writes it again
    G.report([d], str(tmp_path), ddp=False, seeds=[seed], goals_from=seed + 1)   # no later draw: one table
    assert "### The same goals" not in (tmp_path / "results.md").read_text()
    G.report([d], str(tmp_path), ddp=False, seeds=[seed], goals_from=[seed - 1, seed])   # one table per rule
    text = (tmp_path / "results.md").read_text()
    assert text.count("| goal | measured | result |") == 3
    assert f"--goals-from {seed - 1} --goals-from {seed}`" in text


def test_a_draw_whose_runs_are_gone_is_read_back_from_the_report(tmp_path):
    """Run directories are not committed: a report over draws that ran on another machine
    reads them back from draws.csv, with the commit their adaptive run ran at."""
    seed = accuracy_seed()
    runs = tmp_path / "runs" / f"seed{seed}"
    write_run(runs / "dense", [1] * 8, [90, 95, 98, 98])
    write_run(runs / "topk100", [100] * 8, [90, 96, 97.7, 98])
    write_run(runs / "gravac", [10, 10, 100, 100, 100, 100, 100, 100], [90, 97.6, 98, 98], step_s=0.05)
    (runs / "gravac" / G.COMMIT_FILE).write_text("abc1234\n")
    write_run(runs / "time-dense", [1] * 10, [], step_s=1.0)
    write_run(runs / "time-topk100", [100] * 10, [], step_s=0.2)
    d = G.analyse_draw(seed, str(tmp_path), ddp=False)
    assert d["ran_at"] == "abc1234" and d["best_static"] == "topk100"
    G.report([d], str(tmp_path), ddp=False, seeds=[seed])
    before = (tmp_path / "results.md").read_text()
    import shutil
    shutil.rmtree(runs)
    back = G.analyse_draw(seed, str(tmp_path), ddp=False)
    assert back["rows"] == d["rows"] and back["ran_at"] == "abc1234"
    assert (back["target"], back["comm_share"], back["best_static"]) == (d["target"], d["comm_share"], "topk100")
    G.report([back], str(tmp_path), ddp=False, seeds=[seed])
    # the same tables and goals; the curves per family need the runs on disk, so the plot made
    # when they were is kept
    assert (tmp_path / "results.md").read_text() == before and "accuracy_vs_time.png" in before
    (tmp_path / "accuracy_vs_time.png").unlink()
    G.report([back], str(tmp_path), ddp=False, seeds=[seed])
    assert (tmp_path / "results.md").read_text() == before.replace("![accuracy_vs_time.png](accuracy_vs_time.png)\n", "")
    assert G.analyse_draw(seed + 1, str(tmp_path), ddp=False) is None   # never ran, nowhere
    other = dict(back, seed=seed + 1)   # a report over another draw keeps this one's rows
    G.report([other], str(tmp_path), ddp=False, seeds=[seed + 1])
    assert G.analyse_draw(seed, str(tmp_path), ddp=False)["rows"] == d["rows"]
    assert G.analyse_draw(seed + 1, str(tmp_path), ddp=False)["rows"] == d["rows"]
    os.makedirs(tmp_path / "runs" / f"seed{seed + 2}")   # on disk, no dense run, never reported
    assert G.analyse_draw(seed + 2, str(tmp_path), ddp=False) is None


def test_an_adaptive_run_trained_again_is_judged_against_the_archived_draw(tmp_path):
    """``--only gravac`` on a draw whose fixed runs are gone (after the rule changed): the new
    run replaces the archived row, timed by its own steps, against the archived target."""
    seed = accuracy_seed()
    runs = tmp_path / "runs" / f"seed{seed}"
    write_run(runs / "dense", [1] * 8, [90, 95, 98, 98])                       # target 97.5
    write_run(runs / "topk100", [100] * 8, [90, 96, 97.7, 98])
    write_run(runs / "gravac", [10] * 8, [90, 96, 97, 97], step_s=0.05)        # never
    (runs / "gravac" / G.COMMIT_FILE).write_text("old1234\n")
    (runs / "topk100" / G.COMMIT_FILE).write_text("old1234\n")
    write_run(runs / "time-dense", [1] * 10, [], step_s=1.0)
    write_run(runs / "time-topk100", [100] * 10, [], step_s=0.2)
    d = G.analyse_draw(seed, str(tmp_path), ddp=False)
    G.report([d], str(tmp_path), ddp=False, seeds=[seed])
    import shutil
    shutil.rmtree(runs)
    write_run(runs / "gravac", [100] * 8, [90, 97.6, 98, 98], step_s=0.05)    # at step 4
    (runs / "gravac" / G.COMMIT_FILE).write_text("new5678\n")
    again = G.analyse_draw(seed, str(tmp_path), ddp=False)
    assert again["ran_at"] == "new5678" and again["target"] == pytest.approx(97.5)
    assert again["rows"]["gravac"]["tta_s"] == pytest.approx(4 * 0.05) and again["rows"]["gravac"]["median_cf"] == 100
    assert {n: r for n, r in again["rows"].items() if n != "gravac"} == \
        {n: r for n, r in d["rows"].items() if n != "gravac"}                 # the fixed rows as archived
    G.report([again], str(tmp_path), ddp=False, seeds=[seed])
    assert "`gravac` runs at " + str(seed) + " at new5678" in (tmp_path / "results.md").read_text()
    # each row says which code it ran: the fixed rows keep the commit they were timed at
    with open(tmp_path / "draws.csv", newline="") as f:
        commits = {r["config"]: r["ran_at"] for r in csv.DictReader(f)}
    assert commits["gravac"] == "new5678" and commits["topk100"] == "old1234"
    assert G.analyse_draw(seed, str(tmp_path), ddp=False)["rows"]["topk100"]["ran_at"] == "old1234"


def test_trial_readings_pair_a_passed_trial_with_the_full_window_after_it(tmp_path):
    seed = accuracy_seed()
    window = W.draw(seed).window
    probe = max(1, window // 4)
    def check(cf, move, steps, gain, judged=None, delayed=False):
        return {"evaluated_cf": cf, "move": move, "interval_steps": steps, "window_gain": gain,
                "judged_gain": gain if judged is None else judged, "delayed_signal": delayed}
    history = [check(10.0, "up", probe, 0.98),                    # 10x -> 40x
               check(40.0, "stay", probe, 0.7, judged=0.95),      # the trial passes: judged loss 0.05
               check(40.0, "stay", window, 0.9),                  # the window after it: loss 0.1 -> 2x
               check(40.0, "up", window, 0.92),                   # a kept CF's check is no trial
               check(80.0, "stay", probe, 0.6, judged=0.9),       # a trial ...
               check(80.0, "hold", 3, 0.8, delayed=True),         # ... whose next interval failed: left out
               check(10.0, "stay", probe, 1.0)]
    runs = tmp_path / "runs" / f"seed{seed}"
    write_run(runs / "gravac", [10] * 8, [90, 97.6, 98, 98])
    with open(runs / "gravac" / "summary.json", "w") as f:
        json.dump({"ranks_identical": True, "controller_history": history}, f)
    assert G.trial_readings([{"seed": seed}], str(tmp_path)) == [pytest.approx(2.0)]
    # draws.csv keeps them, so a report made after the run directories are gone still counts them
    write_run(runs / "dense", [1] * 8, [90, 95, 98, 98])
    write_run(runs / "time-dense", [1] * 10, [], step_s=1.0)
    d = G.analyse_draw(seed, str(tmp_path), ddp=False)
    G.report([d], str(tmp_path), ddp=False, seeds=[seed])
    import shutil
    shutil.rmtree(tmp_path / "runs")
    back = G.analyse_draw(seed, str(tmp_path), ddp=False)
    assert back["trial_ratios"] == [pytest.approx(2.0)]
    assert G.trial_readings([back], str(tmp_path)) == [pytest.approx(2.0)]
    G.report([back], str(tmp_path), ddp=False, seeds=[seed])   # ... and writes them again
    assert G.analyse_draw(seed, str(tmp_path), ddp=False)["trial_ratios"] == [pytest.approx(2.0)]


@pytest.mark.parametrize("text, seeds", [("1000-1019", list(range(1000, 1020))), ("1001,1003", [1001, 1003]),
                                         ("0-2,7,9-10", [0, 1, 2, 7, 9, 10]), ("5", [5])])
def test_the_report_names_the_seeds_that_ran(text, seeds):
    # the report's header gives the --seeds that regenerates it: a gap is not written as a range
    assert G.parse_seeds(text) == seeds
    assert G.format_seeds(seeds) == text


def test_goals_count_misses_and_ties():
    def draw(seed, share, default, best, acc, t10=1.0):
        rows = {"gravac": {"tta_s": default, "timed": True}, "accordion": {"tta_s": acc, "timed": True},
                "topk10": {"tta_s": t10, "timed": True}, "topk100": {"tta_s": best, "timed": True}}
        return {"seed": seed, "comm_share": share, "best_static": "topk100" if best else None, "rows": rows}
    draws = [draw(i, 0.6, 1.2, 1.0, 1.5) for i in range(11)]
    draws.append(draw(11, 0.6, None, None, None, t10=None))    # nothing reaches: a tie with Accordion
    checks = {c["goal"]: c for c in G.goals(draws)}
    assert checks["at least 12 draws where communication is half of a Top-k 10x step or more"]["pass"]
    assert checks["reaches the target on every draw where Top-k 10x does"]["pass"]
    assert checks["median TTA at most 1.3x the best static CF's"]["pass"]
    assert checks["no slower than Accordion on at least 3 draws of 4"]["measured"] == "12 of 12"
    draws.append(draw(12, 0.7, None, 1.0, 1.0))                 # a miss where Top-k 10x reached
    checks = {c["goal"]: c for c in G.goals(draws)}
    assert not checks["reaches the target on every draw where Top-k 10x does"]["pass"]
    assert not checks["at most 2.5x the best static CF's on every draw"]["pass"]
    compute_bound = "at most 1.05x Top-k 10x where communication is under a fifth of the step"
    light = [draw(20, 0.1, 1.06, 1.0, 1.0)]
    assert not {c["goal"]: c for c in G.goals(light)}[compute_bound]["pass"]
    assert not {c["goal"]: c for c in G.goals([draw(21, 0.1, None, 1.0, 1.0)])}[compute_bound]["pass"]
    # neither Top-k 10x nor the default reaches: a tie; the default alone reaching: a pass
    assert {c["goal"]: c for c in G.goals([draw(22, 0.1, None, None, None, t10=None),
                                           draw(23, 0.1, 3.0, None, None, t10=None),
                                           draw(24, 0.1, 1.04, 1.0, 1.0)])}[compute_bound]["pass"]


def test_ddp_goal_against_the_hooks_that_reach_the_target():
    def draw(seed, default, **hooks):
        rows = {"gravac": {"tta_s": default, "timed": True}, "accordion": {"tta_s": None, "timed": True},
                "topk10": {"tta_s": 1.0, "timed": True}}
        rows.update({h: {"tta_s": t, "timed": True} for h, t in hooks.items()})
        return {"seed": seed, "comm_share": 0.6, "best_static": "topk10", "rows": rows}
    goal = "no slower than each DDP hook that reaches the target (fp16, PowerSGD ranks 1, 2, 4)"
    # Horovod draws have no hooks: no such row
    assert goal not in {c["goal"] for c in G.goals([draw(1, 1.0)])}
    # a hook that never reaches does not count against the default; one that is faster does,
    # and so does one that reaches where the default misses
    checks = {c["goal"]: c for c in G.goals([draw(1, 1.0, fp16=2.0, powersgd1=None),
                                             draw(2, 1.0, fp16=3.0, powersgd4=0.9),
                                             draw(3, None, fp16=5.0, powersgd2=None)])}
    assert not checks[goal]["pass"]
    assert checks[goal]["measured"] == "on 1 of 3 draws; slower than powersgd4 on [2]; slower than fp16 on [3]"
    assert {c["goal"]: c for c in G.goals([draw(1, 1.0, fp16=2.0, powersgd1=None)])}[goal]["pass"]


@pytest.mark.parallel
@pytest.mark.slow
def test_one_draw_trains_on_two_ranks(tmp_path):
    """A real 2-rank run of a draw through Horovod and through DDP: a finished run directory with
    identical ranks."""
    seed = next(s for s in range(100) if W.draw(s).family == "mlp")
    for ddp in (False, True):
        out = tmp_path / ("ddp" if ddp else "hvd")
        ok = G.launch(seed, "gravac", str(out), None, ddp, timeout=240, steps=12)
        assert ok, open(out / "rank0.err").read()[-3000:]
        summary = json.load(open(out / "summary.json"))
        assert summary["ranks_identical"] is True
        steps = [json.loads(line) for line in open(out / "steps.jsonl")]
        assert len(steps) == 12 and all(s["cf"] >= 1 for s in steps)
