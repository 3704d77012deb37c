"""Do the threshold compressors keep k at every CF GraVAC may pick, not only 10/100/1000?
Kept count over k, directly and multi-level.

    python -m benchmarks.quality_ladder                     # ~10 seconds
    python -m benchmarks.quality_ladder --sizes 1048576 --steps 4 --compressors sidco-exp

The size sweep (``benchmarks/compressors.py``) checks quality at CF 10, 100 and 1000 on Laplace
data.  GraVAC's ladders visit the CFs between them (10, 20, 40, 80, ... with the geometric
policy), and the optimizer compresses real gradients.  For each input (Laplace, normal, and
captured gradients: heavy-tailed, 17-22 % exact zeros), size and CF of ``--cfs``, each
compressor compresses the same tensor ``--steps`` times (``set_step`` before each, as the
optimizer does) and the row gives the smallest and largest kept / k.  A second table does the
same for multi-level compression, which GraVAC uses to try several CFs in one step: compress at
``--bases`` (10x, 20x), then ``compress_further`` by each of ``--factors`` (k counted from the
original size, as the optimizer does).  The target is [0.8, 1.25]; cells outside it are marked
with '!', and the last line counts them.

Current output: ``python -m benchmarks.quality_ladder > benchmarks/results/quality_ladder.txt``.
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.compressors import COMPRESSORS, INPUTS, QUALITY_RANGE as TARGET, THRESHOLD, make_input
from horovod_gravac.compressors import kept_count

ORDER = [name for name in COMPRESSORS if name in THRESHOLD]   # (THRESHOLD is a set)


def kept_over_k(name: str, tensor: torch.Tensor, cf: float, steps: int, factor: float = 1.0):
    """``(min, max)`` of kept / k over ``steps`` compressions of ``tensor`` at ``cf``, each then
    compressed ``factor`` further (multi-level, ``compress_further``) unless ``factor`` is 1."""
    comp = COMPRESSORS[name](cf)
    k = kept_count(tensor.numel(), cf * factor)
    ratios = []
    for step in range(steps):
        comp.set_step(step, 0)
        payload, ctx = comp.compress(tensor)
        if factor != 1.0:
            payload = comp.compress_further(payload, ctx, factor)
        ratios.append(payload.values.numel() / k)
    return min(ratios), max(ratios)


def table(title: str, rows, columns, steps: int) -> int:
    """Print one table of min-max kept / k; ``rows`` yields ``(label, [(lo, hi), ...])``.
    Returns how many cells lie outside the target."""
    print(f"# {title}: kept / k, min-max over {steps} steps; target [{TARGET[0]}, {TARGET[1]}], '!' outside it")
    print(f"{'input':<8} {'entries':>10} {'compressor':<14} " + " ".join(f"{c:>11}" for c in columns))
    outside = 0
    for label, cells in rows:
        text = []
        for lo, hi in cells:
            miss = not (TARGET[0] <= lo and hi <= TARGET[1])
            outside += miss
            text.append(f"{lo:.2f}-{hi:.2f}{'!' if miss else ' '}")
        print(label + " " + " ".join(f"{c:>11}" for c in text), flush=True)
    return outside


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--inputs", default=",".join(INPUTS))
    ap.add_argument("--sizes", default="262144,1048576,6553600")
    ap.add_argument("--cfs", default="10,20,30,50,100,200,300,500,1000")
    ap.add_argument("--compressors", default=",".join(ORDER))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--bases", default="10,20", help="multi-level table: the first level's CFs")
    ap.add_argument("--factors", default="2,4,5,10,20,50,100", help="multi-level table: further factors")
    ap.add_argument("--no-further", action="store_true", help="skip the multi-level table")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    names = args.compressors.split(",")
    for name in names:
        if name not in THRESHOLD:
            ap.error(f"unknown threshold compressor {name!r}; known: {', '.join(ORDER)}")
    cfs = [float(c) for c in args.cfs.split(",")]
    tensors = [(inp, n, make_input(inp, n, 0)) for inp in args.inputs.split(",")
               for n in (int(v) for v in args.sizes.split(","))]

    def direct():
        for inp, n, tensor in tensors:
            for name in names:
                yield (f"{inp:<8} {n:>10,} {name:<14}",
                       [kept_over_k(name, tensor, cf, args.steps) for cf in cfs])

    outside = table("direct", direct(), [f"CF {cf:g}" for cf in cfs], args.steps)
    if not args.no_further:
        factors = [float(f) for f in args.factors.split(",")]

        def further():
            for inp, n, tensor in tensors:
                for name in names:
                    for base in (float(b) for b in args.bases.split(",")):
                        yield (f"{inp:<8} {n:>10,} {name + '@' + format(base, 'g') + 'x':<14}",
                               [kept_over_k(name, tensor, base, args.steps, f) for f in factors])

        print()
        outside += table("multi-level (compress at the row's CF, then compress_further by the column's factor)",
                         further(), [f"x{f:g}" for f in factors], args.steps)
    print(f"# {outside} cell(s) outside [{TARGET[0]}, {TARGET[1]}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
