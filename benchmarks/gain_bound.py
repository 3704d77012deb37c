#!/usr/bin/env python3
"""The highest CF that any selection can send while the paper's per-step gain stays >= eps.

The paper's gain of a step is ``||C(x)||^2 / ||x||^2`` on the error-fed gradient ``x``.  Among
all selections of ``k`` entries, whatever their split between layers, the ``k`` largest
magnitudes of the whole vector keep the most squared norm.  So the smallest ``k*`` whose
exact Top-k keeps ``eps`` of the norm is a floor for every selection at that gain: per-layer
(layer-wise) CFs, finer rungs, or any other compressor.  ``n / k*`` is a ceiling on the CF
that the per-step gain allows, and with the step-time model ``a + b / CF`` it bounds the
per-step speed-up over Top-k 10x.  A layer-wise rule that asks each layer for ``eps`` (rather
than the bucket) needs more than ``k*``: the sum of the layers' own ``k*_l``.

Not a timing benchmark.  It replays ``benchmarks/controller_study.py``'s two heavy workloads
(the 1D CNN and the row LSTM on digits, 2 workers simulated in one process, each with its own
error-feedback residual) trained with static Top-k 10x, and every ``--every`` steps reads each
worker's error-fed gradient before it is compressed.

    python -m benchmarks.gain_bound     # ~8 minutes on 2 cores; committed as results/gain_bound.txt
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Dict, List, Optional, Sequence

import torch

from benchmarks.controller_study import WORKERS, WORKLOADS, Batches, _top, flat_gradient, set_gradients, setup

EPSILONS = (0.5, 0.7, 0.9)
RUNGS = (10, 20, 40, 100, 1000)


def floor_counts(x: torch.Tensor, epsilons) -> List[int]:
    """For each eps, the fewest entries of ``x`` that keep ``eps`` of its squared norm (the
    largest ones): one sort for all of them."""
    sq = (x.double() ** 2).sort(descending=True).values
    cum = sq.cumsum(0)
    total = float(cum[-1])
    if total <= 0.0:
        return [1 for _ in epsilons]
    wanted = torch.tensor([eps * total for eps in epsilons], dtype=torch.float64)
    return [int(j) + 1 for j in torch.searchsorted(cum, wanted)]


def floor_count(x: torch.Tensor, eps: float) -> int:
    """Fewest entries of ``x`` that keep ``eps`` of its squared norm (the largest ones)."""
    return floor_counts(x, [eps])[0]


def rung_gain(x: torch.Tensor, cf: float) -> float:
    sq = x.double() ** 2
    total = float(sq.sum())
    k = max(1, int(x.numel() / cf))
    return float(sq.topk(k).values.sum()) / total if total > 0 else 1.0


def measure(workload: str, seed: int, steps: int, every: int) -> List[Dict]:
    """One Top-k 10x training run; per probe step and worker, the bounds on its error-fed gradient."""
    data, model, opt = setup(workload, seed)
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    n = sum(sizes)
    residual = [torch.zeros(n) for _ in range(WORKERS)]
    batches = Batches(data, seed)
    rows = []
    for step in range(1, steps + 1):
        update = torch.zeros(n)
        for r in range(WORKERS):
            acc = residual[r] + flat_gradient(model, params, batches.next())
            if step % every == 0:
                row = {"step": step, "worker": r}
                bucket = floor_counts(acc, EPSILONS)
                # every layer held to eps on its own: the sum of the layers' floors
                layers = [sum(c) for c in zip(*(floor_counts(part, EPSILONS)
                                                for part in acc.split(sizes) if part.numel()))]
                for eps, fb, fl in zip(EPSILONS, bucket, layers):
                    row[f"cf_bucket@{eps}"] = n / fb
                    row[f"cf_layers@{eps}"] = n / fl
                for cf in RUNGS:
                    row[f"gain@{cf}"] = rung_gain(acc, cf)
                rows.append(row)
            sent = _top(acc, 10.0)
            residual[r] = acc - sent
            update += sent / WORKERS
        set_gradients(params, update)
        opt.step()
    return rows


def oracle_ms(cf_star: float, cost, theta_min: float = 10.0, theta_max: float = 1000.0,
              fallback: bool = True) -> float:
    """Modelled step time of a rule that sends, every step, the highest CF in
    ``[theta_min, theta_max]`` whose per-step gain passes eps (``cf_star``).  Where even
    ``theta_min`` does not pass, it falls back to dense (``fallback``, as GraVAC does) or sends
    ``theta_min`` anyway."""
    a, b, dense = cost
    if cf_star < theta_min:
        return dense if fallback else a + b / theta_min
    return a + b / min(cf_star, theta_max)


def report(workload: str, rows: Sequence[Dict], steps: int) -> str:
    cost = WORKLOADS[workload]["cost"]
    a, b, _ = cost
    tenx = a + b / 10.0
    out = [f"{workload} ({sum(1 for _ in rows)} probes; step-time model {a:g} + {b:g}/CF ms, "
           f"Top-k 10x {tenx:.0f} ms of which {b / 10 / tenx:.0%} scales with 1/CF)"]
    thirds = [(1, steps // 3), (steps // 3 + 1, 2 * steps // 3), (2 * steps // 3 + 1, steps)]
    out.append("  steps        " + "  ".join(f"gain@{cf:<4d}" for cf in RUNGS)
               + "  " + "  ".join(f"CF*@{eps} bucket/layers  speed-up d/10" for eps in EPSILONS))
    for lo, hi in [*thirds, (1, steps)]:
        part = [r for r in rows if lo <= r["step"] <= hi]
        if not part:
            continue
        cells = [f"{statistics.median(r[f'gain@{cf}'] for r in part):9.2f}" for cf in RUNGS]
        for eps in EPSILONS:
            cb = statistics.median(r[f"cf_bucket@{eps}"] for r in part)
            cl = statistics.median(r[f"cf_layers@{eps}"] for r in part)
            oracle = statistics.mean(oracle_ms(r[f"cf_bucket@{eps}"], cost) for r in part)
            floored = statistics.mean(oracle_ms(r[f"cf_bucket@{eps}"], cost, fallback=False) for r in part)
            cells.append(f"{cb:8.1f} / {cl:6.1f}  {tenx / oracle:5.2f}x / {tenx / floored:4.2f}x")
        out.append(f"  {lo:4d}-{hi:<4d}  " + "  ".join(cells))
    return "\n".join(out)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--seeds", default="42,1,2")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--rows", help="also write every probe as a JSON line to this file")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--every", type=int, default=10)
    args = p.parse_args(argv)
    seeds = [int(v) for v in args.seeds.split(",")]
    workloads = args.workloads.split(",")
    print(f"# per-step gain bounds, Top-k 10x training, seeds {args.seeds}, {args.steps} steps, "
          f"{WORKERS} workers, probe every {args.every} steps; medians over probes, workers and seeds")
    print("# gain@CF: the paper's gain of exact Top-k at that CF; CF*@eps: n / (fewest entries keeping eps"
          " of the squared norm), for the bucket as a whole / with every layer held to eps;"
          " speed-up: the model's Top-k 10x step over the mean step of a rule that sends the bucket's"
          " CF* every step, within 10-1000x, where CF* < 10 dense (d: an oracle that holds every"
          " step's gain at eps) or 10x (10: one that never sends more than CF* above 10x)")
    jobs = [(w, seed, args.steps, args.every) for w in workloads for seed in seeds]
    with ProcessPoolExecutor(args.jobs) as ex:
        runs = list(ex.map(_measure, jobs))
    if args.rows:
        with open(args.rows, "w") as f:
            for (w, seed, *_), part in zip(jobs, runs):
                for r in part:
                    f.write(json.dumps({"workload": w, "seed": seed, **r}) + "\n")
    for workload in workloads:
        rows = [r for (w, *_), part in zip(jobs, runs) if w == workload for r in part]
        print(report(workload, rows, args.steps))
    return 0


def _measure(job) -> List[Dict]:
    return measure(*job)


if __name__ == "__main__":
    sys.exit(main())
