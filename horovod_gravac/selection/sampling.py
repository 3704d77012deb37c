"""Random samples and draws of the selectors: stratified positions, private generators.

The threshold selectors estimate their thresholds from a *stratified* sample: the
tensor is cut into ``s`` equal strata and one uniform position is drawn per stratum,
from a private ``torch.Generator`` that lives on the tensor's own device
(:class:`DeviceGenerators`; the global RNG is never touched).  That never repeats an
index and cannot alias with periodic structure (tiled or convolutional layouts) the way
a fixed-stride sample could.

* :func:`stratified_indices`: one float draw per stratum, on the generator's device
  (Random-k's strata; RedSync's CPU torch path and SIDCo's ``device_fits="device"`` sample
  with it).  DGC's torch path, RedSync's accelerator path and SIDCo's host fits off the CPU
  host path (a GPU's tensors) draw uniform positions instead, one ``randint``: on a GPU a
  call's time follows its operation count (about 25 us each on an H100), and a stratified
  sample takes five operations more; for a threshold's estimate independent uniform draws
  do as well, and random positions cannot alias with a periodic layout either;
* :func:`uniform_abs_sample`: the accelerators' sample (exact Top-k's, DGC's, RedSync's, SIDCo's
  host fits');
* :func:`stratified_abs_sample`, :func:`sample_size`, :func:`sample_quantiles`,
  :func:`sample_rank_values`: the torch path's sample and the thresholds read off it;
* :func:`host_abs_sample`, :func:`host_sample_size`, :func:`host_rank_value`,
  :func:`margin_rank`: the CPU host path's sample (one draw per call), NumPy and host
  scalars.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from .. import native
from .kernels import _work_dtype

def _stratum_starts(numel: int, k: int, device=None) -> torch.Tensor:
    """``floor(i * numel / k)`` for ``i = 0..k``: strata of floor or ceil of numel/k entries,
    the long and short ones evenly interleaved (so every entry's chance is ~k/numel locally,
    not only on average).  Float64 division is exact here while ``k * numel < 2**52``
    (the quotient is never within half an ulp below an integer) and ~2x cheaper than
    int64 division.  Made on ``device``: uploading it from the CPU would be a synchronising
    (pageable) copy on a GPU."""
    i = torch.arange(k + 1, dtype=torch.float64 if k * numel < 2 ** 52 else torch.int64, device=device)
    if i.dtype == torch.int64:
        return i.mul_(numel).floor_divide_(k)
    return i.mul_(numel).div_(k).floor_().to(torch.int64)


def stratified_indices(numel: int, k: int, generator: torch.Generator, device=None) -> torch.Tensor:
    """``k`` unique sorted indices in ``[0, numel)``, one uniform draw per stratum.

    Offsets come from one uniform float per stratum: float32 (24 bits) while strata
    are shorter than 4096 entries, so each position's chance is off by at most
    4096 / 2**24 = 0.02 % of itself, float64 above that.  Indices are made on the
    generator's device (a CUDA generator cannot draw CPU tensors) and moved to ``device``.
    The strata themselves depend only on ``(numel, k)`` and are kept (:func:`_strata`), so a
    call runs five tensor operations: on a GPU each one is a kernel launch, and launches,
    not arithmetic, set the time of a sample.
    """
    if k >= numel:
        return torch.arange(numel, device=device)
    size = numel // k
    gdev = generator.device
    u = torch.rand(k, generator=generator, dtype=torch.float32 if size < 4095 else torch.float64, device=gdev)
    starts, sizes, last = _strata(numel, k, u.dtype, gdev)
    if sizes is None:   # equal strata
        # u * size can round up to size in floating point: the clamp keeps the draw in its stratum
        offsets = u.mul_(size).to(torch.int64).clamp_(max=size - 1)
    else:
        offsets = torch.minimum(u.mul_(sizes).to(torch.int64), last)
    index = starts + offsets
    return index if device is None else index.to(device)


# Strata kept per (numel, k, dtype, device), at most _STRATA_BYTES of them (the least
# recently used dropped first; one larger entry alone is kept): a model has a few bucket
# sizes and a controller a few CFs, so the same strata recur every step.
_STRATA: Dict[Tuple[int, int, torch.dtype, str], Tuple] = {}
_STRATA_BYTES = 64 << 20


def _strata(numel: int, k: int, dtype: torch.dtype, device) -> Tuple:
    """``(starts, sizes, sizes - 1)`` of ``k`` strata of ``numel`` (``sizes`` and ``sizes - 1``
    None when all strata are equal), on ``device``; ``sizes`` in ``dtype``."""
    key = (numel, k, dtype, str(device))
    hit = _STRATA.pop(key, None)
    if hit is None:
        size, extra = divmod(numel, k)
        if extra == 0:
            hit = (torch.arange(k, dtype=torch.int64, device=device).mul_(size), None, None)
        else:
            bounds = _stratum_starts(numel, k, device)
            sizes = bounds[1:] - bounds[:-1]                   # >= 1 because k <= numel
            hit = (bounds[:-1], sizes.to(dtype), sizes.sub_(1))
        used = sum(map(_nbytes, _STRATA.values()))
        while _STRATA and used + _nbytes(hit) > _STRATA_BYTES:
            used -= _nbytes(_STRATA.pop(next(iter(_STRATA))))   # the least recently used
    _STRATA[key] = hit   # (re)inserted last: the most recently used
    return hit


def _nbytes(entry: Tuple) -> int:
    return sum(t.numel() * t.element_size() for t in entry if t is not None)


def stratified_abs_sample(flat: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """``|x|`` at ``size`` stratified random positions (all of ``|x|`` when ``size >= numel``)."""
    if size >= flat.numel():
        return _work_dtype(flat).abs()
    idx = stratified_indices(flat.numel(), size, generator, device=flat.device)
    return _work_dtype(flat.index_select(0, idx)).abs()


def uniform_abs_sample(flat: torch.Tensor, size: int, generator: Optional[torch.Generator],
                       abs_flat: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``|x|`` at ``size`` uniform positions drawn with replacement (one ``randint``, one gather;
    ``generator`` None: the device's global one): the accelerators' sample, five operations
    fewer than :func:`stratified_abs_sample`.  ``abs_flat``: ``|flat|``, when the caller has it."""
    device = generator.device if generator is not None else flat.device
    pos = torch.randint(flat.numel(), (size,), generator=generator, device=device).to(flat.device)
    if abs_flat is not None:
        return abs_flat.index_select(0, pos)
    return _work_dtype(flat).index_select(0, pos).abs()


