"""The base of every sparsifier's selection: a compression factor and ``select``.

A :class:`Selector` decides which flat entries of a gradient to keep; it knows nothing
of Horovod.  ``horovod_gravac.compressors.SparseCompressor`` holds one and adds Horovod's
``Compressor`` contract (``compress``/``decompress``/``compress_further``); each compressor
there is ``class XCompressor(SparseCompressor)`` naming its ``selector_class``, with no
code of its own.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from ..cf import check_cf
from .payload import SparsePayload, sparse_payload


class Selector:
    """Which flat entries a sparsifier keeps, at a fixed compression factor.

    Subclasses implement :meth:`select`.

    Attributes:
        cf: the target compression factor (``numel / kept``).
        shared_indices: True when every rank picks the same indices (Random-k with a
            shared seed); the optimizer then sums values with a dense allreduce and
            sends no indices at all.
        step_seeded: True when the draws depend on the step: the optimizer calls
            :meth:`set_step` before each bucket and keeps the step index the same on every
            rank (and in checkpoints).
        fixed_count: True when every selection of ``k`` entries holds exactly ``k``, on every
            rank (exact Top-k, Random-k): two ranks can then exchange payloads of equal size.
        last_quality: after a selection, kept / k of a threshold estimate (None: exact k).
    """

    shared_indices = False
    step_seeded = False
    fixed_count = False
    last_quality: Optional[float] = None

    def __init__(self, cf: float = 100.0):
        self.cf = check_cf(cf)

    def repr_args(self) -> str:
        """The settings that identify this selection, as a constructor's arguments (ranks
        compare them at start-up, checkpoints record them)."""
        return f"cf={self.cf:g}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.repr_args()})"

    def set_step(self, step: int, stream: int = 0) -> None:
        """Draw from ``(seed, step, stream)`` from now on (``stream``: the bucket)."""

    def select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        """Return the int64 or int32 flat indices to keep (about ``k`` of them, unique)."""
        raise NotImplementedError

    def select_payload(self, flat: torch.Tensor, k: int) -> SparsePayload:
        """The payload keeping what :meth:`select` picks.  Subclasses whose selection
        already holds the values (Top-k's native pass) override this to skip the gather."""
        return sparse_payload(flat, self.select(flat, k))

    def select_further(self, values: torch.Tensor, k: int) -> SparsePayload:
        """Multi-level compression: the payload keeping about ``k`` of an earlier payload's
        ``values`` (its indices are positions in ``values``).  By default the selection itself,
        run on the values; the magnitude selectors override it on accelerators
        (:func:`largest_of_payload`)."""
        return self.select_payload(values, k)


def largest_of_payload(values: torch.Tensor, k: int) -> Optional[SparsePayload]:
    """The ``k`` largest magnitudes of a payload's ``values`` by one ``torch.topk``, on
    accelerators (None on the CPU: there the selector runs as for a direct compress).

    Why: a payload is ``1/cf`` of its tensor, and on a GPU a selection's time is its kernel
    launches and host synchronisations, not its arithmetic.  A threshold selector's estimate
    (a sample, a sort, a ``nonzero``: 14-20 launches and 1-3 synchronisations) then cost as much
    on the payload as on the whole tensor, and multi-level compression (10x, then x100 more) ran
    at 0.70-0.99x the time of compressing at 10x and 1000x directly on an H100.  One ``topk``
    over the payload launches a few kernels and needs no synchronisation (``k`` is known on the
    host), and what it keeps is what every magnitude selector aims at: the ``k`` largest (Top-k's
    own further compression is exact anyway; for DGC, RedSync and SIDCo the kept count becomes
    exactly ``k``).  NaN counts as largest, as in Top-k.  None too when ``k`` keeps nothing or
    everything: the selector's own answer then (``topk`` would refuse a ``k`` above the count)."""
    if not (_exact_further(values) and 0 < k < values.numel()):
        return None
    return sparse_payload(values, torch.topk(values.abs(), k, sorted=False).indices)


def _exact_further(values: torch.Tensor) -> bool:
    """Whether :func:`largest_of_payload` applies: accelerators.  (Tests patch it.)"""
    return values.device.type != "cpu"


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

