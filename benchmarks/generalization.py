#!/usr/bin/env python3
"""Does ``GraVAC()`` hold on work it was not tuned on?  Time to dense accuracy over draws of
the workload family (``benchmarks/workloads.py``), 2 ranks on emulated 100 Mbit/s links,
against static Top-k at 10x, 30x, 100x, 300x and 1000x, Accordion (10x/1000x) and dense SGD.

The protocol: rules are tuned on development draws (seeds 0-29) and reported once on
evaluation draws (seeds 1000-1019), every draw included, misses too::

    python -m benchmarks.generalization --seeds 0-29 --out /tmp/generalization-dev   # tuning
    python -m benchmarks.generalization --seeds 1000-1019                          # the report
    python -m benchmarks.generalization --seeds 1000-1019 --report-only
    python -m benchmarks.generalization --ddp --seeds 1000-1005 --out benchmarks/results/generalization_ddp
    python -m benchmarks.generalization --seeds 1001 --only gravac   # the default again, against draws.csv's fixed runs

Run from the repository root, as root (``benchmarks/netem.py`` puts each rank in its own
network namespace behind a shaped link).  With ``--ddp`` every run trains under
``torch.distributed`` with DDP comm hooks instead of Horovod: this package's hook
(``hg.ddp.GravacState(controller=hg.GraVAC())``, static Top-k, Accordion) against DDP's own
``fp16_compress_hook`` and ``powerSGD_hook`` at ranks 1, 2 and 4 (one bucket, vanilla
allreduce for the first 10 % of the steps, as ``benchmarks/ddp_hooks.py`` runs it); its
goals add one row, whether the default is no slower than each of those hooks that reaches
the target.

How time is measured (as in ``benchmarks/adaptivity.py``).  A fixed configuration (dense,
static, Accordion, DDP's hooks) decides nothing from time, so its arithmetic, and so its
accuracy curve, is the same on any link: it is trained once in full on plain localhost
ranks, and timed by short runs (``TIMING_STEPS`` steps, the first ``WARMUP`` not counted)
at the rate; its training time is the sum over the full run's steps of the mean step
period at the rate of what that step sent.  ``GraVAC()`` reads measured step times, so it
is trained in full at the rate and its own step periods are summed.  Evaluation is not
training time.  The timing runs and the GraVAC runs are the ones that need a quiet machine.

TTA: training time to the first evaluation within 0.5 pp of dense's final accuracy
(language models: within 2 % of its final perplexity).  A draw's communication share is
the median share of a Top-k 10x timing step spent waiting for communication.

Outputs under ``--out`` (default ``benchmarks/results/generalization/``): ``results.md``
(every draw, the goals, the commit), ``draws.csv`` (one row per draw and configuration),
``tta_ratios.png`` (the distribution of TTA ratios) and ``accuracy_vs_time.png`` (one draw
of each family).  Run directories go to ``<out>/runs/`` (not committed).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union

from benchmarks import adaptivity as A
from benchmarks import workloads as W
from horovod_gravac.harness import runlog

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "results", "generalization")
RATE = "100mbit"
TIMING_STEPS, WARMUP = 50, 5
TOLERANCE_PP, TOLERANCE_PPL = 0.5, 0.02
STATIC_CFS = (10, 30, 100, 300, 1000)
DEFAULT = "gravac"
COMMIT_FILE = "commit.txt"   # in each run directory: the commit of the tree that ran it

#: name -> (--controller spec, kind): "fixed" is trained once on localhost and timed by short
#: runs; "adaptive" is trained at the rate.
HOROVOD_CONFIGS: Dict[str, Tuple[str, str]] = {
    "dense": ("dense", "fixed"),
    **{f"topk{cf}": (f"topk:{cf}", "fixed") for cf in STATIC_CFS},
    "accordion": ("accordion", "fixed"),
    "gravac": ("gravac", "adaptive"),
}
DDP_CONFIGS: Dict[str, Tuple[str, str]] = {
    "dense": ("dense", "fixed"),
    "fp16": ("ddp-fp16", "fixed"),
    **{f"powersgd{r}": (f"ddp-powersgd:{r}", "fixed") for r in (1, 2, 4)},
    **{f"topk{cf}": (f"topk:{cf}", "fixed") for cf in STATIC_CFS},
    "accordion": ("accordion", "fixed"),
    "gravac": ("gravac", "adaptive"),
}
#: DDP's own hooks: the DDP configurations Horovod has no twin of.  The issue's bar under DDP
#: is to beat each that reaches the target.
DDP_HOOKS = tuple(name for name in DDP_CONFIGS if name not in HOROVOD_CONFIGS)


def log(msg: str) -> None:
    print(f"[generalization] {msg}", flush=True)


def parse_seeds(text: str) -> List[int]:
    seeds: List[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-"))
            seeds += list(range(lo, hi + 1))
        elif part:
            seeds.append(int(part))
    return seeds


def format_seeds(seeds: Sequence[int]) -> str:
    """The ``--seeds`` text that :func:`parse_seeds` reads back as ``seeds`` (runs as LO-HI)."""
    parts: List[str] = []
    for seed in seeds:
        if parts and parts[-1].rpartition("-")[2] == str(seed - 1):
            lo = parts[-1].partition("-")[0]
            parts[-1] = f"{lo}-{seed}"
        else:
            parts.append(str(seed))
    return ",".join(parts)


def configs(ddp: bool) -> Dict[str, Tuple[str, str]]:
    return DDP_CONFIGS if ddp else HOROVOD_CONFIGS


# --------------------------------------------------------------------------- running
def draw_dir(out: str, seed: int) -> str:
    """Where draw ``seed``'s run directories are, under ``out``."""
    return os.path.join(out, "runs", f"seed{seed}")


