#!/usr/bin/env python3
"""How soon does each compressor and controller reach dense accuracy, and with how many
floats, on a constrained network?  Time to accuracy and floats sent on the emulated network.

Every configuration trains one workload as Horovod Gloo ranks placed in network
namespaces joined by tbf rate-limited links (:func:`benchmarks.netem.run_ranks`), one
run after another, each with a timeout.  Workloads (``--workload``):

``ngram`` (default)  next-character prediction on CPython's pydoc text with the
                     fastText-style HashedNGram model (``--preset ngram-pydoc-chars``,
                     2^16 hash buckets x 16: 1.05M parameters, 4.2 MB of fp32 gradient
                     per step), 600 steps.  Communication-bound like the paper's models:
                     at 100 Mbit/s a dense step is ~95 % communication, and only the
                     embedding rows of a batch's contexts get a gradient (~1.5 % of the
                     entries), so there is real room for compression;
``digits``           the embedded demo's TinyCNN on scikit-learn's digits at width 64
                     (206k parameters), 240 steps: ~70 % communication when dense.

From the per-step JSON lines and the evaluations of every run it reports, like the paper:

* final test accuracy and its difference to dense (percentage points);
* time to accuracy (TTA): training time until the first evaluation whose accuracy is
  within ``--tolerance-pp`` (0.5) of dense's final accuracy (or ``--target``);
* speedup of that time over dense and over static Top-k 10x;
* floats sent relative to dense and to Accordion (Top-k);
* the per-phase split of the training time: compute (forward, backward, update, data),
  compress, communicate (``compress_time`` and ``comm_time`` of ``opt.stats``);
* the targets (T1a: >= 3x faster than dense, T1b: >= 1.5x faster than static Top-k 10x,
  T2: <= 1.2x the fastest static run), PASS/FAIL as measured;
* the alpha-beta cost model (benchmarks/cost_model.py, link fitted by the probe) fed
  with each run's measured compute/compress times and per-step payloads, against the
  measured step times.

Times are training time: the sum of the per-step ``iter_time`` (evaluation excluded).

Outputs under ``--out`` (default benchmarks/results/end_to_end/): ``results.csv``,
``phases.csv``, ``cost_model.csv``, ``targets.csv``, ``results.md`` (all tables),
``accuracy_vs_time.png``, ``speedups.png``, ``phases.png`` and the run directories
(``runs/<config>/``, not meant for git).

    python -m benchmarks.end_to_end                       # ngram, all configurations (~25 min)
    python -m benchmarks.end_to_end --workload digits     # the demo's CNN (~15 min)
    python -m benchmarks.end_to_end --quick               # a ~5 minute subset
    python -m benchmarks.end_to_end --configs dense,topk-cf10,gravac-exp-eps0.7
    python -m benchmarks.end_to_end --report-only         # re-analyse existing runs
"""
from __future__ import annotations

import argparse
import csv
import importlib
import json
import math
import os
import shutil
import statistics
import sys
import time
from typing import Dict, List, Optional, Sequence

from benchmarks import cost_model as cm
from benchmarks.netem import run_ranks
from horovod_gravac.harness import runlog

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# Workloads: training flags, steps, evaluation interval, GraVAC window and Accordion
# interval (scaled down from the paper's 500-2000 with the number of steps), the
# fixed secondary accuracy target (%), and where results go. One torch thread per
# rank: 3 ranks share 2 cores.
WORKLOADS: Dict[str, dict] = {
    # 2^16 buckets (not the preset's 2^18) keeps a dense step at ~0.5 s at 100 Mbit/s, so
    # the whole benchmark fits in ~25 minutes; the learning-rate drop moves with the steps.
    "ngram": dict(flags=["--preset", "ngram-pydoc-chars", "--num-buckets", "65536", "--threads", "1",
                         "--lr-milestones", "480"],
                  steps=600, eval_every=20, window=30, interval=30, fixed_target=66.5,
                  out=os.path.join(HERE, "results", "end_to_end"),
                  title="ngram-pydoc-chars, HashedNGram 2^16 x 16"),
    # The demo's preset (digits, TinyCNN, batch 32/rank, lr 0.05, momentum 0.9), made larger
    # so that communication matters at 100 Mbit/s (width 64: 206k parameters, 0.8 MB of fp32
    # gradient per step), shorter (the digits converge within ~100 steps).
    "digits": dict(flags=["--preset", "digits", "--width", "64", "--threads", "1"],
                   steps=240, eval_every=20, window=30, interval=30, fixed_target=98.0,
                   out=os.path.join(HERE, "results", "end_to_end_digits"),
                   title="digits, TinyCNN w64"),
}
DEFAULT_WORKLOAD = "ngram"
WORKLOAD = WORKLOADS[DEFAULT_WORKLOAD]   # set by main()

