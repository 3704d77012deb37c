"""System throughput and compression throughput per CF (paper section III-C).

T_sys = N * b / t_iter (samples/s over all ranks), and
T_compress[theta] = T_sys * gain(theta) for the CF actually sent in a step
(dense: CF 1, gain 1).  Steps are collected per evaluation window; the table keeps,
for every CF, one figure from the last window in which that CF was sent.

``statistic="mean"`` is the paper's window average.  ``"median"`` ignores the odd slow
step (an evaluation pause, a page fault, a neighbour's burst on a shared machine) that
can move a short window's mean by tens of percent.  ``age(cf)`` counts the windows since
a CF's figure was measured, so a controller can re-measure figures that went stale.
"""
from __future__ import annotations

import statistics
from typing import Dict, List, Optional

STATISTICS = ("mean", "median")


class ThroughputTable:
    def __init__(self, statistic: str = "mean"):
        if statistic not in STATISTICS:
            raise ValueError(f"statistic must be one of {STATISTICS}, got {statistic!r}")
        self.statistic = statistic
        self.compression: Dict[float, float] = {}   # CF -> T_compress of its last window
        self.system: Dict[float, float] = {}        # CF -> T_sys of its last window
        self.measured_at: Dict[float, int] = {}     # CF -> window index of that figure
        self.windows = 0                            # windows closed so far
        self._window: Dict[float, List[List[float]]] = {}   # CF -> [[T_sys...], [T_compress...]]

    def record(self, cf: float, system_throughput: float, gain: float) -> float:
        """Add one step; returns that step's compression throughput."""
        t_compress = system_throughput * gain
        sys_values, comp_values = self._window.setdefault(cf, [[], []])
        sys_values.append(system_throughput)
        comp_values.append(t_compress)
        return t_compress

    def _reduce(self, values: List[float]) -> float:
        return statistics.median(values) if self.statistic == "median" else sum(values) / len(values)

    def close_window(self, gains: Optional[Dict[float, float]] = None) -> None:
        """Fold this window's figures into the table; start a new window.  ``gains``: the
        gain of each CF measured over the whole window (GraVAC "delivered"): T_compress
        is then T_sys x that gain, and a CF sent without one keeps its old figures."""
        for cf, (sys_values, comp_values) in self._window.items():
            if gains is not None and cf not in gains:
                continue
            self.system[cf] = self._reduce(sys_values)
            self.compression[cf] = self._reduce(comp_values) if gains is None \
                else self.system[cf] * gains[cf]
            self.measured_at[cf] = self.windows
        self._window.clear()
        self.windows += 1

    def age(self, cf: float) -> Optional[int]:
        """Windows closed since ``cf``'s figure was measured (0: the last one); None if never."""
        at = self.measured_at.get(cf)
        return None if at is None else self.windows - 1 - at

    def reset(self) -> None:
        """Drop every figure (they were measured under other conditions, e.g. another N)."""
        self.compression.clear()
        self.system.clear()
        self.measured_at.clear()
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
        return {"statistic": self.statistic, "compression": dict(self.compression),
                "system": dict(self.system), "measured_at": dict(self.measured_at),
                "windows": self.windows,
                "window": {cf: [list(s), list(c)] for cf, (s, c) in self._window.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.statistic = state.get("statistic", "mean")
        self.compression = {float(k): v for k, v in state["compression"].items()}
        self.system = {float(k): v for k, v in state["system"].items()}
        self.measured_at = {float(k): int(v) for k, v in state.get("measured_at", {}).items()}
        self.windows = int(state.get("windows", 0))
        self._window = {}
        for k, v in state["window"].items():
            if len(v) == 3 and not isinstance(v[0], list):   # older states: (sum T_sys, sum T_comp, n)
                n = int(v[2])
                v = [[v[0] / n] * n, [v[1] / n] * n] if n else [[], []]
            self._window[float(k)] = [list(v[0]), list(v[1])]
