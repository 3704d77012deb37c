"""DGC as a Horovod ``Compressor``: the selection is
:class:`horovod_gravac.selection.dgc.DGCSelector` (see that module for the algorithm)."""
from __future__ import annotations

from ..selection.dgc import DGCSelector
from .base import SparseCompressor


class DGCCompressor(SparseCompressor):
    """Keep the entries with ``|g| >=`` a threshold estimated from a stratified random
    sample.  Arguments: ``cf``, ``sample_ratio``, ``min_sample_hits``, ``seed``; see
    :class:`~horovod_gravac.selection.dgc.DGCSelector`."""

    selector_class = DGCSelector
