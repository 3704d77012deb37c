"""Random-k: keep k entries chosen uniformly at random.

Indices are drawn by *stratified* sampling: the flat tensor is cut into k
contiguous strata (every entry, the last one included, lies in exactly one; each
holds floor or ceil of numel/k entries) and one position is drawn uniformly inside
each.  That costs O(k), never touches the other entries, gives every entry a
chance of about k/numel, and never repeats an index, so the sparse allgather's
``index_add_`` and error feedback need no de-duplication.

When ``seed`` is given, the draw is a pure function of ``(seed, step, bucket, draw)``:
every rank that uses the same seed and calls ``set_step`` identically picks the same
indices, on any device, so the optimizer can sum the k values with a dense allreduce and
send no indices at all.  ``seed=None`` keys the draws from the operating system's entropy
instead: each rank draws its own indices (not reproducible, so a resumed run will not repeat
them).  The global RNG is never touched.

The draw (:func:`stratified_draw`) is counter-based: the i-th index is the start of stratum i
plus ``floor(u_i * width_i)``, ``u_i`` a 31-bit hash of ``(key, i)``.  Why not a generator:
the indices must be the same integers on every rank whatever device or path computes them,
and on an accelerator they must be drawn there: a host generator's draws (NumPy's bounded draw
with an array of bounds costs 12-18 ns an index) uploaded every step are a synchronising copy
that can take most of a GPU step.  The CPU computes the hash in C (NumPy without the native
kernels) and an accelerator with about 30 integer kernels over k entries, no copy and no
synchronisation (measured 1.3-9.6x faster than a host PCG64 draw; on an H100, Random-k 10x
costs 1.19x a dense step with it, 2.75x with the host draw).  The hash's bias is at most
``width / 2**31`` per position (5e-7 at CF 1000).
"""
from __future__ import annotations

import secrets

import numpy as np
import torch

from .. import native
from .base import Selector

_M32, _M64 = 0xFFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFF
_MIX1, _MIX2 = 0x7FEB352D, 0x1B873593   # odd, below 2**31: int64 products of 32-bit values stay exact


def _mix32(x):
    """A 32-bit mixer (values in [0, 2**32) held in int64 tensors or arrays; the result
    likewise), the C kernel's ``hg_mix32``."""
    x = x ^ (x >> 16)
    x = (x * _MIX1) & _M32
    x = x ^ (x >> 15)
    x = (x * _MIX2) & _M32
    return x ^ (x >> 16)


def _draw_key(base: int, step: int, stream: int, draw: int) -> int:
    """A 64-bit key for one draw from ``(base, step, stream, draw)`` (SplitMix64's finaliser
    over each part in turn, in Python integers: the same on every host)."""
    z = 0
    for part in (base, step, stream, draw):
        z = ((z ^ (int(part) & _M64)) + 0x9E3779B97F4A7C15) & _M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        z ^= z >> 31
    return z


def _index_dtype(numel: int):
    return torch.int32 if numel <= np.iinfo(np.int32).max else torch.int64


def stratified_draw(numel: int, k: int, key: int, device="cpu") -> torch.Tensor:
    """``k`` unique sorted indices in ``[0, numel)`` on ``device``, the i-th uniform in the
    i-th stratum ``[floor(i numel / k), floor((i + 1) numel / k))`` (the strata of
    ``sampling.stratified_indices``), as int32 (int64 beyond 2**31 - 1 entries), so
    compressing needs no index conversion.  The same integers for the same
    ``(numel, k, key)`` on every device and path (``key`` taken modulo 2**64)."""
    key = int(key) & _M64
    dtype = _index_dtype(numel)
    device = torch.device(device)
    if k >= numel:
        return torch.arange(numel, dtype=dtype, device=device)
    size = numel // k
    if size >= 2 ** 32:   # a stratum too wide for the 31-bit fraction's exact products
        raise ValueError(f"Random-k: keeping {k} of {numel} entries makes strata of {size} entries, more than "
                         f"2**32 - 1 (the draw's limit): lower the compression factor cf")
    if device.type == "cpu":
        if native.available():
            return torch.from_numpy(native.stratified_draw(numel, k, key))
        index = _strata_positions_numpy(numel, k, key)
        return torch.from_numpy(index.astype(np.int32 if dtype == torch.int32 else np.int64, copy=False))
    return _strata_positions(torch.arange(k, dtype=torch.int64, device=device), numel, k, key).to(dtype)


