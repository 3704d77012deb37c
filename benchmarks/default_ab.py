#!/usr/bin/env python3
"""Is a change to ``GraVAC()`` better?  The default controller from two source trees, this
checkout and a git revision, trained on the same workloads and seeds, back to back, on the
emulated link of ``benchmarks/adaptivity.py``.

The adaptivity benchmark compares the default with static CFs and Accordion over three seeds;
it takes hours, and its timings move with this shared machine's state from one day to the
next (15-25 % between sessions).  Comparing a changed default with the figures of the earlier
one in git mixes that drift into the answer.  Here both trees run in one session, seed by
seed (the revision first, then this checkout), so they see the same machine:

    python -m benchmarks.default_ab --against f4cf1b4 --workloads cnn1d-long
    python -m benchmarks.default_ab --against HEAD --workloads cnn1d-waves --seeds 42   # a change not committed yet

Each run is the adaptivity benchmark's ``gravac-<default variant>`` configuration of that
tree: only the compressor chosen, the window scaled to the run.  The target is the one
``benchmarks/results/adaptivity/results.csv`` records for the workload and rate (dense's
final accuracy, seed 42, less 0.5 pp; perplexity: plus 2 %), or ``--target``.  Per run:
the step of the first evaluation at the target, the training seconds to it (step periods,
evaluation excluded, as in the adaptivity benchmark), the mean step and the steps sent at
theta_min.  Steps to the target do not depend on the machine's speed; seconds do, alike for
both trees.

Writes ``results.md`` and ``results.csv`` under ``--out`` (default
``benchmarks/results/default_ab/``); runs go to ``<out>/runs/`` (not committed).  Needs
root for the emulated network, as the adaptivity benchmark.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

from benchmarks import adaptivity as A
from horovod_gravac.controllers import DEFAULT_VARIANT

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(HERE, "results", "default_ab")
CONFIG = f"gravac-{DEFAULT_VARIANT}"


def short_sha(rev: str) -> str:
    return subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", rev], check=True, capture_output=True,
                          text=True).stdout.strip()


@contextlib.contextmanager
def revision_tree(sha: str):
    """A detached worktree of ``sha`` in a temporary directory, removed afterwards."""
    path = tempfile.mkdtemp(prefix=f"default_ab-{sha}-")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "--force", path, sha], check=True,
                   capture_output=True)
    share_kernels(sha, path)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", path], capture_output=True)


def share_kernels(sha: str, tree: str) -> None:
    """Give the revision's tree this checkout's built C kernels (``horovod_gravac/_kernels*.so``,
    not tracked) where the revision's kernel source is the same: without them it runs the
    slower fallback, and its steps would not compare with this checkout's."""
    built = glob.glob(os.path.join(ROOT, "horovod_gravac", "_kernels*.so"))
    same = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", sha, "--", "horovod_gravac/_native"]).returncode == 0
    if built and same:
        for so in built:
            shutil.copy2(so, os.path.join(tree, "horovod_gravac"))
    else:
        print(f"[default_ab] {sha} runs without the C kernels ({'none built here' if not built else 'its source differs'}):"
              " its steps are slower than this checkout's", flush=True)


@contextlib.contextmanager
def source(tree: str):
    """Ranks launched inside import ``horovod_gravac`` from ``tree`` (``python -m`` puts the
    working directory first on the path, PYTHONPATH then wins over the installed package)."""
    cwd, pythonpath = os.getcwd(), os.environ.get("PYTHONPATH")
    os.chdir(tree)
    os.environ["PYTHONPATH"] = tree
    try:
        yield
    finally:
        os.chdir(cwd)
        if pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = pythonpath


def recorded_target(workload: str, rate: str) -> Optional[float]:
    """The adaptivity benchmark's target for the workload and rate (its results.csv)."""
    path = os.path.join(A.DEFAULT_OUT, "results.csv")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["workload"] == workload and row["rate"] == rate and row["config"] == "dense":
                return float(row["target"])
    return None


#: The configuration's lowest CF (its ``--theta-min``).
THETA_MIN = float(A.CONFIGS[CONFIG][1][A.CONFIGS[CONFIG][1].index("--theta-min") + 1])