# name -> (group, compressor, flags); GraVAC's window and Accordion's interval are added
# per workload (train_command).
CONFIGS: Dict[str, tuple] = {"dense": ("dense", None, ["--controller", "dense"])}
for _c in ("topk", "dgc", "redsync", "randomk", "sidco"):
    for _cf in (10, 1000):
        CONFIGS[f"{_c}-cf{_cf}"] = ("static", _c, ["--controller", "static", "--compressor", _c,
                                                   "--cf", str(_cf)])
# GraVAC as in the paper (section IV-B): Exponential on DGC (theta 10-1000), Geometric on
# RedSync (theta 10-2000), epsilon 0.7 and 0.9, omega 1 %; and Exponential on Top-k, the
# exact compressor, as a reference.
for _pol, _short, _comp, _max in (("exponential", "exp", "dgc", "1000"), ("geometric", "geo", "redsync", "2000"),
                                  ("exponential", "exp", "topk", "1000")):
    for _eps in ("0.7", "0.9"):
        CONFIGS[f"gravac-{_short}-{_comp}-eps{_eps}"] = (
            "gravac", _comp, ["--controller", "gravac", "--variant", "paper", "--compressor", _comp, "--policy", _pol,
                              "--epsilon", _eps, "--theta-min", "10", "--theta-max", _max,
                              "--omega", "0.01"])
CONFIGS["accordion-topk"] = ("accordion", "topk", [
    "--controller", "accordion", "--compressor", "topk", "--low-cf", "10", "--high-cf", "1000"])
# Paper Table 4: PowerSGD rank 4 in critical regimes (the low CF), rank 1 otherwise;
# train.py maps --powersgd-rank 4 to the low CF and rank 1 to the high CF.
CONFIGS["accordion-powersgd"] = ("accordion", "powersgd", [
    "--controller", "accordion", "--compressor", "powersgd", "--powersgd-rank", "4",
    "--low-cf", "10", "--high-cf", "1000"])

QUICK_CONFIGS = ["dense", "topk-cf10", "dgc-cf10", "gravac-exp-dgc-eps0.9"]
QUICK_STEPS = 200

TARGET_SPEEDUP_DENSE = 3.0
TARGET_SPEEDUP_TOPK10 = 1.5
TARGET_MAX_SLOWDOWN = 1.20


def log(msg: str) -> None:
    print(f"[end_to_end] {msg}", flush=True)


# --------------------------------------------------------------------------- running
def compressor_available(name: Optional[str]) -> Optional[str]:
    """None if the compressor exists in this installation, else why not."""
    if name is None:
        return None
    from horovod_gravac.harness.train import COMPRESSORS
    cls = COMPRESSORS[name]
    try:
        pkg = importlib.import_module("horovod_gravac.compressors")
        if getattr(pkg, cls, None) is not None:
            return None
        mod = importlib.import_module(f"horovod_gravac.compressors.{name}")
        if getattr(mod, cls, None) is not None:
            return None
    except ImportError as e:
        return f"horovod_gravac.compressors has no {cls} ({e})"
    return f"horovod_gravac.compressors has no {cls}"


def train_command(name: str, run_dir: str, steps: int, eval_every: int) -> List[str]:
    group, _, flags = CONFIGS[name]
    extra = {"gravac": ["--window", str(WORKLOAD["window"])],
             "accordion": ["--accordion-interval", str(WORKLOAD["interval"])]}.get(group, [])
    return ([sys.executable, "-m", "horovod_gravac.harness.train"] + WORKLOAD["flags"] + flags + extra
            + ["--steps", str(steps), "--eval-every", str(eval_every), "--log-every", str(steps),
               "--out", run_dir])