def launch(seed: int, spec: str, run_dir: str, rate: Optional[str], ddp: bool, timeout: float,
           steps: Optional[int] = None, diagnose: bool = False) -> bool:
    """Train one configuration of draw ``seed`` on 2 ranks (``rate`` None: plain localhost)."""
    from benchmarks.netem import EmulatedCluster, launch_ranks
    if runlog.is_finished(run_dir):
        return True
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, COMMIT_FILE), "w") as f:   # the report names the code each draw ran
        f.write(commit() + "\n")
    cmd = [sys.executable, "-m", "benchmarks.workloads", "train", "--seed", str(seed), "--controller", spec,
           "--out", run_dir] + (["--ddp"] if ddp else []) + (["--steps", str(steps)] if steps else []) \
        + (["--diagnose"] if diagnose else [])
    t0 = time.time()
    with EmulatedCluster(2, rate, None, force_localhost=rate is None) as cluster:
        env = {"OMP_NUM_THREADS": "1"}
        if ddp:
            env.update({"MASTER_ADDR": cluster.address(0), "MASTER_PORT": str(cluster.port(29531)),
                        "GLOO_SOCKET_IFNAME": cluster.iface})
        results = launch_ranks(cluster, cmd, timeout, env=env, check=False, log_dir=run_dir)
    ok = all(r.returncode == 0 for r in results) and runlog.is_finished(run_dir)
    log(f"seed {seed} {spec} {rate or 'localhost'}{' ddp' if ddp else ''}: {'ok' if ok else 'FAILED'} "
        f"in {time.time() - t0:.0f}s")
    return ok


def timed_specs(ddp: bool) -> Dict[str, str]:
    """What the timing runs measure: step kind -> --controller spec."""
    out = {"dense": "dense", **{f"topk{cf}": f"topk:{cf}" for cf in STATIC_CFS}}
    if ddp:
        out.update({"fp16": "ddp-fp16", **{f"powersgd{r}": f"ddp-powersgd:{r}" for r in (1, 2, 4)}})
    return out


def run_draw(seed: int, out: str, args) -> None:
    runs = draw_dir(out, seed)
    cfg = configs(args.ddp)
    only = set(args.only.split(",")) if args.only else set(cfg)
    # 1. fixed configurations, full, on localhost (their arithmetic does not depend on time)
    for name, (spec, kind) in cfg.items():
        if kind == "fixed" and name in only:
            launch(seed, spec, os.path.join(runs, name), None, args.ddp, args.timeout,
                   diagnose=args.diagnose and name == "topk10")
    if args.accuracy_only:
        return
    # 2. timing runs at the rate: a PowerSGD step before start_powerSGD_iter is dense allreduce,
    #    so the timing run of powersgd<r> starts PowerSGD at once (steps // 10 of 50 -> 5 = WARMUP).
    for kind, spec in timed_specs(args.ddp).items():
        if kind in only or kind == "dense" or (kind in ("topk10", "topk1000") and "accordion" in only):
            launch(seed, spec, os.path.join(runs, f"time-{kind}"), RATE, args.ddp, args.timeout,
                   steps=TIMING_STEPS)
    # 3. adaptive configurations, full, at the rate
    for name, (spec, kind) in cfg.items():
        if kind == "adaptive" and name in only:
            launch(seed, spec, os.path.join(runs, name), RATE, args.ddp, args.timeout)


