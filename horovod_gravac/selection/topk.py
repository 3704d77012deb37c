"""Top-k: keep exactly the k entries of largest magnitude.

``torch.topk`` over a 25M-entry tensor costs 7-10 streaming passes on a CPU.  We get
the same answer cheaper: estimate from a random sample a threshold ``T`` slightly
*below* the k-th largest magnitude, collect the ``c`` candidates ``|x| >= T`` (a
little over ``k``) in one pass, and drop the ``c - k`` smallest of them.  The result is
exact whenever at least ``k`` candidates pass; when the estimate overshoots (rare: the
margin is four standard deviations of the sampled count) the threshold is lowered and
the pass repeated, and the last resort is the exact k-th magnitude of the whole tensor.

Semantics: the kept set is the exact top-k of ``|x|``, with NaN larger than any
number (as in ``torch.topk``).  On the CPU above ``_TINY`` entries it is moreover a
function of the input alone (the sample only changes the speed): among entries tied
at the k-th magnitude the lowest flat indices are kept.  Up to ``_TINY`` entries
(16384) a single ``torch.topk`` call is cheapest and decides ties its own way.

Exact zeros: when fewer than ``k`` entries are nonzero (an embedding's gradient, most rows
untouched), the nonzero ones are topped up with the first zeros, as ``torch.topk`` would, so
a payload is always ``k`` entries (the paper's Top-k and GRACE's).  ``send_zeros=False``
(:class:`TopKSelector`) leaves them out on the CPU: zeros carry nothing (the decompressed
tensor and the error-feedback residual are the same), and each costs 8 bytes on the wire.  On
other devices the payload holds ``k`` entries either way: knowing how many are nonzero there
takes a host synchronisation, one more every call.

CPU path (on the tensor's own memory; float16/bfloat16 are widened first):

1. sample: ``|x|`` at ``s`` stratified random positions (``sampling.host_abs_sample``: one
   position per stratum, all from one random draw), ``s = (k n)^(1/3)`` clamped to
   ``[2048, 65536]`` (a larger sample costs random memory reads, a smaller one excess
   candidates; the optimum is flat); up to ``_SMALL`` entries ``T`` is instead the
   exact k-th magnitude (``np.partition``);
2. one pass collecting the candidates' indices and values;
3. the ``e = c - k`` smallest candidates lie below a second sample quantile ``U``;
   only the candidates under ``U`` are searched for the e-th smallest ``V`` (ties by
   index), and the dropped slots among the first ``k`` candidates are refilled from the
   last ``e``: ``O(c)`` scans plus ``O(e)`` work.

Steps 2 and 3 run in the native kernels (``horovod_gravac.native``) for float32 when
they are built: one fused pass that compacts survivors inside AVX-512 registers as it
streams (a portable C loop on other CPUs), and a radix select over the candidates
below ``U``.  The pass also yields the kept values, so ``compress`` needs no gather.
Otherwise (float64, or no C compiler at install) NumPy runs them over cache-sized
chunks: ``|x|`` into a reused buffer, the candidate mask, its ``nonzero`` and the
candidates' magnitudes, then ``np.partition`` below ``U``.  Both give the same indices
in the same order.  At 25M entries and CF 10 the native path takes about a quarter of
NumPy's time (``benchmarks/compressors.py --native off`` prints the NumPy figures).

Measured and left out (NumPy path): a column-max prefilter (as in torch's
``kernels.select_abs_at_least``) is slower here at every CF, since NumPy's ``nonzero`` of a
sparse mask already costs little more than the compare; comparing signed values
against ``+-T`` instead of taking ``|x|`` gains nothing.  (Native path): recording the
positions below ``U`` inside the main pass costs more (a mispredicted branch per
block) than a second pass over the ``c`` candidates.

Other devices (CUDA): the same sample in torch ops (131072 entries, sorted once), both
thresholds read off it up front, the wider one chosen on the device when the first keeps
fewer than ``k`` (a ``count_nonzero``), then ``nonzero`` of the candidate mask and an
exact ``torch.topk`` over the candidates.  Host synchronisations per call: exactly one,
the output size of that ``nonzero`` (none up to 65536 entries or at CF < 4, where a
plain ``topk`` runs); sampling, the sort, the choice of threshold, ``topk`` and
the full-``topk`` fallback add none.  (The CPU path has no device to wait for.)
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch

from .. import native
from .base import Selector, largest_of_payload
from .payload import SparsePayload, sparse_payload
from .sampling import DeviceGenerators, host_abs_sample, margin_rank, sample_rank_values, uniform_abs_sample

# CPU: up to _TINY entries a plain torch.topk; up to _SMALL the threshold is the exact
# k-th magnitude (no sampling).
_TINY = 1 << 14
_SMALL = 1 << 16
# CPU chunk: 512 KiB of float32 (its magnitudes and mask stay in L2).
_CHUNK = 1 << 17
# CPU sample size: _SAMPLE_SCALE * (k n)^(1/3), clamped.
_SAMPLE_SCALE = 1.0
_SAMPLE_MIN = 1 << 11
_SAMPLE_MAX = 1 << 16
# Accelerator path: below this many entries a plain topk; sample size otherwise.
_SMALL_DEVICE = 1 << 16
_SAMPLE_DEVICE = 1 << 17
# Margins (standard deviations of the sampled count) of the first and the retried threshold.
_SIGMAS = (4.0, 12.0)


def topk_indices(magnitude: torch.Tensor, k: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Flat int64 indices of the ``k`` entries of largest ``|magnitude|`` (any shape).

    Signed values are accepted (their absolute values are ranked).  ``generator`` draws
    the threshold sample (the global generator of the device when None); it must live
    on the tensor's device.  See the module docstring for NaN, ties and host syncs.
    """
    return _topk(magnitude.detach().reshape(-1), int(k), lambda: generator).long()


