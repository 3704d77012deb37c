"""SIDCo off the CPU host path: fits on the host (``device_fits="host"``, the default) against
fits on the device (``"device"``), side by side on the same tensors.

    .venv/bin/python -m benchmarks.sidco_device_fits                  # the GPU's path, emulated on the CPU
    python -m benchmarks.sidco_device_fits --device cuda              # on a GPU (scripts/gpu_check.sh)

For each size, distribution and CF it prints, for both settings: the tensor operations per
``compress`` (each one a kernel launch on a GPU; counted with a dispatch counter), the copies
to the host, the median time of a call (thread CPU time on the CPU; wall time between
``torch.cuda.synchronize`` on a GPU) and the kept count over k.  On the CPU the selectors are
forced onto the path they take on accelerators (the native host path switched off, no
chunking), so the operation counts are exactly the GPU's; the times are only a proxy there:
a CPU runs a small operation in a few microseconds, a GPU launch costs about as much, but a
GPU runs the passes themselves far faster.
"""
from __future__ import annotations

import argparse
import statistics

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import horovod_gravac.selection.sidco_device as sidco_device
from benchmarks.compressors import DeviceClock, accelerator_path, make_input
from horovod_gravac.compressors import SIDCoCompressor


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", default="262144,1048576,6553600")
    ap.add_argument("--cfs", default="10,100,1000")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.set_num_threads(1)
    real_to_host = sidco_device._to_host
    copies = [0]

    def counting(t):
        copies[0] += 1
        return real_to_host(t)
    sidco_device._to_host = counting
    try:
        with accelerator_path(device):
            _run(args, device, cuda, copies)
    finally:
        sidco_device._to_host = real_to_host
    return 0


def _run(args, device, cuda, copies):
    clock = DeviceClock(device)

    print(f"# SIDCo device_fits on {device}{' (the accelerator path, emulated)' if not cuda else ''}, "
          f"torch {torch.__version__}; median of {args.repeats}")
    print(f"{'entries':>10} {'distribution':<12}{'CF':>5}  {'ops dev':>8} {'ops host':>8} {'copies':>6}  "
          f"{'ms dev':>8} {'ms host':>8} {'dev/host':>8}  {'q dev':>5} {'q host':>6}")
    for numel in (int(x) for x in args.sizes.split(",")):
        t = make_input("laplace", numel, 0).to(device)
        for dist in ("exponential", "gpareto", "gamma"):
            for cf in (float(c) for c in args.cfs.split(",")):
                res = {}
                comps = {f: SIDCoCompressor(cf, distribution=dist, device_fits=f) for f in ("device", "host")}
                for comp in comps.values():
                    comp.compress(t)   # warm-up
                for f, comp in comps.items():
                    with _OpCounter() as ops:
                        payload, _ = comp.compress(t)
                    copies[0] = 0
                    comp.compress(t)
                    res[f] = dict(ops=ops.n, copies=copies[0], q=payload.values.numel() * cf / numel, t=[])
                for _ in range(args.repeats):   # interleaved
                    for f, comp in comps.items():
                        clock(lambda: comp.compress(t))
                        res[f]["t"].append(clock.t)
                d, h = res["device"], res["host"]
                md, mh = statistics.median(d["t"]) * 1e3, statistics.median(h["t"]) * 1e3
                print(f"{numel:>10,} {dist:<12}{cf:>5g}  {d['ops']:>8} {h['ops']:>8} {h['copies']:>6}  "
                      f"{md:>8.2f} {mh:>8.2f} {md / mh:>7.1f}x  {d['q']:>5.2f} {h['q']:>6.2f}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
