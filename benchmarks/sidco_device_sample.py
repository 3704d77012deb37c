"""SIDCo's host fits off the CPU (``device_fits="host"``, a GPU's path): the earlier stage-1 sample
and candidate limit (16384 and 65536) against the current ones, side by side with exact Top-k.

    python -m benchmarks.sidco_device_sample --device cuda      # on a GPU (scripts/gpu_check.sh)
    .venv/bin/python -m benchmarks.sidco_device_sample          # the GPU's path, emulated on the CPU

On a GPU, SIDCo copies its stage-1 sample to the host, fits there, gathers the candidates on the
device and copies them (every stride-th beyond the candidate limit) to the host for the
candidate phase's fits and counts.  The sample and the limit are module constants of
``horovod_gravac.selection.sidco`` (``_HOST_SAMPLE``, ``_DEVICE_CANDIDATE_FITS``); this sets each
configuration in turn, call by call, interleaved with exact Top-k on the same tensor, and prints
each one's median select time as a ratio to Top-k's (wall time between
``torch.cuda.synchronize`` on a GPU; thread CPU time on the CPU, where the numbers are only a
smoke test: the selectors are forced onto the accelerators' path there), with the kept count
over k across the repeats' sample seeds.
"""
from __future__ import annotations

import argparse
import statistics

import torch

import horovod_gravac.selection.sidco as sidco
import horovod_gravac.selection.sidco_host as sidco_host
from benchmarks.compressors import DeviceClock, accelerator_path, make_input
from horovod_gravac.selection.topk import TopKSelector

_KNOBS = ("_HOST_SAMPLE", "_DEVICE_CANDIDATE_FITS")
EARLIER = (1 << 14, 1 << 16)


def configurations() -> dict:
    return {"earlier": EARLIER, "current": tuple(getattr(sidco_host, name) for name in _KNOBS)}


def _use(values) -> None:
    for name, value in zip(_KNOBS, values):
        setattr(sidco_host, name, value)


def compare(t: torch.Tensor, cf: float, distribution: str, repeats: int, clock: DeviceClock) -> dict:
    """Per configuration: (median select time / Top-k's, min kept / k, max kept / k); and
    ``"topk_ms"``: Top-k's median."""
    configs = configurations()
    n = t.numel()
    k = int(n / cf)
    selectors = {name: sidco.SIDCoSelector(cf=cf, distribution=distribution) for name in configs}
    topk = TopKSelector(cf=cf)
    times = {name: [] for name in list(configs) + ["topk"]}
    kept = {name: [] for name in configs}
    try:
        for r in range(repeats + 1):   # the first round warms up and is not timed
            for name, values in configs.items():
                _use(values)
                selectors[name].set_step(r)
                idx = clock(lambda: selectors[name].select(t, k))
                if r:
                    times[name].append(clock.t)
                    kept[name].append(idx.numel() / k)
            clock(lambda: topk.select(t, k))
            if r:
                times["topk"].append(clock.t)
    finally:
        _use(configs["current"])
    ref = statistics.median(times["topk"])
    out = {name: (statistics.median(times[name]) / ref, min(kept[name]), max(kept[name])) for name in configs}
    out["topk_ms"] = ref * 1e3
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", default="262144,1048576,4194304,6553600,25000000")
    ap.add_argument("--cfs", default="10,100,1000")
    ap.add_argument("--distributions", default="exponential,gamma")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.set_num_threads(1)
    clock = DeviceClock(device)
    configs = configurations()
    with accelerator_path(device):
        print(f"# SIDCo host fits on {device}{' (the accelerator path, emulated)' if not cuda else ''}, "
              f"torch {torch.__version__}: earlier {configs['earlier']} against current {configs['current']} "
              f"({', '.join(_KNOBS)}); select time / exact Top-k's, median of {args.repeats}, "
              f"interleaved; q = kept / k over the repeats")
        print(f"{'entries':>11} {'CF':>5} {'distribution':<12} {'earlier':>8} {'q':>9}  {'current':>8} {'q':>9}  "
              f"{'Top-k ms':>8}")
        for n in (int(x) for x in args.sizes.split(",")):
            t = make_input("laplace", n, 0).to(device)
            for cf in (float(c) for c in args.cfs.split(",")):
                for dist in args.distributions.split(","):
                    r = compare(t, cf, dist, args.repeats, clock)
                    cells = "  ".join(f"{r[c][0]:>7.2f}x {r[c][1]:>4.2f}-{r[c][2]:<4.2f}" for c in configs)
                    print(f"{n:>11,} {cf:>5g} {dist:<12} {cells}  {r['topk_ms']:>8.3f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
