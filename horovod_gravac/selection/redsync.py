"""RedSync: binary search of a threshold between mean(|g|) and max(|g|).

RedSync (Fang et al., 2019) looks for ``thr = mean + r * (max - mean)`` with a
binary search on ``r`` until the number of entries with ``|g| >= thr`` lands near
``k``.  The search must move the right way: too *few* kept means the threshold is
too high and must come *down* (``hi = mid``); too many means it must go up
(``lo = mid``).  Public implementations raise it when too few are kept.

Counting ``|g| >= thr`` over the whole tensor at every step costs a pass per step
(the public implementations measured 7-8 streaming passes).  Here each step
counts exactly but over a *candidate set* only:

1. a stratified random sample brackets the k-th magnitude: ``floor`` (a sample
   quantile a few standard deviations *below* it, so ``|g| >= floor`` holds at
   least ``k`` entries with overwhelming probability) and ``ceil`` (a few standard
   deviations above it);
2. one selection pass keeps the candidates ``|g| >= floor``; ``max(|g|)`` is their
   maximum;
3. the binary search runs on ``[floor, min(max, ceil)]``, the part of RedSync's
   ``[mean, max]`` that the sample brackets, with exact counts over the candidates.
   Between the mean and ``floor`` every count is at least the candidate count, so
   every step the search could take there would be "too many, go up": starting at
   ``floor`` skips exactly those steps (the mean itself is therefore never needed
   and not computed).  If the sample's bracket is wrong on the high side (``ceil``
   still keeps too many) the upper end goes back to ``max``.  When the k-th
   magnitude lies below the mean (low CFs such as 2x on Laplace data) ``floor`` is
   below the mean too and the search goes there, instead of stopping at the mean
   and keeping too few as the original would;
4. the search stops moving once the count is within ``tolerance`` of ``k``.

At low CFs (when the sample expects at least 10,000 entries above the threshold, e.g.
CF <= 25 for 25M entries with the defaults) gathering the >= k candidates would cost
as much as the final selection, while the sample's counts are already within ~1 % of
the exact ones; there the search counts on the sample (scaled) and one selection pass
follows.

The steps are a fixed number of tensor operations with no host synchronisation
(the "done" state is carried in the bounds: once within tolerance ``lo = hi = mid``).
On accelerators they are resolved together rather than one by one: every midpoint the
steps could visit is counted with one sort and one ``searchsorted``, and the bisection's
outcome is read off the counts, bit for bit the same (:func:`redsync_search`).  On a GPU the
kernel launches, not the arithmetic, set the search's time: 7 steps took 99 tensor
operations one by one, 38 together.  The CPU keeps the steps (the sort costs more there).

Host synchronisations per ``select``: two (the candidate ``nonzero`` and the final
``nonzero`` over the candidates); one at low CFs.

CPU host path (float32 with the native kernels): the same steps with host scalars.  The
sample is the size Top-k's CPU path uses, ``(k n)^(1/3)`` clamped to 2048-65536 (a
proportional 1 % sample costs more than the selection at bucket sizes), so the bracket
is wider at high CFs, which only adds candidates (a few thousand at CF 1000); the
search's counts stay exact.  The search then runs in the native kernel ``hg_redsync``: one
pass over the candidates (AVX2 where the CPU has it) counts those above the bracket and
records the magnitudes of the others, and each step counts the recorded ones in one
vectorised pass, with the same counts and the same moves as :func:`redsync_search`.  (An
earlier version narrowed the recorded set step by step and recorded it with scalar code:
RedSync then cost 1.12-1.19x exact Top-k at CF 10.)
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from .. import native
from .base import check_count, check_fraction
from .kernels import TINY, select_abs_at_least
from .sampling import (host_abs_sample, host_rank_value, host_sample_size, sample_quantile, sample_quantiles,
                       sample_size, stratified_abs_sample)
from .threshold import ThresholdSelector
from .topk import sample_size as topk_sample_size

# Width of the sampled bracket, in standard deviations of the sampled count.
_BRACKET_SIGMAS = 4.0
# Search on the sample's counts when it expects at least this many kept entries (error <= 1 %).
_SAMPLE_COUNT_HITS = 10_000


def redsync_search(values: torch.Tensor, k: int, lo: torch.Tensor, hi: torch.Tensor,
                   steps: int, tolerance: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """Binary search of a threshold in ``[lo, hi]`` keeping about ``k`` of ``values``.

    ``values`` (non-negative; NaN never counts as kept) must hold every entry the threshold
    could keep (all entries ``> lo``).  Each step: ``mid = (lo + hi) * 0.5``,
    ``count = #(values > mid)``; ``count < k (1 - tolerance)`` -> too few kept -> ``hi = mid``
    (lower the threshold); ``count > k (1 + tolerance)`` -> too many -> ``lo = mid`` (raise
    it); otherwise done: ``lo = hi = mid`` and later steps leave it there.
    Returns the final bounds ``(lo, hi)``; the threshold is ``lo`` (keep ``values > lo``):
    ``mid`` when done, else the highest bound known to keep more than ``k``.

    On accelerators the steps are not taken one by one: every midpoint that ``m`` steps
    could visit is made at once (``2^m - 1`` of them, by the same ``(a + b) * 0.5`` as the
    steps, so bit for bit the same values), all are counted with one ``searchsorted`` in the
    sorted values, and the steps' outcome is read off the counts (:func:`_walk`).  A step
    costs about 14 tensor operations, each a kernel launch on a GPU; there ``m`` steps cost
    one sort and about ``2 m + 24``.  On the CPU, where an operation costs what it computes,
    the steps are taken one by one (the sort cost 2.4-2.6x the steps at CF 10).  Both give
    the same bounds.  No host synchronisation.
    """
    few, many = k * (1.0 - tolerance), k * (1.0 + tolerance)
    lo = lo.to(values.dtype)
    hi = hi.to(values.dtype)
    if steps <= 0:
        return lo, hi
    # NaN is never above a threshold (as in the native search); magnitudes are >= 0.
    values = torch.nan_to_num(values, nan=0.0)
    if not _resolves(values):
        scratch = torch.empty_like(values)
        for _ in range(steps):
            mid = (lo + hi) * 0.5
            # count of values > mid: sub, clamp, sign, sum (cheaper than count_nonzero(values > mid))
            count = torch.sub(values, mid, out=scratch).clamp_(min=0).sign_().sum()
            too_few = count < few
            too_many = count > many
            done = ~(too_few | too_many)
            hi = torch.where(too_few | done, mid, hi)
            lo = torch.where(too_many | done, mid, lo)
        return lo, hi
    ordered = torch.sort(values).values
    while steps > 0:
        levels = min(steps, _LEVELS_PER_ROUND)
        steps -= levels
        lo, hi = _walk(ordered, few, many, lo, hi, levels)
    return lo, hi


def _resolves(values: torch.Tensor) -> bool:
    """Whether :func:`redsync_search` resolves its steps together (accelerators) or takes them
    one by one (CPU).  (Tests patch it to run either branch.)"""
    return values.device.type != "cpu"


# Steps resolved per round of redsync_search: a grid of 2^10 + 1 points.
_LEVELS_PER_ROUND = 10
_COARSENESS: Dict[Tuple[int, str], torch.Tensor] = {}


def _coarseness(size: int, device) -> torch.Tensor:
    """``j & -j`` for ``j = 1..size-1`` (the lowest set bit: larger on coarser levels), kept per device."""
    key = (size, str(device))
    if key not in _COARSENESS:
        j = torch.arange(1, size, device=device)
        _COARSENESS[key] = j & -j
    return _COARSENESS[key]


def _walk(ordered: torch.Tensor, few: float, many: float, lo: torch.Tensor, hi: torch.Tensor,
          levels: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``levels`` steps of :func:`redsync_search`'s bisection over the sorted values, resolved together."""
    size = 1 << levels
    grid = torch.empty(size + 1, dtype=ordered.dtype, device=ordered.device)
    grid[0], grid[size] = lo, hi
    half = size // 2
    while half:   # the midpoints each further step could visit, coarsest first
        torch.add(grid[:-half:2 * half], grid[2 * half::2 * half], out=grid[half::2 * half]).mul_(0.5)
        half //= 2
    # #(values > grid[j]) for the interior points j = 1..size-1, from the sorted values
    # (a histogram by atomic adds was slower on a GPU: the values crowd into a few bins)
    at_or_below = torch.searchsorted(ordered, grid[1:size], right=True)
    above = ordered.numel() - at_or_below
    too_many, too_few = above > many, above < few
    done = ~(too_many | too_few)
    # Counts fall as j grows: too many, then done, then too few.  The bisection stops at the
    # first done point it visits: the one of the coarsest level (most trailing zero bits of j).
    coarseness = _coarseness(size, ordered.device)
    stop = torch.where(done, coarseness, torch.zeros_like(coarseness)).argmax() + 1
    last_many = too_many.sum()                                # grid index of the last too-many point
    first_few = last_many + done.sum() + 1                    # ... of the first too-few point
    # (index_select: indexing with a 0-dim tensor would read it on the host)
    picked = grid.index_select(0, torch.stack([stop, last_many, first_few]))
    any_done = done.any()
    return torch.where(any_done, picked[0], picked[1]), torch.where(any_done, picked[0], picked[2])


