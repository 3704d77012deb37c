"""SIDCo as a Horovod ``Compressor``: the selection is
:class:`horovod_gravac.selection.sidco.SIDCoSelector` (its stages) with the distribution fits
of :mod:`horovod_gravac.selection.fits` (see those modules for the algorithm)."""
from __future__ import annotations

from ..selection.sidco import SIDCoSelector
from .base import SparseCompressor


class SIDCoCompressor(SparseCompressor):
    """Threshold from a fitted sparsity-inducing distribution with multi-stage refinement.
    Arguments: ``cf``, ``distribution``, ``stages``, ``first_density``, ``stage_density``,
    ``compact_density``, ``refine``, ``tolerance``, ``seed``, ``device_fits``; see
    :class:`~horovod_gravac.selection.sidco.SIDCoSelector`."""

    selector_class = SIDCoSelector
