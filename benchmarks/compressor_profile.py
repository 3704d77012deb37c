"""Where each compressor's ``compress`` spends its time: the operations it runs, from
``torch.profiler``, sorted by device time on a GPU (CPU time on the CPU).

    python -m benchmarks.compressor_profile --device cuda            # scripts/gpu_check.sh runs this
    .venv/bin/python -m benchmarks.compressor_profile --numel 1048576 --cfs 10

Why it exists: on an H200 exact Top-k cost 1.2-1.9 ms at every size from 262K to 25M entries
(16-30 streaming passes) although it runs only seven tensor operations a call, and RedSync at
CF 1000 3.8-5.4x Top-k; the sweep gives totals, this gives the operations behind them.
"""
from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.compressors import COMPRESSORS, make_input


def profile_compress(name: str, cf: float, t: torch.Tensor, repeats: int, rows: int) -> str:
    comp = COMPRESSORS[name](cf)
    for _ in range(3):   # warm-up: generators, caches
        comp.compress(t)
    cuda = t.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for _ in range(repeats):
            comp.compress(t)
        if cuda:
            torch.cuda.synchronize()
    key = "cuda_time_total" if cuda else "cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--numel", type=int, default=1_048_576)
    ap.add_argument("--cfs", default="10,1000")
    ap.add_argument("--compressors", default="topk,dgc,redsync,sidco-gamma")
    ap.add_argument("--repeats", type=int, default=5, help="calls profiled together")
    ap.add_argument("--rows", type=int, default=12)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    t = make_input("laplace", args.numel, 0).to(device)
    for name in args.compressors.split(","):
        for cf in (float(c) for c in args.cfs.split(",")):
            print(f"\n## {name} CF {cf:g}, {args.numel:,} entries on {device} ({args.repeats} calls)")
            print(profile_compress(name, cf, t, args.repeats, args.rows), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
