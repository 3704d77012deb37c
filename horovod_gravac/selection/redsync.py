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
4. the search stops moving once the count is within ``tolerance`` of ``k``;
5. when many magnitudes share the value at the k-th rank (a constant or value-clipped
   gradient), no threshold keeps a count within tolerance: then the ``k`` largest are kept,
   the earliest of the tie first (``_fill_ties``), on every path, instead of none of the
   bucket (which error feedback would then hold for good) or the whole tie.

At low CFs (when the sample expects at least 10,000 entries above the threshold, e.g.
CF <= 25 for 25M entries with the defaults) gathering the >= k candidates would cost
as much as the final selection, while the sample's counts are already within ~1 % of
the exact ones; there the search counts on the sample (scaled) and one selection pass
follows.

On the CPU's torch path the steps are a fixed number of tensor operations with no host
synchronisation (the "done" state is carried in the bounds: once within tolerance
``lo = hi = mid``).

Accelerators (:meth:`RedSyncSelector._select_on_device`) take a path of their own, built from
the fewest operations: on a GPU a call's time at bucket sizes follows its operation count
(10-25 us of the host's time each), not its arithmetic or its copies.  The search runs on the host from one copy of the order
statistics that decide its steps, on ``[T_many, max]`` (``T_many`` the magnitude of rank
``floor(k (1 + tolerance)) + 1``: every midpoint below it would only raise the lower end), over
the candidates of a 16384-entry uniform sample's floor, sorted once; the kept entries are the
first of that order, so their set is what a full sort would decide.  At low CFs (up to ~13) it
counts on a 131072-entry sample instead, and one ``nonzero`` selects.  About 15 operations a
call, two host synchronisations: about exact Top-k's time at CF 100 and 1000 on an H100.
(Resolving the steps on the device, with one ``searchsorted`` over every midpoint they could
visit, or with fixed buffers read back in one copy, takes more operations and 1.3-3x the time.)

Host synchronisations per ``select``: on the CPU's torch path two (the candidate ``nonzero``
and the final ``nonzero`` over the candidates), one at low CFs; on accelerators two (a
``nonzero`` and one copy to the host).

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
from typing import Optional, Tuple

import numpy as np
import torch

from .. import native
from .base import check_count, check_fraction
from .kernels import _ROUNDING, TINY, _work_dtype, largest_positions, select_abs_at_least
from .sampling import (host_abs_sample, host_rank_value, host_sample_size, margin_rank, sample_quantile,
                       sample_quantiles, sample_size, stratified_abs_sample, uniform_abs_sample)
from .threshold import ThresholdSelector
from .topk import sample_size as topk_sample_size

