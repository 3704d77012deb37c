"""Top-k as a Horovod ``Compressor``: the selection is
:class:`horovod_gravac.selection.topk.TopKSelector` (see that module for the algorithm)."""
from __future__ import annotations

from ..selection.topk import TopKSelector
from .base import SparseCompressor


class TopKCompressor(SparseCompressor):
    """Keep the ``numel / cf`` largest-magnitude entries (at least one); multi-level
    compression is exact.  Arguments: ``cf``, ``seed`` (of the threshold sample; the
    kept set does not depend on it), ``send_zeros`` (False: a tensor with fewer nonzeros
    than that sends only its nonzeros, on the CPU); see
    :class:`~horovod_gravac.selection.topk.TopKSelector`."""

    selector_class = TopKSelector
