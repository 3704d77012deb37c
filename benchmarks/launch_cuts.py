"""The three launch cuts of the H100 session, side by side with what they replaced, on any device.

    .venv/bin/python -m benchmarks.launch_cuts                      # CPU (the torch path: native kernels off)
    python -m benchmarks.launch_cuts --device cuda                  # on a GPU

1. RedSync's search: its steps run on the host from one sort of the candidates and one copy
   of five scalars (what accelerators run) against the steps one by one as tensor operations
   (what the CPU runs), on the torch path of RedSync's compress (native kernels switched off),
   interleaved.
2. The residual add of error feedback: one ``add_`` per parameter against one
   ``torch._foreach_add_`` (``error_feedback.add_into_slices``), over ResNet101's 314
   gradient tensors (42.5M entries).
3. Multi-level compression: ``compress_further`` of a 10x payload by 100 against a direct
   compress at 1000x, alone (not interleaved with other compressors).

Each figure is the median wall time of ``--repeats`` calls between device synchronisations.
"""
from __future__ import annotations

import argparse

import torch

from benchmarks.compressors import COMPRESSORS, make_input
from benchmarks.sample_order_stats import median_ms


def _timer(device):
    """``timed(fn, repeats)``: median ms of ``fn`` on ``device`` after two warm-up calls."""
    return lambda fn, repeats: median_ms(fn, device, repeats, warmup=2)


def redsync_search_paths(device, timed, repeats, sizes):
    import horovod_gravac.native as native
    import horovod_gravac.selection.redsync as R
    print("\n## 1. RedSync compress on the torch path: search on the host ('resolved') against step by step (ms)")
    print(f"{'entries':>11} {'CF':>5} {'resolved':>9} {'steps':>9} {'ratio':>7}")
    previous, real = native.use("off"), R._resolves
    try:
        for n in sizes:
            t = make_input("laplace", n, 0).to(device)
            for cf in (10, 100, 1000):
                comp = COMPRESSORS["redsync"](float(cf))
                ms = {}
                for mode in ("resolved", "steps", "resolved", "steps"):   # interleaved, best of both rounds
                    R._resolves = (lambda values: True) if mode == "resolved" else (lambda values: False)
                    ms[mode] = min(ms.get(mode, float("inf")), timed(lambda: comp.compress(t), repeats))
                print(f"{n:>11,} {cf:>5} {ms['resolved']:>9.2f} {ms['steps']:>9.2f} "
                      f"{ms['resolved'] / ms['steps']:>6.2f}x", flush=True)
    finally:
        R._resolves = real
        native.use(previous)


def residual_add(device, timed, repeats):
    from horovod_gravac.error_feedback import add_into_slices
    from horovod_gravac.harness.models import resnet101
    grads = [torch.randn_like(p, device=device) for p in resnet101(num_classes=10).parameters()]
    offsets, start = [], 0
    for g in grads:
        offsets.append((start, start + g.numel()))
        start += g.numel()
    buf = torch.zeros(start, device=device)

    def per_slice():
        for g, (a, b) in zip(grads, offsets):
            buf[a:b].add_(g.reshape(-1))

    ms = {}
    for name, fn in (("per_slice", per_slice), ("foreach", lambda: add_into_slices(buf, grads, offsets))) * 2:
        ms[name] = min(ms.get(name, float("inf")), timed(fn, repeats))
    print(f"\n## 2. Residual add over ResNet101's {len(grads)} gradients ({start:,} entries), ms")
    print(f"one add_ per parameter {ms['per_slice']:.2f}, one _foreach_add_ {ms['foreach']:.2f} "
          f"({ms['foreach'] / ms['per_slice']:.2f}x)", flush=True)


def further_vs_direct(device, timed, repeats, numel):
    print(f"\n## 3. compress_further (10x payload, by 100) against a direct 1000x compress, {numel:,} entries, ms")
    t = make_input("laplace", numel, 0).to(device)
    for name in ("topk", "dgc", "sidco-exp"):
        low, high = COMPRESSORS[name](10.0), COMPRESSORS[name](1000.0)
        payload, ctx = low.compress(t)
        direct = timed(lambda: high.compress(t), repeats)
        further = timed(lambda: low.compress_further(payload, ctx, 100.0), repeats)
        base = timed(lambda: low.compress(t), repeats)
        print(f"{name}: compress 10x {base:.3f}, direct 1000x {direct:.3f}, further x100 {further:.3f}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--sizes", default="1048576,6553600", help="entries of table 1")
    ap.add_argument("--numel", type=int, default=1_048_576, help="entries of table 3")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU, one thread"
    print(f"# launch cuts on {device} ({name}), torch {torch.__version__}; median of {args.repeats}")
    timed = _timer(device)
    redsync_search_paths(device, timed, args.repeats, [int(s) for s in args.sizes.split(",")])
    residual_add(device, timed, args.repeats)
    further_vs_direct(device, timed, args.repeats, args.numel)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
