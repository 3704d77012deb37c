"""RedSync as a Horovod ``Compressor``: the selection is
:class:`horovod_gravac.selection.redsync.RedSyncSelector` (see that module for the algorithm)."""
from __future__ import annotations

from ..selection.redsync import RedSyncSelector
from .base import SparseCompressor


class RedSyncCompressor(SparseCompressor):
    """Binary-search a threshold between ``mean(|g|)`` and ``max(|g|)`` until ``~k`` entries
    pass.  Arguments: ``cf``, ``tolerance``, ``sample_ratio``, ``min_sample_hits``,
    ``max_steps``, ``seed``; see :class:`~horovod_gravac.selection.redsync.RedSyncSelector`."""

    selector_class = RedSyncSelector
