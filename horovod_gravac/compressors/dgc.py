"""DGC: keep every entry whose magnitude reaches a threshold estimated from a sample.

Deep Gradient Compression (Lin et al., ICLR 2018) estimates the threshold for
density ``1/cf`` from a small random sample of the gradient (0.1-1 % of the
entries), then keeps every entry with ``|g| >= threshold``.  The kept count is
therefore only *about* ``k`` (it varies per call and per rank); the achieved
``kept / k`` is recorded as ``last_quality`` (estimation quality).  DGC's momentum
correction and local gradient clipping are training-side options of the
optimizer / error-feedback memory (``momentum_correction=``, ``local_clip_norm=``),
not of the compressor.

The sample is *stratified*: the tensor is cut into ``s`` equal strata and one
uniform position is drawn per stratum, from a private ``torch.Generator`` that
lives on the tensor's own device (the global RNG is never touched).  That never
repeats an index and cannot alias with periodic structure (tiled or
convolutional layouts) the way a fixed-stride sample could.  The sample size is
chosen so that the sample holds a few hundred entries above the threshold, which
bounds the relative error of the kept count (about ``1/sqrt(hits)``, i.e. 5 % for
the default 400 hits) at every CF, CF 1000 included.

This module also holds the threshold kernels shared by the other threshold
compressors (RedSync, SIDCo):

* :func:`exceedance_moments`: one streaming pass giving the count, sum and sum of
  squares of the excesses ``|x| - t`` over ``|x| > t``;
* :func:`select_abs_at_least`: indices and magnitudes of the entries with
  ``|x| >= t`` (with a column-maximum prefilter on the CPU when few entries pass);
* :func:`stratified_abs_sample`.

On the CPU the passes run over cache-sized chunks of the tensor with one reused
scratch buffer: materialising ``flat.abs()`` (a fresh 100 MB tensor for 25M
entries) costs most of a streaming pass in page faults alone.  The chunk loop
contains no host synchronisation (thresholds are 0-dim tensors; partial results
stay tensors until the end).  On other devices (CUDA) each kernel is a single
vectorised expression over the whole tensor, since the caching allocator makes
temporaries cheap there.  Host synchronisations per call are listed in each
compressor's docstring; a "sync" is any point where the host must know a
device value, here always the output size of ``nonzero``.

CPU host path.  The optimizer compresses buckets of at most 6.5M entries, where
a streaming pass runs in cache (0.06-1.6 ms) and per-call fixed costs decide: torch ops on
0-dim tensors cost 5-10 us each, a 1 % sample (or ``min_sample_hits * cf`` entries, 400k
at CF 1000) costs more than the selection, and a search that recounts every candidate per
step costs a pass per step.  So on the CPU, float32 tensors with the native kernels
switched on (:func:`host_path`) go through ``_select_host`` of each compressor: NumPy
arrays and Python floats (there is no device to wait for), a sample of fixed size drawn
from the same private generator, the native select pass (which also gathers the kept
values, so ``compress`` needs no gather), and for RedSync and SIDCo native kernels for
their search and statistics passes.  Every other case (other devices, float64, kernels
not built or switched off) runs the torch code described above.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from .. import native
from .base import SparseCompressor, SparsePayload
from .randomk import stratified_indices

# Chunk of the CPU kernels: 512 KiB of float32, comfortably inside a 1 MiB L2.
CHUNK = 1 << 17
# Thresholds are never below this, so exact zeros are never "kept" (sending them is useless).
TINY = torch.finfo(torch.float32).tiny


# -- shared threshold kernels ------------------------------------------------------------
def _work_dtype(flat: torch.Tensor) -> torch.Tensor:
    """float32/float64 stay as they are; half precision is widened (sums would overflow)."""
    return flat if flat.dtype in (torch.float32, torch.float64) else flat.float()


def _chunked(flat: torch.Tensor) -> bool:
    return flat.device.type == "cpu" and flat.numel() > CHUNK


def _count_positive_(b: torch.Tensor) -> torch.Tensor:
    """Number of entries > 0 of a non-negative buffer, overwriting it (``sign_`` then ``sum``).

    About twice as fast as ``count_nonzero`` on CPU floats; exact (counts < 2^24 per chunk).
    """
    return b.sign_().sum()


def exceedance_moments(flat: torch.Tensor, threshold: torch.Tensor, squares: bool = True) -> torch.Tensor:
    """One pass: float64 ``[m, sum w, sum w^2]`` of the excesses ``w = |x| - t`` over ``|x| > t``.

    ``threshold`` is a 0-dim tensor on ``flat``'s device; ``squares=False`` skips the sum of
    squares (left 0).  No host synchronisation.
    """
    flat = _work_dtype(flat)
    t = threshold.to(flat.dtype)
    if not _chunked(flat):
        w = (flat.abs() - t).clamp_(min=0)
        sq = torch.dot(w, w).double() if squares else w.new_zeros((), dtype=torch.float64)
        return torch.stack([torch.count_nonzero(w).double(), w.sum().double(), sq])
    buf = torch.empty(CHUNK, dtype=flat.dtype)
    cnt, s1, s2 = [], [], []
    for start in range(0, flat.numel(), CHUNK):
        c = flat[start:start + CHUNK]
        b = buf[:c.numel()]
        torch.abs(c, out=b)
        b.sub_(t).clamp_(min=0)
        s1.append(b.sum())
        if squares:
            s2.append(torch.dot(b, b))
        cnt.append(_count_positive_(b))
    sq = torch.stack(s2).double().sum() if squares else torch.zeros((), dtype=torch.float64)
    return torch.stack([torch.stack(cnt).double().sum(), torch.stack(s1).double().sum(), sq])


def _prefilter_width(density: float) -> int:
    """Rows of the column-max prefilter for an expected density (0: select directly).

    Measured on one core: the prefilter halves the cost of a selection at densities up
    to about 1 %, and loses above about 2 %.
    """
    if density <= 0.003:
        return 16
    if density <= 0.02:
        return 8
    return 0


def select_abs_at_least(flat: torch.Tensor, threshold: torch.Tensor, density: float = 1.0,
                        magnitudes: bool = True) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Flat int64 indices and magnitudes of the entries with ``|x| >= threshold``.

    ``magnitudes=False`` returns ``(indices, None)``, saving a gather and a copy.

    ``density`` (expected fraction kept; a hint, any value gives the same result) lets the
    CPU path skip most of each chunk: the chunk is viewed as ``rows x cols``, the column
    maxima are compared first and only the columns holding a kept entry are examined.
    Indices are then grouped by chunk but not sorted within it.
    One host synchronisation on accelerators (the output size of ``nonzero``).

    On the CPU, float32 goes through the native kernel when it is built (one fused pass,
    int32 indices in ascending order, the same set).
    """
    flat = _work_dtype(flat)
    if flat.device.type == "cpu" and native.usable(flat.numpy()):
        return _select_native(flat.numpy(), float(threshold), density, magnitudes)
    t = threshold.to(flat.dtype)
    if not _chunked(flat):
        a = flat.abs()
        idx = torch.nonzero(a >= t).view(-1)
        return idx, (a.index_select(0, idx) if magnitudes else None)
    rows = _prefilter_width(density)
    cols = CHUNK // rows if rows else 0
    buf = torch.empty(CHUNK, dtype=flat.dtype)
    mask = torch.empty(CHUNK, dtype=torch.bool)
    idxs, vals = [], []
    for start in range(0, flat.numel(), CHUNK):
        c = flat[start:start + CHUNK]
        b = buf[:c.numel()]
        torch.abs(c, out=b)
        if rows and c.numel() == CHUNK:
            grid = b.view(rows, cols)
            hit_cols = torch.nonzero(grid.amax(0) >= t).view(-1)
            sub = grid.index_select(1, hit_cols)
            rc = torch.nonzero(sub >= t)
            r, col = rc[:, 0], rc[:, 1]
            if magnitudes:
                vals.append(sub[r, col])
            idxs.append(r.mul_(cols).add_(hit_cols.index_select(0, col)).add_(start))
            continue
        m = mask[:c.numel()]
        torch.ge(b, t, out=m)
        local = torch.nonzero(m).view(-1)
        if magnitudes:
            vals.append(b.index_select(0, local))
        idxs.append(local.add_(start))
    return torch.cat(idxs), (torch.cat(vals) if magnitudes else None)


