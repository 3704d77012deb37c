"""SIDCo as a Horovod ``Compressor``: the selection is
:class:`horovod_gravac.selection.sidco.SIDCoSelector` (its stages) with the distribution fits
of :mod:`horovod_gravac.selection.fits` (see those modules for the algorithm)."""
from __future__ import annotations

from ..selection.fits import (DISTRIBUTIONS, fitted_excess, fitted_excess_host,  # noqa: F401  (re-exported)
                              gamma_upper_quantile, gamma_upper_quantile_host)
from ..selection.sidco import SIDCoSelector
from .dgc import ThresholdCompressor


class SIDCoCompressor(SIDCoSelector, ThresholdCompressor):
    """Threshold from a fitted sparsity-inducing distribution with multi-stage refinement.
    Arguments: ``cf``, ``distribution``, ``stages``, ``first_density``, ``stage_density``,
    ``compact_density``, ``refine``, ``tolerance``, ``seed``, ``device_fits``; see
    :class:`~horovod_gravac.selection.sidco.SIDCoSelector`."""
