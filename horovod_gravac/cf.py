"""The compression factor (CF): its validation and the entry count it keeps.

Plain Python, so the controllers (which only reason about CFs) import without
torch's distributed stack or Horovod.
"""
from __future__ import annotations

import math


def check_cf(cf, name: str = "cf") -> float:
    """Validate a compression factor: a finite real number >= 1."""
    if isinstance(cf, bool) or not isinstance(cf, (int, float)):
        raise ValueError(f"{name} must be a real number >= 1, got {cf!r} ({type(cf).__name__})")
    cf = float(cf)
    if math.isnan(cf) or math.isinf(cf) or cf < 1.0:
        raise ValueError(f"{name} must be a finite number >= 1 (CF = numel / kept), got {cf!r}")
    return cf


def kept_count(numel: int, cf: float) -> int:
    """Entries kept at CF ``cf``: ``numel / cf`` rounded down, at least one (none for empty)."""
    if numel == 0:
        return 0
    return max(1, min(numel, int(numel / cf)))
