"""Scaling policies (paper section IV-B): the ladder of candidate CFs.

Both are defined relative to the *first* theta_min and capped at theta_max:
- Exponential: theta_min * 2**(2**j): factors 2, 4, 16, 256, ...
  (theta_min 10, theta_max 1000 -> 10, 20, 40, 160, 1000).
- Geometric: theta_min * ratio**j (ratio 2: 10, 20, 40, ..., 1280, 2000).
"""
from __future__ import annotations

from typing import List


class ScalingPolicy:
    name = "base"

    def factors(self, limit: float) -> List[float]:
        """Increasing step factors (> 1) relative to the first theta_min, up to ``limit``."""
        raise NotImplementedError

    def ladder(self, theta_min: float, theta_max: float) -> List[float]:
        """All candidate CFs, starting at theta_min and ending exactly at theta_max."""
        rungs = [theta_min]
        for f in self.factors(theta_max / theta_min):
            rungs.append(min(theta_min * f, theta_max))
            if rungs[-1] >= theta_max:
                break
        if rungs[-1] < theta_max:
            rungs.append(theta_max)
        return rungs

    def next_cf(self, current: float, theta_min0: float, theta_max: float) -> float:
        """The first rung above ``current`` (or ``current`` itself at the top)."""
        for rung in self.ladder(theta_min0, theta_max):
            if rung > current * (1 + 1e-9):
                return rung
        return current

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Exponential(ScalingPolicy):
    name = "exponential"

    def factors(self, limit: float) -> List[float]:
        out, e = [], 1
        while True:
            out.append(2.0 ** e)
            if out[-1] >= limit:
                return out
            e *= 2


class Geometric(ScalingPolicy):
    name = "geometric"

    def __init__(self, ratio: float = 2.0):
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 1.0 \
                or ratio == float("inf"):
            raise ValueError(f"geometric ratio must be > 1, got {ratio!r}")
        self.ratio = float(ratio)

    def factors(self, limit: float) -> List[float]:
        out = [self.ratio]
        while out[-1] < limit:
            out.append(out[-1] * self.ratio)
        return out

    def __repr__(self) -> str:
        return f"Geometric(ratio={self.ratio:g})"


POLICIES = {"exponential": Exponential, "geometric": Geometric}


def make_policy(policy) -> ScalingPolicy:
    if isinstance(policy, ScalingPolicy):
        return policy
    if isinstance(policy, str) and policy.lower() in POLICIES:
        return POLICIES[policy.lower()]()
    raise ValueError(f"policy must be one of {sorted(POLICIES)} or a ScalingPolicy, got {policy!r}")