def _topk(values: torch.Tensor, k: int, generator, pad_zeros: bool = True) -> torch.Tensor:
    """``topk_indices`` of a flat tensor; ``generator()`` gives the generator (called only when sampling)."""
    return _topk_pair(values, k, generator, pad_zeros)[0]


def _topk_pair(values: torch.Tensor, k: int, generator,
               pad_zeros: bool = True) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``(indices, kept values)`` of a flat tensor; the values (float32) only when the
    native kernels produced them on the way (None otherwise: gather them yourself).
    ``pad_zeros=False``: on the CPU, the exact zeros that would top up fewer than ``k``
    nonzero entries are left out (see the module docstring)."""
    n = values.numel()
    if k >= n:
        if pad_zeros or not _numpy_path(values):
            return torch.arange(n, device=values.device), None
        return torch.nonzero(values).view(-1), None   # (NaN is nonzero)
    if k <= 0:
        return torch.empty(0, dtype=torch.int64, device=values.device), None
    if n <= _TINY:   # fixed costs dominate: one call
        mag = values.abs()
        if mag.dtype == torch.float16 and mag.device.type == "cpu":   # (torch 2.0 has no fp16 topk there)
            mag = mag.float()
        idx = torch.topk(mag, k, sorted=False).indices
        if not pad_zeros and _numpy_path(values):
            idx = idx[values.index_select(0, idx) != 0]
        return idx, None
    if _numpy_path(values):
        if values.dtype not in (torch.float32, torch.float64):
            values = values.float()   # NumPy has no bfloat16; float16 arithmetic is emulated there
        idx, vals = _topk_numpy(values.contiguous().numpy(), k, generator, pad_zeros)
        return torch.from_numpy(idx), (None if vals is None else torch.from_numpy(vals))
    return _topk_torch(values, k, generator()), None


# -- CPU ------------------------------------------------------------------------------------
def _numpy_path(values: torch.Tensor) -> bool:
    """CPU tensors go through NumPy (tests force the accelerator path by patching this)."""
    return values.device.type == "cpu"


def sample_size(n: int, k: int) -> int:
    """CPU sample size for ``k`` of ``n``: balances the sample's random reads against excess candidates."""
    return min(n, max(_SAMPLE_MIN, min(_SAMPLE_MAX, int(_SAMPLE_SCALE * (k * n) ** (1.0 / 3.0)))))