class RedSyncSelector(ThresholdSelector):
    """Binary-search a threshold between ``mean(|g|)`` and ``max(|g|)`` until ``~k`` entries pass.

    Args:
        cf: compression factor (target ``numel / kept``).
        tolerance: the search stops once the kept count is within ``k * (1 +- tolerance)``.
        sample_ratio, min_sample_hits: size of the stratified sample that brackets the
            search (as for :class:`~.dgc.DGCSelector`; ``sample_ratio=None``: fixed size on the
            CPU host path, 1 % elsewhere); only the candidate set depends on it,
            the counts of the search are exact (except at low CFs, see above).
        max_steps: upper bound on binary-search steps.
        seed: seed of the private per-device generators (see ``set_step``).

    Host synchronisations per ``select``: two (one at low CFs).  Cost: a sample gather,
    one selection pass, then ``steps`` counts over about ``k`` candidates,
    ``steps ~ log2(bracket width / tolerance) + 2``.
    """

    def __init__(self, cf: float = 100.0, tolerance: float = 0.02, sample_ratio: Optional[float] = None,
                 min_sample_hits: int = 400, max_steps: int = 40, seed: int = 0):
        super().__init__(cf, seed)
        self.tolerance = check_fraction(tolerance, "tolerance", 0.0, 0.5)
        self.sample_ratio = None if sample_ratio is None else check_fraction(sample_ratio, "sample_ratio")
        self.min_sample_hits = check_count(min_sample_hits, "min_sample_hits")
        self.max_steps = check_count(max_steps, "max_steps")
        self.last_steps = 0

    def _select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        n = flat.numel()
        ratio = 0.01 if self.sample_ratio is None else self.sample_ratio
        s = sample_size(n, k, ratio, self.min_sample_hits)
        sample = stratified_abs_sample(flat, s, self._generators(flat.device))
        hits = s * k / n                          # sampled entries expected above the k-th magnitude
        spread = _BRACKET_SIGMAS * math.sqrt(hits) + 2.0
        if s >= n:   # the "sample" is the whole tensor: its quantile is exact
            floor = ceil = sample_quantile(sample, n, k)
        else:
            floor, ceil = sample_quantiles(sample, s, [hits + spread, max(hits - spread, 1.0)])
        floor = floor.clamp(min=TINY)
        if s < n and hits >= _SAMPLE_COUNT_HITS:
            # Low CF: gathering >= k candidates would cost as much as the selection itself,
            # while the sample already pins every count to ~1/sqrt(hits) <= 1 %: search on
            # the sample's counts, then select once.
            steps = self._steps(spread, hits)
            self.last_steps = steps
            thr, _ = redsync_search(sample, hits, floor, ceil, steps, self.tolerance)
            idx, _ = select_abs_at_least(flat, thr.clamp(min=TINY), k / n, magnitudes=False)   # sync 1
            return idx
        cand_idx, cand = select_abs_at_least(flat, floor, (hits + spread) / s)   # sync 1
        if cand.numel() <= k * (1.0 + self.tolerance):
            # Everything at or above the floor: within tolerance, or (rarely) the floor
            # overshot and no threshold the candidates can express keeps more.
            self.last_steps = 0
            return cand_idx
        vmax = cand.max()
        lo = floor.to(cand.dtype)
        hi = torch.minimum(vmax, ceil.to(cand.dtype))
        # A sampled upper end that still keeps too many entries: search up to max instead.
        hi = torch.where(torch.count_nonzero(cand > hi) > k * (1.0 + self.tolerance), vmax, hi)
        lo = torch.minimum(lo, hi)
        steps = self._steps(spread, hits)
        self.last_steps = steps
        thr, _ = redsync_search(cand, k, lo, hi, steps, self.tolerance)
        keep = torch.nonzero(cand > thr).view(-1)                  # sync 2
        return cand_idx.index_select(0, keep)

    def _steps(self, spread: float, hits: float) -> int:
        width = 2.0 * spread / max(hits, 1.0)      # relative bracket width in counts
        return min(self.max_steps, int(math.ceil(math.log2(max(width / self.tolerance, 1.0)))) + 2)

    def _select_host(self, x: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        n = x.size
        # Top-k's sample size: it balances the sample's random reads against surplus candidates
        # (the counts of the search are exact whatever the bracket); raised to sample_ratio * n
        # when a ratio is given.
        s = topk_sample_size(n, k)
        if self.sample_ratio is not None:
            s = max(s, host_sample_size(n, k, self.min_sample_hits, self.sample_ratio))
        s = min(n, s)
        sample = host_abs_sample(x, s, self._host_generator())
        hits = s * k / n
        spread = _BRACKET_SIGMAS * math.sqrt(hits) + 2.0
        few, many = k * (1.0 - self.tolerance), k * (1.0 + self.tolerance)
        if s >= n:   # the "sample" is the whole tensor: its quantile is exact
            floor = ceil = host_rank_value(sample, k)
        else:
            ceil = host_rank_value(sample, int(round(max(hits - spread, 1.0))))
            floor = host_rank_value(sample, int(round(hits + spread)))
        floor = max(floor, float(TINY))
        if s < n and hits >= _SAMPLE_COUNT_HITS:
            # Low CF with a large sample (an explicit sample_ratio): search on its counts.
            steps = self._steps(spread, hits)
            self.last_steps = steps
            lo, hi = redsync_search(torch.from_numpy(sample), hits, torch.tensor(floor), torch.tensor(ceil),
                                    steps, self.tolerance)
            return native.select(x, max(float(lo), float(TINY)), False, int(k * 1.25) + 64, k)
        expected = int(math.ceil((hits + spread + 6.0 * math.sqrt(hits + spread) + 16.0) * n / s)) \
            if s < n else k + 64
        idx, val = native.select(x, floor, False, expected, (hits + spread) * n / s if s < n else k)
        if idx.size <= many:
            self.last_steps = 0
            return idx, val
        steps = self._steps(spread, hits)
        self.last_steps = steps
        idx, val, _ = native.redsync_search(idx, val, floor, ceil, few, many, steps)
        return idx, val
