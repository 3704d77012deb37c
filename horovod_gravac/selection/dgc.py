"""DGC: keep every entry whose magnitude reaches a threshold estimated from a sample.

Deep Gradient Compression (Lin et al., ICLR 2018) estimates the threshold for
density ``1/cf`` from a small random sample of the gradient (0.1-1 % of the
entries), then keeps every entry with ``|g| >= threshold``.  The kept count is
therefore only *about* ``k`` (it varies per call and per rank); the achieved
``kept / k`` is recorded as ``last_quality`` (estimation quality).  DGC's momentum
correction and local gradient clipping are training-side options of the
optimizer / error-feedback memory (``momentum_correction=``, ``local_clip_norm=``),
not of the compressor.

The sample's positions are random, from a private ``torch.Generator`` that lives on
the tensor's own device (the global RNG is never touched), so they cannot alias with
periodic structure (tiled or convolutional layouts) the way a fixed-stride sample
could: on the CPU host path one per stratum (``host_abs_sample``), elsewhere uniform
with replacement (``uniform_abs_sample``: one ``randint`` and one gather, five
operations fewer than one draw per stratum, which on a GPU is what a call's time
follows at bucket sizes; repeats among ``s << n`` draws change the count's error by
a factor ``1 + O(s / n)``).  The sample size is
chosen so that the sample holds a few hundred entries above the threshold, which
bounds the relative error of the kept count (about ``1/sqrt(hits)``, i.e. 5 % for
the default 400 hits) at every CF, CF 1000 included.

The shared parts live beside this module: the threshold kernels in ``kernels.py``, the
samples in ``sampling.py``, the host path's dispatch in ``threshold.py``.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np
import torch

from .. import native
from .base import check_count, check_fraction
from .kernels import TINY, select_abs_at_least
from .sampling import (host_abs_sample, host_rank_value, host_sample_size, margin_rank, sample_quantile,
                       sample_size, uniform_abs_sample)
from .threshold import ThresholdSelector
from .topk import sample_size as topk_sample_size


class DGCSelector(ThresholdSelector):
    """Keep the entries with ``|g| >=`` a threshold estimated from a random sample.

    Args:
        cf: compression factor (target ``numel / kept``).
        sample_ratio: fraction of the entries sampled (DGC uses 0.1 % to 1 %).  ``None``
            (default): a sample of fixed size on the CPU host path (see below) and 1 %
            elsewhere ...
        min_sample_hits: ... raised so that about this many sampled entries lie above the
            threshold; the kept count's relative error is about ``1/sqrt(min_sample_hits)``.
            Tensors up to this sample size use every entry (exact threshold).
        seed: seed of the private per-device generators (see :meth:`set_step`).

    CPU host path (float32 with the native kernels; everything else runs the torch code):
    the sample holds ``min_sample_hits * cf`` entries when that is at most
    ``HOST_SAMPLE_MAX`` (16384; CF <= 40 with the defaults), and DGC's estimate is that
    sample's quantile, as above.  At higher CFs such a sample would cost more than the
    selection itself (400k random reads at CF 1000), so the sample is the size Top-k
    uses (``(k n)^(1/3)``, 2048-65536) and the threshold is read 4 standard deviations
    of the sampled count below the k-th magnitude; when the selection then keeps more
    than ``1.25 k`` the surplus is dropped by magnitude (DGC's hierarchical selection:
    top-k over the selected, here the native radix drop over the candidates).  On both
    branches a count outside ``[0.8 k, 1.25 k]`` is corrected: too many are cut to
    ``k``, too few re-selected at a wider margin.

    Host synchronisations per ``select`` (torch path): one (the size of the final ``nonzero``).
    Cost: a sample gather of ``max(sample_ratio * n, min_sample_hits * cf)`` entries,
    one order statistic of the sample (``sample_quantile``), one selection pass over the tensor.
    """

    # Kept count accepted as it is, as a fraction of k (else refined).
    BAND = (0.8, 1.25)

    def __init__(self, cf: float = 100.0, sample_ratio: Optional[float] = None, min_sample_hits: int = 400,
                 seed: int = 0):
        super().__init__(cf, seed)
        self.sample_ratio = None if sample_ratio is None else check_fraction(sample_ratio, "sample_ratio")
        self.min_sample_hits = check_count(min_sample_hits, "min_sample_hits")

    def threshold(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        """The estimated threshold for keeping about ``k`` entries (0-dim device tensor)."""
        n = flat.numel()
        ratio = 0.01 if self.sample_ratio is None else self.sample_ratio
        s = sample_size(n, k, ratio, self.min_sample_hits)
        sample = uniform_abs_sample(flat, s, self._generators(flat.device))
        return sample_quantile(sample, n, k).clamp(min=TINY)

    def _select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        idx, _ = select_abs_at_least(flat, self.threshold(flat, k), k / flat.numel(), magnitudes=False)
        return idx

    def _select_host(self, x: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        n = x.size
        few, many = k * self.BAND[0], k * self.BAND[1]
        s = host_sample_size(n, k, self.min_sample_hits, self.sample_ratio)
        plain = s >= n or s * k / n >= self.min_sample_hits
        if not plain:
            s = max(s if self.sample_ratio is not None else 0, topk_sample_size(n, k))
        sample = host_abs_sample(x, s, self._host_generator())
        hits = s * k / n
        if s >= n:            # every entry: the exact k-th magnitude
            ranks = [(k, None)]
        elif plain:           # DGC's estimate: about k (1 +- 1/sqrt(hits)) pass it
            ranks = [(int(round(hits)), None), (margin_rank(s, hits, 12.0), None)]
        else:                 # a margin below the k-th magnitude, then the surplus dropped
            ranks = [(margin_rank(s, hits, sigmas), int(hits - 4.0 * math.sqrt(hits) - 2.0))
                     for sigmas in (4.0, 12.0)]
        for rank, upper in ranks:
            threshold = max(host_rank_value(sample, rank), float(TINY))
            lower = host_rank_value(sample, upper) if upper is not None and upper >= 1 else None
            expected = int(math.ceil((rank + 6.0 * math.sqrt(rank) + 16.0) * n / s)) if s < n else k + 64
            idx, val = native.select(x, threshold, False, expected, rank * n / s if s < n else k)
            if idx.size > many:         # refine: the k largest of the selected
                return native.drop_smallest(idx, val, k, lower)
            if idx.size >= few or s >= n or threshold <= TINY:
                # (at TINY every nonzero is kept: a gradient with fewer than k, an embedding's
                # rows; the exact k-th magnitude below is then 0, and finding it would rank the
                # whole bucket for nothing)
                return idx, val
        # Both estimates overshot (or ties at zero): the exact k-th magnitude.
        threshold = max(host_rank_value(np.abs(x), k), float(TINY))
        idx, val = native.select(x, threshold, False, k + 64, k)
        return native.drop_smallest(idx, val, k) if idx.size > many else (idx, val)