def run_config(name: str, run_dir: str, np_: int, rate: Optional[str], steps: int,
               eval_every: int, timeout: float, force_localhost: bool) -> Dict:
    if os.path.isdir(run_dir):
        shutil.rmtree(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    cmd = train_command(name, run_dir, steps, eval_every)
    log(f"{name}: {' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    status, mode = "ok", None
    try:
        res = run_ranks(cmd, np=np_, rate=rate, delay=None, timeout=timeout,
                        env={"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")},
                        check=False, force_localhost=force_localhost, log_dir=run_dir + ".logs")
        mode = res[0].mode if res else None
        bad = [r for r in res if r.returncode != 0]
        if any(r.timed_out for r in res):
            status = f"timed out after {timeout:.0f}s"
        elif bad:
            status = f"rank {bad[0].rank} exited {bad[0].returncode}"
            tail = (bad[0].stderr or "")[-1500:]
            log(f"{name}: {status}\n{tail}")
    except Exception as e:  # namespaces/launcher failure: record it, go on with the others
        status = f"launcher error: {e}"
    if status == "ok" and not runlog.is_finished(run_dir):
        status = "no summary.json"
    wall = time.perf_counter() - t0
    log(f"{name}: {status} in {wall:.0f}s ({mode})")
    meta = {"name": name, "status": status, "mode": mode, "np": np_, "rate": rate,
            "launch_seconds": wall}
    with open(os.path.join(run_dir, "bench.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return meta


# --------------------------------------------------------------------------- analysis
def load_run(run_dir: str) -> Optional[Dict]:
    """Steps, evaluations (with cumulative training time) and summary of one run."""
    meta_path = os.path.join(run_dir, "bench.json")
    meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
    if meta.get("status", "ok") != "ok" or not runlog.is_finished(run_dir):
        return None
    run = runlog.load_run(run_dir)
    steps, evals = run.steps, run.evals
    if not steps or not evals:
        return None
    cum, t = {}, 0.0
    for s in steps:
        t += float(s.get("iter_time") or 0.0)
        cum[int(s["step"])] = t
    for e in evals:
        e["train_time"] = cum.get(int(e["step"]), t)
    return {"steps": steps, "evals": evals, "summary": run.summary, "config": run.config, "meta": meta}


def time_to(evals: List[dict], target: float) -> Optional[float]:
    for e in evals:
        if e["accuracy"] >= target - 1e-12:
            return e["train_time"]
    return None


def phase_split(steps: List[dict]) -> Dict[str, float]:
    total = sum(float(s.get("iter_time") or 0.0) for s in steps)
    compress = sum(float(s.get("compress_time") or 0.0) for s in steps)
    comm = sum(float(s.get("comm_time") or 0.0) for s in steps)
    return {"total_s": total, "compute_s": max(0.0, total - compress - comm),
            "compress_s": compress, "comm_s": comm}


def _ratio(a, b):
    return a / b if (a is not None and b not in (None, 0)) else None


def analyse(runs: Dict[str, Dict], tolerance_pp: float, target: Optional[float],
            fixed_target: Optional[float] = None) -> Dict:
    dense = runs.get("dense")
    if target is None:
        if dense is None:
            raise SystemExit("no dense run and no --target: nothing to measure time-to-accuracy against")
        dense_final = dense["evals"][-1]["accuracy"]
        target = dense_final - tolerance_pp / 100.0
        target_desc = f"dense final {100 * dense_final:.2f}% - {tolerance_pp:g} pp = {100 * target:.2f}%"
    else:
        dense_final = dense["evals"][-1]["accuracy"] if dense else None
        target_desc = f"--target {100 * target:.2f}%"
    tta = {n: time_to(r["evals"], target) for n, r in runs.items()}
    tta2 = {n: (time_to(r["evals"], fixed_target) if fixed_target is not None else None)
            for n, r in runs.items()}
    floats = {n: float(r["summary"]["floats_sent"]) for n, r in runs.items()}
    acc_ref = "accordion-topk" if "accordion-topk" in runs else (
        "accordion-powersgd" if "accordion-powersgd" in runs else None)
    rows = []
    for n, r in runs.items():
        final = r["evals"][-1]["accuracy"]
        ph = phase_split(r["steps"])
        cfs = r["summary"].get("steps_per_cf") or {}
        top_cf = max(cfs.items(), key=lambda kv: kv[1])[0] if cfs else ""
        rows.append({
            "config": n, "group": CONFIGS.get(n, ("?",))[0],
            "compressor": r["summary"].get("compressor") if n != "dense" else "-",
            "steps": r["summary"].get("steps"),
            "final_acc_pct": 100 * final,
            "diff_vs_dense_pp": 100 * (final - dense_final) if dense_final is not None else None,
            "tta_s": tta[n],
            "train_s": ph["total_s"],
            "speedup_vs_dense": _ratio(tta.get("dense"), tta[n]),
            "speedup_vs_topk10": _ratio(tta.get("topk-cf10"), tta[n]),
            "tta_fixed_s": tta2[n],
            "speedup_vs_dense_fixed": _ratio(tta2.get("dense"), tta2[n]),
            "speedup_vs_topk10_fixed": _ratio(tta2.get("topk-cf10"), tta2[n]),
            "floats_vs_dense": _ratio(floats[n], floats.get("dense")) if "dense" in floats
            else _ratio(floats[n], float(r["summary"]["dense_floats"])),
            "floats_vs_accordion": _ratio(floats[n], floats.get(acc_ref)) if acc_ref else None,
            "mean_step_ms": 1e3 * ph["total_s"] / max(1, len(r["steps"])),
            "compute_pct": 100 * ph["compute_s"] / ph["total_s"] if ph["total_s"] else None,
            "compress_pct": 100 * ph["compress_s"] / ph["total_s"] if ph["total_s"] else None,
            "comm_pct": 100 * ph["comm_s"] / ph["total_s"] if ph["total_s"] else None,
            "compute_s": ph["compute_s"], "compress_s": ph["compress_s"], "comm_s": ph["comm_s"],
            "most_used_cf": top_cf,
            "mode": r["meta"].get("mode"), "np": r["config"].get("world_size"),
        })
    return {"rows": rows, "target": target, "target_desc": target_desc, "tta": tta,
            "accordion_ref": acc_ref, "fixed_target": fixed_target}


def check_targets(res: Dict) -> List[Dict]:
    """The targets T1a, T1b and T2 (see the module docstring), per GraVAC configuration."""
    tta = res["tta"]
    static_hits = {n: t for n, t in tta.items()
                   if t is not None and CONFIGS.get(n, ("",))[0] == "static"}
    best_static = min(static_hits.items(), key=lambda kv: kv[1]) if static_hits else None
    out = []
    for n, t in tta.items():
        if CONFIGS.get(n, ("",))[0] != "gravac":
            continue
        sd = _ratio(tta.get("dense"), t)
        st = _ratio(tta.get("topk-cf10"), t)
        slow = _ratio(t, best_static[1]) if best_static else None
        # GraVAC picks the CF, not the compressor: also against static runs of its own compressor.
        own = CONFIGS[n][1]
        same = {m: v for m, v in static_hits.items() if CONFIGS[m][1] == own}
        best_same = min(same.items(), key=lambda kv: kv[1]) if same else None

        def verdict(ok, why_missing):
            return "FAIL (" + why_missing + ")" if ok is None else ("PASS" if ok else "FAIL")
        reached = t is not None
        out.append({
            "config": n,
            "reaches_target": "yes" if reached else "no",
            "speedup_vs_dense": sd,
            f"T1a >= {TARGET_SPEEDUP_DENSE:g}x vs dense": verdict(
                None if sd is None else sd >= TARGET_SPEEDUP_DENSE,
                "target not reached" if not reached else "no dense TTA"),
            "speedup_vs_topk10": st,
            f"T1b >= {TARGET_SPEEDUP_TOPK10:g}x vs Top-k 10x": verdict(
                None if st is None else st >= TARGET_SPEEDUP_TOPK10,
                "target not reached" if not reached else "Top-k 10x did not reach it"),
            "best_static": best_static[0] if best_static else None,
            "time_vs_best_static": slow,
            f"T2 <= {TARGET_MAX_SLOWDOWN:g}x best static": verdict(
                None if slow is None else slow <= TARGET_MAX_SLOWDOWN,
                "target not reached" if not reached else "no static run reached it"),
            "best_static_same_compressor": best_same[0] if best_same else None,
            "time_vs_same_compressor": _ratio(t, best_same[1]) if best_same else None,
        })
    return out


# --------------------------------------------------------------------------- cost model
def cost_model_rows(runs: Dict[str, Dict], np_: int, rate: Optional[str]) -> List[Dict]:
    """Alpha-beta model (link fitted by the probe at `rate`) fed with each run's measured
    compute and compress times and per-step payloads; compared with the measured times.

    Per step: dense (cf 1) -> ring allreduce of the fp32 gradient; Top-k & co -> ring
    allgather of `floats_sent` 4-byte words (values + int32 indices); Random-k (shared
    indices) -> allreduce of the values; PowerSGD -> two allreduces of its factors.
    """
    link = cm.PROBE_FIT.get(rate or "")
    if link is None:
        return []
    out = []
    for n, r in runs.items():
        comp = r["summary"].get("compressor")
        sync_pred, step_pred, comm_meas, step_meas = [], [], [], []
        for s in r["steps"][5:]:            # skip warm-up steps
            floats = float(s.get("floats_sent") or 0.0)
            cf = float(s.get("cf") or 1.0)
            if n == "dense" or cf <= 1.0:
                sync = cm.dense_sync_time(int(floats), np_, link)
            elif comp == "randomk":
                sync = cm.collective_time("allreduce", floats * cm.VALUE_BYTES, np_, link)
            elif comp == "powersgd":
                sync = 2 * cm.collective_time("allreduce", floats * cm.VALUE_BYTES / 2, np_, link)
            else:
                sync = cm.collective_time("allgather", floats * cm.VALUE_BYTES, np_, link)
            it = float(s.get("iter_time") or 0.0)
            comm = float(s.get("comm_time") or 0.0)
            compute_compress = it - comm
            sync_pred.append(sync)
            step_pred.append(compute_compress + sync)
            comm_meas.append(comm)
            step_meas.append(it)
        if not step_meas:
            continue
        med = statistics.median
        row = {"config": n, "np": np_, "rate": rate,
               "density": float(r["summary"]["floats_sent_vs_dense"] or 0.0)
               / (1.0 if n == "dense" or comp in ("randomk", "powersgd") else 2.0),
               "compute_compress_ms": 1e3 * med([a - b for a, b in zip(step_meas, comm_meas)]),
               "comm_measured_ms": 1e3 * med(comm_meas), "comm_model_ms": 1e3 * med(sync_pred),
               "step_measured_ms": 1e3 * med(step_meas), "step_model_ms": 1e3 * med(step_pred)}
        row["comm_meas_over_model"] = _ratio(row["comm_measured_ms"], row["comm_model_ms"])
        row["step_meas_over_model"] = _ratio(row["step_measured_ms"], row["step_model_ms"])
        q = row["comm_meas_over_model"]
        row["agreement"] = ("agrees (within 25%)" if q is not None and 0.8 <= q <= 1.25 else
                            "measured slower: CPU/Gloo overhead not in the model" if q and q > 1.25
                            else "measured faster than the model")
        out.append(row)
    return out


# --------------------------------------------------------------------------- output
def _fmt(v, spec=".2f", none="-"):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return none
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def write_csv(rows: List[Dict], path: str) -> None:
    if not rows:
        return
    fields = list(rows[0].keys())
    for r in rows[1:]:
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def md_table(header: Sequence[str], rows: List[Sequence]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def markdown(res: Dict, targets: List[Dict], cost: List[Dict], skipped: List[str],
             failed: List[str], setup: str) -> str:
    rows = res["rows"]
    parts = [f"Setup: {setup}.", f"Time-to-accuracy target: {res['target_desc']} "
             "(training time, evaluation excluded; `-` = not reached)."]
    if skipped:
        parts.append("Skipped (not in this installation): " + ", ".join(skipped) + ".")
    if failed:
        parts.append("Did not finish: " + ", ".join(failed) + ".")
    acc_ref = res["accordion_ref"] or "Accordion"
    parts.append(md_table(
        ["config", "final acc %", "Δ dense pp", "TTA s", "speedup vs dense", "speedup vs Top-k 10x",
         "floats vs dense", f"floats vs {acc_ref}", "most used CF", "train s"],
        [[r["config"], _fmt(r["final_acc_pct"]), _fmt(r["diff_vs_dense_pp"], "+.2f"), _fmt(r["tta_s"], ".1f"),
          _fmt(r["speedup_vs_dense"]), _fmt(r["speedup_vs_topk10"]), _fmt(r["floats_vs_dense"], ".4f"),
          _fmt(r["floats_vs_accordion"], ".3f"), r["most_used_cf"], _fmt(r["train_s"], ".1f")]
         for r in rows]))
    if res.get("fixed_target") is not None:
        parts.append(f"Secondary target: fixed {100 * res['fixed_target']:.1f}% test accuracy:")
        parts.append(md_table(
            ["config", "TTA s", "speedup vs dense", "speedup vs Top-k 10x"],
            [[r["config"], _fmt(r["tta_fixed_s"], ".1f"), _fmt(r["speedup_vs_dense_fixed"]),
              _fmt(r["speedup_vs_topk10_fixed"])] for r in rows]))
    parts.append("Per-phase split of training time (compute = step time minus compress minus communicate: forward, backward, update, data, and for GraVAC its consensus exchange when not counted in comm_time):")
    parts.append(md_table(
        ["config", "mean step ms", "compute %", "compress %", "communicate %"],
        [[r["config"], _fmt(r["mean_step_ms"], ".0f"), _fmt(r["compute_pct"], ".1f"),
          _fmt(r["compress_pct"], ".1f"), _fmt(r["comm_pct"], ".1f")] for r in rows]))
    if targets:
        parts.append("Issue 6 targets (per GraVAC configuration):")
        keys = list(targets[0].keys())
        parts.append(md_table(keys, [[_fmt(t[k]) for k in keys] for t in targets]))
    if cost:
        parts.append("Cost model (alpha-beta, link fitted by the probe) fed with the measured "
                     "compute+compress time and per-step payload, medians per step:")
        parts.append(md_table(
            ["config", "density", "compute+compress ms", "comm measured ms", "comm model ms",
             "meas/model comm", "step measured ms", "step model ms", "meas/model step", "verdict"],
            [[c["config"], _fmt(c["density"], ".4f"), _fmt(c["compute_compress_ms"], ".0f"),
              _fmt(c["comm_measured_ms"], ".1f"), _fmt(c["comm_model_ms"], ".1f"),
              _fmt(c["comm_meas_over_model"]), _fmt(c["step_measured_ms"], ".0f"),
              _fmt(c["step_model_ms"], ".0f"), _fmt(c["step_meas_over_model"]), c["agreement"]]
             for c in cost]))
    return "\n\n".join(parts) + "\n"


def plots(runs: Dict[str, Dict], res: Dict, out: str) -> List[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    made = []
    styles = {"dense": ("black", "-"), "static": (None, "--"), "gravac": (None, "-"),
              "accordion": (None, ":")}
    cmap = plt.get_cmap("tab10")
    markers = {"dense": "o", "static": "s", "gravac": "o", "accordion": "^"}
    panels = [("dense and static CFs", lambda g, n: g in ("dense", "static")),
              ("dense, Top-k 10x, GraVAC and Accordion",
               lambda g, n: g in ("dense", "gravac", "accordion") or n == "topk-cf10")]
    fig, axes = plt.subplots(1, 2, figsize=(15, 6.5), sharey=True)
    lo = min(100 * res["target"] - 6, 90)
    top = max(100 * e["accuracy"] for r in runs.values() for e in r["evals"]) + 1.0
    for ax, (title, keep) in zip(axes, panels):
        i = 0
        for n, r in runs.items():
            group = CONFIGS.get(n, ("static",))[0]
            if not keep(group, n):
                continue
            color, ls = styles.get(group, (None, "-"))
            if n == "topk-cf10" and group == "static" and title.startswith("dense,"):
                color = "grey"
            xs = [e["train_time"] for e in r["evals"]]
            ys = [100 * e["accuracy"] for e in r["evals"]]
            ax.plot(xs, ys, ls, color=color or cmap(i % 10), lw=2.4 if n == "dense" else 1.6,
                    marker=markers.get(group, "o"), ms=4, label=n)
            if color is None:
                i += 1
        ax.axhline(100 * res["target"], color="grey", lw=1, ls="-.",
                   label=f"target {100 * res['target']:.2f}%")
        ax.set_ylim(lo, min(100.5, top))
        times = [e["train_time"] for r in runs.values() for e in r["evals"] if e["train_time"] > 0]
        log_x = times and max(times) / min(times) > 20   # fast and slow runs both readable
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel("training time (s, evaluation excluded" + (", log scale)" if log_x else ")"))
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=2, loc="lower right")
    axes[0].set_ylabel("test accuracy (%)")
    fig.suptitle(f"Accuracy vs wall-clock training time ({WORKLOAD['title']}, emulated link)")
    fig.tight_layout()
    p = os.path.join(out, "accuracy_vs_time.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    made.append(p)

    rows = [r for r in res["rows"] if r["config"] != "dense"]
    fig, ax = plt.subplots(figsize=(10, 5.5))
    names = [r["config"] for r in rows]
    x = list(range(len(names)))
    w = 0.4
    sd = [r["speedup_vs_dense"] or 0.0 for r in rows]
    st = [r["speedup_vs_topk10"] or 0.0 for r in rows]
    b1 = ax.bar([i - w / 2 for i in x], sd, w, label="vs dense", color="tab:blue")
    b2 = ax.bar([i + w / 2 for i in x], st, w, label="vs static Top-k 10x", color="tab:orange")
    for bars, vals in ((b1, sd), (b2, st)):
        for b, v in zip(bars, vals):
            ax.text(b.get_x() + b.get_width() / 2, v + 0.02, f"{v:.2f}" if v else "n/r",
                    ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(TARGET_SPEEDUP_DENSE, color="tab:blue", lw=0.8, ls="--", label="target vs dense (3x)")
    ax.axhline(TARGET_SPEEDUP_TOPK10, color="tab:orange", lw=0.8, ls="--", label="target vs Top-k 10x (1.5x)")
    ax.set_ylim(0, max([3.5] + [1.15 * v for v in sd + st]))
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("time-to-accuracy speedup (higher is better)")
    ax.set_title("Speedup in time to dense accuracy (n/r = target not reached)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    p = os.path.join(out, "speedups.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    made.append(p)

    rows = res["rows"]
    fig, ax = plt.subplots(figsize=(10, 5.5))
    names = [r["config"] for r in rows]
    steps = [max(1, r["steps"] or 1) for r in rows]
    comp = [1e3 * r["compute_s"] / s for r, s in zip(rows, steps)]
    cpr = [1e3 * r["compress_s"] / s for r, s in zip(rows, steps)]
    com = [1e3 * r["comm_s"] / s for r, s in zip(rows, steps)]
    ax.bar(names, comp, label="compute + other (step minus compress minus communicate)", color="tab:green")
    ax.bar(names, cpr, bottom=comp, label="compress", color="tab:purple")
    ax.bar(names, com, bottom=[a + b for a, b in zip(comp, cpr)], label="communicate", color="tab:red")
    ax.set_ylabel("mean time per step (ms)")
    ax.set_title("Per-phase time split per step")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    p = os.path.join(out, "phases.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    made.append(p)
    return made


# --------------------------------------------------------------------------- main
def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default=DEFAULT_WORKLOAD,
                    help="what to train (see the module docstring)")
    ap.add_argument("--configs", help="comma-separated subset of: " + ",".join(CONFIGS))
    ap.add_argument("--quick", action="store_true",
                    help=f"~5 min: {','.join(QUICK_CONFIGS)} with {QUICK_STEPS} steps")
    ap.add_argument("--np", type=int, default=3, help="ranks (3; 2-rank Gloo allgather runs at half rate)")
    ap.add_argument("--rate", default="100mbit", help="link rate per rank")
    ap.add_argument("--steps", type=int, default=None, help="training steps (the workload's)")
    ap.add_argument("--eval-every", type=int, default=None, help="(the workload's)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per configuration")
    ap.add_argument("--tolerance-pp", type=float, default=0.5,
                    help="time-to-accuracy target: dense final accuracy minus this many points")
    ap.add_argument("--target", type=float, default=None, help="fixed accuracy target in %% instead")
    ap.add_argument("--fixed-target", type=float, default=None,
                    help="secondary time-to-accuracy target in %% (the workload's; reported beside the main one)")
    ap.add_argument("--out", help="results folder (the workload's, under benchmarks/results/)")
    ap.add_argument("--localhost", action="store_true", help="plain localhost ranks, no shaping")
    ap.add_argument("--report-only", action="store_true", help="analyse the runs already in --out")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    global WORKLOAD
    WORKLOAD = WORKLOADS[args.workload]
    args.out = args.out or WORKLOAD["out"]
    if args.fixed_target is None:
        args.fixed_target = WORKLOAD["fixed_target"]

    names = list(QUICK_CONFIGS) if args.quick else list(CONFIGS)
    if args.configs:
        names = [n.strip() for n in args.configs.split(",") if n.strip()]
        unknown = [n for n in names if n not in CONFIGS]
        if unknown:
            ap.error(f"unknown configs {unknown}; known: {','.join(CONFIGS)}")
    steps = args.steps or (QUICK_STEPS if args.quick else WORKLOAD["steps"])
    eval_every = args.eval_every or WORKLOAD["eval_every"]
    os.makedirs(args.out, exist_ok=True)
    runs_root = os.path.join(args.out, "runs")

    skipped, failed = [], []
    t0 = time.perf_counter()
    for n in names:
        why = compressor_available(CONFIGS[n][1])
        if why:
            print(f"note: skipping {n}: {why}", flush=True)
            skipped.append(n)
            continue
        if args.report_only:
            continue
        meta = run_config(n, os.path.join(runs_root, n), args.np, None if args.localhost else args.rate,
                          steps, eval_every, args.timeout, args.localhost)
        if meta["status"] != "ok":
            failed.append(f"{n} ({meta['status']})")

    runs = {}
    for n in names:
        if n in skipped:
            continue
        r = load_run(os.path.join(runs_root, n))
        if r is None:
            if args.report_only:
                failed.append(f"{n} (no finished run in {runs_root})")
            continue
        runs[n] = r
    if not runs:
        log("no run finished")
        return 1
    target = args.target / 100.0 if args.target is not None else None
    res = analyse(runs, args.tolerance_pp, target, args.fixed_target / 100.0)
    targets = check_targets(res)
    modes = sorted({str(r["mode"]) for r in res["rows"]})
    nps = sorted({str(r["np"]) for r in res["rows"]})
    rate = None if args.localhost or modes == ["localhost"] else args.rate
    cost = cost_model_rows(runs, int(nps[0]), rate) if len(nps) == 1 else []
    setup = (f"{'/'.join(nps)} ranks, {'/'.join(modes)} mode, link {rate or 'unshaped'}, "
             f"workload {args.workload} (`{' '.join(WORKLOAD['flags'])}`), {steps} steps, eval every "
             f"{eval_every}, GraVAC window {WORKLOAD['window']}, Accordion interval {WORKLOAD['interval']}, "
             f"shared 2-core machine "
             f"(1-min load {os.getloadavg()[0]:.1f} at report time)")
    write_csv(res["rows"], os.path.join(args.out, "results.csv"))
    write_csv(targets, os.path.join(args.out, "targets.csv"))
    write_csv(cost, os.path.join(args.out, "cost_model.csv"))
    md = markdown(res, targets, cost, skipped, failed, setup)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    made = [] if args.no_plots else plots(runs, res, args.out)
    print("\n" + md)
    log(f"wrote {args.out}/results.csv, results.md, targets.csv, cost_model.csv"
        + (", " + ", ".join(os.path.basename(p) for p in made) if made else "")
        + f"; benchmark took {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
