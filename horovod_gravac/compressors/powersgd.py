"""PowerSGD (Vogels et al., NeurIPS 2019): rank-r approximation by one power iteration.

For a gradient matrix M (n x m; conv kernels are viewed as out_channels x rest):

    P = M Q            -> allreduce-mean P     (n*r floats)
    P = orthonormal(P)
    Q = M^T P          -> allreduce-mean Q     (m*r floats)
    M ~ P Q^T,  residual = M - P Q^T (error feedback)

Q is warm-started from the previous step (it starts from the same seeded random
matrix on every rank) so one power iteration per step suffices.  Vectors
(biases, norms) are sent uncompressed, as in the paper.  The two collectives and
the warm-start state live in the optimizer (they need the parameter's identity);
this class holds the rank rule and the math, so it can be tested alone.

Used by ``Accordion`` in the paper's Table 4 (rank 4 in critical regimes, rank 1
otherwise): ``compressor=lambda cf: PowerSGDCompressor(cf=cf, rank=4 if cf == low else 1)``,
or give only ``cf`` and let each matrix get the largest rank that reaches it.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..cf import check_cf
from ..selection.payload import check_tensor
from .base import GradientCompressor, _HorovodCompressor


class LowRankPayload(NamedTuple):
    p: torch.Tensor   # n x r, orthonormal columns
    q: torch.Tensor   # m x r


class LowRankContext(NamedTuple):
    shape: torch.Size
    dtype: torch.dtype


def as_matrix(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(tensor.shape[0], -1)


def orthonormalize(p: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning p (reduced QR); zero columns stay harmless."""
    q, _ = torch.linalg.qr(p, mode="reduced")
    return q


class PowerSGDCompressor(_HorovodCompressor):
    """Low-rank compressor.

    Args:
        cf: target compression factor; a matrix n x m gets rank
            ``max(1, floor(n*m / (cf*(n+m))))`` unless ``rank`` is given.
        rank: fixed rank for every matrix (the paper's Rank-1 / Rank-4).
        seed: seed of the initial Q, identical on every rank.
    """

    low_rank = True
    # The rest of what the optimizer asks of a compressor (GradientCompressor): one seeded Q,
    # no per-step draws, no sparse payload.
    shared_indices = False
    step_seeded = False
    fixed_count = False
    last_quality = None

    def set_step(self, step: int, stream: int = 0) -> None:
        pass

    def __init__(self, cf: float = 10.0, rank: Optional[int] = None, seed: int = 0):
        self.cf = check_cf(cf)
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
            raise ValueError(f"rank must be a positive integer or None, got {rank!r}")
        self.rank = rank
        self.seed = int(seed)

    def __repr__(self) -> str:
        return f"PowerSGDCompressor(cf={self.cf:g}, rank={self.rank})"

    def rank_for(self, n: int, m: int) -> int:
        r = self.rank if self.rank is not None else int(n * m / (self.cf * (n + m)))
        return max(1, min(r, n, m))

    def initial_q(self, m: int, r: int, key: int, device=None) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + key)
        return torch.randn(m, r, generator=g).to(device)

    @staticmethod
    def compressible(tensor: torch.Tensor) -> bool:
        return tensor.dim() >= 2 and min(tensor.shape[0], tensor[0].numel()) > 1

    # Horovod's Compressor contract, single process (no averaging): one power iteration.
    def compress(self, tensor: torch.Tensor):
        check_tensor(tensor)
        m = as_matrix(tensor.detach().float())
        r = self.rank_for(*m.shape)
        p = orthonormalize(m @ self.initial_q(m.shape[1], r, 0, m.device))
        return LowRankPayload(p, m.t() @ p), LowRankContext(tensor.shape, tensor.dtype)

    def decompress(self, payload: LowRankPayload, ctx: LowRankContext) -> torch.Tensor:
        return (payload.p @ payload.q.t()).to(ctx.dtype).reshape(ctx.shape)

    def compress_further(self, payload, ctx, factor):
        raise NotImplementedError("multi-level compression applies to sparsifiers; "
                                  "PowerSGD works with Dense, StaticCF and Accordion controllers")


GradientCompressor.register(PowerSGDCompressor)