def _select_native(x, threshold: float, density: float, magnitudes: bool):
    """``select_abs_at_least`` by the native kernel."""
    # Room for the expected count plus a margin; a miss costs a second, exactly sized pass.
    idx, val = native.select(x, threshold, False, int(density * x.size * 1.25 + 4096), density * x.size)
    return torch.from_numpy(idx), (torch.from_numpy(np.abs(val, out=val)) if magnitudes else None)


def stratified_abs_sample(flat: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    """``|x|`` at ``size`` stratified random positions (all of ``|x|`` when ``size >= numel``)."""
    if size >= flat.numel():
        return _work_dtype(flat).abs()
    idx = stratified_indices(flat.numel(), size, generator, device=flat.device)
    return _work_dtype(flat.index_select(0, idx)).abs()


def sample_size(numel: int, k: int, ratio: float, hits: int, minimum: int = 4096) -> int:
    """Sample size: ``ratio * numel``, raised so ``hits`` sampled entries are expected above the threshold."""
    want = max(int(math.ceil(ratio * numel)), int(math.ceil(hits * numel / max(k, 1))), minimum)
    return min(numel, want)


def sample_quantile(sample: torch.Tensor, numel: int, count: float) -> torch.Tensor:
    """Magnitude above which about ``count`` of the ``numel`` entries lie, read off the sample.

    ``kthvalue`` is a selection, not a sort; the result stays a device tensor.
    """
    s = sample.numel()
    rank = int(round(count * s / numel))          # sampled entries expected at or above it
    rank = min(max(rank, 1), s)
    return torch.kthvalue(sample, s - rank + 1).values


# -- the CPU (host) path -----------------------------------------------------------------------
# At the sizes the optimizer compresses (buckets of at most 6.5M entries, often far fewer) a
# streaming pass runs in cache and costs 0.06-1.6 ms, so per-call fixed costs decide: torch
# operations on 0-dim tensors (5-10 us each), a sample proportional to the tensor, and a
# threshold search that recounts the whole candidate set per step.  On the CPU, float32
# tensors that the native kernels take therefore go through NumPy and the kernels with host
# scalars (no device to wait for on a CPU), and the sample has a fixed size.

# Host sample: enough for ``min_sample_hits`` sampled entries above the threshold, but at
# most HOST_SAMPLE_MAX entries (and at least HOST_SAMPLE_MIN).  When the cap leaves fewer
# hits, the compressors widen their thresholds by a margin and finish on the candidates.
HOST_SAMPLE_MIN = 1 << 11
HOST_SAMPLE_MAX = 1 << 14
_STRATA_CACHE: Dict[Tuple[int, int], Tuple[np.ndarray, np.ndarray]] = {}
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def host_path(flat: torch.Tensor) -> bool:
    """Whether a (work-dtype) tensor takes the host path: CPU, float32, native kernels on.
    (Tests of the accelerator path switch it off by patching this function.)"""
    return flat.device.type == "cpu" and flat.dtype == torch.float32 and native.usable(flat.numpy())


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


def check_fraction(value, name: str, low: float = 0.0, high: float = 1.0) -> float:
    """Validate a real parameter in ``(low, high]``; ValueError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)) \
            or not low < float(value) <= high:
        raise ValueError(f"{name} must be a real number in ({low:g}, {high:g}], got {value!r}")
    return float(value)


def check_count(value, name: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


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


class ThresholdCompressor(SparseCompressor):
    """Common parts of the threshold compressors: degenerate inputs, ``last_quality``, seeding.

    Sampling draws from private per-device generators.  The optimizer calls
    ``set_step(step, bucket)`` before compressing a bucket (as for Random-k); the draws
    then depend only on ``(seed, step, bucket)``, so a run resumed from a checkpoint
    samples exactly what the original run sampled.
    """

    step_seeded = True

    def __init__(self, cf: float = 100.0, seed: int = 0):
        super().__init__(cf)
        self._generators = DeviceGenerators(seed)
        self.seed = seed

    def set_step(self, step: int, stream: int = 0) -> None:
        """Re-seed the private generators for ``(seed, step, stream)``."""
        self._generators.reseed(hash((self.seed, int(step), int(stream))) & 0x7FFF_FFFF_FFFF_FFFF)

    def select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        n = flat.numel()
        if k >= n:   # CF 1 (or a payload smaller than k): everything, as Top-k does
            idx = torch.arange(n, device=flat.device)
        else:
            pair = self._host_pair(flat, k)
            idx = self._select(flat, k) if pair is None else pair[0]
        self.last_quality = idx.numel() / k if k > 0 else 1.0
        return idx

    def select_payload(self, flat: torch.Tensor, k: int) -> SparsePayload:
        pair = self._host_pair(flat, k) if 0 < k < flat.numel() else None
        if pair is None:
            return super().select_payload(flat, k)
        self.last_quality = pair[0].numel() / k
        return SparsePayload(pair[1], pair[0])   # the native pass gathered the values

    def _host_pair(self, flat: torch.Tensor, k: int):
        """``(int32 indices, float32 values)`` from the host path, or None when it does not apply."""
        if type(self)._select_host is ThresholdCompressor._select_host:
            return None   # no host path (SIDCo)
        work = _work_dtype(flat)
        if not host_path(work):
            return None
        idx, val = self._select_host(work.numpy(), k)
        return torch.from_numpy(idx), torch.from_numpy(val)

    def _select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        raise NotImplementedError

    def _select_host(self, x: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """The host path: ``(idx, val)`` (int32, signed float32) of a float32 array."""
        raise NotImplementedError

    def _host_generator(self) -> torch.Generator:
        return self._generators(torch.device("cpu"))


class DGCCompressor(ThresholdCompressor):
    """Keep the entries with ``|g| >=`` a threshold estimated from a stratified random sample.

    Args:
        cf: compression factor (target ``numel / kept``).
        sample_ratio: fraction of the entries sampled (DGC uses 0.1 % to 1 %).  ``None``
            (default): a sample of fixed size on the CPU host path (see below) and 1 %
            elsewhere ...
        min_sample_hits: ... raised so that about this many sampled entries lie above the
            threshold; the kept count's relative error is about ``1/sqrt(min_sample_hits)``.
            Tensors up to this sample size use every entry (exact threshold).
        seed: seed of the private per-device generators (see :meth:`set_step`).

    CPU host path (float32 with the native kernels; everything else runs the torch code):
    the sample holds ``min_sample_hits * cf`` entries when that is at most
    ``HOST_SAMPLE_MAX`` (16384; CF <= 40 with the defaults), and DGC's estimate is that
    sample's quantile, as above.  At higher CFs such a sample would cost more than the
    selection itself (400k random reads at CF 1000), so the sample is the size Top-k
    uses (``(k n)^(1/3)``, 2048-65536) and the threshold is read 4 standard deviations
    of the sampled count below the k-th magnitude; when the selection then keeps more
    than ``1.25 k`` the surplus is dropped by magnitude (DGC's hierarchical selection:
    top-k over the selected, here the native radix drop over the candidates).  On both
    branches a count outside ``[0.8 k, 1.25 k]`` is corrected: too many are cut to
    ``k``, too few re-selected at a wider margin.

    Host synchronisations per ``select`` (torch path): one (the size of the final ``nonzero``).
    Cost: a sample gather of ``max(sample_ratio * n, min_sample_hits * cf)`` entries,
    one ``kthvalue`` on the sample, one selection pass over the tensor.
    """

    # Kept count accepted as it is, as a fraction of k (else refined).
    BAND = (0.8, 1.25)

    def __init__(self, cf: float = 100.0, sample_ratio: Optional[float] = None, min_sample_hits: int = 400,
                 seed: int = 0):
        super().__init__(cf, seed)
        self.sample_ratio = None if sample_ratio is None else check_fraction(sample_ratio, "sample_ratio")
        self.min_sample_hits = check_count(min_sample_hits, "min_sample_hits")

    def threshold(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        """The estimated threshold for keeping about ``k`` entries (0-dim device tensor)."""
        n = flat.numel()
        ratio = 0.01 if self.sample_ratio is None else self.sample_ratio
        s = sample_size(n, k, ratio, self.min_sample_hits)
        sample = stratified_abs_sample(flat, s, self._generators(flat.device))
        return sample_quantile(sample, n, k).clamp(min=TINY)

    def _select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        idx, _ = select_abs_at_least(flat, self.threshold(flat, k), k / flat.numel(), magnitudes=False)
        return idx

    def _select_host(self, x: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        from .topk import sample_size as topk_sample_size   # (topk imports this module)

        n = x.size
        few, many = k * self.BAND[0], k * self.BAND[1]
        s = host_sample_size(n, k, self.min_sample_hits, self.sample_ratio)
        plain = s >= n or s * k / n >= self.min_sample_hits
        if not plain:
            s = max(s if self.sample_ratio is not None else 0, topk_sample_size(n, k))
        sample = host_abs_sample(x, s, self._host_generator())
        hits = s * k / n
        if s >= n:            # every entry: the exact k-th magnitude
            ranks = [(k, None)]
        elif plain:           # DGC's estimate: about k (1 +- 1/sqrt(hits)) pass it
            ranks = [(int(round(hits)), None), (margin_rank(s, hits, 12.0), None)]
        else:                 # a margin below the k-th magnitude, then the surplus dropped
            ranks = [(margin_rank(s, hits, sigmas), int(hits - 4.0 * math.sqrt(hits) - 2.0))
                     for sigmas in (4.0, 12.0)]
        for rank, upper in ranks:
            threshold = max(host_rank_value(sample, rank), float(TINY))
            lower = host_rank_value(sample, upper) if upper is not None and upper >= 1 else None
            expected = int(math.ceil((rank + 6.0 * math.sqrt(rank) + 16.0) * n / s)) if s < n else k + 64
            idx, val = native.select(x, threshold, False, expected, rank * n / s if s < n else k)
            if idx.size > many:         # refine: the k largest of the selected
                return native.drop_smallest(idx, val, k, lower)
            if idx.size >= few or s >= n:
                return idx, val
        # Both estimates overshot (or ties at zero): the exact k-th magnitude.
        threshold = max(host_rank_value(np.abs(x), k), float(TINY))
        idx, val = native.select(x, threshold, False, k + 64, k)
        return native.drop_smallest(idx, val, k) if idx.size > many else (idx, val)
