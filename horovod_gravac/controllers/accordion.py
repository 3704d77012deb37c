"""Accordion (Agarwal et al., MLSys 2021): the baseline the paper compares GraVAC with."""
from __future__ import annotations

import math
from typing import Optional

from ..cf import check_cf
from .base import Controller, Decision, StepObservation, bounded_history


class Accordion(Controller):
    """Accordion (Agarwal et al., MLSys 2021): low compression in critical regimes.

    Every ``interval`` steps, compare the norm of the gradient accumulated over the
    interval with that of the previous interval; a relative change of at least
    ``threshold`` marks a critical regime, trained at ``low_cf``; otherwise
    ``high_cf``.  The first interval is treated as critical.
    """

    needs_consensus = True
    needs_accumulation = True

    def __init__(self, low_cf: float = 10.0, high_cf: float = 1000.0, threshold: float = 0.5,
                 interval: int = 100):
        super().__init__()
        self.low_cf = check_cf(low_cf, "low_cf")
        self.high_cf = check_cf(high_cf, "high_cf")
        if self.high_cf < self.low_cf:
            raise ValueError(f"high_cf ({high_cf}) must be >= low_cf ({low_cf})")
        if isinstance(threshold, bool) or not (isinstance(threshold, (int, float))
                                               and math.isfinite(threshold) and threshold > 0):
            raise ValueError(f"threshold must be a finite number > 0, got {threshold!r}")
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ValueError(f"interval must be an integer >= 1, got {interval!r}")
        self.threshold, self.interval = float(threshold), interval
        self.accumulation_interval = interval
        self.previous_norm: Optional[float] = None
        self.critical = True
        self.history = bounded_history()   # the last HISTORY_MAXLEN interval checks
        self.history_count = 0
        self.decision = Decision(self.low_cf, self.low_cf, self.low_cf)

    def config(self) -> dict:
        return {"type": "Accordion", "low_cf": self.low_cf, "high_cf": self.high_cf,
                "threshold": self.threshold, "interval": self.interval}

    def checks_at(self, step: int) -> bool:
        return step % self.interval == 0   # the only steps whose decision can change

    def observe(self, obs: StepObservation) -> Decision:
        self.step += 1
        if self.step % self.interval == 0 and obs.accumulated_sq is not None and obs.finite:
            norm = math.sqrt(max(0.0, obs.accumulated_sq))
            if self.previous_norm is None or self.previous_norm == 0.0:
                self.critical = True
            else:
                self.critical = abs(self.previous_norm - norm) / self.previous_norm >= self.threshold
            self.previous_norm = norm
            cf = self.low_cf if self.critical else self.high_cf
            self.decision = Decision(cf, cf, cf)
            self.history.append({"step": self.step, "norm": norm, "critical": self.critical, "cf": cf})
            self.history_count += 1
        return self.decision

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update({"previous_norm": self.previous_norm, "critical": self.critical,
                      "history": list(self.history), "history_count": self.history_count})
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.previous_norm, self.critical = state["previous_norm"], state["critical"]
        self.history = bounded_history(state["history"])
        self.history_count = int(state.get("history_count", len(state["history"])))
