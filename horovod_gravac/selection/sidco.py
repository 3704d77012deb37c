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

With the defaults, CF 10 costs a sample, one statistics pass and the selection pass; CF 100
and 1000 cost a sample, two statistics passes, the candidate gather (at ~1.6 % density) and
work proportional to the candidates.

One algorithm, three implementations, chosen per call by :class:`SIDCoSelector`:

* ``sidco_host.py``: the stages on host scalars (:class:`~.sidco_host.HostStages`), for the CPU
  host path (float32 with the native kernels; its stage-1 sample is 8192 entries, its stages
  before the candidate phase are fitted on that sample rather than on streaming passes, and
  its fits and counts are native passes) and for the accelerators' default host fits;
* ``sidco_native.py``: the same host stages in C (:class:`~.sidco_native.NativeStages`), what
  the CPU host path runs unless ``_NATIVE_STAGES`` is off;
* ``sidco_device.py``: tensors off the CPU host path, fitted on the host
  (:class:`~.sidco_device.HostFits`, ``device_fits="host"``) or on the device
  (:class:`~.sidco_device.DeviceFits`, ``device_fits="device"``).
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import numpy as np
import torch

from .base import check_count, check_fraction
from .fits import DISTRIBUTIONS
from .sampling import host_abs_sample
from .sidco_device import DeviceFits, HostFits
from .sidco_host import HostStages, tiling_sample_size
from .sidco_native import NativeStages
from .threshold import ThresholdSelector

# The CPU host path runs its stages in C (``sidco_native``) rather than in Python
# (``sidco_host``): the same selection.  Tests and benchmarks turn it off to run the Python
# version on the same inputs.
_NATIVE_STAGES = True


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
            kernel launch on a GPU (see ``sidco_device.py``).

    After a call, ``last_stages`` is the number of stages fitted and ``last_passes`` the
    streaming passes over the tensor that fitted one (host fits).
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
        self._host_stages, self._native_stages = HostStages(self), NativeStages(self)
        self._host_fits, self._device_fits = HostFits(self), DeviceFits(self)

    def repr_args(self) -> str:
        return (f"cf={self.cf:g}, distribution={self.distribution!r}, stages={self.stages!r}, "
                f"device_fits={self.device_fits!r}")

    def stage_dist(self, stage: int) -> str:
        """The distribution fitted at ``stage`` (1-based)."""
        return "gpareto" if self.distribution == "gamma" and stage > 1 else self.distribution

    def plan(self, n: int, k: int) -> List[float]:
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
        """Off the CPU host path (an accelerator's tensor, or the kernels not built or off):
        fitted where ``device_fits`` says."""
        if self.device_fits == "device":
            idx = self._device_fits.select(flat, k)
            self.last_stages = self._device_fits.stages_fitted
            return idx
        return self._recorded(self._host_fits.stages, self._host_fits.select(flat, k))

    def _select_host(self, x: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """The CPU host path: ``(idx, val)`` (int32, float32) of a float32 array, from a sample
        of about 8192 entries that tiles it (``sidco_host.tiling_sample_size``)."""
        sample = host_abs_sample(x, tiling_sample_size(x.size), self._host_generator())
        stages = self._native_stages if _NATIVE_STAGES else self._host_stages
        return self._recorded(stages, stages.select_array(x, k, sample))

    def _recorded(self, stages, selection):
        self.last_stages, self.last_passes = stages.stages_fitted, stages.passes
        return selection
