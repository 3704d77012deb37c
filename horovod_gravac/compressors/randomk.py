"""Random-k as a Horovod ``Compressor``: the selection is
:class:`horovod_gravac.selection.randomk.RandomKSelector` (see that module for the draw)."""
from __future__ import annotations

from ..selection.randomk import RandomKSelector
from .base import SparseCompressor


class RandomKCompressor(SparseCompressor):
    """Keep ``numel / cf`` uniformly random entries; ranks sharing ``seed`` pick the same
    indices each step (no index traffic).  Arguments: ``cf``, ``seed``; see
    :class:`~horovod_gravac.selection.randomk.RandomKSelector`."""

    selector_class = RandomKSelector
