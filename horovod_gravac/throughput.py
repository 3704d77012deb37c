"""System throughput and compression throughput per CF (paper section III-C).

T_sys = N * b / t_iter (samples/s over all ranks), and
T_compress[theta] = T_sys * gain(theta) for the CF actually sent in a step
(dense: CF 1, gain 1).  Values are averaged over each evaluation window; the table
keeps, for every CF, the mean of the last window in which that CF was sent.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple


class ThroughputTable:
    def __init__(self):
        self.compression: Dict[float, float] = {}   # CF -> mean T_compress of its last window
        self.system: Dict[float, float] = {}        # CF -> mean T_sys of its last window
        self._window: Dict[float, Tuple[float, float, int]] = {}

    def record(self, cf: float, system_throughput: float, gain: float) -> float:
        """Add one step; returns that step's compression throughput."""
        t_compress = system_throughput * gain
        sys_sum, comp_sum, n = self._window.get(cf, (0.0, 0.0, 0))
        self._window[cf] = (sys_sum + system_throughput, comp_sum + t_compress, n + 1)
        return t_compress

    def close_window(self) -> None:
        """Fold this window's means into the table; start a new window."""
        for cf, (sys_sum, comp_sum, n) in self._window.items():
            self.system[cf] = sys_sum / n
            self.compression[cf] = comp_sum / n
        self._window.clear()

    def saturated_cf(self, omega: float, min_cf: float = 1.0) -> Optional[float]:
        """If the two best compression throughputs among CFs >= ``min_cf`` are within
        ``omega`` (relative), the lower of their two CFs (more compression no longer
        pays); else ``None``.  Dense (CF 1, e.g. the first step) and CFs below the
        current theta_min are not candidates, so they never take part."""
        eligible = [(cf, t) for cf, t in self.compression.items() if cf >= min_cf and cf > 1.0]
        if len(eligible) < 2:
            return None
        (cf_a, best), (cf_b, second) = sorted(eligible, key=lambda kv: kv[1])[-1:-3:-1]
        if second <= 0.0:
            return None
        if abs(best - second) / second <= omega:
            return min(cf_a, cf_b)
        return None

    def state_dict(self) -> dict:
        return {"compression": dict(self.compression), "system": dict(self.system),
                "window": dict(self._window)}

    def load_state_dict(self, state: dict) -> None:
        self.compression = {float(k): v for k, v in state["compression"].items()}
        self.system = {float(k): v for k, v in state["system"].items()}
        self._window = {float(k): tuple(v) for k, v in state["window"].items()}
