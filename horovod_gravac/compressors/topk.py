"""Top-k: keep exactly the k entries of largest magnitude.

``torch.topk`` over a 25M-entry tensor costs 7-10 streaming passes on a CPU.  We
get the same answer cheaper: estimate a threshold from a random sample that is
slightly *below* the k-th largest magnitude, take the (few) candidates above it,
and run the exact ``topk`` on those only.  The result is exact whenever at least
k candidates pass; when the estimate overshoots (rare: the margin is four
standard deviations of the sample quantile) the threshold is lowered and we try
again, and the last resort is a full ``topk``.
"""
from __future__ import annotations

import math

import torch

from .base import SparseCompressor

# Below this many entries a plain topk is cheaper than sampling.
_SMALL = 1 << 16
_SAMPLE = 1 << 17


def topk_indices(magnitude: torch.Tensor, k: int, generator: torch.Generator = None) -> torch.Tensor:
    """Flat indices of the ``k`` largest entries of ``magnitude`` (1-D, non-negative)."""
    n = magnitude.numel()
    if k >= n:
        return torch.arange(n, device=magnitude.device)
    if n <= _SMALL or k * 4 >= n:
        return torch.topk(magnitude, k, sorted=False).indices
    sample = magnitude[torch.randint(n, (_SAMPLE,), device=magnitude.device, generator=generator)]
    p = k / n
    for widen in (4.0, 12.0):
        # Expected candidates: a little over k, by `widen` standard deviations.
        q = min(1.0, p * (1.0 + widen / math.sqrt(max(1.0, _SAMPLE * p))) + 8.0 / _SAMPLE)
        rank = max(1, _SAMPLE - int(q * _SAMPLE))  # kthvalue is 1-based ascending
        threshold = torch.kthvalue(sample, rank).values
        candidates = torch.nonzero(magnitude >= threshold).view(-1)
        if candidates.numel() >= k:
            keep = torch.topk(magnitude.index_select(0, candidates), k, sorted=False).indices
            return candidates.index_select(0, keep)
    return torch.topk(magnitude, k, sorted=False).indices


class TopKCompressor(SparseCompressor):
    """Keep the ``numel / cf`` largest-magnitude entries (at least one).

    Multi-level compression is exact: the top ``k2`` of the top ``k1`` entries are
    the top ``k2`` of the original, for ``k2 <= k1``.
    """

    exact_multilevel = True

    def select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        return topk_indices(flat.abs(), k)