# --------------------------------------------------------------------------- analysis
def load(path: str) -> Optional[dict]:
    return A.load_run(path)


def step_kind(name: str, index: int, step: dict, steps: int) -> str:
    """What step ``index`` (from 0) of a full run of ``name`` sent, as a timing run's name."""
    if name.startswith("powersgd"):
        return "dense" if index < max(2, steps // 10) else name
    if name == "accordion" or name.startswith("topk"):
        return f"topk{float(step.get('cf') or 1.0):g}"
    return name


def analyse_draw(seed: int, out: str, ddp: bool) -> Optional[dict]:
    """Per configuration of draw ``seed``: final score, TTA and the draw's facts.  Without a
    finished dense run on disk, the draw as ``<out>/draws.csv`` archived it
    (:func:`archived_draw`), with any adaptive run now on disk in its place
    (:func:`with_adaptive_runs`); None where it has neither."""
    w = W.draw(seed)
    runs = draw_dir(out, seed)
    dense = load(os.path.join(runs, "dense"))
    if dense is None:
        archived = archived_draw(seed, out)
        return None if archived is None else with_adaptive_runs(archived, runs, ddp)
    metric = w.metric
    scores = A.score(dense["evals"], metric)
    target = scores[-1] * (1 + TOLERANCE_PPL) if metric == "perplexity" else scores[-1] - TOLERANCE_PP
    timings = {k: A.mean_step(r) for k in timed_specs(ddp)
               if (r := load(os.path.join(runs, f"time-{k}"))) is not None}
    t10 = load(os.path.join(runs, "time-topk10"))
    share = A.comm_share(t10) if t10 is not None and any(s.get("comm_time") is not None for s in t10["steps"]) \
        else None
    rows = {}
    for name, (spec, kind) in configs(ddp).items():
        r = load(os.path.join(runs, name))
        if r is None:
            continue
        if kind == "fixed":
            n = len(r["steps"])
            per_step = [timings.get(step_kind(name, i, s, n)) for i, s in enumerate(r["steps"])]
            times = None if any(t is None for t in per_step) else list(_cumsum(per_step))
        else:
            times = A.curve(r)
        rows[name] = dict(run_row(r, times, target, metric),
                          ran_at=_read_commit(os.path.join(runs, name, COMMIT_FILE)))
    return {"seed": seed, "family": w.family, "workload": w.describe(), "metric": metric,
            "target": target, "dense_final": scores[-1], "comm_share": share, "best_static": best_static(rows),
            "timings_ms": {k: 1000 * v for k, v in timings.items()}, "rows": rows,
            "ran_at": _read_commit(os.path.join(runs, DEFAULT, COMMIT_FILE)),
            "trial_ratios": trial_readings_of_run(os.path.join(runs, DEFAULT), w.window)}


def run_row(r: dict, times: Optional[List[float]], target: float, metric: str) -> dict:
    """One configuration's row of a draw: its final score, TTA against ``target`` on the
    cumulative training ``times`` (None: not timed), median CF and mean step."""
    cfs = [float(s.get("cf") or 1.0) for s in r["steps"]]
    return {"final": A.score(r["evals"], metric)[-1],
            "tta_s": A.first_at_target(r, times, target, metric)[1] if times else None,
            "timed": times is not None, "train_s": times[-1] if times else None,
            "median_cf": statistics.median(cfs),
            "mean_step_ms": 1000 * times[-1] / len(times) if times else None,
            "ranks_identical": r["summary"].get("ranks_identical")}


def best_static(rows: Dict[str, dict]) -> Optional[str]:
    """The static CF with the shortest TTA (in hindsight); None where none reaches."""
    statics = {n: v["tta_s"] for n, v in rows.items() if n.startswith("topk") and v["tta_s"] is not None}
    return min(statics, key=statics.get) if statics else None


def archived_draw(seed: int, out: str) -> Optional[dict]:
    """Draw ``seed`` as an earlier report wrote it to ``<out>/draws.csv``, for a draw whose run
    directories are gone (they are not committed): its rows, target and share, and the commit
    its adaptive run ran at.  None where the file has no row for it."""
    path = os.path.join(out, "draws.csv")
    if not os.path.exists(path):
        return None
    with open(path, newline="") as f:
        mine = [r for r in csv.DictReader(f) if int(r["seed"]) == seed]
    if not mine:
        return None

    def num(v: Optional[str]) -> Optional[float]:
        return float(v) if v not in (None, "") else None

    rows = {r["config"]: {"final": num(r["final"]), "tta_s": num(r["tta_s"]), "timed": r["timed"] == "True",
                          "train_s": num(r["train_s"]), "median_cf": num(r["median_cf"]),
                          "mean_step_ms": num(r["mean_step_ms"]), "ranks_identical": r["ranks_identical"] == "True",
                          "ran_at": r.get("ran_at") or "unknown"}
            for r in mine}
    first = mine[0]
    return {"seed": seed, "family": first["family"], "workload": first["workload"], "metric": W.draw(seed).metric,
            "target": num(first["target"]), "dense_final": rows.get("dense", {}).get("final"),
            "comm_share": num(first["comm_share"]), "best_static": best_static(rows), "timings_ms": {},
            "rows": rows, "ran_at": rows.get(DEFAULT, {}).get("ran_at") or first.get("ran_at") or "unknown",
            "trial_ratios": next((json.loads(r["trial_loss_ratios"]) for r in mine
                                  if r["config"] == DEFAULT and r.get("trial_loss_ratios")), None)}


def with_adaptive_runs(draw: dict, runs: str, ddp: bool) -> dict:
    """An archived ``draw`` with the adaptive runs now on disk in ``runs`` in place of its
    rows: an adaptive configuration is timed by its own run at the rate, so it can be trained
    again (``--only gravac``, say, after its rule changed) and judged against the archived
    fixed configurations and target.  Its commit becomes the draw's ``ran_at`` and its row's,
    and its trial readings the draw's; the fixed rows keep the commit they ran at."""
    for name, (_, kind) in configs(ddp).items():
        r = load(os.path.join(runs, name)) if kind == "adaptive" else None   # (fixed rows stay archived)
        if r is None:
            continue
        commit = _read_commit(os.path.join(runs, name, COMMIT_FILE))
        draw["rows"][name] = dict(run_row(r, A.curve(r), draw["target"], draw["metric"]), ran_at=commit)
        if name == DEFAULT:
            draw["ran_at"] = commit
            draw["trial_ratios"] = trial_readings_of_run(os.path.join(runs, name), W.draw(draw["seed"]).window)
    return draw


def _cumsum(xs):
    t = 0.0
    for x in xs:
        t += x
        yield t


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def ratio_or_tie(mine: Optional[float], other: Optional[float]) -> float:
    """``mine / other`` of two TTAs, where never reaching the target counts: both never is a
    tie (1), only ``other`` never is 0, only ``mine`` never is infinite."""
    if mine is None:
        return 1.0 if other is None else math.inf
    return 0.0 if other is None else mine / other


def goals(draws: List[dict], judged: str = DEFAULT) -> List[dict]:
    """The issue's goals for ``judged`` over the analysed draws (module docstring of README's
    "Which controller when")."""
    out = []
    comm = [d for d in draws if d["comm_share"] is not None and d["comm_share"] >= 0.5
            and judged in d["rows"] and d["rows"][judged]["timed"]]
    out.append({"goal": "at least 12 draws where communication is half of a Top-k 10x step or more",
                "measured": f"{len(comm)} draws", "pass": len(comm) >= 12})
    misses = [d["seed"] for d in comm if d["rows"].get("topk10", {}).get("tta_s") is not None
              and d["rows"][judged]["tta_s"] is None]
    out.append({"goal": "reaches the target on every draw where Top-k 10x does",
                "measured": f"missed on {misses}" if misses else "no miss", "pass": not misses})
    vs_best = [ratio(d["rows"][judged]["tta_s"], d["rows"][d["best_static"]]["tta_s"])
               for d in comm if d["best_static"]]
    finite = [v if v is not None else math.inf for v in vs_best]
    med = statistics.median(finite) if finite else None
    out.append({"goal": "median TTA at most 1.3x the best static CF's",
                "measured": f"{A.fmt(med)}x over {len(finite)} draws", "pass": med is not None and med <= 1.3})
    worst = max(finite) if finite else None
    out.append({"goal": "at most 2.5x the best static CF's on every draw",
                "measured": f"worst {A.fmt(worst)}x", "pass": worst is not None and worst <= 2.5})
    vs_acc = [ratio_or_tie(d["rows"][judged]["tta_s"], d["rows"].get("accordion", {}).get("tta_s")) for d in comm]
    med_acc = statistics.median(vs_acc) if vs_acc else None
    wins = sum(v <= 1.0 for v in vs_acc)
    out.append({"goal": "no slower than Accordion on the median",
                "measured": f"{A.fmt(med_acc)}x", "pass": med_acc is not None and med_acc <= 1.0})
    out.append({"goal": "no slower than Accordion on at least 3 draws of 4",
                "measured": f"{wins} of {len(vs_acc)}", "pass": bool(vs_acc) and wins >= 0.75 * len(vs_acc)})
    light = [d for d in draws if d["comm_share"] is not None and d["comm_share"] < 0.2
             and judged in d["rows"] and d["rows"][judged]["timed"]]
    bad = [d["seed"] for d in light
           if ratio_or_tie(d["rows"][judged]["tta_s"], d["rows"].get("topk10", {}).get("tta_s")) > 1.05]
    out.append({"goal": "at most 1.05x Top-k 10x where communication is under a fifth of the step",
                "measured": (f"{len(light)} such draws; over 1.05x on {bad}" if bad else f"{len(light)} such draws, all within"),
                "pass": not bad})
    with_hooks = [d for d in comm if any(h in d["rows"] for h in DDP_HOOKS)]
    if with_hooks:   # (DDP draws only)
        slower: Dict[str, List[int]] = {}   # hook -> the draws where it beat the default (a hook that
        for d in with_hooks:                # never reaches ties or loses: ratio_or_tie)
            for h in DDP_HOOKS:
                if h in d["rows"] and ratio_or_tie(d["rows"][judged]["tta_s"], d["rows"][h]["tta_s"]) > 1.0:
                    slower.setdefault(h, []).append(d["seed"])
        lost = {seed for seeds in slower.values() for seed in seeds}
        out.append({"goal": "no slower than each DDP hook that reaches the target (fp16, PowerSGD ranks 1, 2, 4)",
                    "measured": f"on {len(with_hooks) - len(lost)} of {len(with_hooks)} draws"
                    + "".join(f"; slower than {h} on {seeds}" for h, seeds in slower.items()),
                    "pass": not slower})
    return out


def trial_readings(draws: List[dict], out: str) -> List[float]:
    """For each trial the default passed and then kept for a full window at the same CF: that
    window's loss (1 - its window gain) over the trial's judged loss.  A trial is the check a
    probe interval after a move to a CF (``controllers/predictive.py``); its judged gain reads
    the interval's loss as a window's, and ``keep_epsilon`` allows for how low that reads.
    A draw's readings are its ``trial_ratios`` (:func:`analyse_draw`: from the default's run on
    disk, else as ``draws.csv`` archived them); a draw without that key is read from disk, and
    one with neither adds none."""
    out_ratios = []
    for d in draws:
        ratios = d["trial_ratios"] if "trial_ratios" in d else draw_trial_readings(d["seed"], out)
        out_ratios += ratios or []
    return out_ratios


def draw_trial_readings(seed: int, out: str) -> Optional[List[float]]:
    """:func:`trial_readings` of draw ``seed``'s default run on disk; None where it has none."""
    return trial_readings_of_run(os.path.join(draw_dir(out, seed), DEFAULT), W.draw(seed).window)


def trial_readings_of_run(run: str, window: int) -> Optional[List[float]]:
    """:func:`trial_readings` of one finished run of the default; None where it is not on disk."""
    if not runlog.is_finished(run):
        return None
    summary = runlog.read_json(os.path.join(run, runlog.SUMMARY))   # the summary alone: the history is all this reads
    history = summary.get("controller_history") or []
    out_ratios = []
    for before, trial, after in zip(history, history[1:], history[2:]):
        cf = trial["evaluated_cf"]
        judged = trial.get("judged_gain")
        if before["evaluated_cf"] == cf or trial["move"] != "stay" or trial.get("delayed_signal") \
                or judged is None or judged >= 1.0 or trial["interval_steps"] >= window:
            continue   # not a passed, lossy trial of a CF just moved to
        if after["evaluated_cf"] == cf and after["interval_steps"] == window \
                and after.get("window_gain") is not None and not after.get("delayed_signal"):
            out_ratios.append((1.0 - after["window_gain"]) / (1.0 - judged))
    return out_ratios


def trials_paragraph(draws: List[dict], out: str) -> List[str]:
    ratios = sorted(trial_readings(draws, out))
    if len(ratios) < 4:
        return []
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    # (a draw archived before draws.csv kept its readings has none: only the others count)
    read = [d["seed"] for d in draws if d.get("trial_ratios") is not None]
    return ["## A trial's judged gain against the window after it", "",
            f"Over the {len(ratios)} trials `{DEFAULT}` passed and then kept for a full window at the "
            f"same CF (draws {_ranges(read)}), that window's loss (1 - window gain) was a median {med:.2f}x the trial's judged "
            f"loss (quartiles {q1:.2f}x-{q3:.2f}x), most likely because a CF's backlog in error "
            "feedback is still growing when its probe interval ends.  A CF that passed is kept down "
            "to a gain of epsilon squared, about twice the loss a trial may show.", ""]


# --------------------------------------------------------------------------- report
def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _read_commit(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip() or "unknown"
    except OSError:
        return "unknown"


def ran_at(draws: List[dict]) -> str:
    """Which commit ran each draw's adaptive run (its ``commit.txt``), as ranges of seeds."""
    by_commit: Dict[str, List[int]] = {}
    for d in draws:
        by_commit.setdefault(d.get("ran_at") or "unknown", []).append(d["seed"])
    return "; ".join(f"{_ranges(seeds)} at {at}" for at, seeds in by_commit.items())


def _ranges(seeds: List[int]) -> str:
    seeds, parts, start = sorted(seeds), [], None
    for i, s in enumerate(seeds):
        if start is None:
            start = s
        if i + 1 == len(seeds) or seeds[i + 1] != s + 1:
            parts.append(f"{start}" if start == s else f"{start}-{s}")
            start = None
    return ", ".join(parts)


def goals_table(draws: List[dict]) -> str:
    return A.md_table(["goal", "measured", "result"],
                      [[c["goal"], c["measured"], "PASS" if c["pass"] else "FAIL"] for c in goals(draws)])


def report(draws: List[dict], out: str, ddp: bool, seeds: Sequence[int],
           goals_from: Union[None, int, Sequence[int]] = None) -> None:
    names = list(configs(ddp))
    froms = [] if goals_from is None else [goals_from] if isinstance(goals_from, int) else list(goals_from)
    title = "DDP hooks" if ddp else "Horovod"
    md = [f"# Generalization benchmark ({title})", "",
          f"Draws {format_seeds(seeds)} of `benchmarks/workloads.py`, 2 ranks on emulated {RATE} links; "
          f"written by `python -m benchmarks.generalization{' --ddp' if ddp else ''} --seeds {format_seeds(seeds)}"
          f"{''.join(f' --goals-from {g}' for g in froms)}` "
          f"at commit {commit()}; the draws' `{DEFAULT}` runs at {ran_at(draws)}.",
          "TTA: training seconds to within 0.5 pp of dense's final accuracy (language models: 2 % of its "
          "perplexity); '-': never reached.  Comm: the share of a Top-k 10x step spent waiting for "
          "communication.  Ratios are TTA over the best static CF's (in hindsight, over "
          + ", ".join(f"{cf}x" for cf in STATIC_CFS) + ") and over Accordion's.", ""]
    header = ["seed", "workload", "comm", "target"] + [f"{n} TTA s" for n in names] + \
        [f"{DEFAULT} / best static", f"{DEFAULT} / Accordion", f"{DEFAULT} median CF"]
    rows = []
    for d in draws:
        g = d["rows"].get(DEFAULT, {})
        best = d["rows"].get(d["best_static"], {}).get("tta_s") if d["best_static"] else None
        acc = d["rows"].get("accordion", {}).get("tta_s")
        rows.append([d["seed"], d["workload"], A.fmt(100 * d["comm_share"] if d["comm_share"] is not None else None, ".0f") + " %",
                     A.fmt(d["target"])] + [A.fmt(d["rows"].get(n, {}).get("tta_s"), ".1f") for n in names]
                    + [A.fmt(ratio(g.get("tta_s"), best)), A.fmt(ratio(g.get("tta_s"), acc)),
                       A.fmt(g.get("median_cf"), "g")])
    md += [A.md_table(header, rows), ""]
    md += [f"## Goals, for `{DEFAULT}` (`GraVAC()` with its defaults, window a twelfth of the steps)", "",
           goals_table(draws), ""]
    for start in froms:   # the draws a later rule ran, on their own (its commits are in the header)
        later = [d for d in draws if d["seed"] >= start]
        if later:
            md += [f"### The same goals over draws {_ranges([d['seed'] for d in later])} only", "",
                   goals_table(later), ""]
    if not ddp:
        md += trials_paragraph(draws, out)
    made = plots(draws, out, names)
    md += [f"![{os.path.basename(m)}]({os.path.basename(m)})" for m in made]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    flat = []
    for d in draws:
        for n, r in d["rows"].items():
            flat.append({"seed": d["seed"], "family": d["family"], "workload": d["workload"],
                         "comm_share": d["comm_share"], "target": d["target"], "ran_at": d.get("ran_at"),
                         "config": n, **r,   # (a row's own ran_at, where it has one, in that column)
                         "vs_best_static": ratio(r["tta_s"], d["rows"].get(d["best_static"], {}).get("tta_s")
                                                 if d["best_static"] else None),
                         "vs_accordion": ratio(r["tta_s"], d["rows"].get("accordion", {}).get("tta_s")),
                         **({"trial_loss_ratios": _archive_ratios(d)} if n == DEFAULT and not ddp else {})})
    rows = sorted(kept_rows(out, {d["seed"] for d in draws}) + flat, key=lambda r: int(r["seed"]))   # (stable)
    A.write_csv(rows, os.path.join(out, "draws.csv"))
    log(f"wrote {os.path.join(out, 'results.md')}")


def _archive_ratios(d: dict) -> str:
    """The default's trial readings of draw ``d`` as ``draws.csv`` keeps them (JSON), so that a
    report made after its run directories are gone still counts them; "" where none were read."""
    ratios = d.get("trial_ratios")
    return "" if ratios is None else json.dumps([round(x, 6) for x in ratios])


def kept_rows(out: str, seeds: set) -> List[dict]:
    """The rows of ``<out>/draws.csv`` for draws other than ``seeds``: the file keeps every draw
    reported into it, so a report over one draw does not drop the others (they may have run
    on another machine, their run directories gone; :func:`archived_draw`)."""
    path = os.path.join(out, "draws.csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return [r for r in csv.DictReader(f) if int(r["seed"]) not in seeds]


def plots(draws: List[dict], out: str, names: List[str]) -> List[str]:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plots")
        return []
    made = []
    comm = [d for d in draws if d["comm_share"] is not None and d["comm_share"] >= 0.5]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    shown = [n for n in names if n != "dense"]
    for ax, ref in zip(axes, ("best static", "accordion")):
        data = []
        for n in shown:
            vals = []
            for d in comm:
                base = d["rows"].get(d["best_static"], {}).get("tta_s") if ref == "best static" and d["best_static"] \
                    else d["rows"].get("accordion", {}).get("tta_s") if ref == "accordion" else None
                mine = d["rows"].get(n, {}).get("tta_s")
                if base is None:
                    continue
                vals.append(mine / base if mine is not None else math.nan)
            data.append(vals)
        for i, vals in enumerate(data):
            finite = [v for v in vals if not math.isnan(v)]
            missed = len(vals) - len(finite)
            ax.scatter([i + 0.15 * ((j % 5) - 2) / 2 for j in range(len(finite))], finite, s=14,
                       color="C3" if shown[i] == DEFAULT else "C0", alpha=0.8)
            med = statistics.median([math.inf if math.isnan(v) else v for v in vals]) if vals else math.inf
            if math.isfinite(med):   # as the goals count it: a miss is never
                ax.plot([i - 0.3, i + 0.3], [med] * 2, color="k", lw=1.5)
            if missed:
                ax.annotate(f"{missed} missed", (i, 0.52), ha="center", fontsize=7, color="C3")
        ax.axhline(1.0, color="grey", ls=":", lw=1)
        ax.set_yscale("log")
        ax.set_ylim(0.5, 30)
        ax.set_xticks(range(len(shown)))
        ax.set_xticklabels(shown, rotation=30, fontsize=8)
        ax.set_ylabel(f"TTA / {ref}'s TTA")
        ax.set_title(f"against {ref}, {len(comm)} communication-bound draws (line: median, a miss counted as never)", fontsize=9)
    fig.tight_layout()
    path = os.path.join(out, "tta_ratios.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    made.append(path)
    # One draw per family: accuracy (perplexity) against training time, from the runs on disk
    # (a draw read back from draws.csv has no curves, and one whose adaptive run alone was
    # trained again has no others).  Where some family has no draw on disk, the plot already
    # there (made when they were) is kept rather than drawn with fewer families.
    first = {}
    for d in draws:
        runs = draw_dir(out, d["seed"])
        if runlog.is_finished(os.path.join(runs, DEFAULT)) and runlog.is_finished(os.path.join(runs, "dense")):
            first.setdefault(d["family"], d)
    path = os.path.join(out, "accuracy_vs_time.png")
    missing = sorted({d["family"] for d in draws} - set(first))
    if missing and os.path.exists(path):
        log(f"no run on disk for {', '.join(missing)}: {path} kept as it is")
        made.append(path)
    elif first:
        fig, axes = plt.subplots(1, len(first), figsize=(4 * len(first), 3.4), squeeze=False)
        for ax, (fam, d) in zip(axes[0], sorted(first.items())):
            runs = draw_dir(out, d["seed"])
            for i, n in enumerate(names):
                r = load(os.path.join(runs, n))
                row = d["rows"].get(n)
                if r is None or row is None or row["train_s"] is None:
                    continue
                if n == DEFAULT:
                    t = A.curve(r)
                    xs = [t[e["step"] - 1] for e in r["evals"]]
                else:
                    xs = [e["step"] * row["train_s"] / len(r["steps"]) for e in r["evals"]]
                ax.plot(xs, A.score(r["evals"], d["metric"]), lw=2 if n == DEFAULT else 1, label=n,
                        color="C3" if n == DEFAULT else plt.get_cmap("tab10")(i % 10))
            ax.axhline(d["target"], color="k", ls=":", lw=1)
            ttas = [v["tta_s"] for k, v in d["rows"].items() if v["tta_s"] and k != "dense"]
            if ttas:
                ax.set_xlim(0, 2.5 * max(ttas))
            if d["metric"] == "accuracy":
                ax.set_ylim(d["target"] - 10, min(100.5, d["dense_final"] + 3))
            else:
                ax.set_ylim(d["target"] * 0.9, d["target"] * 1.6)
            ax.set_title(f"seed {d['seed']}: {fam}", fontsize=9)
            ax.set_xlabel("training seconds")
            ax.set_ylabel(d["metric"])
        drawn = [ax for ax in axes[0] if ax.get_legend_handles_labels()[0]]
        if drawn:
            drawn[0].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(path, dpi=80)
        plt.close(fig)
        made.append(path)
    return made


# --------------------------------------------------------------------------- main
def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1000-1019", help="draws: comma-separated seeds or LO-HI ranges")
    p.add_argument("--out", default=None, help=f"default {os.path.relpath(DEFAULT_OUT)} (with --ddp: _ddp)")
    p.add_argument("--ddp", action="store_true", help="DDP comm hooks instead of Horovod")
    p.add_argument("--only", help="comma-separated configurations to run (the rest on disk, or archived in "
                                  "draws.csv, are reused)")
    p.add_argument("--accuracy-only", action="store_true",
                   help="only the fixed configurations' full runs (localhost; no timing or adaptive runs)")
    p.add_argument("--diagnose", action="store_true", help="record raw-gradient statistics in the Top-k 10x run")
    p.add_argument("--adaptive", action="append", default=[], metavar="NAME=SPEC",
                   help="another adaptive configuration to train at the rate, e.g. "
                        "paper=gravac:variant=paper (repeatable)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--goals-from", type=int, metavar="SEED", action="append",
                   help="also judge the goals over the draws from SEED on (those a later rule ran; repeatable)")
    args = p.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    for item in args.adaptive:
        name, _, spec = item.partition("=")
        if not spec:
            p.error(f"--adaptive takes NAME=SPEC, got {item!r}")
        configs(args.ddp)[name] = (spec, "adaptive")
    out = args.out or (DEFAULT_OUT + ("_ddp" if args.ddp else ""))
    if args.only and not set(args.only.split(",")) <= set(configs(args.ddp)):
        p.error(f"--only takes {', '.join(configs(args.ddp))}")
    os.makedirs(out, exist_ok=True)
    if not args.report_only:
        for seed in seeds:
            run_draw(seed, out, args)
    draws = [d for d in (analyse_draw(s, out, args.ddp) for s in seeds) if d is not None]
    if draws:
        report(draws, out, args.ddp, seeds, args.goals_from)
    return 0


if __name__ == "__main__":
    sys.exit(main())
