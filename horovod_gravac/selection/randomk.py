"""Random-k: keep k entries chosen uniformly at random.

Indices are drawn by *stratified* sampling: the flat tensor is cut into k
contiguous strata (every entry, the last one included, lies in exactly one; each
holds floor or ceil of numel/k entries) and one position is drawn uniformly inside
each.  That costs O(k), never touches the other entries, gives every entry a
chance of about k/numel, and never repeats an index, so the sparse allgather's
``index_add_`` and error feedback need no de-duplication.

When ``seed`` is given, the draw comes from a private NumPy PCG64 generator seeded
with ``(seed, step, bucket)``: every rank that uses the same seed and calls
``set_step`` identically picks the same indices, so the optimizer can sum the k
values with a dense allreduce and send no indices at all.  ``seed=None`` seeds the
generator from the operating system's entropy: each rank draws its own indices (not
reproducible, so a resumed run will not repeat them).  The global RNG is never
touched.

Random-k draws on the CPU with :func:`stratified_draw` (integer offsets straight into
int32, about twice as fast as the float-based ``sampling.stratified_indices``, which DGC's
samplers keep because they draw on the tensor's own device).
"""
from __future__ import annotations

import numpy as np
import torch

from .base import Selector


def stratified_draw(numel: int, k: int, rng: np.random.Generator) -> torch.Tensor:
    """``k`` unique sorted indices in ``[0, numel)``, one exactly uniform draw per stratum
    (the strata of ``sampling.stratified_indices``), on the CPU, as int32 (int64 beyond
    2**31 - 1 entries), so compressing needs no index conversion."""
    dtype = np.int32 if numel <= np.iinfo(np.int32).max else np.int64
    if k >= numel:
        return torch.from_numpy(np.arange(numel, dtype=dtype))
    size, extra = divmod(numel, k)
    if extra == 0:   # equal strata
        index = np.arange(0, numel, size, dtype=dtype)
        index += rng.integers(0, size, size=k, dtype=dtype)
    else:            # floor(i * numel / k) = i * size + floor(i * extra / k), without overflow
        i = np.arange(k + 1, dtype=np.int64)
        starts = i * size + i * extra // k
        index = (starts[:-1] + rng.integers(0, np.diff(starts))).astype(dtype, copy=False)
    return torch.from_numpy(index)


class RandomKSelector(Selector):
    """Keep ``numel / cf`` uniformly random entries.

    Multi-level compression is exact in law: a uniform random subset of a uniform
    random subset is a uniform random subset.

    Args:
        cf: compression factor.
        seed: ranks sharing a seed pick the same indices each step (no index traffic).
            ``None`` draws independent indices per rank (seeded from OS entropy).
    """

    step_seeded = True   # set_step re-seeds (with seed=None too: the step index stays aligned)

    def __init__(self, cf: float = 100.0, seed: int = 1234):
        super().__init__(cf)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an integer (shared by all ranks) or None, got {seed!r}")
        self.seed = seed
        self.shared_indices = seed is not None
        self._step = 0
        self._stream = 0
        self._rng = np.random.Generator(np.random.PCG64(None if seed is None else int(seed)))

    def __repr__(self) -> str:
        # The seed is part of the identity: ranks with different seeds must not pair up.
        return f"{type(self).__name__}(cf={self.cf:g}, seed={self.seed})"

    def set_step(self, step: int, stream: int = 0) -> None:
        """Re-seed for (step, stream): the same on every rank, so indices agree."""
        self._step, self._stream = int(step), int(stream)
        if self.seed is not None:
            mixed = (int(self.seed) * 1_000_003 + self._step) * 1_000_033 + self._stream
            self._rng = np.random.Generator(np.random.PCG64(mixed & 0x7FFF_FFFF_FFFF_FFFF))

    def select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        # Drawn on the CPU; indices move to the tensor's device.
        return stratified_draw(flat.numel(), k, self._rng).to(flat.device)