def _strata_positions(i, numel: int, k: int, key: int):
    """The draw's formula on ``i = arange(k)`` as an int64 torch tensor (or NumPy array; every
    product below 2**63): the accelerators' path, and the reference the other paths are
    tested against."""
    size, extra = divmod(numel, k)
    h = _mix32(_mix32((i & _M32) ^ (key & _M32)) ^ ((key >> 32) ^ (i >> 32)))
    if extra:   # floor(i * numel / k) = i * size + floor(i * extra / k); width: the next start less this one
        below = (i * extra) // k
        start = i * size + below
        width = ((i + 1) * extra) // k - below + size
    else:
        start, width = i * size, size
    return start + (((h >> 1) * width) >> 31)


def _strata_positions_numpy(numel: int, k: int, key: int) -> np.ndarray:
    """:func:`_strata_positions` in NumPy with the hash in uint32 (wrapping products, in
    place): the same integers at about half the formula's cost, for CPUs without the native
    kernels."""
    if k >= 2 ** 32:   # (i >> 32 is part of the hash)
        return _strata_positions(np.arange(k, dtype=np.int64), numel, k, key)
    x = np.arange(k, dtype=np.uint32)
    with np.errstate(over="ignore"):
        for part in (key & _M32, key >> 32):
            x ^= np.uint32(part)
            x ^= x >> np.uint32(16)
            x *= np.uint32(_MIX1)
            x ^= x >> np.uint32(15)
            x *= np.uint32(_MIX2)
            x ^= x >> np.uint32(16)
    x >>= np.uint32(1)
    size, extra = divmod(numel, k)
    if not extra:
        index = x.astype(np.int64)
        index *= size
        index >>= 31
        index += np.arange(0, numel, size, dtype=np.int64)[:k]
        return index
    below = np.arange(k + 1, dtype=np.int64)
    below *= extra
    below //= k
    width = np.diff(below)
    width += size
    index = x.astype(np.int64)
    index *= width
    index >>= 31
    index += below[:-1]
    index += np.arange(0, size * k, size, dtype=np.int64)[:k]
    return index


class RandomKSelector(Selector):
    """Keep ``numel / cf`` uniformly random entries.

    Multi-level compression is exact in law: a uniform random subset of a uniform
    random subset is a uniform random subset.

    Args:
        cf: compression factor.
        seed: ranks sharing a seed pick the same indices each step (no index traffic).
            ``None`` draws independent indices per rank (seeded from OS entropy).
    """

    step_seeded = True   # set_step re-keys (with seed=None too: the step index stays aligned)
    fixed_count = True   # always exactly k draws

    def __init__(self, cf: float = 100.0, seed: int = 1234):
        super().__init__(cf)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an integer (shared by all ranks) or None, got {seed!r}")
        self.seed = seed
        self.shared_indices = seed is not None
        self._base = int(seed) if seed is not None else secrets.randbits(64)
        self._step = 0
        self._stream = 0
        self._draws = 0   # draws since set_step: compress, then compress_further, each its own key

    def repr_args(self) -> str:
        # The seed is part of the identity: ranks with different seeds must not pair up.
        return f"cf={self.cf:g}, seed={self.seed}"

    def set_step(self, step: int, stream: int = 0) -> None:
        """Key the next draws by (step, stream): the same on every rank, so indices agree."""
        self._step, self._stream, self._draws = int(step), int(stream), 0

    def select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        key = _draw_key(self._base, self._step, self._stream, self._draws)
        self._draws += 1
        return stratified_draw(flat.numel(), k, key, flat.device)
