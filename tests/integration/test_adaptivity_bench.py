"""benchmarks/adaptivity.py's analysis on synthetic runs (no training, no network)."""
import argparse

import pytest

from benchmarks import adaptivity as A


def fake_run(cfs, accs, step_s=0.1, every=2):
    steps = [{"step": i + 1, "cf": cf, "iter_time": step_s, "floats_sent": 100.0 / cf, "dense_floats": 100.0,
              "comm_time": step_s / 2} for i, cf in enumerate(cfs)]
    evals = [{"step": (i + 1) * every, "accuracy": a / 100} for i, a in enumerate(accs)]
    return {"summary": {}, "steps": steps, "evals": evals}


ARGS = argparse.Namespace(tolerance_pp=0.5, tolerance_ppl=0.02)


def lm(ppls):
    """A language-model run: 4 steps, one perplexity evaluation every 2."""
    r = fake_run([1] * 4, [0, 0])
    r["evals"] = [{"step": 2 * (i + 1), "perplexity": p} for i, p in enumerate(ppls)]
    return r


def test_time_to_accuracy_and_ratios_with_measured_times():
    runs = {"dense": fake_run([1] * 8, [90, 95, 98, 98], step_s=0.4),
            "topk-cf10": fake_run([10] * 8, [90, 97.6, 98, 98], step_s=0.2),
            "gravac-ladder": fake_run([1, 10, 20, 20, 20, 20, 20, 20], [90, 97.9, 98, 98], step_s=0.1)}
    rows = {r["config"]: r for r in A.analyse("digits", "1gbit", runs, None, ARGS)}
    assert rows["dense"]["target"] == pytest.approx(97.5)
    assert rows["dense"]["tta_s"] == pytest.approx(6 * 0.4)           # third evaluation, step 6
    assert rows["topk-cf10"]["tta_s"] == pytest.approx(4 * 0.2)       # second evaluation, step 4
    g = rows["gravac-ladder"]
    assert g["tta_s"] == pytest.approx(0.4)
    assert g["speedup_vs_topk10"] == pytest.approx(2.0) and g["best_static"] == "topk-cf10"
    assert g["median_cf"] == 20 and g["dense_steps_pct"] == pytest.approx(12.5)


def test_fixed_configurations_are_timed_by_the_cf_each_step_sent():
    runs = {"dense": fake_run([1] * 4, [98, 98], step_s=9.0),
            "accordion-topk": fake_run([10, 10, 1000, 1000], [97, 98], step_s=9.0)}
    timings = {"dense": 1.0, "topk-cf10": 0.5, "topk-cf1000": 0.1}
    rows = {r["config"]: r for r in A.analyse("digits", "100mbit", runs, timings, ARGS)}
    assert rows["dense"]["train_s"] == pytest.approx(4.0)             # measured steps ignored
    assert rows["accordion-topk"]["train_s"] == pytest.approx(0.5 + 0.5 + 0.1 + 0.1)
    assert rows["accordion-topk"]["tta_s"] == pytest.approx(1.2)      # reached at step 4


def test_fixed_configurations_without_a_timing_at_this_rate_are_left_out_not_judged():
    # --only runs time nothing: Accordion trained at 100mbit sent 1000x, which has no timing at
    # 1gbit.  Its row and its goal are left out there (a NaN time read as "slower than Accordion").
    runs = {"dense": fake_run([1] * 4, [98, 98]), "accordion-topk": fake_run([10, 10, 1000, 1000], [97, 98]),
            "gravac-ladder": fake_run([10] * 4, [98, 98])}
    rows = A.analyse("digits", "1gbit", runs, {"topk-cf10": 0.5}, ARGS)
    assert {r["config"] for r in rows} == {"dense", "gravac-ladder"}   # dense keeps the target
    goals = [c["goal"] for c in A.goals(rows, [], {("digits", "1gbit"): 0.6}, "gravac-ladder")]
    assert "no slower than Accordion" not in goals


