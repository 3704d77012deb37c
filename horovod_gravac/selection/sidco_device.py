"""SIDCo on a tensor off the CPU host path (an accelerator's, or the CPU's without the native
kernels): the two places its fits can run, ``SIDCoSelector(device_fits=...)``.

* :class:`HostFits` (``"host"``, the default): the tensor's passes and gathers stay on its
  device; the stage-1 sample (8192 entries at uniform positions, one ``randint``) and, with a
  candidate phase, the candidates' magnitudes (every ``stride``-th beyond 32768 of them) are
  copied to the host once each, and every fit, count and refinement round runs there on Python
  scalars, exactly as the CPU host path's (:class:`~.sidco_host.HostStages`).  7 tensor operations
  a call at CF 10, 11-15 with a candidate phase (on a GPU a call's time at bucket sizes follows
  that count).  When every candidate's magnitude is on the host the kept ones are picked there
  and only their positions go back.  Host synchronisations: one or two copies to the host, one
  ``nonzero``, and the final ``nonzero`` or the upload of the kept positions: at most four.
* :class:`DeviceFits` (``"device"``): every stage and refinement round is a fixed sequence of
  tensor operations over the candidates, masked by the stage's base, so thresholds and counts
  stay on the device: at most two host synchronisations (the candidate gather and the final
  selection, both ``nonzero``; one at low CFs).  That is 560-2300 small tensor operations a
  call (exponential / generalised Pareto / gamma), each a kernel launch on a GPU, several
  times exact Top-k's time where the passes themselves take a fraction of a millisecond.  It
  stays as the option for hardware where a synchronisation costs more than hundreds of
  launches.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from . import sidco_host
from .fits import excess_moments, fitted_excess
from .kernels import TINY, _work_dtype, abs_for_reuse, exceedance_moments, select_abs_at_least
from .sampling import stratified_abs_sample, uniform_abs_sample
from .sidco_host import HostStages, fit_stride

# Stage 1 of the device fits fits this many stratified samples (it aims at a density of 1/4:
# ~16k excesses).
_FIRST_SAMPLE = 1 << 16


def _to_host(t: torch.Tensor) -> np.ndarray:
    """A device tensor's values (never part of a graph) as a float32 host array (float64 for
    moments): one device-to-host copy, a synchronisation on an accelerator (tests count the calls)."""
    return t.cpu().numpy() if t.dtype in (torch.float64, torch.float32) else t.float().cpu().numpy()


class HostFits:
    """Fits on the host for a device tensor (see the module docstring)."""

    def __init__(self, selector):
        self.selector = selector
        self.stages = HostStages(selector)

    def select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        """The device tensor's passes and gathers stay on its device; the sample and the
        candidates are copied to the host once each (``_to_host``), and every fit, count and
        refinement round runs there (:class:`~.sidco_host.HostStages`).  Host synchronisations: the
        sample copy, the final ``nonzero`` (or the upload of the kept positions), and with a
        candidate phase the candidate ``nonzero`` and copy: at most four (plus one per
        streaming-pass fit, which only a tensor below 512K entries can need, as on the CPU host
        path)."""
        n = flat.numel()
        squares = self.selector.distribution != "exponential"
        # |x| once, for the sample and every gather, where that saves operations (on a GPU a
        # call's time follows their count); None on the CPU.
        a = abs_for_reuse(flat)
        s = min(n, sidco_host._HOST_SAMPLE)
        if s < n:
            sample = _to_host(uniform_abs_sample(flat, s, self.selector._generators(flat.device), a))
        else:
            sample = _to_host(_work_dtype(flat).abs() if a is None else a)

        def pass_moments(threshold):
            moments = exceedance_moments(flat, torch.tensor(threshold, dtype=torch.float64), squares)
            return tuple(_to_host(moments).tolist())

        def gather(threshold, expected, final):
            idx, mag = select_abs_at_least(flat, threshold, expected / n, not final, abs_flat=a)
            if final:
                return idx, None, 1
            stride = fit_stride(mag.numel(), sidco_host._DEVICE_CANDIDATE_FITS)
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

        return self.stages.select(n, k, sample, pass_moments, gather, finish, count=lambda c: c[0].numel())


class DeviceFits:
    """Fits on the device (see the module docstring).  Cost: a 64k sample, one statistics pass
    per large stage (one at CF 10, two at CF 100 and 1000 with the defaults), one selection
    pass, then work proportional to the candidates."""

    def __init__(self, selector):
        self.selector = selector
        self.stages_fitted = 0   # of the last call

    def select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        sel = self.selector
        n = flat.numel()
        dev = flat.device
        squares = sel.distribution != "exponential"
        plan = sel.plan(n, k)
        adaptive = sel.stages is None
        # -- stage 1: fit a stratified sample ---------------------------------------------------
        # Its threshold only decides where stage 2 starts: stage 2 onwards fit exact statistics
        # of the whole tensor and aim at planned counts from actual counts.
        s = min(n, _FIRST_SAMPLE)
        sample = stratified_abs_sample(flat, s, sel._generators(dev))
        base = sample.amin().double()                         # 0 when zeros are present
        moments = excess_moments(sample, base, squares)       # zeros and the minimum left out
        scale = n / s
        stage = 1
        density = (plan[0] / (moments[0] * scale).clamp(min=1.0)).clamp(max=1.0)
        last = (base, moments, density)        # the last stage's base, moments and density
        threshold = base + fitted_excess(sel.stage_dist(1), moments, density)
        if adaptive and sel.refine > 0:
            # A heavy tail can put stage 1 far off its planned count, and no later stage can
            # go below it: correct it on the sample's own counts (~16k kept entries).
            threshold = self.refine(sample, plan[0] / scale, threshold, *last, sel.stage_dist(1))
        # -- stages fitted from streaming passes over the whole tensor --------------------------
        while stage < len(plan) and plan[stage - 1] > sel.compact_density * n:
            moments = exceedance_moments(flat, threshold, squares)
            target = plan[stage]
            stage += 1
            density = (target / moments[0].clamp(min=1.0)).clamp(max=1.0)
            last = (threshold, moments, density)
            threshold = threshold + fitted_excess(sel.stage_dist(stage), moments, density)
        if stage == len(plan):   # reached k without a candidate phase (low CFs)
            if adaptive and sel.refine > 0 and k * s / n >= sidco_host._SAMPLE_REFINE_HITS:
                # No candidates to count exactly: refine on the stage-1 sample's counts,
                # which at these densities hold thousands of kept entries.
                threshold = self.refine(sample, k * s / n, threshold, *last, sel.stage_dist(stage))
            self.stages_fitted = stage
            idx, _ = select_abs_at_least(flat, threshold.clamp(min=TINY), k / n, False)   # sync 1
            return idx
        # -- candidate phase ------------------------------------------------------------------
        cand_idx, cand = select_abs_at_least(flat, threshold.clamp(min=TINY),
                                             plan[stage - 1] / n)                        # sync 1
        mcount = cand.numel()
        if mcount <= k:
            self.stages_fitted = stage
            return cand_idx
        if adaptive:   # re-plan the remaining stages from the actual candidate count
            rest = max(1, math.ceil(math.log(k / mcount) / math.log(sel.stage_density)))
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
            threshold = threshold + fitted_excess(sel.stage_dist(stage), moments, density)
        if adaptive and sel.refine > 0:
            threshold = self.refine(values, k, threshold, last_base, last_moments, last_density,
                                    sel.stage_dist(stage))
        self.stages_fitted = stage
        keep = torch.nonzero(cand >= threshold.to(cand.dtype)).view(-1)          # sync 2
        return cand_idx.index_select(0, keep)

    def refine(self, values: torch.Tensor, k: float, threshold: torch.Tensor, base: torch.Tensor,
               moments: torch.Tensor, density: torch.Tensor, dist: str) -> torch.Tensor:
        """``refine`` sync-free correction rounds of the last stage (see ``sidco.py``).

        The last stage's fit (its base and excess moments) is kept; only the density it is
        asked for moves, by secant steps on ``ln(kept)`` against ``ln(density)`` (the first
        step assumes proportionality), until the exact kept count over the candidates is
        within tolerance.  ``values`` holds every candidate above ``base``.
        """
        sel = self.selector
        few, many = k * (1.0 - sel.tolerance), k * (1.0 + sel.tolerance)
        log_k = math.log(k)
        log_d = torch.log(density)
        prev_log_d = prev_log_kept = None
        for _ in range(sel.refine):
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
