"""Random-k as a Horovod ``Compressor``: the selection is
:class:`horovod_gravac.selection.randomk.RandomKSelector` (see that module for the draw)."""
from __future__ import annotations

from ..selection.randomk import RandomKSelector, stratified_draw  # noqa: F401  (re-exported)
from ..selection.sampling import stratified_indices  # noqa: F401  (re-exported)
from .base import SparseCompressor


class RandomKCompressor(RandomKSelector, SparseCompressor):
    """Keep ``numel / cf`` uniformly random entries; ranks sharing ``seed`` pick the same
    indices each step (no index traffic).  Arguments: ``cf``, ``seed``; see
    :class:`~horovod_gravac.selection.randomk.RandomKSelector`."""
