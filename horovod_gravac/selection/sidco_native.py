"""SIDCo's CPU host path in C: after the sample, the whole of
:meth:`~.sidco_host.HostStages.select` runs in ``native.sidco_select`` (``kernels.c``'s
``hg_sidco_select``), step for step and in the same double arithmetic, so both keep the same
entries (``tests/unit/test_host_path.py`` compares them).  In Python the scalar work between the
native passes costs about as much as the selection pass of a 1M-entry bucket; in C it is
negligible.  ``sidco._NATIVE_STAGES`` switches back to the Python version.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from .. import native
from . import fits, sidco_host
from .kernels import TINY

_DIST_CODES = {"exponential": 0, "gpareto": 1, "gamma": 2}   # (kernels.c's HG_EXPONENTIAL ...)


class NativeStages:
    """SIDCo's host stages in C for ``selector`` (a :class:`~.sidco.SIDCoSelector`)."""

    def __init__(self, selector):
        self.selector = selector
        self.stages_fitted = 0   # of the last call
        self.passes = 0          # streaming passes over the tensor that fitted a stage, last call

    def select_array(self, x: np.ndarray, k: int, sample: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """``(idx, val)`` (int32, float32) of a float32 array, from its host ``sample``."""
        idx, val, done = native.sidco_select(x, sample, k, self.settings())
        self.stages_fitted, self.passes = done["stages"], done["passes"]
        return idx, val

    def settings(self) -> tuple:
        """The selector's settings and the host stages' constants, as ``native.sidco_select``
        takes them (in the order of ``kernels.c``'s ``HG_S_*``; the constants are read per call,
        so a change to ``sidco_host``'s reaches C too)."""
        sel = self.selector
        return (_DIST_CODES[sel.distribution], sel.stages or 0, sel.first_density, sel.stage_density,
                sel.compact_density, sel.refine, sel.tolerance, sidco_host._SAMPLE_REFINE_HITS,
                sidco_host._SAMPLE_TRUST_HITS, sidco_host._SAMPLE_FIT_MIN, sidco_host._SAMPLE_DEEP_MIN,
                sidco_host._GATHER_NOT_PASS_MIN, sidco_host._CANDIDATE_FITS, sidco_host._GATHER_AT_LEAST,
                fits._NEWTON_STEPS, float(TINY))
