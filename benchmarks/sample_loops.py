"""The native host sample's two loops (``hg_abs_sample``): AVX-512 and portable, side by side.

    .venv/bin/python -m benchmarks.sample_loops          # ~15 s

Every host-path compressor draws a stratified sample of ``|x|`` first (``sampling.host_abs_sample``:
2048 entries for Top-k at bucket sizes, 8192 for SIDCo).  Its positions are double arithmetic
with a double-to-integer conversion per entry, and the reads are random.  The AVX-512 loop computes
eight positions a step and gathers them; the portable loop is the scalar code (what
``HOROVOD_GRAVAC_NATIVE=portable`` and CPUs without AVX-512 run).  Both give the same sample
(``tests/test_host_path.py``).  Each call gets a fresh random shift, as in use: with one shift
repeated, the same cache lines are read every time and the loads look free.  Thread CPU time,
median of 301, the two interleaved.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from horovod_gravac import native
from horovod_gravac.selection import sampling


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="262144,1048576,4194304,6553600,25000000")
    ap.add_argument("--samples", default="2048,8192")
    ap.add_argument("--repeats", type=int, default=301)
    args = ap.parse_args(argv)
    if not native.available():
        print("the native kernels are not built")
        return 1
    gen = torch.Generator().manual_seed(0)
    print(f"# the host sample's loops (thread CPU time, median of {args.repeats}, interleaved), "
          f"kernels {native.mode()}")
    print(f"{'entries':>11} {'sample':>7} {'auto us':>8} {'portable us':>12} {'auto/portable':>14}")
    before = native.use("auto")
    try:
        for n in (int(v) for v in args.sizes.split(",")):
            x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
            for s in (int(v) for v in args.samples.split(",")):
                times = {"auto": [], "portable": []}
                for _ in range(args.repeats):
                    for mode in times:
                        native.use(mode)
                        shift = float(torch.rand((), dtype=torch.float64, generator=gen))
                        t0 = time.thread_time()
                        native.abs_sample(x, s, shift, sampling._GOLDEN)
                        times[mode].append(time.thread_time() - t0)
                a, p = (statistics.median(times[m]) * 1e6 for m in ("auto", "portable"))
                print(f"{n:>11,} {s:>7} {a:>8.1f} {p:>12.1f} {a / p:>14.2f}", flush=True)
    finally:
        native.use(before)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
