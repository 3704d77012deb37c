"""Kept count over k of the threshold compressors at every CF GraVAC may pick, not only 10/100/1000.

    python -m benchmarks.quality_ladder                     # ~10 seconds
    python -m benchmarks.quality_ladder --sizes 1048576 --steps 4 --compressors sidco-exp

The size sweep (``benchmarks/compressors.py``) checks quality at CF 10, 100 and 1000 on Laplace
data.  GraVAC's ladders visit the CFs between them (10, 20, 40, 80, ... with the geometric
policy), and the optimizer compresses real gradients.  For each input (Laplace, normal, and
captured gradients: heavy-tailed, 17-22 % exact zeros), size and CF of ``--cfs``, each
compressor compresses the same tensor ``--steps`` times (``set_step`` before each, as the
optimizer does) and the row gives the smallest and largest kept / k.  The target is
[0.8, 1.25]; rows outside it are marked, and the last line counts them.

Committed output: ``benchmarks/results/quality_ladder.txt``.
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.compressors import COMPRESSORS, QUALITY_RANGE as TARGET, THRESHOLD, make_input

ORDER = [name for name in COMPRESSORS if name in THRESHOLD]   # (THRESHOLD is a set)


def kept_over_k(name: str, tensor: torch.Tensor, cf: float, steps: int):
    """``(min, max)`` of kept / k over ``steps`` compressions of ``tensor``."""
    comp = COMPRESSORS[name](cf)
    k = max(1, int(tensor.numel() / cf))
    ratios = []
    for step in range(steps):
        comp.set_step(step, 0)
        payload, _ = comp.compress(tensor)
        ratios.append(payload.values.numel() / k)
    return min(ratios), max(ratios)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", default="laplace,normal,real")
    ap.add_argument("--sizes", default="262144,1048576,6553600")
    ap.add_argument("--cfs", default="10,20,30,50,100,200,300,500,1000")
    ap.add_argument("--compressors", default=",".join(ORDER))
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    names = args.compressors.split(",")
    for name in names:
        if name not in THRESHOLD:
            ap.error(f"unknown threshold compressor {name!r}; known: {', '.join(ORDER)}")
    cfs = [float(c) for c in args.cfs.split(",")]
    print(f"# kept / k, min-max over {args.steps} steps; target [{TARGET[0]}, {TARGET[1]}], '!' outside it")
    print(f"{'input':<8} {'entries':>10} {'compressor':<14} " + " ".join(f"{'CF ' + format(cf, 'g'):>11}" for cf in cfs))
    outside = 0
    for inp in args.inputs.split(","):
        for n in (int(s) for s in args.sizes.split(",")):
            tensor = make_input(inp, n, 0)
            for name in names:
                cells = []
                for cf in cfs:
                    lo, hi = kept_over_k(name, tensor, cf, args.steps)
                    miss = not (TARGET[0] <= lo and hi <= TARGET[1])
                    outside += miss
                    cells.append(f"{lo:.2f}-{hi:.2f}{'!' if miss else ' '}")
                print(f"{inp:<8} {n:>10,} {name:<14} " + " ".join(f"{c:>11}" for c in cells), flush=True)
    print(f"# {outside} cell(s) outside [{TARGET[0]}, {TARGET[1]}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
