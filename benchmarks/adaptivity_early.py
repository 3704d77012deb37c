#!/usr/bin/env python3
"""What the adaptive runs of ``benchmarks.adaptivity`` sent early in training, and what it cost.

For each seed directory, workload, rate and configuration: the steps sent at each CF (1 is
dense), the median step period at each CF in ms, the training seconds of the first
``--steps`` steps and of the whole run (``adaptivity.step_periods``, as the TTA counts them:
evaluations left out).
It reads the runs' ``steps.jsonl``, so it needs the ``runs/`` folders of a local benchmark
run (they are not committed)::

    python -m benchmarks.adaptivity_early --dirs benchmarks/results/adaptivity_split_seed42,... \\
        --labels 42,... --workloads cnn1d-digits,rowlstm-digits \\
        --configs gravac-ladder-exp-topk-eps0.7,gravac-ladder-exp-topk-eps0.7-split --steps 60

A missing run is reported, and makes the exit status 1.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict

from benchmarks.adaptivity import load_run, step_periods


def summarise(run_: dict, first: int) -> str:
    """One line for a finished run (as ``load_run`` returns it)."""
    seconds = step_periods(run_)
    by_cf = defaultdict(list)
    for s, t in zip(run_["steps"], seconds):
        by_cf[s["cf"]].append(t)
    sent = ", ".join(f"{cf:g}x {len(ts)} ({1000 * statistics.median(ts):.0f} ms)"
                     for cf, ts in sorted(by_cf.items()))
    return (f"first {first}: {sum(seconds[:first]):6.1f} s | all {len(seconds)}: {sum(seconds):6.1f} s"
            f" | {sent}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dirs", required=True, help="comma-separated benchmarks.adaptivity --out folders")
    p.add_argument("--labels", required=True, help="one label per folder (the seed)")
    p.add_argument("--workloads", required=True)
    p.add_argument("--rates", default="100mbit,1gbit")
    p.add_argument("--configs", required=True)
    p.add_argument("--steps", type=int, default=60, help="the early phase, in steps (default 60)")
    args = p.parse_args(argv)
    dirs, labels = args.dirs.split(","), args.labels.split(",")
    if len(dirs) != len(labels):
        p.error("--dirs and --labels differ in length")
    missing = 0
    for w in args.workloads.split(","):
        for rate in args.rates.split(","):
            print(f"## {w} at {rate}")
            for d, label in zip(dirs, labels):
                for c in args.configs.split(","):
                    run_dir = os.path.join(d, "runs", w, rate, c)
                    run_ = load_run(run_dir)
                    if run_ is not None:
                        print(f"seed {label:>3} {c}: {summarise(run_, args.steps)}")
                    else:
                        print(f"seed {label:>3} {c}: no finished run in {run_dir}")
                        missing += 1
            print()
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
