"""The native select pass's two vector loops, timed against each other over densities.

    .venv/bin/python -m benchmarks.select_loops          # ~1 minute

``hg_select`` (``_native/kernels.c``) has two equivalent AVX-512 loops: one stores the
compacted survivors of every 16 entries unconditionally (``dense``), the other tests the mask
first and skips the stores of blocks without survivors (``branchy``).  The caller's expected
density picks one.  The test's branch is mispredicted about as often as a block holds a
survivor, so the branchy loop only wins while blocks with survivors are rare.  This times both
on Laplace data at thresholds that keep 0.1-5 % of the tensor (thread CPU time, median of 41,
interleaved), which is where the switch-over density in ``hg_select`` comes from, and the loop
``hg_select`` picks for the true density against the faster of the two.  On CPUs
without AVX-512 it prints what the AVX2 loop pair does instead (``--native avx2`` times that pair
on a CPU with AVX-512 too: ``select_loops_avx2_cpu.txt``).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from benchmarks.compressors import make_input
from horovod_gravac import native

DENSITIES = (0.001, 0.002, 0.003, 0.004, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="262144,1048576,6553600,25000000")
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--native", choices=["auto", "avx2"], default="auto",
                    help="auto: the best loops this CPU has; avx2: the AVX2 pair (x86 without AVX-512)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if not native.available():
        print("the native kernels are not built")
        return 1
    before = native.use(args.native)   # (put back at the end: tests call main in their process)
    try:
        _time_loops(args)
    finally:
        native.use(before)
    return 0


def _time_loops(args) -> None:
    print(f"# the select pass's two loops (thread CPU time, median of {args.repeats}, interleaved), "
          f"Laplace input, kernels {native.mode()}")
    print(f"{'entries':>11} {'density':>8} {'branchy ms':>11} {'dense ms':>9} {'dense/branchy':>14} "
          f"{'chosen/the faster':>17}")
    for n in (int(s) for s in args.sizes.split(",")):
        x = make_input("laplace", n).numpy()
        ranked = np.sort(np.abs(x))[::-1]
        for density in DENSITIES:
            threshold = float(ranked[int(density * n)])
            cap = int(density * n * 1.5) + 64
            times = {"branchy": [], "dense": [], "chosen": []}
            for _ in range(args.repeats):
                # the expected density passed in is what picks the loop (a hint: results are equal);
                # "chosen": the true density passed, the loop hg_select picks for it
                for loop, hint in (("branchy", 1e-6), ("dense", 0.5), ("chosen", density)):
                    t0 = time.thread_time()
                    native.select_into(x, threshold, False, cap, hint * n)
                    times[loop].append(time.thread_time() - t0)
            b, d, c = (statistics.median(times[k]) * 1e3 for k in ("branchy", "dense", "chosen"))
            print(f"{n:>11,} {density:>8.3f} {b:>11.3f} {d:>9.3f} {d / b:>14.2f} {c / min(b, d):>17.2f}",
                  flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