def _kth_largest(a: np.ndarray, rank: int):
    """The ``rank``-th largest entry of ``a`` (1-based; NaN counts as largest), partitioning ``a`` in place."""
    j = a.size - rank
    a.partition(j)
    return a[j]


def _candidates(x: np.ndarray, threshold, strict: bool):
    """Flat indices (ascending) and magnitudes of the entries with ``|x| >= threshold``
    (``> threshold`` when ``strict``); NaN entries always pass."""
    n = x.size
    size = min(n, _CHUNK)
    buf = np.empty(size, dtype=x.dtype)
    mask = np.empty(size, dtype=bool)
    below = np.less_equal if strict else np.less
    idxs, vals = [], []
    for start in range(0, n, _CHUNK):
        chunk = x[start:start + _CHUNK]
        b = buf[:chunk.size]
        m = mask[:chunk.size]
        np.abs(chunk, out=b)
        below(b, threshold, out=m)
        np.logical_not(m, out=m)           # "not below": NaN passes
        i = m.nonzero()[0]
        if i.size:
            vals.append(b[i])
            i += start
            idxs.append(i)
    if not idxs:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=x.dtype)
    return np.concatenate(idxs), np.concatenate(vals)


def _smallest_positions(vals: np.ndarray, e: int) -> np.ndarray:
    """Positions of the ``e`` smallest of ``vals`` (``0 < e < vals.size``; NaN largest);
    among entries tied with the e-th smallest, the highest positions."""
    v = np.partition(vals, e - 1)[e - 1]
    if v != v:   # NaN: fewer than e numbers; drop them all and the last NaNs
        lt, eq = np.flatnonzero(~np.isnan(vals)), np.flatnonzero(np.isnan(vals))
    else:
        lt, eq = np.flatnonzero(vals < v), np.flatnonzero(vals == v)
    return np.concatenate([lt, eq[eq.size - (e - lt.size):]])


def _drop_smallest(idx: np.ndarray, vals: np.ndarray, k: int, upper) -> np.ndarray:
    """The ``k`` of the candidates ``idx`` with the largest ``vals`` (ties: lowest index).

    ``upper``: a magnitude expected to lie above the ``c - k`` smallest candidates (None
    when unknown); only the candidates below it are searched.
    """
    c = idx.size
    e = c - k
    if e <= 0:
        return idx
    if upper is not None:
        mid = np.flatnonzero(vals < upper)
        if mid.size > e:
            drop = mid[_smallest_positions(vals[mid], e)]
        elif mid.size == e:
            drop = mid
        else:   # the sample's upper quantile was too low: search all candidates
            drop = _smallest_positions(vals, e)
    else:
        drop = _smallest_positions(vals, e)
    # Keep idx[:k] and refill the dropped slots in it, in ascending order, with the
    # surviving tail entries (as the native kernel does, so both give the same order).
    # drop is two ascending runs (below V, then ties at V): timsort merges them in O(e).
    drop = np.sort(drop, kind="stable")
    tail = np.ones(e, dtype=bool)
    tail[drop[drop >= k] - k] = False
    out = idx[:k]
    out[drop[drop < k]] = idx[k + np.flatnonzero(tail)]
    return out


