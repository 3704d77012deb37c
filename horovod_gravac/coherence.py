"""Gradient coherence: how much of a step's gradient is signal rather than sampling noise.

GraVAC's gain says how much of a gradient a CF keeps; it cannot say whether what is dropped
matters.  That depends on the noise in the gradient.  A minibatch gradient is the true
gradient G plus sampling noise.  When the noise dominates, as on a model that has fitted its
training data, what a sparsifier drops (and error feedback delays) is small next to noise
that SGD already averages out, and a high CF costs little accuracy.  When the signal
dominates, as in a language model that is still learning, every step's gradient carries
information the next step needs, and a CF above the lowest costs accuracy even when its
gain looks good.  ("Signal" and "noise" as in McCandlish et al., *An Empirical Model of
Large-Batch Training*, 2018: the critical batch size.)

The statistic is the cosine between a rank's raw gradients at consecutive steps. Two
independent minibatch gradients of a slowly moving G have an expected inner product of
about |G|^2, while each has a squared norm of about |G|^2 plus the noise.  So the cosine
estimates the signal's share of one rank's gradient, near 0 when noise dominates.  It is
measured on a fixed, evenly strided sample of each bucket's coordinates: at most
``SAMPLE_MAX`` per bucket, kept from one step to the next.  This costs no communication
beyond three float64 statistics that ride with the step's others (``wire.StepStats``).
Consecutive batches that are not independent (consecutive chunks of one text) read higher
than their signal share, which errs toward holding the lowest CF.

What the step applies is the gradient averaged over N ranks, whose noise is 1/N of one
rank's: its signal share is ``N c / (1 + (N - 1) c)`` for a per-rank share ``c``
(:func:`signal_share`).  It is one half where the noise of the averaged gradient equals its
signal, i.e. where the global batch is McCandlish's critical batch size: below it a step's
progress is limited by noise, and the error that compression adds (what a sparsifier drops
and error feedback delays) is one more noise that SGD averages out; above it each step's
gradient is mostly information the next step needs, and delaying part of it costs progress.
:func:`hold_coherence` is the per-rank cosine at that point, ``1 / (N + 1)``: the threshold
``GraVAC(variant="predictive")`` holds theta_min above (``controllers/predictive.py``).
docs/benchmarks.md has the readings on the benchmarks' workloads.
"""
from __future__ import annotations

import math
from typing import Dict, Optional

import torch

#: Coordinates sampled per bucket, at most: plenty for a window's mean, and a negligible
#: copy per step (2 % of a bucket of 3 M entries).
SAMPLE_MAX = 65536


def sample_stride(numel: int) -> int:
    """The stride of a bucket's sample: every coordinate up to ``SAMPLE_MAX``."""
    return max(1, -(-numel // SAMPLE_MAX))


class CoherenceSampler:
    """Each bucket's sample of the previous step's raw gradient (this rank's), and the three
    sums of a step: ``<g_t, g_t-1>``, ``|g_t|^2`` and ``|g_t-1|^2`` over the sampled
    coordinates, as one float64 tensor left on the bucket's device (no host sync).  Buckets
    are keyed by their parameters' names, so a checkpoint's samples find their bucket again
    (``state_dict``: saved with the residuals, by ``checkpoint.gravac_state``)."""

    def __init__(self):
        self._previous: Dict[str, torch.Tensor] = {}

    @staticmethod
    def key(names) -> str:
        return "|".join(names)

    def before(self, residual: Optional[torch.Tensor], numel: int) -> Optional[torch.Tensor]:
        """The sampled residual before this step's gradient is added (None: no residual yet)."""
        if residual is None or residual.numel() != numel:
            return None
        return residual[::sample_stride(numel)].clone()

    def measure(self, key: str, g_ef: torch.Tensor, residual_before: Optional[torch.Tensor],
                scale: float) -> torch.Tensor:
        """The three sums for the bucket ``key`` (zeros on its first step or after a change
        of its size).  ``g_ef`` = ``residual_before * scale + g``; ``g``, the step's raw
        gradient, is their difference at the sampled coordinates, divided by ``scale``."""
        now = g_ef[::sample_stride(g_ef.numel())].double()
        if residual_before is not None:
            now = now - residual_before.double() * scale
        if scale != 1.0:
            now = now / scale
        prev = self._previous.get(key)
        self._previous[key] = now
        if prev is None or prev.shape != now.shape:
            return torch.zeros(3, dtype=torch.float64, device=now.device)
        prev = prev.to(now.device)
        return torch.stack([now.dot(prev), now.dot(now), prev.dot(prev)])

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self._previous.items()}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        """The samples of a checkpoint (a state without them: start afresh, as on a first step)."""
        self._previous = {str(k): v.detach().clone() for k, v in (state or {}).items()}


def coherence(dot: float, now_sq: float, prev_sq: float) -> Optional[float]:
    """The cosine of the (rank-averaged) sums; None when a step has nothing to compare."""
    if not (now_sq > 0.0 and prev_sq > 0.0) or not all(map(math.isfinite, (dot, now_sq, prev_sq))):
        return None
    return dot / math.sqrt(now_sq * prev_sq)


def signal_share(c: float, n: int) -> float:
    """The signal's share of the gradient averaged over ``n`` ranks, from the share ``c`` of
    one rank's (its coherence, clipped to [0, 1]): ``n c / (1 + (n - 1) c)``."""
    c = min(max(float(c), 0.0), 1.0)
    n = max(1, int(n))
    return n * c / (1.0 + (n - 1) * c)


def hold_coherence(n: int) -> float:
    """The per-rank coherence at which the gradient averaged over ``n`` ranks is half signal,
    half noise (``signal_share(1 / (n + 1), n) == 0.5``): the global batch is then the
    critical batch size (module doc)."""
    return 1.0 / (max(1, int(n)) + 1)


def mean_coherence(values) -> Optional[float]:
    """The mean over an interval's steps of those that had a value."""
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def mean_upper_bound(values, z: float) -> Optional[float]:
    """The mean of the readings that had a value plus ``z`` standard errors of it; None with
    fewer than two.  Consecutive readings share a gradient (the cosine at step t and at t+1
    both contain g_t), so they are correlated: the standard error counts the effective
    number of readings of a lag-1 autoregression, ``n (1 - r) / (1 + r)`` for the measured
    lag-1 autocorrelation ``r`` (a negative ``r`` is taken as 0, which errs toward the larger
    error; at least one reading)."""
    vals = [v for v in values if v is not None]
    n = len(vals)
    if n < 2:
        return None
    mean = sum(vals) / n
    dev = [v - mean for v in vals]
    var = sum(d * d for d in dev) / (n - 1)
    lag = sum(a * b for a, b in zip(dev, dev[1:])) / (n - 1)
    r = min(max(lag / var, 0.0), 1.0) if var > 0 else 0.0
    n_eff = max(1.0, n * (1.0 - r) / (1.0 + r))
    return mean + z * math.sqrt(var / n_eff)


__all__ = ["SAMPLE_MAX", "sample_stride", "CoherenceSampler", "coherence", "signal_share", "hold_coherence",
           "mean_coherence", "mean_upper_bound"]
