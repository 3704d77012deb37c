"""The common part of the threshold selectors (DGC, RedSync, SIDCo).

Each keeps the entries whose magnitude reaches a threshold, so the kept count is only
*about* ``k``; the achieved ``kept / k`` is recorded as ``last_quality``.  Sampling
draws from private per-device generators re-seeded by ``set_step``.

CPU host path.  The optimizer compresses buckets of at most 6.5M entries, where
a streaming pass runs in cache (0.06-1.6 ms) and per-call fixed costs decide: torch ops on
0-dim tensors cost 5-10 us each, a 1 % sample (or ``min_sample_hits * cf`` entries, 400k
at CF 1000) costs more than the selection, and a search that recounts every candidate per
step costs a pass per step.  So on the CPU, float32 tensors with the native kernels
switched on (:func:`kernels.host_path`) go through ``_select_host`` of each selector:
NumPy arrays and Python floats (there is no device to wait for), a sample of fixed size
drawn from the same private generator, the native select pass (which also gathers the kept
values, so ``compress`` needs no gather), and for RedSync and SIDCo native kernels for
their search and statistics passes.  Every other case (other devices, float64, kernels
not built or switched off) runs the torch code (``_select``).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

from . import kernels
from .base import Selector, largest_of_payload
from .kernels import _work_dtype
from .payload import SparsePayload
from .sampling import DeviceGenerators


class ThresholdSelector(Selector):
    """Common parts of the threshold selectors: degenerate inputs, ``last_quality``, seeding.

    Sampling draws from private per-device generators.  The optimizer calls
    ``set_step(step, bucket)`` before compressing a bucket (as for Random-k); the draws
    then depend only on ``(seed, step, bucket)``, so a run resumed from a checkpoint
    samples exactly what the original run sampled.
    """

    step_seeded = True

    def __init__(self, cf: float = 100.0, seed: int = 0):
        super().__init__(cf)
        self._generators = DeviceGenerators(seed)
        self.seed = seed

    def set_step(self, step: int, stream: int = 0) -> None:
        """Re-seed the private generators for ``(seed, step, stream)``."""
        self._generators.reseed(hash((self.seed, int(step), int(stream))) & 0x7FFF_FFFF_FFFF_FFFF)

    def select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        n = flat.numel()
        if k >= n:   # CF 1 (or a payload smaller than k): everything, as Top-k does
            idx = torch.arange(n, device=flat.device)
        else:
            pair = self._host_pair(flat, k)
            idx = self._select(flat, k) if pair is None else pair[0]
        self.last_quality = idx.numel() / k if k > 0 else 1.0
        return idx

    def select_payload(self, flat: torch.Tensor, k: int) -> SparsePayload:
        pair = self._host_pair(flat, k) if 0 < k < flat.numel() else None
        if pair is None:
            return super().select_payload(flat, k)
        self.last_quality = pair[0].numel() / k
        return SparsePayload(pair[1], pair[0])   # the native pass gathered the values

    def select_further(self, values: torch.Tensor, k: int) -> SparsePayload:
        """On accelerators the payload's ``k`` largest magnitudes, exactly (see
        :func:`~.base.largest_of_payload`); on the CPU the selector's own estimate."""
        further = largest_of_payload(values, k)
        if further is None:
            return self.select_payload(values, k)
        self.last_quality = 1.0
        return further

    def _host_pair(self, flat: torch.Tensor, k: int):
        """``(int32 indices, float32 values)`` from the host path, or None when it does not apply."""
        if type(self)._select_host is ThresholdSelector._select_host:
            return None   # a selector without a host path
        work = _work_dtype(flat)
        if not kernels.host_path(work):   # (looked up here: tests patch it)
            return None
        idx, val = self._select_host(work.numpy(), k)
        return torch.from_numpy(idx), torch.from_numpy(val)

    def _select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        raise NotImplementedError

    def _select_host(self, x: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """The host path: ``(idx, val)`` (int32, signed float32) of a float32 array."""
        raise NotImplementedError

    def _host_generator(self) -> torch.Generator:
        return self._generators(torch.device("cpu"))
