"""How often SIDCo gathers its candidates twice, with and without the 3k floor on their plan.

    .venv/bin/python -m benchmarks.sidco_gathers          # ~30 s

When SIDCo's last stage is fitted on its candidates, the stage before it is fitted on the host
sample, and the candidates are gathered at its threshold.  On a heavy tail that fit can overshoot;
when the candidates then hold fewer than k, SIDCo asks its fits for 2k and gathers again: a second
select pass over the tensor.  ``sidco_host._GATHER_AT_LEAST`` (3) plans those candidates at 3k at
least; 0 turns the floor off (the plan's quarters then end where they happen to, 1.2-1.6k at CF
100 and 300).  This counts, per setting, the calls that gathered twice (``native.sidco_select``'s
``gathers``), the candidates' median share of the tensor and kept / k, over 40 steps of each
selector on Student's t and on captured gradients (the CPU host path, stages in C).
"""
from __future__ import annotations

import argparse
import statistics

import torch

import horovod_gravac.native as native
import horovod_gravac.selection.sidco as sidco
import horovod_gravac.selection.sidco_host as sidco_host
from benchmarks.compressors import make_input


def count(t: torch.Tensor, cf: float, distribution: str, floor: float, steps: int):
    """(share of calls gathering twice, median candidates / n, min kept / k, max kept / k)."""
    calls = []
    real = native.sidco_select

    def noting(*args, **kwargs):
        idx, val, done = real(*args, **kwargs)
        calls.append(done)
        return idx, val, done

    saved = sidco_host._GATHER_AT_LEAST
    native.sidco_select, sidco_host._GATHER_AT_LEAST = noting, floor
    try:
        sel = sidco.SIDCoSelector(cf, distribution)
        k = int(t.numel() / cf)
        kept = []
        for step in range(steps):
            sel.set_step(step, 0)
            kept.append(sel.select(t, k).numel() / k)
    finally:
        native.sidco_select, sidco_host._GATHER_AT_LEAST = real, saved
    twice = sum(1 for c in calls if c["gathers"] > 1) / len(calls)
    share = statistics.median(c["candidates"] for c in calls) / t.numel()
    return twice, share, min(kept), max(kept)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1048576,4194304")
    ap.add_argument("--cfs", default="100,300,1000")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if not native.available():
        print("the native kernels are not built: SIDCo does not take the CPU host path")
        return 1
    print(f"# SIDCo's candidate gathers over {args.steps} steps: floor 0 (none) against "
          f"{sidco_host._GATHER_AT_LEAST:g} (now)")
    print(f"{'input':<13} {'entries':>11} {'CF':>5} {'fit':<12} {'floor':>5} {'twice':>6} "
          f"{'cand/n':>7} {'kept/k':>10}")
    for n in (int(v) for v in args.sizes.split(",")):
        torch.manual_seed(0)   # (torch.distributions draws from the global generator)
        inputs = {f"student-t {df:g}": torch.distributions.StudentT(df).sample((n,)) for df in (1.5, 2.0, 3.0)}
        inputs["captured"] = make_input("real", n)
        for name, t in inputs.items():
            for cf in (float(c) for c in args.cfs.split(",")):
                for distribution in ("exponential", "gamma"):
                    for floor in (0.0, sidco_host._GATHER_AT_LEAST):
                        twice, share, lo, hi = count(t, cf, distribution, floor, args.steps)
                        print(f"{name:<13} {n:>11,} {cf:>5g} {distribution:<12} {floor:>5g} {twice:>6.0%} "
                              f"{share:>7.2%} {lo:.2f}-{hi:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