def _zeros_first(nonzero: np.ndarray, count: int) -> np.ndarray:
    """Flat indices of the first ``count`` exact zeros, given ``nonzero``: the ascending positions
    of every entry that is not an exact zero (there are at least ``count`` zeros).

    They are the first positions missing from ``nonzero``: the positions below the smallest
    ``span`` with ``count`` zeros under it (a binary search on ``nonzero``), less the nonzero
    ones.  That costs O(span) and never reads the tensor.  Scanning the tensor for its zeros
    would be one more pass over the whole bucket, a large share of exact Top-k's own time on
    the buckets that need padding, whose entries are mostly zeros (an embedding table's
    gradient; docs/benchmarks.md, "Compressors", times such buckets)."""
    position = nonzero.dtype.type   # (a Python int would make searchsorted copy an int32 array)
    lo, hi = count, count + nonzero.size   # zeros below lo <= count <= zeros below hi
    while lo < hi:
        mid = (lo + hi) // 2
        if mid - int(np.searchsorted(nonzero, position(mid))) >= count:
            hi = mid
        else:
            lo = mid + 1
    free = np.ones(lo, dtype=bool)
    free[nonzero[:np.searchsorted(nonzero, position(lo))]] = False
    return np.flatnonzero(free)


def _select_with_threshold(x: np.ndarray, k: int, threshold, upper=None,
                           pad_zeros: bool = True) -> Optional[np.ndarray]:
    """Exact top-k given a threshold; None when fewer than ``k`` entries reach it."""
    if threshold <= 0:   # zero threshold: candidates are the nonzeros (and NaNs), topped up with zeros
        idx, vals = _candidates(x, 0, strict=True)
        if idx.size < k:
            return np.concatenate([idx, _zeros_first(idx, k - idx.size)]) if pad_zeros else idx
    else:
        idx, vals = _candidates(x, threshold, strict=False)
        if idx.size < k:
            return None
    return _drop_smallest(idx, vals, k, upper(idx.size - k) if upper is not None else None)


def _select_native(x: np.ndarray, k: int, threshold, expected: int, lower=None, likely=None,
                   pad_zeros: bool = True):
    """``_select_with_threshold`` by the native kernels, values included: ``(idx, vals)``
    or None.  ``expected``: the expected candidate count (room made for it, see
    ``native.select``); ``lower``: a magnitude expected above the ``c - k`` smallest
    candidates, so that the drop searches only the candidates below it; ``likely``: the
    candidate count actually expected (picks the select loop)."""
    strict = threshold <= 0   # zero threshold: the candidates are the nonzeros (and NaNs)
    idx, vals = native.select(x, threshold, strict, expected, likely)
    count = idx.size
    if count < k:
        if not strict:
            return None
        if not pad_zeros:
            return idx, vals
        zeros = _zeros_first(idx, k - count)   # topped up with the first zeros
        return (np.concatenate([idx, zeros.astype(np.int32)]),
                np.concatenate([vals, np.zeros(zeros.size, dtype=vals.dtype)]))
    return native.drop_smallest(idx, vals, k, None if strict else lower)


