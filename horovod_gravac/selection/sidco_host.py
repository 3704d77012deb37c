"""SIDCo's stages with host scalars: the fits, counts and refinement rounds on Python floats.

:class:`HostStages` runs them for the CPU host path (float32 with the native kernels, when
``sidco._NATIVE_STAGES`` is off; ``sidco_native.py`` is the same in C) and for the
accelerators' default ``device_fits="host"`` (``sidco_device.HostFits``: the tensor's passes
and gathers stay on its device, the sample and the candidates are copied to the host).  What
touches the tensor comes in as functions, so both share every decision.

The tuning constants below are read at call time (``sidco_native.settings`` hands them to C).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

from .. import native
from .fits import fitted_excess_host
from .kernels import TINY

# The stage-1 sample of the host fits (the CPU host path and the accelerators' "host" fits).
# On the CPU each sampled entry is a random read, and SIDCo's fixed cost decides at bucket sizes;
# on an accelerator the sample is copied to the host and fitted there.  8192 still hold 2048
# entries above stage 1 and ~500 above stage 2.
_HOST_SAMPLE = 1 << 13
# Refine the last stage on the sample's counts (no candidate phase) only when the sample holds
# this many kept entries (a count within ~5 %: CF 20 with the 8192-entry sample).  With fewer the
# last stage goes to the candidates.
_SAMPLE_REFINE_HITS = 400
# Below this many (400-800: CF 11-20 with the 8192-entry sample, and the further levels of
# multi-level compression at such factors) the sample's count is not trusted alone: the entries
# at the refined threshold are gathered as candidates, kept as they are when their exact count
# is within tolerance, and otherwise corrected by the candidate phase.
_SAMPLE_TRUST_HITS = 800
# A stage whose input the stage-1 sample holds at least this many entries of is fitted on the
# sample (relative error of the fitted mean ~1/sqrt(400) = 5 %, which moves a stage's count by
# ~7 % at density 1/4; the next stage or the refinement corrects it).
_SAMPLE_FIT_MIN = 400
# Past compact_density, a stage other than the last is still fitted on the sample when the
# sample holds at least this many entries of its input (a fitted mean within ~10 %, a count
# within ~14 % at density 1/4: the candidates then still hold ~4x k at CF 1000), so that they
# are gathered nearer k, where the selection pass costs less.
_SAMPLE_DEEP_MIN = 100
# When the last stage is fitted on the candidates, they are planned at least this many times k
# (see HostStages.select).
_GATHER_AT_LEAST = 3.0
# A large stage with fewer than _SAMPLE_FIT_MIN sampled entries is gathered as the candidates
# from this many entries up, and fitted on a streaming pass below: the candidate phase costs a
# few fits and counts of fixed cost, which a pass over the tensor outweighs only from about here.
_GATHER_NOT_PASS_MIN = 1 << 19
# The candidate phase fits and counts at most about this many candidates (see fit_stride); on
# accelerators, where they are first copied to the host (a synchronisation), half as many.
_CANDIDATE_FITS = 1 << 16
_DEVICE_CANDIDATE_FITS = 1 << 15


class HostStages:
    """SIDCo's stages on host scalars for ``selector`` (a :class:`~.sidco.SIDCoSelector`: its
    settings, ``plan`` and ``stage_dist``)."""

    def __init__(self, selector):
        self.selector = selector
        self.stages_fitted = 0   # of the last call
        self.passes = 0          # streaming passes over the tensor that fitted a stage, last call

    def select_array(self, x: np.ndarray, k: int, sample: np.ndarray):
        """The CPU host path in Python: ``(idx, val)`` (int32, float32) of a float32 array, its
        passes and selections by the native kernels."""
        squares = self.selector.distribution != "exponential"

        def gather(threshold, expected, final):
            if final:
                return native.select(x, threshold, False, int(k * 1.25) + 64, k), None, 1
            idx, val = native.select(x, threshold, False, int(expected * 1.5) + 64, expected)
            stride = fit_stride(val.size)
            return (idx, val), (val if stride == 1 else np.ascontiguousarray(val[::stride])), stride

        def finish(candidates, threshold):
            idx, val = candidates
            if threshold is None:
                return idx, val
            keep, kept_val = native.select(val, threshold, False, int(k * 1.25) + 64, k)
            return np.take(idx, keep), kept_val   # (2-3x faster than idx[keep] with int32 positions)

        return self.select(x.size, k, sample, lambda threshold: native.exceedance_moments(x, threshold, squares),
                           gather, finish, count=lambda c: c[0].size)

    def select(self, n: int, k: int, sample: np.ndarray, pass_moments, gather, finish, count):
        """The stages, fits and refinement rounds with host scalars, shared by the CPU host path
        and the accelerators' ``device_fits="host"``; what touches the tensor itself comes in as
        functions:

        * ``sample``: host magnitudes at stratified positions (every entry when it is whole);
        * ``pass_moments(t)``: exact ``(m, sum w, sum w^2)`` of the excesses over the tensor;
        * ``gather(t, expected, final)``: the entries ``|x| >= t`` (``t`` at least ``TINY``: zeros
          are never kept), as ``(result, None, 1)`` when ``final`` (the selection itself), else
          ``(candidates, host values, stride)``: the values of every ``stride``-th candidate
          (``fit_stride``: all of them up to ``_CANDIDATE_FITS`` candidates), which the
          candidate phase's fits and counts then weigh by ``stride``;
        * ``finish(candidates, t)``: the candidates ``>= t``, the selection (all of them for
          ``t=None``);
        * ``count(candidates)``: how many were gathered.

        Sets ``stages_fitted`` and ``passes`` (streaming passes over the tensor that fitted a
        stage).  ``kernels.c``'s ``hg_sidco_select`` is this function in C for the CPU host path
        (``sidco_native.py``): a change here goes there too (``tests/unit/test_host_path.py`` compares
        the two)."""
        sel = self.selector
        squares = sel.distribution != "exponential"
        self.passes = 0

        def counted(threshold):
            self.passes += 1
            return pass_moments(threshold)

        s = sample.size
        plan = sel.plan(n, k)
        # Zeros are never kept and no fit sees them, so a stage planned to keep at least as many
        # entries as are nonzero (as many as the sample holds, scaled up) keeps them all: its
        # threshold stays at the base.  Such stages are left out: on an embedding's gradient
        # (nonzero in the rows a batch touched) each would leave the next stage too few sampled
        # entries to fit on, and so a streaming pass over the whole bucket.
        base = float(sample.min())
        nonzeros = float(n)
        if base == 0.0:   # (only then can the sample hold zeros: no count on a dense gradient)
            nonzeros = n * np.count_nonzero(sample) / s
            plan = [target for target in plan if target < nonzeros] or [float(k)]
        adaptive = sel.stages is None
        # When the last stage is fitted on the candidates (the sample holds too few kept entries to
        # refine it), they are gathered at the stage before's threshold, planned at
        # _GATHER_AT_LEAST k at least: on a heavy tail that stage, fitted on a few hundred sampled
        # entries, can overshoot, and planned nearer k it often leaves fewer than k candidates,
        # which costs a second gather (a select pass over the tensor).
        raised = _GATHER_AT_LEAST * k
        if (adaptive and sel.refine > 0 and s < n and k * s / n < _SAMPLE_REFINE_HITS and len(plan) >= 3
                and plan[-2] < raised < plan[-3] and raised < nonzeros):
            plan[-2] = raised
        # Every fit and count on the sample is one pass over it (the sampled entries above a
        # stage's base are that stage's input: no copy of them is needed).
        sampled = moments_of(sample)
        moments = sampled(base, squares)
        scale = n / s
        stage = 1
        density = min(plan[0] / max(moments[0] * scale, 1.0), 1.0)
        # Every stage's fit (base, moments, density, distribution) and how many sampled entries
        # its input held: a refinement on the sample's counts goes to the latest stage whose input
        # holds what it aims at.  When a stage overshot, the next one's input holds fewer, its fit
        # is asked for density 1 and cannot come below its base, so refining it would get stuck
        # at that base.
        fits = [(base, moments, density, sel.stage_dist(1), moments[0])]

        def refit(hits: float, threshold: float) -> float:
            fit = next((f for f in reversed(fits) if f[4] >= hits), fits[0])
            return self.refine_threshold(sampled.count_at_least, hits, threshold, *fit[:4])

        threshold = base + fitted_excess_host(sel.stage_dist(1), moments, density)
        if adaptive and sel.refine > 0:
            threshold = refit(plan[0] / scale, threshold)   # (stage 1's own: it holds the sample)
        while stage < len(plan):
            if (adaptive and sel.refine > 0 and stage == len(plan) - 1 and s < n
                    and k * s / n < _SAMPLE_REFINE_HITS):
                # The next stage is the last, and the sample holds too few kept entries to
                # refine it: fit it on the candidates, whose exact counts do (fitted on the
                # sample unrefined, it can keep well under k).
                break
            moments = sampled(threshold, squares)   # this stage's input, sampled
            held = moments[0] if s < n else 0.0
            if adaptive and stage < len(plan) - 1 and held >= _SAMPLE_DEEP_MIN:
                # A stage other than the last may be fitted on as few as _SAMPLE_DEEP_MIN sampled
                # entries, a large one too, so that the candidates are gathered nearer k.
                on_sample = True
            elif plan[stage - 1] > sel.compact_density * n:
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
            fits.append((threshold, moments, density, sel.stage_dist(stage), moments[0] / scale))
            threshold = threshold + fitted_excess_host(sel.stage_dist(stage), moments, density)
        checked = False   # the last stage was refined on the sample, and its count is checked
        if stage == len(plan):
            if adaptive and sel.refine > 0 and k * s / n >= _SAMPLE_REFINE_HITS:
                threshold = refit(k * s / n, threshold)
                checked = s < n and k * s / n < _SAMPLE_TRUST_HITS
            if not checked:
                self.stages_fitted = stage
                return gather(max(threshold, float(TINY)), k, True)[0]
        gathered, values, stride = gather(max(threshold, float(TINY)), plan[stage - 1], False)
        mcount = count(gathered)
        # A sample-refined count is within tolerance of the sample's target, and 400-800 sampled
        # hits add 3.5-5 % of sampling error: within twice the tolerance it held (correcting
        # every count outside the tolerance itself would cost a second pass in half the calls).
        slack = 2.0 * sel.tolerance if checked else sel.tolerance
        if checked and k * (1.0 - slack) <= mcount <= k * (1.0 + slack):
            self.stages_fitted = stage
            return finish(gathered, None)   # the sample's count held: these are the selection
        if mcount < k * (1.0 - slack) and adaptive and sel.refine > 0 and s < n:
            # The last stage fitted on the sample overshot (a deep stage fits on 100-400 sampled
            # entries), and the candidates hold fewer than k: ask the fits for 2k instead, on the
            # sample's counts, and gather again, so that the candidate phase's exact counts can
            # reach k.  One more select pass, in these calls only.
            threshold = refit(2.0 * k * s / n, threshold)
            gathered, values, stride = gather(max(threshold, float(TINY)), 2 * k, False)
            mcount = count(gathered)
        if mcount <= k:
            self.stages_fitted = stage
            return finish(gathered, None)
        if adaptive:
            rest = max(1, math.ceil(math.log(k / mcount) / math.log(sel.stage_density)))
            plan = [mcount * (k / mcount) ** (j / rest) for j in range(1, rest + 1)]
        else:
            plan = plan[stage:]
        # The candidate phase: each stage's fit is one pass over the candidates' values (|v|
        # inside), each refinement count another, and the kept ones are taken by ``finish``
        # (the same work as NumPy array operations costs as much as the selection pass itself).
        last_base, last_moments, last_density = threshold, None, None
        candidates = moments_of(values) if stride == 1 else Weighted(moments_of(values), stride)
        for target in plan:
            stage += 1
            moments = candidates(threshold, squares)
            density = min(target / max(moments[0], 1.0), 1.0)
            last_base, last_moments, last_density = threshold, moments, density
            threshold = threshold + fitted_excess_host(sel.stage_dist(stage), moments, density)
        if adaptive and sel.refine > 0:
            threshold = self.refine_threshold(candidates.count_at_least, k, threshold, last_base,
                                              last_moments, last_density, sel.stage_dist(stage))
        self.stages_fitted = stage
        return finish(gathered, max(threshold, float(TINY)))

    def refine_threshold(self, count, k: float, threshold: float, base: float, moments,
                         density: float, dist: str) -> float:
        """The device fits' refinement (``sidco_device.DeviceFits.refine``) with host scalars: it
        stops at the first round within tolerance, where the torch version's later rounds leave
        everything unchanged, and bisects the log density once one round has kept too few and
        another too many; ``count(t)`` counts the entries at or above ``t``."""
        sel = self.selector
        few, many = k * (1.0 - sel.tolerance), k * (1.0 + sel.tolerance)
        log_k = math.log(k)
        log_d = math.log(max(density, 1e-300))
        prev_log_d = prev_log_kept = None
        too_few = too_many = None   # the log densities seen keeping fewer / more than k
        for _ in range(sel.refine):
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
                # density and then jumps (a mass of magnitudes near 0 below an exponential tail,
                # as in real gradients).
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


def tiling_sample_size(n: int) -> int:
    """About ``_HOST_SAMPLE`` (at most), so that its strata (``n // size`` entries each) tile all
    ``n`` entries but fewer than a stratum's.  With ``_HOST_SAMPLE`` itself the last
    ``n mod 8192`` entries would never be sampled: up to a third of a payload of multi-level
    compression, whose entries come in position order (the last layers' magnitudes)."""
    if n <= _HOST_SAMPLE:
        return n
    return n // -(-n // _HOST_SAMPLE)


class NumpyMoments:
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


class Weighted:
    """Moments and counts of every ``stride``-th candidate, weighed up to all of them."""

    def __init__(self, moments, stride: int):
        self._moments, self._stride = moments, stride

    def __call__(self, threshold, squares: bool = True):
        return tuple(v * self._stride for v in self._moments(threshold, squares))

    def count_at_least(self, threshold) -> float:
        return self._moments.count_at_least(threshold) * self._stride


def fit_stride(count: int, limit: Optional[int] = None) -> int:
    """Every how many-th candidate the candidate phase fits and counts: all of them up to
    ``limit`` (``_CANDIDATE_FITS``; on accelerators ``_DEVICE_CANDIDATE_FITS``).
    Each fit and refinement count is a pass over them on the host (about ten a call), and on an
    accelerator they are first copied there, so on large tensors they would be most of SIDCo's
    time.  65536 of them still hold thousands of kept entries (a count within ~1 %, inside the
    5 % tolerance); 32768 still hold a count within ~1.5 %."""
    return max(1, -(-count // (limit or _CANDIDATE_FITS)))


def moments_of(x: np.ndarray):
    return native.MomentsOf(x) if native.usable(x) else NumpyMoments(x)