# Width of the sampled bracket, in standard deviations of the sampled count.
_BRACKET_SIGMAS = 4.0
# Search on the sample's counts when it expects at least this many kept entries (error <= 1 %).
_SAMPLE_COUNT_HITS = 10_000
# Accelerators: the sample that places the candidates' floor.  Its sort is one of the call's
# larger kernels, and 16384 already hold 167 entries above the floor's rank at CF 100 (4 sigma:
# ~1.3x the entries the search needs become candidates; ~1.1x at CF 10, ~2x at CF 1000).
_DEVICE_SAMPLE = 1 << 14
# Accelerators, low CFs: the sample whose counts the search runs on (as exact Top-k's device sample).
_DEVICE_COUNT_SAMPLE = 1 << 17
# Accelerators: up to this many of the candidates' largest magnitudes are copied in one slice;
# beyond, only the maximum and the ranks the search and the count need (a 25M-entry tensor at CF
# 100 would otherwise copy 1 MB).
_DEVICE_PREFIX = 1 << 15


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

    On the CPU the steps run as tensor operations, one by one: no host synchronisation.  On
    accelerators, where every operation is a kernel launch and launches, not arithmetic, set
    the time (a step is about 14 of them), the values are sorted once and the steps run on
    the host (:func:`_bisect_on_host`) from two of their order statistics, which decide every
    step's count exactly: one sort, one copy of four scalars (a host synchronisation) and no
    launch per step.  Both give the same bounds, bit for bit; on accelerators they come back
    as 0-dim CPU tensors (a device operation takes them as scalars, with no copy).
    """
    few, many = k * (1.0 - tolerance), k * (1.0 + tolerance)
    lo = lo.to(values.dtype)
    hi = hi.to(values.dtype)
    if steps <= 0:
        return lo, hi
    # NaN is never above a threshold (as in the native search); magnitudes are >= 0.
    values = torch.nan_to_num(values, nan=0.0)
    if _resolves(values):
        lo, hi, above_many, above_few = _fetch(torch.sort(values).values, few, many, lo, hi)
        return _as_scalars(_bisect_on_host(lo, hi, above_many, above_few, steps, values.dtype), values.dtype)
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


def _resolves(values: torch.Tensor) -> bool:
    """Whether :func:`redsync_search` runs its steps on the host from sorted values
    (accelerators) or as tensor operations one by one (CPU).  (Tests patch it to run either
    branch.)"""
    return values.device.type != "cpu"


def _fetch(ordered: torch.Tensor, few: float, many: float, *scalars: torch.Tensor) -> list:
    """``scalars`` and the two order statistics that decide every count of the bisection, as
    host numbers of ``ordered``'s dtype, in one copy (the one host synchronisation).

    ``ordered`` holds the values sorted ascending (``m`` of them).  For any threshold ``t``,
    ``#(values > t) > many`` exactly when ``t`` lies below the ``(floor(many) + 1)``-th largest
    value (``above_many``), and ``#(values > t) < few`` exactly when ``t`` is at or above the
    ``ceil(few)``-th largest (``above_few``).  Ranks outside ``1..m`` stand for -inf (never
    too many; always too few) or +inf (never too few)."""
    m = ordered.numel()
    many_rank, few_rank = math.floor(many) + 1, math.ceil(few)
    picks = [t.to(ordered.device, ordered.dtype).reshape(()) for t in scalars]
    if m:
        picks += [ordered[m - min(many_rank, m)], ordered[m - min(max(few_rank, 1), m)]]
    host = torch.stack(picks).cpu().tolist() if picks else []
    if not m:   # no values: every count is 0 (placeholders, replaced below)
        host += [0.0, 0.0]
    if many_rank > m:
        host[-2] = -math.inf
    if few_rank <= 0:
        host[-1] = math.inf
    elif few_rank > m:
        host[-1] = -math.inf
    return host


def _bisect_on_host(lo: float, hi: float, above_many: float, above_few: float, steps: int,
                    dtype: torch.dtype = torch.float32) -> Tuple[float, float]:
    """:func:`redsync_search`'s steps on host numbers: ``too many`` is ``mid < above_many``,
    ``too few`` is ``mid >= above_few`` (see :func:`_fetch`).  The midpoints are rounded to
    ``dtype`` as the device computes them, so the bounds are the device's bit for bit."""
    return _bisect_counting_steps(lo, hi, above_many, above_few, steps, dtype)[:2]


def _bisect_counting_steps(lo: float, hi: float, above_many: float, above_few: float, steps: int,
                           dtype: torch.dtype) -> Tuple[float, float, int]:
    """:func:`_bisect_on_host`, and how many steps it took."""
    rounded = _ROUNDING.get(dtype)
    if rounded is None:   # no NumPy scalar type rounds like it: 0-dim CPU tensors (slower)
        rounded = lambda v, dt=dtype: torch.tensor(v, dtype=dt)   # noqa: E731
    lo, hi, half = rounded(lo), rounded(hi), rounded(0.5)
    taken = 0
    for taken in range(1, steps + 1):
        mid = (lo + hi) * half
        if mid < above_many:      # too many kept: raise the threshold
            lo = mid
        elif mid >= above_few:    # too few kept: lower it
            hi = mid
        else:                     # within tolerance (or NaN): done
            lo = hi = mid
            break
    return float(lo), float(hi), taken


