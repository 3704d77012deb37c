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

A kept count far from ``k`` (outside ``[k/2, 2k]``, ``KEPT_BAND``) is not estimation error (DGC's
is ~5 %, SIDCo's ~10 %) but an input the estimate cannot describe: many magnitudes tied at the
k-th (a constant or value-clipped bucket), where DGC's threshold keeps the whole tie (the bucket
dense, at twice the bytes) and SIDCo's fit lands above it (nothing sent, and error feedback holds
it).  Then the exact ``k`` largest are kept instead (:meth:`ThresholdSelector._within_band`): from
the kept entries when there are too many, by exact Top-k when too few, unless the tensor's zeros
explain the shortfall (zeros are never kept; a 1024-entry probe estimates how many there are).
The count is known on the host either way (the ``nonzero``'s size), so calls within the band
pay nothing; ``fallbacks`` counts the others.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np
import torch

from . import kernels
from .base import Selector, largest_of_payload
from .kernels import _work_dtype, largest_positions
from .payload import SparsePayload
from .sampling import DeviceGenerators, uniform_abs_sample

# Kept counts outside [k/2, 2k] get the exact k largest instead (see the module docstring).
KEPT_BAND = (0.5, 2.0)
# Entries probed to tell a shortfall that the tensor's zeros explain from one a tie caused.
_NONZERO_PROBE = 1024


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
        self.fallbacks = 0   # calls whose count left KEPT_BAND and got the exact k largest
        self._exact = None   # the Top-k selector of those calls (made on first use)

    def set_step(self, step: int, stream: int = 0) -> None:
        """Re-seed the private generators for ``(seed, step, stream)``."""
        self._generators.reseed(hash((self.seed, int(step), int(stream))) & 0x7FFF_FFFF_FFFF_FFFF)

    def select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        n = flat.numel()
        if k >= n:   # CF 1 (or a payload smaller than k): everything, as Top-k does
            idx = torch.arange(n, device=flat.device)
        else:
            pair = self._host_pair(flat, k)
            if pair is None:
                idx = self._within_band(flat, k, self._select(flat, k), None)[0]
            else:
                idx = self._within_band(flat, k, *pair)[0]
        self.last_quality = idx.numel() / k if k > 0 else 1.0
        return idx

    def select_payload(self, flat: torch.Tensor, k: int) -> SparsePayload:
        pair = self._host_pair(flat, k) if 0 < k < flat.numel() else None
        if pair is None:
            return super().select_payload(flat, k)
        idx, val = self._within_band(flat, k, *pair)
        self.last_quality = idx.numel() / k
        return SparsePayload(val, idx)   # the native pass gathered the values

    def _within_band(self, flat: torch.Tensor, k: int, idx: torch.Tensor, val):
        """``(idx, val)`` as selected when ``idx.numel()`` lies in ``KEPT_BAND * k``; otherwise
        the exact ``k`` largest magnitudes (see the module docstring).  ``val``: the kept values
        (host path) or None; kept in step with ``idx``, ascending positions preserved."""
        count = idx.numel()
        if KEPT_BAND[0] * k <= count <= KEPT_BAND[1] * k:
            return idx, val
        work = _work_dtype(flat).reshape(-1)
        if count > k:   # every kept entry passed one threshold: the k largest are among them
            mags = (work.index_select(0, idx.long()) if val is None else val).abs()
            pick = largest_positions(mags, k)
            self.fallbacks += 1
            return idx.index_select(0, pick), None if val is None else val.index_select(0, pick)
        if count >= KEPT_BAND[0] * min(k, self._nonzeros_at_least(work)):   # the zeros explain it
            return idx, val
        if self._exact is None:
            from .topk import TopKSelector   # (topk imports this module's neighbours)
            self._exact = TopKSelector(self.cf, self.seed)
        exact = self._exact.select_payload(flat, k)
        nonzero = torch.nonzero(exact.values != 0).view(-1)   # zeros are never kept
        self.fallbacks += 1
        out_idx = exact.indices.index_select(0, nonzero).to(idx.dtype)
        return out_idx, None if val is None else exact.values.index_select(0, nonzero)

    def select_further(self, values: torch.Tensor, k: int) -> SparsePayload:
        """On accelerators the payload's ``k`` largest magnitudes, exactly (see
        :func:`~.base.largest_of_payload`); on the CPU the selector's own estimate."""
        further = largest_of_payload(values, k)
        if further is None:
            return self.select_payload(values, k)
        self.last_quality = 1.0
        return further

    def _nonzeros_at_least(self, work: torch.Tensor) -> float:
        """A low estimate of ``work``'s nonzero count (NaN counts) from a uniform probe of 1024
        entries, 3 standard deviations down.  A gradient with fewer nonzeros than ``k`` (an
        embedding's rows, most untouched) sends all of them, which a count of at least half this
        estimate confirms; a tie in a gradient without zeros (the probe finds nearly all of them
        nonzero) does not pass for that.  Counting them exactly would be one more pass over the
        whole bucket on every such call, slower on the CPU than the selection's own fused pass."""
        n, s = work.numel(), min(work.numel(), _NONZERO_PROBE)
        if s == n:
            return float(torch.count_nonzero(work))
        probe = uniform_abs_sample(work, s, self._generators(work.device))
        hits = float(torch.count_nonzero(probe))
        return max(hits - 3.0 * hits ** 0.5, 0.0) * n / s

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