def test_best_static_goal_when_no_static_cf_reaches_the_target():
    rows = [{"workload": "w", "rate": "r", "config": "g", "tta_s": 5.0, "speedup_vs_topk10": None,
             "speedup_vs_accordion": None, "vs_best_static": None, "best_static": None, "final": 98.0,
             "target": 97.5}]
    check = next(c for c in A.goals(rows, [], {("w", "r"): 0.6}, "g") if "best static" in c["goal"])
    assert check["pass"] is True and "no static CF" in check["measured"]
    rows[0]["tta_s"] = None
    checks = {c["goal"]: c["pass"] for c in A.goals(rows, [], {("w", "r"): 0.6}, "g")}
    assert checks["within 1.5x of the best static CF"] is False and checks["reaches dense accuracy"] is False


def test_goals_by_communication_share():
    g = {"workload": "w", "rate": "r", "config": "g", "tta_s": 5.0, "final": 98.0, "target": 97.5,
         "speedup_vs_topk10": 1 / 1.04, "speedup_vs_accordion": 1.1, "vs_best_static": 1 / 1.4,
         "best_static": "topk-cf100"}
    acc = {"workload": "w", "rate": "r", "config": "accordion-topk", "tta_s": 5.5}
    bound = {c["goal"]: c["pass"] for c in A.goals([g, acc], [], {("w", "r"): 0.6}, "g")}
    assert bound == {"reaches dense accuracy": True, "within 1.5x of the best static CF": True,
                     "no slower than Accordion": True}
    light = {c["goal"]: c["pass"] for c in A.goals([g, acc], [], {("w", "r"): 0.1}, "g")}
    assert light == {"reaches dense accuracy": True, "at most 5 % slower than Top-k 10x": True}
    g["speedup_vs_topk10"], g["vs_best_static"], g["speedup_vs_accordion"] = 1 / 1.06, 1 / 1.6, 0.9
    assert not any(c["pass"] for c in A.goals([g], [], {("w", "r"): 0.1}, "g") if "5 %" in c["goal"])
    bound = {c["goal"]: c["pass"] for c in A.goals([g, acc], [], {("w", "r"): 0.6}, "g")}
    assert bound["within 1.5x of the best static CF"] is False and bound["no slower than Accordion"] is False


def test_same_payload_paths_are_judged_by_the_median_of_their_interleaved_runs():
    def runs(*step_s):
        return [fake_run([10] * 20, [98], step_s=t) for t in step_s]
    rounds = {"static": runs(0.10, 0.30, 0.11), "accordion-pinned": runs(0.105, 0.104, 0.5),
              "gravac-pinned": runs(0.108, 0.2, 0.107)}
    row = A.path_row("w", "r", rounds)
    # one slow run of a path (a noisy neighbour) no longer decides the goal
    assert row["static_ms"] == pytest.approx(110.0) and row["accordion-pinned_ms"] == pytest.approx(105.0)
    assert row["gravac-pinned_ms"] == pytest.approx(108.0) and row["rounds"] == 3
    assert row["spread"] == pytest.approx(110.0 / 105.0 - 1)
    assert A.path_row("w", "r", {**rounds, "gravac-pinned": []}) is None   # a path without a run
    assert A.path_dir_name("static", 0) == "__path__static"                 # earlier results: one run
    with pytest.raises(SystemExit):
        A.main(["--report-only", "--out", "/tmp/unused", "--path-rounds", "0"])


def test_language_model_target_is_relative_perplexity():
    rows = {r["config"]: r for r in A.analyse("tinylstm-pydoc", "1gbit",
                                              {"dense": lm([120, 100]), "topk-cf10": lm([101.9, 99])},
                                              None, ARGS)}
    assert rows["topk-cf10"]["target"] == pytest.approx(102.0) and rows["topk-cf10"]["tta_s"] == pytest.approx(0.2)


