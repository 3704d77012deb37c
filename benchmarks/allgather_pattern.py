#!/usr/bin/env python3
"""Does the adaptive path's extra small broadcast change how fast a sparse payload's
allgather goes through?  A communication-only loop, run under the emulated network:

    python -m benchmarks.netem run --np 2 --rate 100mbit -- \\
        .venv/bin/python -m benchmarks.allgather_pattern

Each step does 60 ms of compute (matrix products, one thread), then one allgather of a
(k, 2) int32 buffer the size of the row LSTM's Top-k 10x payload (k = 80,128), as the
static path does.  "bcast" adds the adaptive path's 5-number float64 broadcast after it
(waited for before the next allgather); "header" also puts the 7 statistics-header rows
in front of the payload.  Rank 0 prints the median allgather time of each pattern, twice.
"""
import statistics
import time

import horovod.torch as hvd
import torch

K = 80128
PATTERNS = ("plain", "bcast", "header")


def compute(a: torch.Tensor, ms: float = 60.0) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < ms / 1000:
        a @ a


def run(pattern: str, a: torch.Tensor, iters: int = 30) -> float:
    times, pending = [], None
    for _ in range(iters):
        compute(a)
        if pending is not None:
            hvd.synchronize(pending)
            pending = None
        payload = torch.zeros(K + (7 if pattern == "header" else 0), 2, dtype=torch.int32)
        t = time.perf_counter()
        hvd.synchronize(hvd.allgather_async(payload, name=f"{pattern}.ag"))
        times.append(time.perf_counter() - t)
        if pattern != "plain":
            pending = hvd.broadcast_async(torch.zeros(5, dtype=torch.float64), 0, name=f"{pattern}.bc")
    if pending is not None:
        hvd.synchronize(pending)
    return 1000 * statistics.median(times[3:])


def main() -> None:
    hvd.init()
    torch.set_num_threads(1)
    a = torch.randn(512, 512)
    for rep in range(2):
        for pattern in PATTERNS:
            ms = run(pattern, a)
            if hvd.rank() == 0:
                print(f"{pattern:6s} round {rep}: median allgather {ms:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
