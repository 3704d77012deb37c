"""Random-k: keep k entries chosen uniformly at random.

Indices are drawn by *stratified* sampling: the flat tensor is cut into k
contiguous strata with integer boundaries ``floor(i * numel / k)`` (every entry,
the last one included, lies in exactly one; each holds floor or ceil of numel/k
entries) and one position is drawn uniformly inside each.  That costs O(k), never
touches the other entries, gives every entry a chance of about k/numel, and never
repeats an index, so the sparse allgather's ``index_add_`` and error feedback need
no de-duplication.

When ``seed`` is given, the draw comes from a private ``torch.Generator`` seeded
with ``(seed, step, bucket)``: every rank that uses the same seed and calls
``set_step`` identically picks the same indices, so the optimizer can sum the k
values with a dense allreduce and send no indices at all.  The global RNG is
never touched.
"""
from __future__ import annotations

import torch

from .base import SparseCompressor


def stratified_indices(numel: int, k: int, generator: torch.Generator, device=None) -> torch.Tensor:
    """``k`` unique sorted indices in ``[0, numel)``, one uniform draw per stratum."""
    if k >= numel:
        return torch.arange(numel, device=device)
    bounds = torch.arange(k + 1, dtype=torch.int64, device=device) * numel // k
    sizes = bounds[1:] - bounds[:-1]                   # >= 1 because k <= numel
    u = torch.rand(k, generator=generator, dtype=torch.float64, device=device)
    offsets = (u * sizes).floor_().to(torch.int64).clamp_(max=sizes - 1)
    return bounds[:-1] + offsets


class RandomKCompressor(SparseCompressor):
    """Keep ``numel / cf`` uniformly random entries.

    Multi-level compression is exact in law: a uniform random subset of a uniform
    random subset is a uniform random subset.

    Args:
        cf: compression factor.
        seed: ranks sharing a seed pick the same indices each step (no index traffic).
            ``None`` draws independent indices per rank from a private generator.
    """

    def __init__(self, cf: float = 100.0, seed: int = 1234):
        super().__init__(cf)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an integer (shared by all ranks) or None, got {seed!r}")
        self.seed = seed
        self.shared_indices = seed is not None
        self._step = 0
        self._stream = 0
        self._generator = torch.Generator()
        self._generator.manual_seed(0 if seed is None else int(seed))

    def __repr__(self) -> str:
        # The seed is part of the identity: ranks with different seeds must not pair up.
        return f"RandomKCompressor(cf={self.cf:g}, seed={self.seed})"

    def set_step(self, step: int, stream: int = 0) -> None:
        """Re-seed for (step, stream): the same on every rank, so indices agree."""
        self._step, self._stream = int(step), int(stream)
        if self.seed is not None:
            mixed = (int(self.seed) * 1_000_003 + self._step) * 1_000_033 + self._stream
            self._generator.manual_seed(mixed & 0x7FFF_FFFF_FFFF_FFFF)

    def select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        # The generator lives on the CPU; indices move to the tensor's device.
        return stratified_indices(flat.numel(), k, self._generator).to(flat.device)
