"""Where SIDCo's time goes on the CPU, next to exact Top-k's, at the optimizer's bucket sizes.

    .venv/bin/python -m benchmarks.sidco_cost                  # ~1 minute
    .venv/bin/python -m benchmarks.sidco_cost --sizes 1048576 --cfs 1000

Issue #17 asks the threshold compressors to cost no more than exact Top-k from 1M entries up.
SIDCo misses that at CF 100 and 1000 below ~4M entries (``compressors_sweep.txt``).  This
splits one ``compress`` of each into the parts its host path is made of, by timing the native
calls it makes (thread CPU time, summed per call, median over ``--repeats`` calls):

* ``sample``: the stratified host sample (``sampling.host_abs_sample``): 16384 entries for
  SIDCo, Top-k's ``(k n)^(1/3)`` (2048 at these sizes) for Top-k;
* ``select``: the native select passes (``native.select``): the gather of the candidates over
  the whole tensor, and SIDCo's final pick among them;
* ``fits``: SIDCo's fits and counts (``native.MomentsOf``: about ten passes over its sample and
  its candidates) and Top-k's exact drop of its surplus candidates (``native.drop_smallest``);
* ``staged``: SIDCo's stages in C (``native.sidco_select``, the default since 2026-11-27): its
  select passes, fits, counts and the Python-free work between them in one native call;
* ``rest``: everything else: Python between those calls (with ``--stages python``: the stage
  plan, the fitted thresholds, the refinement's secant steps), NumPy's copies of the candidates
  (the strided subsample the candidate phase fits on, the gather of the kept ones' indices) and
  the torch wrapping of the result.

``--stages both`` (the default) times each SIDCo variant twice, as ``sidco-exp`` (stages in C) and
``sidco-exp:py`` (``sidco._NATIVE_STAGES`` off: the same selection by ``sidco_host.HostStages`` in
Python with the native passes), so that one run shows what the C stage loop saves.

The select pass is the same work for both; what SIDCo adds is its definition: a sample large
enough to fit a distribution in three stages (at least 500 sampled entries above each stage's
base) and a fit and count per stage and refinement round.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import horovod_gravac.native as native
import horovod_gravac.selection.sidco as sidco_mod
import horovod_gravac.selection.topk as topk_mod
from benchmarks.compressors import COMPRESSORS, INPUTS, make_input

PARTS = ("sample", "select", "fits", "staged", "rest")


class _Clock:
    """Thread CPU time spent inside wrapped functions, per part, for the current call."""

    def __init__(self):
        self.spent = dict.fromkeys(PARTS[:-1], 0.0)

    def wrap(self, fn, part):
        def timed(*args, **kwargs):
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[part] += time.thread_time() - t0
        return timed


class _TimedMoments:
    """``native.MomentsOf`` with its set-up and its passes (fits and counts) timed as "fits"."""

    def __init__(self, clock, real):
        self._make = clock.wrap(real, "fits")
        self._clock = clock

    def __call__(self, x):
        return _TimedPasses(self._clock, self._make(x))


class _TimedPasses:
    def __init__(self, clock, inner):
        self._moments = clock.wrap(inner, "fits")
        self.count_at_least = clock.wrap(inner.count_at_least, "fits")

    def __call__(self, *args):
        return self._moments(*args)


def breakdown(name: str, tensor: torch.Tensor, cf: float, repeats: int) -> dict:
    """Median ms per part (and ``total``) of ``compress`` for compressor ``name`` (``name:py``:
    SIDCo with its stages in Python)."""
    name, _, variant = name.partition(":")
    clock = _Clock()
    saved = (native.select, native.drop_smallest, native.MomentsOf, sidco_mod.host_abs_sample,
             topk_mod.host_abs_sample, native.sidco_select, sidco_mod._NATIVE_STAGES)
    sidco_mod._NATIVE_STAGES = variant != "py"
    native.sidco_select = clock.wrap(saved[5], "staged")
    native.select = clock.wrap(native.select, "select")
    native.drop_smallest = clock.wrap(native.drop_smallest, "fits")
    native.MomentsOf = _TimedMoments(clock, saved[2])
    sidco_mod.host_abs_sample = clock.wrap(saved[3], "sample")
    topk_mod.host_abs_sample = clock.wrap(saved[4], "sample")
    try:
        comp = COMPRESSORS[name](float(cf))
        for _ in range(3):
            comp.compress(tensor)
        rows = []
        for _ in range(repeats):
            clock.spent = dict.fromkeys(PARTS[:-1], 0.0)
            t0 = time.thread_time()
            comp.compress(tensor)
            total = time.thread_time() - t0
            row = dict(clock.spent, total=total)
            row["rest"] = total - sum(clock.spent.values())
            rows.append(row)
    finally:
        (native.select, native.drop_smallest, native.MomentsOf, sidco_mod.host_abs_sample,
         topk_mod.host_abs_sample, native.sidco_select, sidco_mod._NATIVE_STAGES) = saved
    return {key: statistics.median(r[key] for r in rows) * 1e3 for key in PARTS + ("total",)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="262144,1048576,4194304,6553600")
    ap.add_argument("--cfs", default="10,100,1000")
    ap.add_argument("--compressors", default="sidco-exp,sidco-gamma")
    ap.add_argument("--repeats", type=int, default=101)
    ap.add_argument("--input", default="laplace", choices=INPUTS,
                    help="the tensor (benchmarks.compressors.make_input; 'real': captured gradients, 22 %% zeros)")
    ap.add_argument("--stages", default="both", choices=("native", "python", "both"),
                    help="SIDCo's stage loop in C (the default path), in Python, or each in turn")
    args = ap.parse_args(argv)
    variants = {"native": [""], "python": [":py"], "both": ["", ":py"]}[args.stages]
    names = [name + v for name in args.compressors.split(",") for v in variants]
    torch.set_num_threads(1)
    if not native.available():
        print("the native kernels are not built: SIDCo and Top-k run their NumPy code, not the host path")
        return 1
    print(f"# SIDCo's cost on the CPU, split by part (thread CPU time, median of {args.repeats}), "
          f"{args.input} input, torch {torch.__version__}, kernels {native.mode()}")
    print(f"{'entries':>11} {'CF':>5} {'compressor':<15} {'total':>7} {'sample':>7} {'select':>7} "
          f"{'fits':>7} {'staged':>7} {'rest':>7} {'/Top-k':>7}")
    for n in (int(s) for s in args.sizes.split(",")):
        t = make_input(args.input, n, 0)
        for cf in (float(c) for c in args.cfs.split(",")):
            ref = breakdown("topk", t, cf, args.repeats)
            for name in ["topk"] + names:
                ms = ref if name == "topk" else breakdown(name, t, cf, args.repeats)
                print(f"{n:>11,} {cf:>5g} {name:<15} {ms['total']:>7.3f} {ms['sample']:>7.3f} "
                      f"{ms['select']:>7.3f} {ms['fits']:>7.3f} {ms['staged']:>7.3f} {ms['rest']:>7.3f} "
                      f"{ms['total'] / ref['total']:>6.2f}x", flush=True)
    print("# Top-k's 'fits' column is its exact drop of the surplus candidates")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