def _as_scalars(bounds: Tuple[float, float], dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    return tuple(torch.tensor(b, dtype=dtype) for b in bounds)


def _bracketed_search(cand: torch.Tensor, k: int, floor: torch.Tensor, ceil: torch.Tensor, steps: int,
                      tolerance: float) -> torch.Tensor:
    """The threshold of RedSync's search over the candidates (every entry ``>= floor``):
    on ``[floor, min(max, ceil)]``, or up to ``max`` when the sampled ``ceil`` still keeps too
    many.  (The CPU's torch path; accelerators search in ``_select_on_device``.)"""
    many = k * (1.0 + tolerance)
    vmax = cand.max()
    lo = floor.to(cand.dtype)
    hi = torch.minimum(vmax, ceil.to(cand.dtype))
    # A sampled upper end that still keeps too many entries: search up to max instead.
    hi = torch.where(torch.count_nonzero(cand > hi) > many, vmax, hi)
    lo = torch.minimum(lo, hi)
    return redsync_search(cand, k, lo, hi, steps, tolerance)[0]


def _fill_ties(mags: torch.Tensor, thr: float, k: int) -> torch.Tensor:
    """Positions in ``mags`` of the ``k`` largest at or above ``thr``, the earliest of a tie first
    (all of them when fewer), ascending.

    RedSync keeps ``|g| > thr``.  When many magnitudes share the value at the k-th rank (a
    gradient clipped by value, quantised, or constant), no threshold keeps a count within
    tolerance: the search ends keeping those above the tie, often none (the bucket would never
    be sent, and error feedback would hold it for good), or the whole tie (many times ``k``).
    Then the k largest are kept, the earliest of the tie first, as exact Top-k and DGC's surplus
    drop do.  With no tie the exact counts always end within tolerance."""
    at = torch.nonzero(mags >= thr).view(-1)
    if at.numel() <= k:
        return at
    return at.index_select(0, largest_positions(mags.index_select(0, at), k))


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

    Host synchronisations per ``select``: two (one at low CFs on the CPU's torch path).  Cost: a
    sample gather,
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
        if _resolves(flat):   # accelerators
            return self._select_on_device(flat, k)
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
            idx, mags = select_abs_at_least(flat, thr.clamp(min=TINY), k / n)   # sync 1
            if idx.numel() > k * (1.0 + self.tolerance):   # a tie kept whole (or the sample's ~1 % error)
                idx = idx.index_select(0, largest_positions(mags, k))
            return idx
        cand_idx, cand = select_abs_at_least(flat, floor, (hits + spread) / s)   # sync 1
        few = k * (1.0 - self.tolerance)
        if cand.numel() <= k * (1.0 + self.tolerance):
            # Everything at or above the floor: within tolerance, or (rarely) the floor
            # overshot and no threshold the candidates can express keeps more.
            self.last_steps = 0
            return cand_idx
        steps = self._steps(spread, hits)
        self.last_steps = steps
        thr = _bracketed_search(cand, k, floor, ceil, steps, self.tolerance)   # accelerators: a copy
        keep = torch.nonzero(cand > thr).view(-1)                              # sync 2
        if not few <= keep.numel() <= k * (1.0 + self.tolerance):   # a tie spans the band (_fill_ties)
            keep = _fill_ties(cand, thr, k)
        return cand_idx.index_select(0, keep)

    def _select_on_device(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        """The accelerators' selection: about 15 tensor operations and two host synchronisations.

        On a GPU at bucket sizes a call's time follows how many operations it launches (each
        costs the host 10-25 us, the kernels behind them a few) and how often it waits, not its
        arithmetic.  So the search runs on the host, from
        one copy of the few order statistics that decide every one of its steps (:func:`_fetch`),
        on ``[T_many, max]``: ``T_many`` is the ``r_many``-th largest magnitude, ``r_many =
        floor(k (1 + tolerance)) + 1``, and every midpoint below it would keep too many and only
        move the lower end up, so starting there skips exactly the steps that cannot end the
        search (RedSync starts at the mean: the midpoints differ, the rule does not).

        * Low CFs (a 131072-entry sample expects at least ``_SAMPLE_COUNT_HITS`` entries above
          the threshold: CF up to about 13): the search counts on that uniform sample (each
          count within ~1 %, against a 2 % tolerance), as the CPU's torch path does, and one
          ``nonzero`` selects.  Sorting the ~k candidates instead cost more than the whole of
          exact Top-k at 1M entries and up on an H100.
        * Otherwise a 16384-entry uniform sample places a floor 4 standard deviations of the
          sampled count below ``T_many``; the candidates ``|x| >= floor`` (a ``nonzero``) are
          sorted once, largest first, and the magnitudes of ranks ``ceil(few)`` to ``r_many``
          copied to the host with the maximum.  The threshold never goes below ``T_many``, so
          they also give the kept count exactly, and the kept entries are the first that many of
          the sorted order (no compare, no second ``nonzero``).  The kept set then depends on
          the tensor alone, not on the sample, whenever the floor holds ``r_many`` candidates;
          when it does not (probability ~3e-5) every candidate is kept, as when they are within
          tolerance."""
        n = flat.numel()
        few, many = k * (1.0 - self.tolerance), k * (1.0 + self.tolerance)
        a = _work_dtype(flat).abs()
        gen = self._generators(flat.device)
        s = min(n, _DEVICE_COUNT_SAMPLE)
        if s < n and s * k / n >= _SAMPLE_COUNT_HITS:   # low CF: search on the sample's counts
            sample = uniform_abs_sample(flat, s, gen, a)
            r_many = min(math.floor(many * s / n) + 1, s)   # (s: a CF within tolerance of 1)
            r_few = min(max(math.ceil(few * s / n), 1), r_many)
            top = torch.sort(sample).values[s - r_many:].cpu().numpy()[::-1]         # sync 1
            thr, reachable = self._search(top, r_few, a.dtype)
            thr = max(thr, float(TINY))
            idx = torch.nonzero(a > thr).view(-1)                                    # sync 2
            if not reachable and not few <= idx.numel() <= many:   # a tie spans the sample's band
                idx = _fill_ties(a, thr, k)
            return idx
        r_few, r_many = max(math.ceil(few), 1), math.floor(many) + 1   # 1-based ranks, largest first
        floor = TINY   # zeros are never kept
        s = min(n, _DEVICE_SAMPLE)
        if s < n and r_many < n:
            rank = margin_rank(s, s * r_many / n, _BRACKET_SIGMAS)
            floor = torch.sort(uniform_abs_sample(flat, s, gen, a)).values[s - rank].clamp(min=TINY)
        cand_idx, cand = select_abs_at_least(flat, floor, abs_flat=a)                  # sync 1
        if cand_idx.numel() <= many:   # within tolerance, or (rarely) the floor overshot
            self.last_steps = 0
            return cand_idx
        ordered, order = torch.sort(cand, descending=True, stable=True)   # stable: ties by position
        if r_many <= _DEVICE_PREFIX:   # ranks 1..r_many in one slice
            top = ordered[:r_many].cpu().numpy()                                     # sync 2
        else:                          # the maximum and ranks r_few..r_many only (a smaller copy)
            head = torch.cat([ordered[:1], ordered[r_few - 1:r_many]]).cpu().numpy()
            top = np.concatenate([head[:1], np.full(r_few - 2, np.inf, head.dtype), head[1:]]) \
                if r_few > 1 else head[1:]
        thr, _ = self._search(top, r_few, a.dtype)
        # thr >= T_many, so ranks after r_many are never kept; before r_few always, unless thr
        # reached the magnitude of rank r_few (ties at T_many): then count those exactly.
        if thr < top[r_few - 1] or r_few == 1:
            kept = r_few - 1 + int(np.count_nonzero(top[r_few - 1:] > top.dtype.type(thr)))
        else:
            kept = int((ordered[:r_many] > thr).sum())                                # (ties) sync 3
        if kept < few:   # a tie at the threshold spans the band: the k first of the (stable) order
            kept = k
        return cand_idx.index_select(0, order[:kept])

    def _search(self, top: np.ndarray, r_few: int, dtype: torch.dtype) -> Tuple[float, bool]:
        """The search's threshold from ``top``, the largest magnitudes of ranks 1..r_many
        (descending; only rank 1 and ranks r_few..r_many are read), and whether a threshold can
        keep a count within tolerance (not when a tie spans the band)."""
        above_many, above_few = float(top[-1]), float(top[r_few - 1])
        thr, _, self.last_steps = _bisect_counting_steps(above_many, float(top[0]), above_many, above_few,
                                                         self.max_steps, dtype)
        # Ranks r_few..r_many of one value: every threshold keeps fewer than r_few or r_many or more.
        return thr, above_few != above_many

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
            lo, _ = redsync_search(torch.from_numpy(sample), hits, torch.tensor(floor), torch.tensor(ceil),
                                    steps, self.tolerance)
            idx, val = native.select(x, max(float(lo), float(TINY)), False, int(k * 1.25) + 64, k)
            if idx.size > many:   # a tie kept whole at >= lo (or the sample's ~1 % error): k of it
                idx, val = native.drop_smallest(idx, val, k)
            return idx, val
        expected = int(math.ceil((hits + spread + 6.0 * math.sqrt(hits + spread) + 16.0) * n / s)) \
            if s < n else k + 64
        idx, val = native.select(x, floor, False, expected, (hits + spread) * n / s if s < n else k)
        if idx.size <= many:
            self.last_steps = 0
            return idx, val
        steps = self._steps(spread, hits)
        self.last_steps = steps
        idx, val, thr = native.redsync_search(idx, val, floor, ceil, few, many, steps)
        if idx.size < few:   # a tie at the threshold: fill up to k with the tied (see _fill_ties)
            idx, val = native.select(x, thr, False, int(k * 1.25) + 64, k)
        if idx.size > many:   # (or the tie kept whole): its earliest up to k
            ascending = np.argsort(idx, kind="stable")   # the search's compaction left slots out of order
            idx, val = native.drop_smallest(idx[ascending], val[ascending], k)
        return idx, val