def _select_exact(x: np.ndarray, k: int, fast: bool,
                  pad_zeros: bool = True) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Top-k with the exact k-th magnitude as threshold (no sample)."""
    kth = _kth_largest(np.abs(x), k)
    if fast:
        return _select_native(x, k, kth, x.size, likely=k, pad_zeros=pad_zeros)
    return _select_with_threshold(x, k, kth, pad_zeros=pad_zeros), None


def _topk_numpy(x: np.ndarray, k: int, generator,
                pad_zeros: bool = True) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """CPU top-k of a flat array: ``(idx, vals)``, ``vals`` None unless the native kernels ran;
    ``pad_zeros``: see :func:`_topk_pair`."""
    n = x.size
    fast = native.usable(x)
    if n <= _SMALL:
        return _select_exact(x, k, fast, pad_zeros)
    s = sample_size(n, k)
    sample = host_abs_sample(x, s, generator())   # stratified; one random draw per call
    hits = s * k / n                          # sampled entries expected above the k-th magnitude
    for sigmas in _SIGMAS:
        rank = margin_rank(s, hits, sigmas)
        threshold = _kth_largest(sample, rank)
        if fast:
            # Candidates expected: rank / s of the tensor; room for 6 more standard deviations.
            expected = int(math.ceil((rank + 6.0 * math.sqrt(rank) + 16.0) * n / s))
            # The k-th magnitude lies above the sample's (hits - 4 sd)-th largest: the
            # candidates below that hold the ones to drop.
            r = int(hits - 4.0 * math.sqrt(hits) - 2.0)
            out = _select_native(x, k, threshold, expected, _kth_largest(sample, r) if r >= 1 else None,
                                 likely=rank * n / s, pad_zeros=pad_zeros)
        else:
            def upper(e, rank=rank):
                # Sampled entries expected between T and the e-th smallest candidate, plus a margin.
                q = e * s / n
                r = rank - int(math.ceil(q + 4.0 * math.sqrt(q) + 2.0))
                return _kth_largest(sample, r) if r >= 1 else None

            out = _select_with_threshold(x, k, threshold, upper, pad_zeros)
            out = None if out is None else (out, None)
        if out is not None:
            return out
    # Both estimates overshot: the exact k-th magnitude.
    return _select_exact(x, k, fast, pad_zeros)


# -- other devices --------------------------------------------------------------------------
def _topk_torch(values: torch.Tensor, k: int, generator: Optional[torch.Generator]) -> torch.Tensor:
    """Device path: sampled threshold, ``nonzero`` of the candidates, exact ``topk`` over them.

    Both thresholds (``_SIGMAS``) are read off the sample up front and the wider one is
    used only if the first keeps fewer than ``k`` (decided on the device), so the one
    ``nonzero`` is the only host synchronisation, whatever happens.
    """
    m = values.abs()
    if m.dtype not in (torch.float32, torch.float64):
        m = m.float()
    n = m.numel()
    if n <= _SMALL_DEVICE or k * 4 >= n:
        return torch.topk(m, k, sorted=False).indices
    s = _SAMPLE_DEVICE
    sample = uniform_abs_sample(values, s, generator, m)
    hits = s * k / n
    first, wide = sample_rank_values(sample, [margin_rank(s, hits, sigmas) for sigmas in _SIGMAS])
    enough = torch.count_nonzero(~(m < first)) >= k          # stays on the device
    threshold = torch.where(enough, first, wide)
    candidates = torch.nonzero(~(m < threshold)).view(-1)     # the host sync: the output size
    if candidates.numel() < k:                                # both overshot: exact over everything
        return torch.topk(m, k, sorted=False).indices
    keep = torch.topk(m.index_select(0, candidates), k, sorted=False).indices
    return candidates.index_select(0, keep)


class TopKSelector(Selector):
    """Keep the ``numel / cf`` largest-magnitude entries (at least one).

    ``send_zeros=False``: when fewer than that many entries are nonzero, keep only the nonzero
    ones on the CPU instead of topping them up with exact zeros (see the module docstring).

    Multi-level compression is exact: the top ``k2`` of the top ``k1`` entries are
    the top ``k2`` of the original, for ``k2 <= k1``.

    The threshold sample is drawn from a private generator per device (seeded with
    ``seed``; the global RNG is never touched).  The kept set does not depend on it.
    """

    def __init__(self, cf: float = 100.0, seed: int = 0, send_zeros: bool = True):
        super().__init__(cf)
        if not isinstance(send_zeros, bool):
            raise ValueError(f"send_zeros must be True or False, got {send_zeros!r}")
        self._generators = DeviceGenerators(seed)
        self.send_zeros = send_zeros
        self.fixed_count = send_zeros   # without the zeros, each rank keeps its own count

    def repr_args(self) -> str:
        # (the default's is the plain one: checkpoints and the ranks' start-up check compare it)
        return super().repr_args() if self.send_zeros else f"cf={self.cf:g}, send_zeros=False"

    def select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        return _topk(flat, k, lambda: self._generators(flat.device), self.send_zeros)

    def select_payload(self, flat: torch.Tensor, k: int) -> SparsePayload:
        indices, values = _topk_pair(flat, k, lambda: self._generators(flat.device), self.send_zeros)
        if values is None:
            return sparse_payload(flat, indices)
        return SparsePayload(values, indices.to(torch.int32))   # the native pass gathered them

    def select_further(self, values: torch.Tensor, k: int) -> SparsePayload:
        further = largest_of_payload(values, k)
        return self.select_payload(values, k) if further is None else further
