"""What does compression cost on embedding-like buckets (fewer nonzeros than the CF's k)?

    python -m benchmarks.sparse_buckets                       # 6.5M entries, 2 % and 7 % of rows touched
    python -m benchmarks.sparse_buckets --numel 650000 --repeats 5   # a quick look

A dense-format embedding gradient (``nn.Embedding(sparse=False)``, as the harness's LSTM/PTB
and fastText models use) is nonzero only in the rows a batch touched: 700 tokens of a
10,000-word vocabulary touch 7 % of the rows.  At CF 10 (k = 10 % of the entries) such a
bucket has fewer nonzeros than k; the threshold compressors then send every nonzero (they
never send zeros) and exact Top-k fills k with zeros (``topk-nz``: ``send_zeros=False``, the
nonzeros alone).  The bucket is ``--numel`` entries in
rows of ``--width``, the touched rows of normal values.  Each compressor is timed alone (thread
CPU time, one thread, median of ``--repeats``), with the kept count over k and the selector's
``fallbacks`` (calls whose count left [k/2, 2k] and got the exact k largest: none should).

Current output: ``python -m benchmarks.sparse_buckets > benchmarks/results/sparse_buckets.txt``.
"""
from __future__ import annotations

import argparse
import time

import torch

from benchmarks.compressors import MALLOC_ENV, pin_malloc
from horovod_gravac.compressors import DGCCompressor, RedSyncCompressor, SIDCoCompressor, TopKCompressor

COMPRESSORS = {"topk": TopKCompressor, "topk-nz": lambda cf: TopKCompressor(cf, send_zeros=False),
               "dgc": DGCCompressor, "redsync": RedSyncCompressor, "sidco": SIDCoCompressor}


def embedding_like(numel: int, width: int, touched: float, seed: int) -> torch.Tensor:
    """A flat ``numel``-entry gradient of ``width``-wide rows, ``touched`` of them nonzero."""
    g = torch.Generator().manual_seed(seed)
    rows = numel // width
    x = torch.zeros(rows, width)
    hit = torch.randperm(rows, generator=g)[: max(1, int(touched * rows))]
    x[hit] = torch.randn(len(hit), width, generator=g)
    return x.view(-1)


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.thread_time_ns()
        fn()
        times.append(time.thread_time_ns() - start)
    times.sort()
    return times[len(times) // 2] / 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=6_500_000)
    ap.add_argument("--width", type=int, default=650, help="row width (the embedding's dimension)")
    ap.add_argument("--touched", default="0.02,0.07", help="fractions of rows nonzero")
    ap.add_argument("--cfs", default="10,100,1000")
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--malloc", choices=sorted(MALLOC_ENV), default="steady",
                    help="allocator state (as in benchmarks.compressors: 'steady' pins glibc's adaptive "
                         "thresholds, so that a call's fresh pages do not decide its time)")
    args = ap.parse_args(argv)
    if argv is None:
        pin_malloc("benchmarks.sparse_buckets", args.malloc)
    torch.set_num_threads(1)
    print(f"# embedding-like buckets: {args.numel:,} entries in rows of {args.width}; compress alone, "
          f"thread CPU time, median of {args.repeats}, malloc {args.malloc}")
    print(f"{'touched':>8} {'CF':>5} {'compressor':<10} {'ms':>8} {'x Top-k':>8} {'kept/k':>7} {'fallbacks':>9}")
    for touched in (float(v) for v in args.touched.split(",")):
        x = embedding_like(args.numel, args.width, touched, seed=0)
        for cf in (float(v) for v in args.cfs.split(",")):
            k = int(x.numel() / cf)
            base = None
            for name, cls in COMPRESSORS.items():
                comp = cls(cf)
                ms = median_ms(lambda: comp.compress(x), args.repeats)
                base = ms if base is None else base
                payload, _ = comp.compress(x)
                print(f"{touched:8.2f} {cf:5g} {name:<10} {ms:8.2f} {ms / base:8.2f} "
                      f"{payload.values.numel() / k:7.2f} {getattr(comp, 'fallbacks', '-'):>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
