"""The base of every sparsifier's selection: a compression factor and ``select``.

A :class:`Selector` decides which flat entries of a gradient to keep; it knows nothing
of Horovod.  ``horovod_gravac.compressors.SparseCompressor`` combines it with Horovod's
``Compressor`` (``compress``/``decompress``/``compress_further``), and each compressor
there is ``class XCompressor(XSelector, SparseCompressor)`` with no code of its own.
"""
from __future__ import annotations

import math

import torch

from ..cf import check_cf
from .payload import SparsePayload, sparse_payload


class Selector:
    """Which flat entries a sparsifier keeps, at a fixed compression factor.

    Subclasses implement :meth:`select`.

    Attributes:
        cf: the target compression factor (``numel / kept``).
    """


    def __init__(self, cf: float = 100.0):
        self.cf = check_cf(cf)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cf={self.cf:g})"

    def select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        """Return the int64 or int32 flat indices to keep (about ``k`` of them, unique)."""
        raise NotImplementedError

    def select_payload(self, flat: torch.Tensor, k: int) -> SparsePayload:
        """The payload keeping what :meth:`select` picks.  Subclasses whose selection
        already holds the values (Top-k's native pass) override this to skip the gather."""
        return sparse_payload(flat, self.select(flat, k))


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