def summarise(run_: dict, workload: str, target: float) -> dict:
    metric = A.WORKLOADS[workload]["metric"]
    step, tta = A.first_at_target(run_, A.curve(run_), target, metric)
    cfs = [float(s.get("cf") or 1.0) for s in run_["steps"]]
    return {"steps_to_target": step, "tta_s": tta, "final": A.score(run_["evals"], metric)[-1],
            "mean_step_ms": 1000 * A.mean_step(run_), "theta_min_steps": sum(c == THETA_MIN for c in cfs),
            "median_cf": statistics.median(cfs)}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", required=True, help="the git revision to compare this checkout with")
    p.add_argument("--workloads", default="cnn1d-long", help=f"of the adaptivity benchmark: {', '.join(A.WORKLOADS)}")
    p.add_argument("--seeds", default="42,43,44")
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--target", type=float, help="accuracy (or perplexity) to reach; default: the adaptivity "
                                                "benchmark's for the workload and rate")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds per run")
    p.add_argument("--report-only", action="store_true", help="summarise the runs on disk")
    args = p.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    for w in workloads:
        if w not in A.WORKLOADS:
            p.error(f"unknown workload {w!r}; choose from {', '.join(A.WORKLOADS)}")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    targets: Dict[str, float] = {}
    for w in workloads:
        t = args.target if args.target is not None else recorded_target(w, args.rate)
        if t is None:
            p.error(f"no target recorded for {w} at {args.rate}: give --target")
        targets[w] = t
    runs_dir = os.path.join(args.out, "runs")
    flags = A.CONFIGS[CONFIG][1]

    def run_dir(w, side, seed):
        return os.path.join(runs_dir, w, args.rate, f"{side}-{seed}")

    sha = short_sha(args.against)
    sides = [sha, "this"]
    if not args.report_only:   # (the runs on disk need no checkout)
        with revision_tree(sha) as rev_path:
            trees = {sha: rev_path, "this": ROOT}
            for w in workloads:
                steps, every = A.WORKLOADS[w]["steps"], A.WORKLOADS[w]["eval_every"]
                for seed in seeds:
                    for side in sides:
                        with source(trees[side]):
                            A.run(w, flags, run_dir(w, side, seed), args.rate, 2, steps, every, args.timeout, seed)

    rows = []
    for w in workloads:
        for seed in seeds:
            for side in sides:
                r = A.load_run(run_dir(w, side, seed))
                if r is not None:
                    rows.append({"workload": w, "rate": args.rate, "seed": seed, "tree": side,
                                 "target": targets[w], **summarise(r, w, targets[w])})
    os.makedirs(args.out, exist_ok=True)
    A.write_csv(rows, os.path.join(args.out, "results.csv"))
    md = ["# The default from two source trees", "",
          f"`{CONFIG}` (`GraVAC()`) from this checkout and from `{sha}`, 2 ranks at {args.rate}, seed by seed "
          f"({sha} first); written by `python -m benchmarks.default_ab --against {args.against} --workloads "
          f"{','.join(workloads)} --seeds {','.join(map(str, seeds))} --rate {args.rate}`.", ""]
    for w in workloads:
        sel = [r for r in rows if r["workload"] == w]
        md += [f"## {w}: target {targets[w]:.2f}", "",
               A.md_table(["seed", "tree", "step at target", "TTA s", "mean step ms", "steps at theta_min",
                           "median CF", "final"],
                          [[r["seed"], r["tree"], A.fmt(r["steps_to_target"], "d"), A.fmt(r["tta_s"], ".1f"),
                            A.fmt(r["mean_step_ms"], ".0f"), r["theta_min_steps"], A.fmt(r["median_cf"], "g"),
                            A.fmt(r["final"], ".2f")] for r in sel]), ""]
        med = {}
        for side in sides:
            tta = [r["tta_s"] for r in sel if r["tree"] == side]
            med[side] = statistics.median(tta) if tta and None not in tta else None
        if med.get("this") and med.get(sha):
            md += [f"Median TTA: this checkout {med['this']:.1f} s, {sha} {med[sha]:.1f} s "
                   f"(this / {sha}: {med['this'] / med[sha]:.2f}).", ""]
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