def test_goals_count_accordion_that_never_reaches_the_target_as_not_faster():
    rows = [{"workload": "w", "rate": "r", "config": "accordion-topk", "tta_s": None, "final": 90.0},
            {"workload": "w", "rate": "r", "config": "g", "tta_s": 5.0, "speedup_vs_topk10": 1.6, "final": 98.0,
             "target": 97.5, "speedup_vs_accordion": None, "vs_best_static": 0.95, "best_static": "topk-cf100"}]
    by = {c["goal"]: c["pass"] for c in A.goals(rows, [], {("w", "r"): 0.6}, "g")}
    assert by["no slower than Accordion"] is True and by["within 1.5x of the best static CF"] is True


def test_every_configuration_is_a_valid_training_command():
    from horovod_gravac.harness.train import build_parser
    parser = build_parser()
    for name, (_, flags) in A.CONFIGS.items():
        for w in A.WORKLOADS:
            cmd = A.train_command(w, flags, "/tmp/x", 10, 5)
            args = parser.parse_args(cmd[cmd.index("horovod_gravac.harness.train") + 1:])
            assert args.steps == 10, name


def test_seed_reaches_every_training_command_and_the_report_header():
    from horovod_gravac.harness.train import build_parser
    flags = A.CONFIGS["gravac-delivered"][1]
    cmd = A.train_command("cnn1d-digits", flags, "/tmp/x", 10, 5, seed=7)
    assert build_parser().parse_args(cmd[cmd.index("horovod_gravac.harness.train") + 1:]).seed == 7
    assert "--seed" not in A.train_command("cnn1d-digits", flags, "/tmp/x", 10, 5)   # the harness's own 42
    assert A.provenance({"a"}, ["100mbit"], False, seed=7).endswith(" Seed 7.")
    assert "Seed" not in A.provenance({"a"}, ["100mbit"], False)


def test_training_time_is_the_step_period_without_evaluations():
    # The period counts the wait for the decision broadcast (iter_time of old runs did not);
    # the first step and the step after an evaluation take their iteration time instead.
    from benchmarks.adaptivity import curve, step_periods
    steps = [{"step": i, "iter_time": 0.1, "step_time": 0.3} for i in range(1, 6)]
    run_ = {"steps": steps, "evals": [{"step": 2}]}
    assert step_periods(run_) == [0.1, 0.3, 0.1, 0.3, 0.3]
    assert curve(run_)[-1] == pytest.approx(1.1)
    steps[3].pop("step_time")   # a record without a period falls back to its iteration time
    assert step_periods(run_)[3] == 0.1


def test_goals_do_not_judge_accordion_without_an_accordion_run():
    rows = [{"workload": "w", "rate": "r", "config": "g", "tta_s": 5.0, "speedup_vs_topk10": 1.6, "final": 98.0,
             "target": 97.5, "speedup_vs_accordion": None, "vs_best_static": 0.95, "best_static": "topk-cf100"}]
    goals = [c["goal"] for c in A.goals(rows, [], {("w", "r"): 0.6}, "g")]
    assert "no slower than Accordion" not in goals and "within 1.5x of the best static CF" in goals


def test_window_flag_sets_every_workloads_window_and_accordion_interval(monkeypatch, tmp_path):
    import copy
    monkeypatch.setattr(A, "WORKLOADS", copy.deepcopy(A.WORKLOADS))
    assert A.main(["--report-only", "--out", str(tmp_path), "--window", "7"]) == 0
    for w in A.WORKLOADS:
        cmd = A.train_command(w, A.CONFIGS["gravac-delivered"][1], "/tmp/x", 10, 5)
        assert cmd[cmd.index("--window") + 1] == "7" and cmd[cmd.index("--accordion-interval") + 1] == "7"
    with pytest.raises(SystemExit):
        A.main(["--report-only", "--out", str(tmp_path), "--window", "0"])


def test_report_header_says_how_the_runs_were_made():
    assert A.provenance(None, ["1gbit", "100mbit"], False).startswith("Fixed configurations: one full run")
    assert A.provenance({"b", "a"}, ["100mbit"], True) == "Every configuration trained at 100mbit (`--only a,b --paths`)."
    two = A.provenance({"a"}, ["100mbit", "1gbit"], False)
    assert "trained once, at 100mbit" in two and "timing runs on disk" in two and "Same-payload runs" in two


