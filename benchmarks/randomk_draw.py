"""Random-k's index draw: the counter-based hash against the NumPy PCG64 draw it replaced.

    python -m benchmarks.randomk_draw                  # CPU: native kernel, NumPy fallback, PCG64
    python -m benchmarks.randomk_draw --device cuda    # also the draw on the GPU, and PCG64 + upload

Until 2026-11-27 Random-k drew its k stratified indices with a NumPy PCG64 generator on the
host and uploaded them: strata of two widths (``numel % k != 0``, as for almost every bucket)
took NumPy's bounded draw with an array of bounds, 12-18 ns an index here, and on a GPU each
bucket's upload from pageable memory was a synchronising copy.  On an H100, Random-k at
CF 10 took 93 ms of a 135 ms ResNet101 step (``results/gpu_h100/call17_step_cost/``).  The
``pcg64`` column is that old draw, kept here as the reference (it is no longer in the
library).  Median of ``--repeats`` calls, wall time (synchronised on a GPU).
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from horovod_gravac import native
from horovod_gravac.cf import kept_count
from horovod_gravac.selection.randomk import _draw_key, stratified_draw

from .sample_order_stats import median_ms

# Sizes with both remainders (equal strata or strata of two widths).
SIZES = [1_048_576, 1_048_583, 6_553_600, 6_553_607, 25_000_003]


def resnet101_buckets() -> list:
    """The sizes of ResNet101's (CIFAR-10) buckets in the optimizer at the default
    ``bucket_cap_mb=25``: what one step draws from."""
    from horovod_gravac.harness.models import build_model
    from horovod_gravac.buckets import make_buckets
    model = build_model("resnet101", num_classes=10)
    return [b.numel for b in make_buckets(list(model.named_parameters()), 25 * 2 ** 20)]


def pcg64_draw(numel: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    """The draw Random-k used before: one PCG64 bounded integer per stratum."""
    size, extra = divmod(numel, k)
    if extra == 0:
        index = np.arange(0, numel, size, dtype=np.int32)
        index += rng.integers(0, size, size=k, dtype=np.int32)
    else:
        i = np.arange(k + 1, dtype=np.int64)
        starts = i * size + i * extra // k
        index = (starts[:-1] + rng.integers(0, np.diff(starts))).astype(np.int32, copy=False)
    return torch.from_numpy(index)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cfs", default="10,100,1000")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    rng = np.random.Generator(np.random.PCG64(1234))
    key = _draw_key(1234, 7, 0, 0)
    cols = ["native", "numpy", "pcg64"] + (["device", "pcg64+up"] if cuda else [])
    print(f"# Random-k draw, ms (median of {args.repeats}); native kernels: {native.mode()}"
          + (f"; {torch.cuda.get_device_name(0)}" if cuda else ""))
    print(f"{'entries':>11s} {'CF':>5s} " + " ".join(f"{c:>9s}" for c in cols) + "   pcg64 / current")
    buckets = resnet101_buckets()
    for numel in SIZES + ["step"]:
        for cf in (float(c) for c in args.cfs.split(",")):
            sizes = buckets if numel == "step" else [numel]
            draws = [(n, kept_count(n, cf)) for n in sizes]

            def ms(fn):   # all of the row's draws, once per timed call
                return median_ms(lambda: [fn(n, k) for n, k in draws], device, args.repeats, warmup=1)
            row = {}
            if native.available():
                row["native"] = ms(lambda n, k: stratified_draw(n, k, key))
            previous = native.use("off")
            try:
                row["numpy"] = ms(lambda n, k: stratified_draw(n, k, key))
            finally:
                native.use(previous)
            row["pcg64"] = ms(lambda n, k: pcg64_draw(n, k, rng))
            if cuda:
                row["device"] = ms(lambda n, k: stratified_draw(n, k, key, args.device))
                row["pcg64+up"] = ms(lambda n, k: pcg64_draw(n, k, rng).to(args.device))
            current = row["device"] if cuda else row.get("native", row["numpy"])
            label = f"{numel:>11,}" if numel != "step" else f"{'R101 step':>11s}"
            ratio = (row["pcg64+up"] if cuda else row["pcg64"]) / current
            print(f"{label} {cf:5g} " + " ".join(f"{row[c]:9.3f}" if c in row else f"{'-':>9s}" for c in cols)
                  + f"   {ratio:6.1f}x", flush=True)
    print(f"# 'R101 step': one draw per bucket of ResNet101 at bucket_cap_mb=25 ({len(buckets)} buckets, "
          f"{sum(buckets):,} entries; {sum(n % kept_count(n, 10) != 0 for n in buckets)} of them with strata "
          "of two widths at CF 10)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
