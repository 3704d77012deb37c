"""SIDCo: thresholds from a fitted sparsity-inducing distribution, refined in stages.

SIDCo (Abdelmoniem et al., MLSys 2021) models gradient magnitudes with a
sparsity-inducing distribution and reads the threshold for density ``delta`` off
the fitted tail, with no sort (the fits: ``fits.py``).

One fit rarely matches the far tail of a real gradient, so SIDCo refines in
stages: each stage keeps the magnitudes above the previous stage's threshold,
shifts them by that threshold (the *excesses*) and fits again, until the target
density is reached.  For ``gamma``, as in SIDCo's own gamma variant, stages after
the first fit a generalised Pareto distribution to the excesses (the
peaks-over-threshold law): a moment-fitted gamma on a heavy tail degenerates
(``alpha -> 0``) and stops making progress.  Exact zeros are left out of every fit
and never kept.

Stage plan (``stages=None``, adaptive):

1. Stage 1 aims at ``first_density`` of the entries (SIDCo's first ratio, 0.25),
   each later stage at ``stage_density`` of its input.  Every stage aims at a
   planned *count* and takes its density from the *actual* count of its input, so
   a stage that missed is corrected by the next one.
2. Stage 1 fits a stratified random sample of 65,536 magnitudes (``device_fits="device"``;
   16,384 for the default host fits of an accelerator's tensor, 8,192 on the CPU host path),
   shifted by their
   minimum (which matters for multi-level compression: a payload's magnitudes all
   lie above an earlier threshold).  Its threshold only decides where stage 2
   starts, and at density 1/4 the sample holds ~16k excesses (2-4k on the host); a full pass for it
   would cost a third of the budget.  No later stage can go below stage 1's
   threshold, and on heavy tails a fit can miss its planned count by 2x or more,
   so stage 1 is refined (step 5) on the sample's own counts.
3. While a stage's input is large (planned above ``compact_density`` of the
   tensor), its fit comes from one streaming pass over the whole tensor (exact
   count, sum and sum of squares of the excesses).  The first stage whose input is
   small gathers that input once (the *candidates*); later stages work on them.
4. The number of remaining stages is recomputed from the actual candidate count
   (``ceil(log(k / m) / log(stage_density))``).
5. ``refine`` more rounds correct the last stage using the exact kept count over
   the candidates (SIDCo adapts its stages from the achieved ratio across
   iterations; here the adaptation happens within the call): the last stage's fit
   is kept and the density asked of it moves by secant steps on ``ln(kept)``
   against ``ln(density)``, so the threshold always comes from the fitted
   distribution.  Once the count is within ``tolerance`` of ``k`` nothing moves.
   Low CFs (10-20x) never reach a candidate phase; there the rounds count on stage 1's
   sample instead, which at such densities holds at least 400 kept entries (relative
   error ~1/sqrt(k s / n): 3.5 % at CF 10 and 5 % at CF 20 with the host fits' 8192-entry
   sample).  Below 800 hits (CF 11-20 on the host) the count at the refined threshold is
   checked exactly and corrected by a candidate phase when it is more than twice the
   tolerance off.  Where the sample holds fewer than 400 (CF 20-64 on the host), the last
   stage is fitted on the candidates, as at higher CFs.  When the candidates hold fewer than
   k (a stage fitted on the sample overshot), the fits are asked for 2k on the sample's
   counts and the candidates are gathered again (host fits).  A refinement on the sample
   goes to the latest stage whose input holds what it aims at: after an overshoot the last
   stage's own input can hold less, and its fit cannot come below its base.

With an integer ``stages`` the stage densities are fixed (``delta ** (1 / stages)``
each) and there are no refinement rounds: SIDCo with a fixed stage count.

With the defaults, CF 10 costs a sample, one statistics pass and the selection
pass; CF 100 and 1000 cost a sample, two statistics passes, the candidate gather
(at ~1.6 % density) and work proportional to the candidates.  (The CPU host path fits
those stages on its sample instead of passes, gathers deeper, and runs its stages in C: see
``_select_host``.)

Where the fits run (tensors that do not take the CPU host path: a GPU's, or the CPU's
without the native kernels), ``device_fits``:

* ``"host"`` (default): the stage-1 sample (8192 entries at uniform positions, one ``randint``),
  and with a candidate phase the candidates' magnitudes (every ``stride``-th beyond 32768 of
  them, ``_fit_stride``), are copied to the host once each, and every fit, count and refinement
  round runs there on Python scalars, exactly as the CPU host path's (``_staged_on_host`` is
  shared); the device runs ``|x|`` once, the sample, the candidate gather and the final
  selection: 7 tensor operations a call at CF 10, 11-15 with a candidate phase (27 before; on a
  GPU a call's time at bucket sizes follows that count, ``benchmarks/device_primitives.py``).
  When every candidate's magnitude is on the host the kept ones are picked there and only their
  positions go back.  Host synchronisations: one or two copies to the host, one ``nonzero``, and
  the final ``nonzero`` or the upload of the kept positions: at most four.
* ``"device"``: every stage and refinement round is a fixed sequence of tensor operations
  over the candidates, masked by the stage's base, so thresholds and counts stay on the
  device: at most two host synchronisations (the candidate gather and the final
  selection, both ``nonzero``; one at low CFs).  That is 560-2300 small tensor operations
  a call (exponential / generalised Pareto / gamma), each a kernel launch on a GPU: on an
  H200 it cost 5-31 ms a call, 3.5-21x exact Top-k, where the passes themselves take
  0.1 ms.  It stays as the option for hardware where a synchronisation costs more than
  hundreds of launches.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import numpy as np
import torch

from .. import native
from . import fits as fits_mod
from .base import check_count, check_fraction
from .fits import DISTRIBUTIONS, excess_moments, fitted_excess, fitted_excess_host
from .kernels import TINY, _work_dtype, abs_for_reuse, exceedance_moments, select_abs_at_least
from .sampling import host_abs_sample, stratified_abs_sample, uniform_abs_sample
from .threshold import ThresholdSelector

# Stage 1 fits this many stratified samples (it aims at a density of 1/4: ~16k excesses).
_FIRST_SAMPLE = 1 << 16
# The stage-1 sample of the host fits (the CPU host path and the accelerators' "host" fits).
# On the CPU each sampled entry is a random read: 16384 of them cost 0.09 ms at 1M entries,
# three times Top-k's whole sample, and SIDCo's fixed cost decides at bucket sizes
# (benchmarks/sidco_cost.py).  On an H100 the sample is one gather kernel whatever its size, but
# it is copied to the host and fitted there: 8192 instead of 16384 took SIDCo at CF 100 and
# 1000 from 1.23-1.43x to 1.12-1.34x exact Top-k at bucket sizes (benchmarks/sidco_device_sample.py).
# 8192 still hold 2048 entries above stage 1 and ~500 above stage 2.
_HOST_SAMPLE = 1 << 13
# Refine the last stage on the sample's counts (no candidate phase) only when the sample holds
# this many kept entries (a count within ~5 %: CF 20 with the 8192-entry sample).  With fewer the
# last stage goes to the candidates: fitted on the sample unrefined (800 hits were asked for
# before, so CF 20-64 had neither), it kept 0.55-0.8 of k at CF 30-50 on heavy tails.
_SAMPLE_REFINE_HITS = 400
# Below this many (400-800: CF 11-20 with the 8192-entry sample, and the further levels of
# multi-level compression at such factors) the sample's count is not trusted alone: the entries
# at the refined threshold are gathered as candidates, kept as they are when their exact count
# is within tolerance, and otherwise corrected by the candidate phase (a payload at 20x
# compressed 20x further kept 0.76 of k on captured gradients without the check).
_SAMPLE_TRUST_HITS = 800
# Host path: a stage whose input the stage-1 sample holds at least this many entries of is
# fitted on the sample (relative error of the fitted mean ~1/sqrt(400) = 5 %, which moves
# a stage's count by ~7 % at density 1/4; the next stage or the refinement corrects it).
_SAMPLE_FIT_MIN = 400
# Host path: past compact_density, a stage other than the last is still fitted on the sample
# when the sample holds at least this many entries of its input (a fitted mean within ~10 %, a
# count within ~14 % at density 1/4: the candidates then still hold ~4x k at CF 1000), so that
# they are gathered nearer k: at CF 1000 at 0.4 % of the tensor instead of 1.6 %, where the
# selection pass costs about a third less.
_SAMPLE_DEEP_MIN = 100
# When the last stage is fitted on the candidates, they are planned at least this many times k
# (see _staged_on_host).
_GATHER_AT_LEAST = 3.0
# Host path: a large stage with fewer than _SAMPLE_FIT_MIN sampled entries is gathered as the
# candidates from this many entries up, and fitted on a streaming pass below.  The candidate phase
# then costs a few fits and counts of fixed Python cost, which a pass over the tensor outweighs
# only from about here: on captured gradients SIDCo exponential at 1M and CF 1000 cost 2.08x
# exact Top-k with the pass and 1.66x gathering (benchmarks/results/sidco_cost_real_*.txt), at
# 512K 2.6x and 2.3x, but at 262K and CF 100 1.4x with the pass and 1.9x gathering (interleaved
# runs of both versions, commit f9d52d2).
_GATHER_NOT_PASS_MIN = 1 << 19
# The candidate phase fits and counts at most about this many candidates (see _fit_stride): on the
# CPU host path, and on accelerators, where they are first copied to the host (half as many
# there took SIDCo at CF 100 and 1000 from 1.12-1.34x to 1.07-1.27x exact Top-k on an H100 at
# bucket sizes, benchmarks/sidco_device_sample.py; the CPU's fits are native passes).
_CANDIDATE_FITS = 1 << 16
_DEVICE_CANDIDATE_FITS = 1 << 15
# The CPU host path runs its stages in C (``native.sidco_select``: ``_staged_on_host`` step for step,
# the same selection) rather than in Python, where the scalar work between the native passes cost
# 0.04-0.23 ms a call, as much as the selection pass of a 1M-entry bucket.  Tests and benchmarks turn
# it off to run the Python version on the same inputs.
_NATIVE_STAGES = True
_DIST_CODES = {"exponential": 0, "gpareto": 1, "gamma": 2}   # (kernels.c's HG_EXPONENTIAL ...)


class SIDCoSelector(ThresholdSelector):
    """Threshold from a fitted sparsity-inducing distribution with multi-stage refinement.

    Args:
        cf: compression factor (target ``numel / kept``).
        distribution: ``"exponential"``, ``"gpareto"`` or ``"gamma"``.
        stages: ``None`` (adaptive, see the module docstring) or a fixed stage count >= 1.
        first_density: planned density of the first stage (adaptive plan).
        stage_density: planned density of each later stage (adaptive plan).
        compact_density: stages whose input is planned above this fraction of the tensor
            are fitted from a streaming pass; below it the input is gathered once.
        refine: refinement rounds of the last stage, and of stage 1 on its sample (adaptive
            plan only; see the module docstring).
        tolerance: refinement stops once the kept count is within ``k * (1 +- tolerance)``.
        seed: seed of the private per-device generators (stage 1's sample; see ``set_step``).
        device_fits: where tensors off the CPU host path (a GPU's, or the CPU's without the
            native kernels) are fitted: ``"host"`` (default) copies stage 1's sample and then
            the candidates to the host once each and fits and refines there with Python
            scalars, as the CPU host path does: about 15-20 tensor operations and up to four
            host synchronisations per call; ``"device"`` keeps every fit and refinement round on
            the device: two synchronisations, but 560-2300 small tensor operations, each a
            kernel launch on a GPU (5-31 ms a call on an H200, 3.5-21x exact Top-k).

    Host synchronisations per ``select``: see ``device_fits`` and the module docstring.
    Cost (``device_fits="device"``): a 64k sample, one statistics pass per large stage (one at CF 10, two at CF 100
    and 1000 with the defaults), one selection pass, then work proportional to the
    candidates.
    """

    def __init__(self, cf: float = 100.0, distribution: str = "exponential",
                 stages: Optional[int] = None, first_density: float = 0.25,
                 stage_density: float = 0.25, compact_density: float = 0.02, refine: int = 6,
                 tolerance: float = 0.05, seed: int = 0, device_fits: str = "host"):
        super().__init__(cf, seed)
        if device_fits not in ("host", "device"):
            raise ValueError(f"device_fits must be 'host' or 'device', got {device_fits!r}")
        self.device_fits = device_fits
        if not isinstance(distribution, str) or distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, "
                             f"got {distribution!r}")
        if stages is not None:
            check_count(stages, "stages")
        self.distribution = distribution
        self.stages = stages
        self.first_density = check_fraction(first_density, "first_density")
        self.stage_density = check_fraction(stage_density, "stage_density", 0.0, 0.9)
        self.compact_density = check_fraction(compact_density, "compact_density")
        if isinstance(refine, bool) or not isinstance(refine, int) or refine < 0:
            raise ValueError(f"refine must be an integer >= 0, got {refine!r}")
        self.refine = refine
        self.tolerance = check_fraction(tolerance, "tolerance", 0.0, 0.5)
        self.last_stages = 0
        self.last_passes = 0   # streaming passes over the tensor that fitted a stage (host fits)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(cf={self.cf:g}, distribution={self.distribution!r}, "
                f"stages={self.stages!r}, device_fits={self.device_fits!r})")

    def _stage_dist(self, stage: int) -> str:
        return "gpareto" if self.distribution == "gamma" and stage > 1 else self.distribution

    def _plan(self, n: int, k: int) -> List[float]:
        """Planned kept counts after each stage (host floats), ending at ``k``."""
        if self.stages is not None:
            return [n * (k / n) ** (s / self.stages) for s in range(1, self.stages + 1)]
        if self.first_density * n <= k:   # low CF: halfway (geometrically), then k
            return [math.sqrt(n * k), float(k)]
        plan = []
        target = self.first_density * n
        while target > k * (1.0 + 1e-9):
            plan.append(target)
            target *= self.stage_density
        plan.append(float(k))
        return plan

    def _select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        if self.device_fits == "host":
            return self._select_fitting_on_host(flat, k)
        return self._select_fitting_on_device(flat, k)

    def _select_fitting_on_host(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        """The device tensor's passes and gathers stay on its device; the sample and the
        candidates are copied to the host once each (``_to_host``), and every fit, count and
        refinement round runs there (:meth:`_staged_on_host`).  Host synchronisations: the
        sample copy, the final ``nonzero`` (or the upload of the kept positions), and with a
        candidate phase the candidate ``nonzero`` and copy: at most four (plus one per
        streaming-pass fit, which only a tensor below 512K entries can need, as on the CPU host
        path).

        On an H100 this path cost 1.6-2.0x exact Top-k at CF 100 and 1000 with a 65536-entry
        sample, every candidate copied and fitted on, and the kept set picked on the device;
        with the smaller sample, at most 65536 candidates fitted on and the kept ones picked on
        the host when they are all there, 1.3-1.65x at bucket sizes and 0.97-1.06x at 25M;
        with an 8192-entry sample and at most 32768 candidates, see ``_HOST_SAMPLE``; with
        ``|x|`` taken once and a uniform sample (27 operations down to 15), 0.92-1.54x at CF 100
        and 0.90-1.39x at CF 1000 from 1M to 6.5M entries against 1.17-1.64x in the same
        session (``benchmarks/results/gpu_h100/call20_1ded337/``, which also copied up to 2^18
        candidates: that cost more than it saved at 4-6.5M entries and was taken back)."""
        n = flat.numel()
        squares = self.distribution != "exponential"
        # |x| once, for the sample and every gather, where that saves operations (on a GPU a
        # call's time follows their count, benchmarks/device_primitives.py); None on the CPU.
        a = abs_for_reuse(flat)
        s = min(n, _HOST_SAMPLE)
        if s < n:
            sample = _to_host(uniform_abs_sample(flat, s, self._generators(flat.device), a))
        else:
            sample = _to_host(_work_dtype(flat).abs() if a is None else a)

        def pass_moments(threshold):
            moments = exceedance_moments(flat, torch.tensor(threshold, dtype=torch.float64), squares)
            return tuple(_to_host(moments).tolist())

        def gather(threshold, expected, final):
            idx, mag = select_abs_at_least(flat, threshold, expected / n, not final, abs_flat=a)
            if final:
                return idx, None, 1
            stride = _fit_stride(mag.numel(), _DEVICE_CANDIDATE_FITS)
            host = _to_host(mag if stride == 1 else mag[::stride])
            return (idx, mag, host if stride == 1 else None), host, stride

        def finish(candidates, threshold):
            idx, mag, host = candidates
            if threshold is None:
                return idx
            if host is not None:
                # Every candidate's magnitude is on the host: which are kept is decided there and
                # only their positions go back (no compare and nonzero on the device).
                keep = np.flatnonzero(host >= host.dtype.type(threshold)).astype(np.int32)
                return idx.index_select(0, torch.from_numpy(keep).to(idx.device))
            keep = torch.nonzero(mag >= torch.tensor(threshold, dtype=mag.dtype)).view(-1)
            return idx.index_select(0, keep)

        return self._staged_on_host(n, k, sample, pass_moments, gather, finish,
                                    count=lambda c: c[0].numel())

    def _select_fitting_on_device(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        n = flat.numel()
        dev = flat.device
        squares = self.distribution != "exponential"
        plan = self._plan(n, k)
        adaptive = self.stages is None
        # -- stage 1: fit a stratified sample ---------------------------------------------------
        # Its threshold only decides where stage 2 starts: stage 2 onwards fit exact statistics
        # of the whole tensor and aim at planned counts from actual counts.
        s = min(n, _FIRST_SAMPLE)
        sample = stratified_abs_sample(flat, s, self._generators(dev))
        base = sample.amin().double()                         # 0 when zeros are present
        moments = excess_moments(sample, base, squares)       # zeros and the minimum left out
        scale = n / s
        stage = 1
        density = (plan[0] / (moments[0] * scale).clamp(min=1.0)).clamp(max=1.0)
        last = (base, moments, density)        # the last stage's base, moments and density
        threshold = base + fitted_excess(self._stage_dist(1), moments, density)
        if adaptive and self.refine > 0:
            # A heavy tail can put stage 1 far off its planned count, and no later stage can
            # go below it: correct it on the sample's own counts (~16k kept entries).
            threshold = self._refine(sample, plan[0] / scale, threshold, *last, self._stage_dist(1))
        # -- stages fitted from streaming passes over the whole tensor --------------------------
        while stage < len(plan) and plan[stage - 1] > self.compact_density * n:
            moments = exceedance_moments(flat, threshold, squares)
            target = plan[stage]
            stage += 1
            density = (target / moments[0].clamp(min=1.0)).clamp(max=1.0)
            last = (threshold, moments, density)
            threshold = threshold + fitted_excess(self._stage_dist(stage), moments, density)
        if stage == len(plan):   # reached k without a candidate phase (low CFs)
            if adaptive and self.refine > 0 and k * s / n >= _SAMPLE_REFINE_HITS:
                # No candidates to count exactly: refine on the stage-1 sample's counts,
                # which at these densities hold thousands of kept entries.
                threshold = self._refine(sample, k * s / n, threshold, *last, self._stage_dist(stage))
            self.last_stages = stage
            idx, _ = select_abs_at_least(flat, threshold.clamp(min=TINY), k / n, False)   # sync 1
            return idx
        # -- candidate phase ------------------------------------------------------------------
        cand_idx, cand = select_abs_at_least(flat, threshold.clamp(min=TINY),
                                             plan[stage - 1] / n)                        # sync 1
        mcount = cand.numel()
        if mcount <= k:
            self.last_stages = stage
            return cand_idx
        if adaptive:   # re-plan the remaining stages from the actual candidate count
            rest = max(1, math.ceil(math.log(k / mcount) / math.log(self.stage_density)))
            plan = [mcount * (k / mcount) ** (j / rest) for j in range(1, rest + 1)]
        else:
            plan = plan[stage:]
        values = cand   # stages mask it: a stage's input is the candidates above its base
        # Last fitted stage, kept for refinement: its base, moments and density.
        last_base, last_moments, last_density = threshold, None, None
        for target in plan:
            stage += 1
            moments = excess_moments(values, threshold, squares)
            density = (target / moments[0].clamp(min=1.0)).clamp(max=1.0)
            last_base, last_moments, last_density = threshold, moments, density
            threshold = threshold + fitted_excess(self._stage_dist(stage), moments, density)
        if adaptive and self.refine > 0:
            threshold = self._refine(values, k, threshold, last_base, last_moments, last_density,
                                     self._stage_dist(stage))
        self.last_stages = stage
        keep = torch.nonzero(cand >= threshold.to(cand.dtype)).view(-1)          # sync 2
        return cand_idx.index_select(0, keep)

    def _refine(self, values: torch.Tensor, k: float, threshold: torch.Tensor,
                base: torch.Tensor, moments: torch.Tensor, density: torch.Tensor,
                dist: str) -> torch.Tensor:
        """``refine`` sync-free correction rounds of the last stage (see the module docstring).

        The last stage's fit (its base and excess moments) is kept; only the density it is
        asked for moves, by secant steps on ``ln(kept)`` against ``ln(density)`` (the first
        step assumes proportionality), until the exact kept count over the candidates is
        within tolerance.  ``values`` holds every candidate above ``base``.
        """
        few, many = k * (1.0 - self.tolerance), k * (1.0 + self.tolerance)
        log_k = math.log(k)
        log_d = torch.log(density)
        prev_log_d = prev_log_kept = None
        for _ in range(self.refine):
            at = threshold.clamp(min=TINY).to(values.dtype)      # zeros are never kept
            kept = torch.count_nonzero(values >= at).double().clamp(min=0.5)
            log_kept = torch.log(kept)
            ok = (kept >= few) & (kept <= many)
            if prev_log_d is None:
                slope = torch.ones_like(log_d)
            else:
                slope = ((log_kept - prev_log_kept) / (log_d - prev_log_d)).nan_to_num(1.0, 1.0, 1.0)
                slope = slope.clamp(0.3, 3.0)
            step = ((log_k - log_kept) / slope).clamp(-3.0, 3.0)
            prev_log_d, prev_log_kept = log_d, log_kept
            log_d = torch.where(ok, log_d, (log_d + step).clamp(max=0.0))
            threshold = torch.where(ok, threshold, base + fitted_excess(dist, moments, torch.exp(log_d)))
        return threshold

    # -- CPU host path (float32 with the native kernels) -------------------------------------------
    def _select_host(self, x: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """:meth:`_select` with host scalars, NumPy and the native kernels: the same stages,
        fits and refinement rounds, with a stage-1 sample of ``_HOST_SAMPLE`` (8192) entries
        instead of the device fits' 65536.  The stages before the candidate phase are fitted on
        that sample when it holds at least ``_SAMPLE_FIT_MIN`` (400) entries of the stage's input
        (on Laplace data: every such stage, at every CF and size); when it holds fewer, that
        input is at most ``400 n / 8192`` entries and is gathered there as the candidates from
        ``_GATHER_NOT_PASS_MIN`` (512K) entries up, or fitted on a streaming pass
        (``hg_exceedance_moments``) below.  At bucket sizes a pass is 3-10x the cost of these fits, and two of them
        made SIDCo cost 2-4x exact Top-k; on captured gradients an exponential stage fitted on the
        sample overshot, the next one was fitted on a pass, and SIDCo cost 2.08x exact Top-k at
        1M entries and CF 1000 (1.66x gathering instead, ``benchmarks/sidco_cost.py --input real``).
        The fit of a sample estimates the same moments, and the exact counts of the candidate
        phase and the refinement rounds correct what it misses.

        Three differences in where the work happens, not in what is computed:

        * with the adaptive plan, a stage that is not the last is still fitted on the sample while
          the sample holds ``_SAMPLE_DEEP_MIN`` (100) of its input, so at CF 1000 the candidates
          are gathered at 0.4 % of the tensor rather than 1.6 % (the selection pass costs more
          the more it keeps; SIDCo went from 1.4x to 1.2x exact Top-k at 6.5M entries), and
          at least ``_GATHER_AT_LEAST`` (3) k of them are planned;
        * every fit and count, on the sample and on the candidates, is one native pass
          (``hg_exceedance_moments``), and the kept candidates are gathered by the select
          pass; the NumPy array operations they replace cost as much as the selection pass
          itself at bucket sizes;
        * after the sample, the whole of :meth:`_staged_on_host` runs in C
          (``native.sidco_select``, ``_NATIVE_STAGES``): the same selection, without 0.04-0.23 ms
          of Python a call between the native passes (at 1M entries and CF 1000 SIDCo went from
          1.28x to 0.92x exact Top-k, ``benchmarks/results/sidco_cost_cpu.txt``)."""
        sample = host_abs_sample(x, _tiling_sample_size(x.size), self._host_generator())
        if _NATIVE_STAGES:
            idx, val, done = native.sidco_select(x, sample, k, self._native_settings())
            self.last_stages, self.last_passes = done["stages"], done["passes"]
            return idx, val
        squares = self.distribution != "exponential"

        def gather(threshold, expected, final):
            if final:
                return native.select(x, threshold, False, int(k * 1.25) + 64, k), None, 1
            idx, val = native.select(x, threshold, False, int(expected * 1.5) + 64, expected)
            stride = _fit_stride(val.size)
            return (idx, val), (val if stride == 1 else np.ascontiguousarray(val[::stride])), stride

        def finish(candidates, threshold):
            idx, val = candidates
            if threshold is None:
                return idx, val
            keep, kept_val = native.select(val, threshold, False, int(k * 1.25) + 64, k)
            return np.take(idx, keep), kept_val   # (2-3x faster than idx[keep] with int32 positions)

        return self._staged_on_host(x.size, k, sample,
                                    lambda threshold: native.exceedance_moments(x, threshold, squares),
                                    gather, finish, count=lambda c: c[0].size)

    def _native_settings(self) -> tuple:
        """This selector's settings and the module's host-path constants, as ``native.sidco_select``
        takes them (read per call: benchmarks/sidco_host_sample.py varies the constants)."""
        return (_DIST_CODES[self.distribution], self.stages or 0, self.first_density, self.stage_density,
                self.compact_density, self.refine, self.tolerance, _SAMPLE_REFINE_HITS, _SAMPLE_TRUST_HITS,
                _SAMPLE_FIT_MIN, _SAMPLE_DEEP_MIN, _GATHER_NOT_PASS_MIN, _CANDIDATE_FITS, _GATHER_AT_LEAST,
                fits_mod._NEWTON_STEPS, float(TINY))

    def _staged_on_host(self, n: int, k: int, sample: np.ndarray, pass_moments, gather, finish, count):
        """The stages, fits and refinement rounds of :meth:`_select` with host scalars, shared by
        the CPU host path and the accelerators' ``device_fits="host"``; what touches the
        tensor itself comes in as functions:

        * ``sample``: host magnitudes at stratified positions (every entry when it is whole);
        * ``pass_moments(t)``: exact ``(m, sum w, sum w^2)`` of the excesses over the tensor;
        * ``gather(t, expected, final)``: the entries ``|x| >= t`` (``t`` at least ``TINY``: zeros
          are never kept), as ``(result, None, 1)`` when ``final`` (the selection itself), else
          ``(candidates, host values, stride)``: the values of every ``stride``-th candidate
          (``_fit_stride``: all of them up to ``_CANDIDATE_FITS`` candidates), which the
          candidate phase's fits and counts then weigh by ``stride``;
        * ``finish(candidates, t)``: the candidates ``>= t``, the selection (all of them for
          ``t=None``);
        * ``count(candidates)``: how many were gathered.

        ``kernels.c``'s ``hg_sidco_select`` is this function in C for the CPU host path: a change
        here goes there too (``tests/test_host_path.py`` compares the two)."""
        squares = self.distribution != "exponential"
        self.last_passes = 0

        def counted(threshold):
            self.last_passes += 1
            return pass_moments(threshold)

        s = sample.size
        plan = self._plan(n, k)
        # Zeros are never kept and no fit sees them, so a stage planned to keep at least as many
        # entries as are nonzero (as many as the sample holds, scaled up) keeps them all: its
        # threshold stays at the base.  Such stages are left out.  On an embedding's gradient,
        # nonzero in the rows a batch touched (2 % of a 6.5M bucket), they were not: each left the
        # next stage a few hundred sampled entries to fit on, too few, so it was fitted on a
        # streaming pass, and SIDCo cost 2.3-2.9x exact Top-k at CF 100 and 1000.
        base = float(sample.min())
        nonzeros = float(n)
        if base == 0.0:   # (only then can the sample hold zeros: no count on a dense gradient)
            nonzeros = n * np.count_nonzero(sample) / s
            plan = [target for target in plan if target < nonzeros] or [float(k)]
        adaptive = self.stages is None
        # When the last stage is fitted on the candidates (the sample holds too few kept entries to
        # refine it), they are gathered at the stage before's threshold, planned at
        # _GATHER_AT_LEAST k at least: on a heavy tail that stage, fitted on a few hundred sampled
        # entries, can overshoot, and planned nearer k (1.2-1.6k at CF 100 and 300, where the
        # plan's quarters happen to end close to k) it left fewer than k candidates, and a second
        # gather, in up to 65 % of the calls on Student's t and 52 % on captured gradients
        # (benchmarks/sidco_gathers.py).
        raised = _GATHER_AT_LEAST * k
        if (adaptive and self.refine > 0 and s < n and k * s / n < _SAMPLE_REFINE_HITS and len(plan) >= 3
                and plan[-2] < raised < plan[-3] and raised < nonzeros):
            plan[-2] = raised
        # Every fit and count on the sample is one pass over it (the sampled entries above a
        # stage's base are that stage's input: no copy of them is needed).
        sampled = _moments_of(sample)
        moments = sampled(base, squares)
        scale = n / s
        stage = 1
        density = min(plan[0] / max(moments[0] * scale, 1.0), 1.0)
        # Every stage's fit (base, moments, density, distribution) and how many sampled entries
        # its input held: a refinement on the sample's counts goes to the latest stage whose input
        # holds what it aims at.  When a stage overshot, the next one's input holds fewer, its fit
        # is asked for density 1 and cannot come below its base (a payload at 20x compressed 20x
        # further kept 0.76 of k on captured gradients, its refinement stuck at that base for six
        # rounds).
        fits = [(base, moments, density, self._stage_dist(1), moments[0])]

        def refit(hits: float, threshold: float) -> float:
            fit = next((f for f in reversed(fits) if f[4] >= hits), fits[0])
            return self._refine_host(sampled.count_at_least, hits, threshold, *fit[:4])

        threshold = base + fitted_excess_host(self._stage_dist(1), moments, density)
        if adaptive and self.refine > 0:
            threshold = refit(plan[0] / scale, threshold)   # (stage 1's own: it holds the sample)
        while stage < len(plan):
            if (adaptive and self.refine > 0 and stage == len(plan) - 1 and s < n
                    and k * s / n < _SAMPLE_REFINE_HITS):
                # The next stage is the last, and the sample holds too few kept entries to
                # refine it: fit it on the candidates, whose exact counts do.  Fitted on the
                # sample unrefined, it kept 0.61-0.79 of k at CF 50 on captured gradients.
                break
            moments = sampled(threshold, squares)   # this stage's input, sampled
            held = moments[0] if s < n else 0.0
            if adaptive and stage < len(plan) - 1 and held >= _SAMPLE_DEEP_MIN:
                # A stage other than the last may be fitted on as few as _SAMPLE_DEEP_MIN sampled
                # entries, a large one too: with fewer than _SAMPLE_FIT_MIN a large stage's input
                # was gathered whole instead, and the candidate phase then worked on all of it.
                on_sample = True
            elif plan[stage - 1] > self.compact_density * n:
                if s < n and held < _SAMPLE_FIT_MIN and n >= _GATHER_NOT_PASS_MIN:
                    # Too few sampled to fit on (a heavy tail the previous stage's fit
                    # overshot): gather this stage's input now, at most 400 n / s entries, which
                    # costs one pass, rather than fit it on a streaming pass and gather later.
                    break
                on_sample = held >= _SAMPLE_FIT_MIN
            else:
                break   # gather the candidates here
            if on_sample:
                moments = tuple(v * scale for v in moments)
            else:   # too few sampled, in a small tensor: a streaming pass
                moments = counted(threshold)
            target = plan[stage]
            stage += 1
            density = min(target / max(moments[0], 1.0), 1.0)
            fits.append((threshold, moments, density, self._stage_dist(stage), moments[0] / scale))
            threshold = threshold + fitted_excess_host(self._stage_dist(stage), moments, density)
        checked = False   # the last stage was refined on the sample, and its count is checked
        if stage == len(plan):
            if adaptive and self.refine > 0 and k * s / n >= _SAMPLE_REFINE_HITS:
                threshold = refit(k * s / n, threshold)
                checked = s < n and k * s / n < _SAMPLE_TRUST_HITS
            if not checked:
                self.last_stages = stage
                return gather(max(threshold, float(TINY)), k, True)[0]
        gathered, values, stride = gather(max(threshold, float(TINY)), plan[stage - 1], False)
        mcount = count(gathered)
        # A sample-refined count is within tolerance of the sample's target, and 400-800 sampled
        # hits add 3.5-5 % of sampling error: within twice the tolerance it held.  (Correcting
        # every count outside the tolerance itself cost a second pass in half the calls at CF 20
        # on captured gradients, 1.7x exact Top-k instead of 1.0x.)
        slack = 2.0 * self.tolerance if checked else self.tolerance
        if checked and k * (1.0 - slack) <= mcount <= k * (1.0 + slack):
            self.last_stages = stage
            return finish(gathered, None)   # the sample's count held: these are the selection
        if mcount < k * (1.0 - slack) and adaptive and self.refine > 0 and s < n:
            # The last stage fitted on the sample overshot (a deep stage fits on 100-400 sampled
            # entries), and the candidates hold fewer than k: ask the fits for 2k instead, on the
            # sample's counts, and gather again, so that the candidate phase's exact counts can
            # reach k (it kept 0.63 of k at CF 300 on captured gradients before).  One more
            # select pass, in these calls only.
            threshold = refit(2.0 * k * s / n, threshold)
            gathered, values, stride = gather(max(threshold, float(TINY)), 2 * k, False)
            mcount = count(gathered)
        if mcount <= k:
            self.last_stages = stage
            return finish(gathered, None)
        if adaptive:
            rest = max(1, math.ceil(math.log(k / mcount) / math.log(self.stage_density)))
            plan = [mcount * (k / mcount) ** (j / rest) for j in range(1, rest + 1)]
        else:
            plan = plan[stage:]
        # The candidate phase: each stage's fit is one pass over the candidates' values (|v|
        # inside), each refinement count another, and the kept ones are taken by ``finish``;
        # in NumPy the same work (|val|, then per stage a subtraction, a clamp, a count and two
        # sums) cost 1-2 ms per call at bucket sizes, as much as the selection pass itself.
        last_base, last_moments, last_density = threshold, None, None
        candidates = _moments_of(values) if stride == 1 else _Weighted(_moments_of(values), stride)
        for target in plan:
            stage += 1
            moments = candidates(threshold, squares)
            density = min(target / max(moments[0], 1.0), 1.0)
            last_base, last_moments, last_density = threshold, moments, density
            threshold = threshold + fitted_excess_host(self._stage_dist(stage), moments, density)
        if adaptive and self.refine > 0:
            threshold = self._refine_host(candidates.count_at_least, k, threshold, last_base, last_moments,
                                          last_density, self._stage_dist(stage))
        self.last_stages = stage
        return finish(gathered, max(threshold, float(TINY)))

    def _refine_host(self, count, k: float, threshold: float, base: float, moments,
                     density: float, dist: str) -> float:
        """:meth:`_refine` with host scalars (it stops at the first round within tolerance,
        where the torch version's later rounds leave everything unchanged, and bisects the log
        density once one round has kept too few and another too many); ``count(t)`` counts the
        entries at or above ``t``."""
        few, many = k * (1.0 - self.tolerance), k * (1.0 + self.tolerance)
        log_k = math.log(k)
        log_d = math.log(max(density, 1e-300))
        prev_log_d = prev_log_kept = None
        too_few = too_many = None   # the log densities seen keeping fewer / more than k
        for _ in range(self.refine):
            # (count rounds the threshold to its values' dtype, as finish compares in it)
            kept = max(float(count(max(threshold, float(TINY)))), 0.5)
            if few <= kept <= many:
                break
            if kept < few:
                too_few = log_d if too_few is None else max(too_few, log_d)
            else:
                too_many = log_d if too_many is None else min(too_many, log_d)
            log_kept = math.log(kept)
            if too_few is not None and too_many is not None:
                # k is bracketed: bisect.  Secant steps stall where the count is flat in the
                # density and then jumps (captured gradients: a mass of magnitudes near 0 below
                # an exponential tail), and left stage 1 at 0 after six rounds.
                log_d = 0.5 * (too_few + too_many)
            else:
                slope = 1.0
                if prev_log_d is not None and log_d != prev_log_d:
                    slope = (log_kept - prev_log_kept) / (log_d - prev_log_d)
                    slope = min(max(slope, 0.3), 3.0)
                step = min(max((log_k - log_kept) / slope, -3.0), 3.0)
                prev_log_d, prev_log_kept = log_d, log_kept
                log_d = min(log_d + step, 0.0)
            threshold = base + fitted_excess_host(dist, moments, math.exp(log_d))
        return threshold


def _tiling_sample_size(n: int) -> int:
    """About ``_HOST_SAMPLE`` (at most), so that its strata (``n // size`` entries each) tile all
    ``n`` entries but fewer than a stratum's.  With ``_HOST_SAMPLE`` itself the last
    ``n mod 8192`` entries were never sampled: a third of a 12,000-entry payload of multi-level
    compression, whose entries come in position order, so the last layers' magnitudes were
    missing from every fit and count (0.65 of k, 20x then 10x further on captured gradients)."""
    if n <= _HOST_SAMPLE:
        return n
    return n // -(-n // _HOST_SAMPLE)


def _to_host(t: torch.Tensor) -> np.ndarray:
    """A device tensor's values (never part of a graph) as a float32 host array (float64 for
    moments): one device-to-host copy, a synchronisation on an accelerator (tests count the calls)."""
    return t.cpu().numpy() if t.dtype in (torch.float64, torch.float32) else t.float().cpu().numpy()


class _NumpyMoments:
    """``native.MomentsOf``'s interface in NumPy, where the native kernels do not take the array
    (not built or switched off, or not float32)."""

    def __init__(self, x: np.ndarray):
        self._a = np.abs(x.astype(np.float64))
        self._dtype = x.dtype.type   # what a threshold is rounded to: float32, or float64 values'

    def __call__(self, threshold, squares: bool = True):
        w = self._a[self._a > threshold] - threshold   # NaN compares False: left out
        return float(w.size), float(w.sum()), (float(np.dot(w, w)) if squares else 0.0)

    def count_at_least(self, threshold) -> float:
        return float(np.count_nonzero(self._a >= float(self._dtype(threshold))))


class _Weighted:
    """Moments and counts of every ``stride``-th candidate, weighed up to all of them."""

    def __init__(self, moments, stride: int):
        self._moments, self._stride = moments, stride

    def __call__(self, threshold, squares: bool = True):
        return tuple(v * self._stride for v in self._moments(threshold, squares))

    def count_at_least(self, threshold) -> float:
        return self._moments.count_at_least(threshold) * self._stride


def _fit_stride(count: int, limit: Optional[int] = None) -> int:
    """Every how many-th candidate the candidate phase fits and counts: all of them up to
    ``limit`` (``_CANDIDATE_FITS``; on accelerators ``_DEVICE_CANDIDATE_FITS``).  Each fit and
    refinement count is a pass over them on the host (about
    ten a call), and on an accelerator they are first copied there: at 25M entries and CF 100
    the candidates are 390k (1.6 %), which made those passes and the copy most of SIDCo's time
    on an H100 (1.7-1.9x exact Top-k).  65536 of them still hold thousands of kept entries
    (a count within ~1 %, inside the 5 % tolerance); 32768 still hold a count within ~1.5 %."""
    return max(1, -(-count // (limit or _CANDIDATE_FITS)))


def _moments_of(x: np.ndarray):
    return native.MomentsOf(x) if native.usable(x) else _NumpyMoments(x)