def test_window_checks_list_every_gravac_check_with_the_gain_it_was_judged_on():
    hist = [{"step": 20, "evaluated_cf": 10.0, "theta_min": 10.0, "next_candidate_cf": 20.0, "move": "try",
             "window_gain": 0.97, "gain_min": 0.7, "gain_candidate": 0.6, "compression_throughput": {"10.0": 5.0}}]
    accordion = [{"step": 20, "norm": 1.0, "critical": True, "cf": 10.0}]
    runs = {("cnn1d-digits", "100mbit"): {
        "gravac-delivered": {"summary": {"controller_history": hist}},
        "accordion-topk": {"summary": {"controller_history": accordion}},
        "topk-cf10": {"summary": {}}}}
    rows = A.window_checks(runs)
    assert len(rows) == 1   # Accordion's interval checks and a static run have no window checks
    assert rows[0]["config"] == "gravac-delivered" and rows[0]["window_gain"] == 0.97
    assert rows[0]["move"] == "try" and rows[0]["evaluated_cf"] == 10.0 and "compression_throughput" not in rows[0]


@pytest.mark.filterwarnings("ignore:No artists with labels")   # a static run has no CF or gain curves
def test_plots_without_a_dense_run_draw_no_target(tmp_path):
    # --only without dense: no row gives a target, and the accuracy plot simply has no line for it.
    pytest.importorskip("matplotlib")
    steps = [{"step": i, "iter_time": 0.1, "step_time": 0.1, "cf": 10.0} for i in range(1, 5)]
    runs = {("cnn1d-digits", "1gbit"): {"topk-cf10": {"summary": {}, "steps": steps,
                                                     "evals": [{"step": 4, "accuracy": 0.9}]}}}
    made = A.plots(runs, [], str(tmp_path))
    assert any(m.endswith("accuracy_vs_time.png") for m in made)


def test_last_evaluations_are_compared_with_dense_in_pp_and_in_perplexity_percent(monkeypatch):
    monkeypatch.setattr(A, "LATE_EVALS", 2)
    runs = {"dense": fake_run([1] * 8, [90, 95, 98, 99]),            # last two: mean 98.5
            "topk-cf10": fake_run([10] * 8, [90, 99, 97, 97.5])}    # last two: mean 97.25
    rows = {r["config"]: r for r in A.analyse("digits", "1gbit", runs, None, ARGS)}
    assert rows["topk-cf10"]["late"] == pytest.approx(97.25)
    assert rows["topk-cf10"]["late_vs_dense"] == pytest.approx(-1.25) and rows["dense"]["late_vs_dense"] == 0.0

    rows = {r["config"]: r for r in A.analyse("tinylstm-pydoc", "1gbit",
                                              {"dense": lm([100, 100]), "topk-cf10": lm([110, 90])},
                                              None, ARGS)}
    assert rows["topk-cf10"]["late_vs_dense"] == pytest.approx(0.0)
    rows = {r["config"]: r for r in A.analyse("tinylstm-pydoc", "1gbit",
                                              {"dense": lm([100, 100]), "topk-cf10": lm([104, 106])},
                                              None, ARGS)}
    assert rows["topk-cf10"]["late_vs_dense"] == pytest.approx(-5.0)   # 5 % higher perplexity: worse


def test_every_rule_set_runs_as_the_library_builds_it():
    """Each GraVAC row is ``GraVAC(variant=...)`` with the library's settings for that rule set
    (epsilon, policy); only the compressor and the window are the benchmark's."""
    import horovod_gravac as hg
    from horovod_gravac.harness.train import make_controller, resolve_args
    for variant in hg.controllers.VARIANTS:
        cmd = A.train_command("shapes-resnet", A.CONFIGS[f"gravac-{variant}"][1], "/tmp/x", 10, 5)
        ours = make_controller(resolve_args(cmd[cmd.index("horovod_gravac.harness.train") + 1:]))
        lib = hg.GraVAC(variant=variant, window=100, batch_size=ours.batch_size)   # (samples/s, not a rule)
        assert ours.config() == lib.config(), variant
    assert A.DEFAULT_GRAVAC == f"gravac-{hg.controllers.DEFAULT_VARIANT}"


