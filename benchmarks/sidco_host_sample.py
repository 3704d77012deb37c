"""SIDCo's CPU host path with its earlier 16384-entry sample against the current 8192, side by side.

    .venv/bin/python -m benchmarks.sidco_host_sample            # ~3 minutes

The host path's sample size and the fit thresholds that go with it are module constants of
``horovod_gravac.selection.sidco``; this sets each configuration in turn, call by call, so both
are timed interleaved with exact Top-k on the same tensor (thread CPU time, median of
``--repeats``), and reports each as a ratio to Top-k.  Quality (kept / k) is taken over
``--seeds`` sample seeds for the exponential, generalised Pareto and gamma fits on Laplace,
normal and real (captured CNN+LSTM) gradients.

``earlier``: sample 16384, a stage fitted on the sample from 500 sampled entries of its input,
the deep stage from 200, CF 10 refined on the sample from 1000 kept sampled entries.
``current``: the module's values (8192, 400, 100, 800).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import horovod_gravac.selection.sidco as sidco
import horovod_gravac.selection.sidco_host as sidco_host
from benchmarks.compressors import INPUTS, make_input
from horovod_gravac.selection.topk import TopKSelector

_KNOBS = ("_HOST_SAMPLE", "_SAMPLE_FIT_MIN", "_SAMPLE_DEEP_MIN", "_SAMPLE_REFINE_HITS")
EARLIER = (1 << 14, 500, 200, 1000)


def configurations() -> dict:
    return {"earlier": EARLIER, "current": tuple(getattr(sidco_host, name) for name in _KNOBS)}


def _use(values) -> None:
    for name, value in zip(_KNOBS, values):
        setattr(sidco_host, name, value)


def timed_ratios(n: int, cf: float, repeats: int) -> dict:
    """Median time of SIDCo exponential under each configuration, as a ratio to exact Top-k's,
    every repeat running each configuration and Top-k once, in turn."""
    configs = configurations()
    t = make_input("laplace", n, 0)
    k = int(n / cf)
    selectors = {name: sidco.SIDCoSelector(cf=cf) for name in configs}
    topk = TopKSelector(cf=cf)
    times = {name: [] for name in list(configs) + ["topk"]}
    try:
        for r in range(repeats):
            for name, values in configs.items():
                _use(values)
                selectors[name].set_step(r)
                t0 = time.thread_time()
                selectors[name].select(t, k)
                times[name].append(time.thread_time() - t0)
            t0 = time.thread_time()
            topk.select(t, k)
            times["topk"].append(time.thread_time() - t0)
    finally:
        _use(configs["current"])
    ref = statistics.median(times["topk"])
    return {name: statistics.median(times[name]) / ref for name in configs}


def quality_range(inp: str, n: int, cf: float, seeds: int) -> dict:
    """(min, max) of kept / k over the three fits and ``seeds`` sample seeds, per configuration."""
    configs = configurations()
    t = make_input(inp, n, 0)
    k = int(n / cf)
    out = {}
    try:
        for name, values in configs.items():
            _use(values)
            q = []
            for dist in ("exponential", "gpareto", "gamma"):
                sel = sidco.SIDCoSelector(cf=cf, distribution=dist)
                for seed in range(seeds):
                    sel.set_step(seed)
                    q.append(sel.select(t, k).numel() / k)
            out[name] = (min(q), max(q))
    finally:
        _use(configs["current"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="262144,1048576,4194304,6553600")
    ap.add_argument("--cfs", default="10,100,1000")
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--seeds", type=int, default=12)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    configs = configurations()
    sizes = [int(s) for s in args.sizes.split(",")]
    cfs = [float(c) for c in args.cfs.split(",")]
    print(f"# SIDCo host sample: earlier {configs['earlier']} against current {configs['current']} "
          f"({', '.join(_KNOBS)})")
    print(f"## SIDCo exponential / exact Top-k, interleaved, median of {args.repeats}")
    print(f"{'entries':>11} {'CF':>5} {'earlier':>8} {'current':>8}")
    for n in sizes:
        for cf in cfs:
            r = timed_ratios(n, cf, args.repeats)
            print(f"{n:>11,} {cf:>5g} {r['earlier']:>7.2f}x {r['current']:>7.2f}x", flush=True)
    print(f"## kept / k over exponential, gpareto and gamma, {args.seeds} seeds each")
    print(f"{'input':>7} {'entries':>11} {'CF':>5} {'earlier':>11} {'current':>11}")
    lows = {name: 1.0 for name in configs}
    highs = {name: 1.0 for name in configs}
    for inp in INPUTS:
        for n in sizes:
            for cf in cfs:
                q = quality_range(inp, n, cf, args.seeds)
                for name, (lo, hi) in q.items():
                    lows[name], highs[name] = min(lows[name], lo), max(highs[name], hi)
                print(f"{inp:>7} {n:>11,} {cf:>5g} {q['earlier'][0]:>5.2f}-{q['earlier'][1]:<5.2f} "
                      f"{q['current'][0]:>5.2f}-{q['current'][1]:<5.2f}", flush=True)
    print("# quality over everything: " + ", ".join(f"{name} {lows[name]:.2f}-{highs[name]:.2f}" for name in configs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