def sample_size(numel: int, k: int, ratio: float, hits: int, minimum: int = 4096) -> int:
    """Sample size: ``ratio * numel``, raised so ``hits`` sampled entries are expected above the threshold."""
    want = max(int(math.ceil(ratio * numel)), int(math.ceil(hits * numel / max(k, 1))), minimum)
    return min(numel, want)


def sample_rank_values(sample: torch.Tensor, ranks) -> list:
    """The ``r``-th largest entry of ``sample`` for each ``r`` of ``ranks`` (1-based, clamped
    to the sample's size; NaN counts as largest), as 0-dim tensors on the sample's device.

    On the CPU each is a ``kthvalue`` (a selection).  Elsewhere the sample is sorted once
    and every rank read off it: CUDA's ``kthvalue`` runs a whole 1-D tensor in one thread
    block, so two ranks of a 131072-entry sample took 1.41 ms on an H100 (a pass over a
    whole bucket takes 0.05 ms there), one multi-block sort and two reads 0.09 ms.  No host synchronisation either way.
    """
    s = sample.numel()
    ranks = [min(max(int(r), 1), s) for r in ranks]
    if not _sorts(sample):
        return [torch.kthvalue(sample, s - r + 1).values for r in ranks]
    ordered = torch.sort(sample).values
    return [ordered[s - r] for r in ranks]


def _sorts(sample: torch.Tensor) -> bool:
    """Whether :func:`sample_rank_values` sorts (accelerators) rather than selects (CPU).
    (Tests patch it to run the accelerators' branch on the CPU.)"""
    return sample.device.type != "cpu"


def sample_quantiles(sample: torch.Tensor, numel: int, counts) -> list:
    """For each of ``counts``: the magnitude above which about that many of the ``numel``
    entries lie, read off the sample (0-dim device tensors; one sort on accelerators)."""
    s = sample.numel()
    return sample_rank_values(sample, [int(round(c * s / numel)) for c in counts])


def sample_quantile(sample: torch.Tensor, numel: int, count: float) -> torch.Tensor:
    """:func:`sample_quantiles` of one count."""
    return sample_quantiles(sample, numel, [count])[0]