def test_over_seeds_takes_medians_and_counts_a_seed_that_misses_as_not_reaching():
    def seed(dense_acc, topk10, topk100, gravac):
        runs = {"dense": fake_run([1] * 4, [dense_acc - 1, dense_acc], step_s=0.4),
                "topk-cf10": fake_run([10] * 4, topk10, step_s=0.2),
                "topk-cf100": fake_run([100] * 4, topk100, step_s=0.1),
                "gravac-predictive": fake_run([10, 100, 100, 100], gravac, step_s=0.1)}
        return A.analyse("digits", "100mbit", runs, None, ARGS)
    per_seed = [seed(98, [98, 98], [90, 98], [98, 98]),     # topk100 at step 4, gravac at step 2
                seed(98, [90, 98], [90, 98], [90, 98]),
                seed(98, [98, 98], [90, 90], [98, 98])]     # topk100 misses on this seed
    rows = {r["config"]: r for r in A.over_seeds(per_seed)}
    g, t10, t100 = rows["gravac-predictive"], rows["topk-cf10"], rows["topk-cf100"]
    assert (g["seeds"], g["reached"]) == (3, 3) and g["tta_s"] == pytest.approx(0.2)
    assert (g["tta_min"], g["tta_max"]) == (pytest.approx(0.2), pytest.approx(0.4))
    assert t10["tta_s"] == pytest.approx(0.4) and t100["reached"] == 2 and t100["tta_s"] is None
    assert g["best_static"] == "topk-cf10" and g["vs_best_static"] == pytest.approx(2.0)
    assert g["speedup_vs_topk10"] == pytest.approx(2.0) and g["speedup_vs_accordion"] is None
    # The goals read the medians: reaching on every seed is what "reaches dense accuracy" means.
    checks = {c["goal"]: c["pass"] for c in A.goals(list(rows.values()), [], {("digits", "100mbit"): 0.6},
                                                    "gravac-predictive")}
    assert checks["reaches dense accuracy"] and checks["within 1.5x of the best static CF"]
    per_seed[1] = seed(98, [90, 98], [90, 98], [90, 90])
    g = next(r for r in A.over_seeds(per_seed) if r["config"] == "gravac-predictive")
    assert g["reached"] == 2 and g["tta_s"] is None


def test_adaptive_flag_trains_only_the_named_rule_sets(monkeypatch, tmp_path):
    made = []
    monkeypatch.setattr(A, "run", lambda w, flags, run_dir, rate, *a, **k: made.append(run_dir))
    assert A.main(["--workloads", "cnn1d-waves", "--out", str(tmp_path), "--adaptive", "gravac-predictive"]) == 0
    adaptive = sorted({d.split("/")[-1] for d in made if "/gravac-" in d})
    assert adaptive == ["gravac-predictive"]
    for rate in A.RATES:   # at every rate, with the fixed and timing runs as usual
        assert any(d.endswith(f"/{rate}/gravac-predictive") for d in made)
        assert any(d.endswith(f"/{rate}/__timing__dense") for d in made)
    assert any(d.endswith("/full/topk-cf1000") for d in made)
    with pytest.raises(SystemExit):
        A.main(["--out", str(tmp_path), "--adaptive", "topk-cf10"])


def test_report_header_names_the_flags_that_shaped_it(tmp_path):
    """A committed summary says how to write it again: the flags that differ from their defaults."""
    assert A.main(["--out", str(tmp_path), "--report-only", "--seed", "42", "--adaptive", "gravac-predictive",
                   "--workloads", "cnn1d-waves"]) == 0
    header = (tmp_path / "results.md").read_text().splitlines()[2]
    assert ("written by `python -m benchmarks.adaptivity --workloads cnn1d-waves --seed 42 "
            "--adaptive gravac-predictive`") in header
    assert A.main(["--out", str(tmp_path), "--report-only"]) == 0
    assert "written by `python -m benchmarks.adaptivity`." in (tmp_path / "results.md").read_text()
