"""Plots and tables of training runs, matching the paper's figures (section IV).

    python -m horovod_gravac.harness.report runs/dense runs/static runs/gravac --out reports/demo

Reads each run directory written by :mod:`horovod_gravac.harness.train` (``config.json``,
``steps.jsonl``, ``eval.jsonl``, ``summary.json``; read with
:func:`horovod_gravac.harness.runlog.load_run`) and writes to ``--out``:

PNG plots
  ``accuracy.png``                test accuracy (or ``perplexity.png``) vs iterations (Fig. 7a/8a/9a)
  ``loss.png``                    training loss vs iterations (smoothed)
  ``cf.png``                      CF sent per iteration (log scale)
  ``gain.png``                    compression gain of theta_min and of the candidate CF per
                                  iteration, with epsilon, for adaptive runs
  ``cf_kde.png``                  density of iterations per CF: gaussian KDE on a log10 CF axis,
                                  bandwidth 0.1 in log10 units (Fig. 7b/8b/9b)
  ``compression_throughput.png``  mean compression throughput per CF sent (Fig. 7c/8c/9c)
  ``floats_sent.png``             cumulative floats sent vs dense SGD

Raw numbers
  ``eval.csv``, ``per_step.csv``, ``kde.csv``, ``compression_throughput.csv``,
  ``summary.csv``, ``summary.json``, ``summary.md`` (the table the demo prints).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from typing import List, Optional, Sequence

import numpy as np

from .runlog import load_run

KDE_BANDWIDTH_LOG10 = 0.1   # paper: "smoothing bandwidth of 0.1 passed to the gaussian KDE"


# --------------------------------------------------------------------------- reading
class Run:
    """One training run directory."""

    def __init__(self, path: str, label: Optional[str] = None):
        log = load_run(path)
        self.path = path
        self.config, self.summary, self.steps, self.evals = log.config, log.summary, log.steps, log.evals
        if not self.steps and not self.evals:
            raise ValueError(f"{path!r} has no steps.jsonl/eval.jsonl: not a finished training run")
        self.label = label or os.path.basename(os.path.normpath(path))
        self.controller = self.config.get("controller", self.summary.get("controller", "?"))
        self.is_lm = self.config.get("task") == "language_model" or any("perplexity" in e for e in self.evals)

    def col(self, key: str, default=float("nan")) -> np.ndarray:
        return np.array([_num(s.get(key), default) for s in self.steps], dtype=float)

    @property
    def step_index(self) -> np.ndarray:
        return np.array([s.get("step", i + 1) for i, s in enumerate(self.steps)], dtype=float)

    @property
    def epsilon(self) -> Optional[float]:
        return self.config.get("epsilon") if self.controller == "gravac" else None


def _num(v, default=float("nan")) -> float:
    try:
        return float(v) if v is not None else default
    except (TypeError, ValueError):
        return default


# --------------------------------------------------------------------------- numbers
def log_kde(cfs: Sequence[float], grid: np.ndarray, bandwidth: float = KDE_BANDWIDTH_LOG10) -> np.ndarray:
    """Gaussian KDE of ``log10(cf)`` evaluated at ``log10(grid)``; integrates to 1 over log10 CF."""
    x = np.log10(np.asarray(cfs, dtype=float))
    x = x[np.isfinite(x)]
    if x.size == 0:
        return np.zeros_like(grid, dtype=float)
    g = np.log10(grid)[:, None]
    z = (g - x[None, :]) / bandwidth
    return np.exp(-0.5 * z * z).sum(axis=1) / (x.size * bandwidth * math.sqrt(2 * math.pi))


def throughput_per_cf(run: Run) -> List[dict]:
    """Per CF sent: steps, mean compression throughput, mean system throughput."""
    cf = run.col("cf", 1.0)
    tc, ts = run.col("compression_throughput"), run.col("system_throughput")
    rows = []
    for c in sorted(set(cf[np.isfinite(cf)].tolist())):
        m = cf == c
        rows.append({"run": run.label, "cf": c, "steps": int(m.sum()),
                     "mean_compression_throughput": float(np.nanmean(tc[m])) if np.isfinite(tc[m]).any() else None,
                     "mean_system_throughput": float(np.nanmean(ts[m])) if np.isfinite(ts[m]).any() else None})
    return rows


def run_summary(run: Run, reference: Optional[Run]) -> dict:
    """Final metric, difference to the dense run, floats relative to dense, time, loader fraction."""
    s = run.summary
    final = s.get("final") or (run.evals[-1] if run.evals else {})
    floats = _num(s.get("floats_sent"), float(np.nansum(run.col("floats_sent", 0.0))))
    dense = _num(s.get("dense_floats"), float(np.nansum(run.col("dense_floats", 0.0))))
    row = {"run": run.label, "controller": run.controller, "steps": len(run.steps),
           "floats_sent": floats, "dense_floats": dense,
           "floats_vs_dense": floats / dense if dense > 0 else None,
           "compression_vs_dense": dense / floats if floats > 0 else None,
           "wall_seconds": _num(s.get("wall_seconds"), float(np.nansum(run.col("iter_time", 0.0)))),
           "loader_fraction": _num(s.get("loader_fraction"), float(
               np.nansum(run.col("data_time", 0.0)) / max(1e-12, np.nansum(run.col("iter_time", 0.0))))),
           "mean_cf": float(np.nanmean(run.col("cf", 1.0))) if run.steps else None}
    ref = (reference.summary.get("final") or reference.evals[-1]) if reference and reference.evals else {}
    key = "perplexity" if run.is_lm else "accuracy"
    row[key] = final.get(key)
    if not run.is_lm:
        row["top5"] = final.get("top5")
    row["reference"] = reference.label if reference else None
    row["diff_vs_dense"] = (row[key] - ref[key] if row[key] is not None and ref.get(key) is not None
                            else None)
    return row


def find_reference(run: Run, runs: Sequence[Run]) -> Optional[Run]:
    """The dense run to compare with: same model and data set, else same task, else none."""
    dense = [r for r in runs if r.controller == "dense" and r.evals]
    for same in (lambda r: (r.config.get("model"), r.config.get("dataset")) ==
                 (run.config.get("model"), run.config.get("dataset")),
                 lambda r: r.is_lm == run.is_lm):
        match = [r for r in dense if same(r)]
        if match:
            return match[0]
    return None


def format_table(rows: List[dict]) -> str:
    """Markdown table of run summaries (accuracy in %, difference in percentage points)."""
    lm = any("perplexity" in r for r in rows)
    both = lm and any("accuracy" in r for r in rows)
    head = ["run", "final acc / ppl" if both else "final ppl" if lm else "final acc",
            "diff vs dense" + (" (pp / ppl)" if both else " (ppl)" if lm else " (pp)"),
            "floats sent / dense", "compression", "mean CF", "time (s)", "loader %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(v, fmt):
        return "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)
    for r in rows:
        if "perplexity" in r:
            metric, diff = f(r.get("perplexity"), "ppl {:.2f}"), f(r.get("diff_vs_dense"), "{:+.2f}")
        else:
            acc = r.get("accuracy")
            metric = f(None if acc is None else 100 * acc, "{:.2f}%")
            d = r.get("diff_vs_dense")
            diff = f(None if d is None else 100 * d, "{:+.2f}")
        lines.append("| " + " | ".join([
            r["run"], metric, diff, f(r.get("floats_vs_dense"), "{:.4f}"),
            f(r.get("compression_vs_dense"), "{:.1f}x"), f(r.get("mean_cf"), "{:.1f}"),
            f(r.get("wall_seconds"), "{:.1f}"),
            f(None if r.get("loader_fraction") is None else 100 * r["loader_fraction"], "{:.2f}")]) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- writing
def _write_csv(path: str, rows: List[dict]) -> None:
    keys: List[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys or ["empty"])
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})


def _smooth(y: np.ndarray, n: int) -> np.ndarray:
    if n <= 1 or y.size < n:
        return y
    k = np.ones(n) / n
    valid = np.convolve(np.nan_to_num(y), k, mode="valid")
    return np.concatenate([np.full(n - 1, np.nan), valid])


def make_report(run_dirs: Sequence[str], out: str, labels: Optional[Sequence[str]] = None) -> dict:
    """Write every plot and table for ``run_dirs`` into ``out``; returns the summary dict."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (log-axis tick labels)

    runs = [Run(d, labels[i] if labels and i < len(labels) else None) for i, d in enumerate(run_dirs)]
    os.makedirs(out, exist_ok=True)
    reference = next((r for r in runs if r.controller == "dense"), None)
    colors = {r.label: plt.cm.tab10(i % 10) for i, r in enumerate(runs)}
    # Runs often coincide (same accuracy): distinct dashes and markers keep every line visible.
    styles = {r.label: (["-", "--", "-.", ":"][i % 4], "osD^v<>p*h"[i % 10]) for i, r in enumerate(runs)}
    files: List[str] = []

    def save(fig, name):
        path = os.path.join(out, name)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)

    title_ctx = ", ".join(sorted({f"{r.config.get('model', '?')} on {r.config.get('dataset', '?')}" for r in runs}))
    world = sorted({r.config.get("world_size") for r in runs if r.config.get("world_size")})
    if world:
        title_ctx += f", {'/'.join(map(str, world))} ranks"

    # -- test accuracy / perplexity vs iterations -------------------------------------
    eval_rows = []
    for lm in (False, True):
        group = [r for r in runs if r.is_lm == lm and r.evals]
        if not group:
            continue
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for r in group:
            steps = [e["step"] for e in r.evals]
            ys = [e.get("perplexity") if lm else 100 * e.get("accuracy", float("nan")) for e in r.evals]
            ls, mk = styles[r.label]
            ax.plot(steps, ys, ls=ls, marker=mk, ms=4, lw=1.6, label=r.label, color=colors[r.label])
            for e in r.evals:
                eval_rows.append({"run": r.label, **{k: e.get(k) for k in
                                  ("step", "accuracy", "top5", "perplexity", "test_loss", "floats_sent", "wall_time")}})
        ax.set_xlabel("iteration")
        if lm:
            ax.set_ylabel("test perplexity (lower is better)")
            ppl = [e["perplexity"] for r in group for e in r.evals if e.get("perplexity")]
            if ppl and max(ppl) / max(min(ppl), 1e-9) > 20:   # early perplexities are huge
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        else:
            ax.set_ylabel("test accuracy (%)")
            lows = [100 * e["accuracy"] for r in group for e in r.evals[len(r.evals) // 3:]]
            if lows:
                ax.set_ylim(max(0.0, min(lows) - 5), min(100.0, max(lows) + 2))
        ax.set_title(f"Test {'perplexity' if lm else 'accuracy'} vs iterations\n({title_ctx})")
        ax.grid(alpha=0.3)
        ax.legend()
        save(fig, "perplexity.png" if lm else "accuracy.png")
    _write_csv(os.path.join(out, "eval.csv"), eval_rows)

    # -- training loss ------------------------------------------------------------------
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for r in runs:
        if r.steps:
            n = max(1, len(r.steps) // 40)
            ax.plot(r.step_index, _smooth(r.col("loss"), n), label=r.label, color=colors[r.label])
    ax.set_xlabel("iteration")
    ax.set_ylabel("training loss (rank 0, moving average)")
    ax.set_yscale("log")
    ax.set_title(f"Training loss vs iterations\n({title_ctx})")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    save(fig, "loss.png")

    # -- CF per iteration ---------------------------------------------------------------
    step_rows = []
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for r in runs:
        if not r.steps:
            continue
        cf = r.col("cf", 1.0)
        ax.step(r.step_index, cf, where="post", label=r.label, color=colors[r.label], lw=1.2)
        if r.controller == "gravac":
            cand = r.col("candidate_cf")
            if np.isfinite(cand).any():
                ax.step(r.step_index, cand, where="post", color=colors[r.label], lw=0.8, ls=":",
                        label=f"{r.label}: candidate CF")
            tmin = r.col("theta_min")
            if np.isfinite(tmin).any():
                ax.step(r.step_index, tmin, where="post", color=colors[r.label], lw=0.8, ls="--",
                        label=f"{r.label}: theta_min")
        cum = np.cumsum(r.col("floats_sent", 0.0))
        cum_dense = np.cumsum(r.col("dense_floats", 0.0))
        for i, s in enumerate(r.steps):
            step_rows.append({"run": r.label, "step": s.get("step", i + 1), "loss": s.get("loss"),
                              "lr": s.get("lr"), "cf": s.get("cf"), "level": s.get("level"),
                              "theta_min": s.get("theta_min"), "candidate_cf": s.get("candidate_cf"),
                              "gain_min": s.get("gain_min"), "gain_candidate": s.get("gain_candidate"),
                              "floats_sent": s.get("floats_sent"), "cumulative_floats_sent": cum[i],
                              "dense_floats": s.get("dense_floats"), "cumulative_dense_floats": cum_dense[i],
                              "bytes_sent": s.get("bytes_sent"), "system_throughput": s.get("system_throughput"),
                              "compression_throughput": s.get("compression_throughput"),
                              "step_time": s.get("step_time"), "iter_time": s.get("iter_time"),
                              "data_time": s.get("data_time")})
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("compression factor (log scale; 1 = dense)")
    ax.set_title(f"CF sent per iteration\n({title_ctx})")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    save(fig, "cf.png")
    _write_csv(os.path.join(out, "per_step.csv"), step_rows)

    # -- compression gain -----------------------------------------------------------------
    adaptive = [r for r in runs if r.steps and np.isfinite(r.col("gain_min")).any()
                and r.controller != "dense"]
    if adaptive:
        fig, axes = plt.subplots(len(adaptive), 1, figsize=(7.5, 3.2 * len(adaptive) + 0.6), squeeze=False)
        for ax, r in zip(axes[:, 0], adaptive):
            x = r.step_index
            ax.plot(x, r.col("gain_min"), label="gain of theta_min", color="tab:blue")
            ax.plot(x, r.col("gain_candidate"), label="gain of candidate CF", color="tab:orange")
            if r.epsilon is not None:
                ax.axhline(r.epsilon, color="tab:red", ls="--", lw=1, label=f"epsilon = {r.epsilon:g}")
            ax.set_ylim(0, 1.05)
            ax.set_ylabel("compression gain\n(EWMA)")
            ax.set_title(f"{r.label}")
            ax.grid(alpha=0.3)
            ax2 = ax.twinx()
            ax2.step(x, r.col("candidate_cf"), where="post", color="gray", lw=0.8, ls=":", label="candidate CF")
            ax2.set_yscale("log")
            ax2.set_ylabel("candidate CF", color="gray")
            h1, l1 = ax.get_legend_handles_labels()
            h2, l2 = ax2.get_legend_handles_labels()
            ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="lower left")
        axes[-1, 0].set_xlabel("iteration")
        fig.suptitle(f"Compression gain per iteration ({title_ctx})", fontsize=11)
        save(fig, "gain.png")

    # -- KDE of iterations per CF --------------------------------------------------------------
    all_cf = np.concatenate([r.col("cf", 1.0) for r in runs if r.steps] or [np.ones(1)])
    lo = max(0.5, np.nanmin(all_cf) / 3)
    hi = np.nanmax(all_cf) * 3
    grid = np.logspace(math.log10(lo), math.log10(hi), 400)
    kde_rows = []
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for r in runs:
        if not r.steps:
            continue
        dens = log_kde(r.col("cf", 1.0), grid)
        ax.plot(grid, dens, label=r.label, color=colors[r.label])
        ax.fill_between(grid, dens, alpha=0.15, color=colors[r.label])
        kde_rows += [{"run": r.label, "cf": float(c), "density": float(d)} for c, d in zip(grid, dens)]
    ax.set_xscale("log")
    ax.set_xlabel("compression factor (log scale)")
    ax.set_ylabel("density of iterations\n(gaussian KDE, bandwidth 0.1 in log10 CF)")
    ax.set_title(f"Iterations per CF\n({title_ctx})")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    save(fig, "cf_kde.png")
    _write_csv(os.path.join(out, "kde.csv"), kde_rows)

    # -- compression throughput per CF ----------------------------------------------------------
    tp_rows = [row for r in runs if r.steps for row in throughput_per_cf(r)]
    _write_csv(os.path.join(out, "compression_throughput.csv"), tp_rows)
    with_tp = [r for r in runs if any(row["run"] == r.label and row["mean_compression_throughput"] is not None
                                      for row in tp_rows)]
    if with_tp:
        cfs = sorted({row["cf"] for row in tp_rows if row["mean_compression_throughput"] is not None})
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        width = 0.8 / len(with_tp)
        for i, r in enumerate(with_tp):
            vals = {row["cf"]: row for row in tp_rows if row["run"] == r.label}
            xs = [j + (i - (len(with_tp) - 1) / 2) * width for j, c in enumerate(cfs) if c in vals]
            ys = [vals[c]["mean_compression_throughput"] or 0.0 for c in cfs if c in vals]
            bars = ax.bar(xs, ys, width, label=r.label, color=colors[r.label])
            for b, c in zip(bars, [c for c in cfs if c in vals]):
                ax.annotate(f"{vals[c]['steps']} it", (b.get_x() + b.get_width() / 2, b.get_height()),
                            ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(cfs)))
        ax.set_xticklabels([f"{c:g}x" for c in cfs])
        ax.set_xlabel("CF sent (1x = dense); bar labels: iterations at that CF")
        ax.set_ylabel("mean compression throughput\n(samples/s x gain)")
        ax.set_title(f"Compression throughput per CF\n({title_ctx})")
        ax.grid(alpha=0.3, axis="y")
        ax.legend()
        save(fig, "compression_throughput.png")

    # -- cumulative floats sent ------------------------------------------------------------------
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    dense_drawn = set()
    several = len({(r.config.get("model"), r.config.get("dataset")) for r in runs}) > 1
    for r in runs:
        if not r.steps:
            continue
        x = r.step_index
        sent, dense = np.nansum(r.col("floats_sent", 0.0)), np.nansum(r.col("dense_floats", 0.0))
        tag = f" ({dense / sent:.1f}x fewer)" if sent > 0 and dense > 0 and r.controller != "dense" else ""
        ax.plot(x, np.cumsum(r.col("floats_sent", 0.0)), label=r.label + tag, color=colors[r.label],
                ls=styles[r.label][0])
        workload = (r.config.get("model"), r.config.get("dataset"))
        if workload not in dense_drawn and np.nansum(r.col("dense_floats", 0.0)) > 0:
            ax.plot(x, np.cumsum(r.col("dense_floats", 0.0)), color="black", ls="--", lw=1,
                    label="dense SGD (reference)" + (f": {workload[0]}" if several else ""))
            dense_drawn.add(workload)
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("cumulative floats sent per rank (log)")
    ax.set_title(f"Communication volume vs dense SGD\n({title_ctx})")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    save(fig, "floats_sent.png")

    # -- summary ------------------------------------------------------------------------------
    rows = [run_summary(r, find_reference(r, runs)) for r in runs]
    table = format_table(rows)
    _write_csv(os.path.join(out, "summary.csv"), rows)
    result = {"runs": rows, "reference": reference.label if reference else None,
              "plots": [os.path.basename(f) for f in files], "table": table}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(table + "\n")
    return result


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m horovod_gravac.harness.report",
                                description="Plots and CSV/JSON tables from horovod_gravac.harness.train "
                                            "run directories.")
    p.add_argument("runs", nargs="+",
                   help="run directories (each written by horovod_gravac.harness.train --out)")
    p.add_argument("--out", required=True, help="report directory")
    p.add_argument("--labels", help="comma-separated legend labels (default: run directory names)")
    args = p.parse_args(argv)
    labels = args.labels.split(",") if args.labels else None
    result = make_report(args.runs, args.out, labels)
    print(result["table"])
    print(f"\nreport written to {args.out}: {', '.join(result['plots'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