# -- the CPU (host) path: NumPy and host scalars, a sample of fixed size ----------------------
# Host sample: enough for ``min_sample_hits`` sampled entries above the threshold, but at
# most HOST_SAMPLE_MAX entries (and at least HOST_SAMPLE_MIN).  When the cap leaves fewer
# hits, the selectors widen their thresholds by a margin and finish on the candidates.
HOST_SAMPLE_MIN = 1 << 11
HOST_SAMPLE_MAX = 1 << 14
_STRATA_CACHE: Dict[Tuple[int, int], Tuple[np.ndarray, np.ndarray]] = {}
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def host_sample_size(numel: int, k: int, hits: int, ratio: Optional[float]) -> int:
    """Sample size of the host path: ``hits * numel / k`` clamped to
    ``[HOST_SAMPLE_MIN, HOST_SAMPLE_MAX]``, or at least ``ratio * numel`` when a ratio is set."""
    want = min(HOST_SAMPLE_MAX, int(math.ceil(hits * numel / max(k, 1))))
    if ratio is not None:
        want = max(want, int(math.ceil(ratio * numel)))
    return min(numel, max(HOST_SAMPLE_MIN, want))


def host_abs_sample(x: np.ndarray, size: int, generator: torch.Generator) -> np.ndarray:
    """``|x|`` at ``size`` stratified positions (a float copy; all of ``|x|`` when ``size >= x.size``).

    Stratum ``i`` is ``[i d, (i + 1) d)`` with ``d = n // s``, and its position is
    ``i d + floor(d * frac(u + i phi))``: a Weyl sequence (``phi`` the golden ratio) shifted
    by one uniform ``u`` drawn from ``generator`` (the compressor's private CPU generator).
    Each stratum's position is uniform in it, as with one draw per stratum, but the whole
    sample costs one draw: 16384 draws from torch's generator cost about 0.2 ms, as much as
    the selection pass of a 1M-entry bucket.  The irrational rotation keeps the offsets from
    lining up with periodic layouts (tiled or convolutional).  The last ``n - s d < s``
    entries are never sampled (at most 1 in 2048 of the tensor's tail)."""
    n = x.size
    if size >= n:
        return np.abs(x)
    if native.usable(x):   # the same positions in one native loop
        return native.abs_sample(x, size, float(torch.rand((), dtype=torch.float64, generator=generator)), _GOLDEN)
    stride = n // size
    cached = _STRATA_CACHE.get((size, stride))
    if cached is None:
        if len(_STRATA_CACHE) > 64:
            _STRATA_CACHE.clear()
        i = np.arange(size, dtype=np.float64)
        cached = _STRATA_CACHE[(size, stride)] = (np.arange(0, size * stride, stride, dtype=np.int64),
                                                  np.modf(i * _GOLDEN)[0])
    base, phases = cached
    u = float(torch.rand((), dtype=torch.float64, generator=generator))
    frac = phases + u
    frac -= frac >= 1.0
    pos = (frac * stride).astype(np.int64)
    np.minimum(pos, stride - 1, out=pos)   # (guards the rounding of frac * stride)
    pos += base
    return np.abs(x[pos])


def host_rank_value(sample: np.ndarray, rank: int) -> float:
    """The ``rank``-th largest of ``sample`` (1-based, clamped to its size), partitioning it in place."""
    rank = min(max(int(rank), 1), sample.size)
    j = sample.size - rank
    sample.partition(j)
    return float(sample[j])


def margin_rank(s: int, hits: float, sigmas: float) -> int:
    """Sample rank of a threshold ``sigmas`` standard deviations of the sampled count below
    the k-th magnitude (``hits`` sampled entries expected above it)."""
    return min(s, max(1, int(math.ceil(hits + sigmas * math.sqrt(hits) + 2.0))))


class DeviceGenerators:
    """One private ``torch.Generator`` per device, all seeded from ``seed`` (never the global RNG)."""

    def __init__(self, seed: int = 0):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        self.seed = seed
        self._gens: Dict[str, torch.Generator] = {}

    def __call__(self, device: torch.device) -> torch.Generator:
        key = str(device)
        gen = self._gens.get(key)
        if gen is None:
            gen = self._gens[key] = torch.Generator(device=device)
            gen.manual_seed(self.seed)
        return gen

    def reseed(self, seed: int) -> None:
        self.seed = int(seed)
        self._gens.clear()

