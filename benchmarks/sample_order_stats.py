"""The order statistics the threshold selectors read off their samples, on the device:
``kthvalue`` per rank (what the accelerator path ran up to this benchmark) against one
``sort`` and indexing (what it runs now, ``sampling.sample_rank_values``), and ``topk``.

    python -m benchmarks.sample_order_stats --device cuda      # scripts/gpu_check.sh runs this
    .venv/bin/python -m benchmarks.sample_order_stats          # CPU: kthvalue is the faster there

Sample sizes are those the selectors draw: DGC/RedSync ``max(1 % n, 400 cf)`` (4096 to
409,600), Top-k 131,072.  Each figure is the median wall time of ``--repeats`` calls
between device synchronisations, for two ranks read (Top-k and RedSync read two).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def median_ms(fn, device, repeats, warmup=3):
    """Median wall time of ``fn()`` in ms over ``repeats`` calls after ``warmup`` calls; on a
    GPU each call is timed between two synchronizations (its kernels, not their launch)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", default="4096,10486,65536,131072,409600")
    ap.add_argument("--repeats", type=int, default=25)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"# order statistics of a sample on {device} ({name}), torch {torch.__version__}; "
          f"median of {args.repeats}, ms for two ranks")
    print(f"{'sample':>9} {'2x kthvalue':>12} {'sort + 2 idx':>13} {'topk(r) + min':>14} {'kth/sort':>9}")
    g = torch.Generator(device=device).manual_seed(0)
    for s in (int(x) for x in args.sizes.split(",")):
        x = torch.rand(s, generator=g, device=device)
        r1, r2 = max(1, s // 100), max(1, s // 80)
        kth = median_ms(lambda: [torch.kthvalue(x, s - r + 1).values for r in (r1, r2)], device, args.repeats)
        srt = median_ms(lambda: (lambda o: [o[s - r1], o[s - r2]])(torch.sort(x).values), device, args.repeats)
        top = median_ms(lambda: torch.topk(x, r2, sorted=False).values.min(), device, args.repeats)
        print(f"{s:>9,} {kth:>12.3f} {srt:>13.3f} {top:>14.3f} {kth / srt:>8.1f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
