"""DGC as a Horovod ``Compressor``: the selection is
:class:`horovod_gravac.selection.dgc.DGCSelector` (see that module for the algorithm).

The names that used to live here (threshold kernels, samplers, ``DeviceGenerators``,
``check_*``) are re-exported from :mod:`horovod_gravac.selection`.
"""
from __future__ import annotations

from ..selection.base import check_count, check_fraction  # noqa: F401  (re-exported)
from ..selection.dgc import DGCSelector
from ..selection.kernels import (CHUNK, TINY, exceedance_moments, host_path,  # noqa: F401
                                 select_abs_at_least)
from ..selection.sampling import (HOST_SAMPLE_MAX, HOST_SAMPLE_MIN, DeviceGenerators,  # noqa: F401
                                  host_abs_sample, host_rank_value, host_sample_size, margin_rank,
                                  sample_quantile, sample_size, stratified_abs_sample)
from ..selection.threshold import ThresholdSelector
from .base import SparseCompressor


class ThresholdCompressor(ThresholdSelector, SparseCompressor):
    """A threshold selector (DGC, RedSync, SIDCo) as a Horovod ``Compressor``."""


class DGCCompressor(DGCSelector, ThresholdCompressor):
    """Keep the entries with ``|g| >=`` a threshold estimated from a stratified random
    sample.  Arguments: ``cf``, ``sample_ratio``, ``min_sample_hits``, ``seed``; see
    :class:`~horovod_gravac.selection.dgc.DGCSelector`."""
