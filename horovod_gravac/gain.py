"""Compression gain (paper section III-B) and its EWMA smoothing.

gain(theta) = ||C(g_ef, theta)||^2 / ||g_ef||^2, where g_ef is the error-fed
gradient (backprop gradient plus residual).  The norms are *global*: squared norms
summed over every parameter, then averaged across ranks, so every rank computes the
same gain.  (The paper's printed formula has g_c over g_c, a typo; the text defines
it as compressed over error-fed original.)  Dense SGD has gain 1.
"""
from __future__ import annotations

import math
from typing import Optional


def compression_gain(compressed_sq: float, original_sq: float) -> float:
    """Fraction of the squared norm that survives compression, in [0, 1].

    A zero gradient loses nothing, so its gain is 1 (compressing it is free).
    """
    if not (math.isfinite(compressed_sq) and math.isfinite(original_sq)):
        raise ValueError(f"non-finite norms: compressed {compressed_sq}, original {original_sq}")
    if original_sq <= 0.0:
        return 1.0
    return min(1.0, max(0.0, compressed_sq / original_sq))


class EWMA:
    """Exponentially weighted moving average, defined from the first observation.

    ``value = alpha * x + (1 - alpha) * value``; the first ``update`` sets the value
    (no zero start, no warm-up window that returns 0).  ``value`` is ``None`` until
    then.

    ``warm_start=True`` uses the running mean of the first observations until ``1/n``
    falls below ``alpha`` (weight ``max(alpha, 1/n)`` for the n-th).  With the paper's
    small factor (0.02 for two ranks) the plain form keeps the first, single-step gain
    at 36 % weight after 50 steps; a gain measured for a new CF then reads one noisy
    step for most of a short window.
    """

    def __init__(self, alpha: float, warm_start: bool = False):
        if not (0.0 < alpha <= 1.0):
            raise ValueError(f"ewma_alpha must be in (0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        self.warm_start = bool(warm_start)
        self.value: Optional[float] = None
        self.count = 0          # observations since the last reset

    def update(self, x: float) -> float:
        self.count += 1
        if self.value is None:
            self.value = x
        else:
            weight = max(self.alpha, 1.0 / self.count) if self.warm_start else self.alpha
            self.value = weight * x + (1.0 - weight) * self.value
        return self.value

    def reset(self, value: Optional[float] = None, count: int = 1) -> None:
        """Forget the history; a given ``value`` counts as ``count`` observations (the
        ones it was averaged from, when it is another EWMA's value)."""
        self.value = value
        self.count = 0 if value is None else max(1, int(count))

    def state_dict(self) -> dict:
        return {"alpha": self.alpha, "value": self.value, "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.alpha, self.value = float(state["alpha"]), state["value"]
        self.count = int(state.get("count", 0 if self.value is None else 1))


def paper_alpha(world_size: int) -> float:
    """The paper's smoothing factor N/100 for N workers, kept inside (0, 1]."""
    return min(1.0, max(1, world_size) / 100.0)
