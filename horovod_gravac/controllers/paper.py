"""GraVAC's Algorithm 1 exactly as published (``GraVAC(variant="paper")``).

Each step sends the candidate CF if its smoothed gain reaches epsilon, else theta_min if
its gain does, else the dense gradient (lines 10-24).  Every ``window`` steps CheckGraVAC
moves theta_min up to the evaluated candidate when their gains are within omega, takes
the scaling policy's next rung as the candidate, and stops at the lower of the two best
compression throughputs when they are within omega of each other.
"""
from __future__ import annotations

from .base import StepObservation
from .gravac import GraVAC


class PaperGraVAC(GraVAC, variant="paper"):
    """Algorithm 1 as published: theta_s = 1 in the first window (the candidate starts at
    theta_min), plain EWMA gains, window-mean throughputs."""

    def _decide(self, obs: StepObservation, window_end: bool) -> None:
        if window_end:
            self._check_window()
        self.decision = self._choose()

    def _check_window(self) -> None:
        """CheckGraVAC, every ``window`` steps: theta_min scale-up, scaling policy, stop rule."""
        evaluated = self.candidate_cf
        g_min, g_c = self.gain_min, self.gain_candidate
        self.throughput.close_window()
        # theta_min moves up to the evaluated candidate when their gains are within omega.
        if evaluated > self.theta_min and g_min and g_c is not None \
                and abs(g_min - g_c) / g_min <= self.omega:
            self.theta_min = evaluated
            self._gain_min.reset(g_c)   # the new theta_min's gain is what we measured for it
        # ScalingPolicy: the next rung of the ladder, never past theta_max.
        candidate = self.policy.next_cf(max(evaluated, self.theta_min), self.theta_min0, self.theta_max)
        # Stop rule: the two best compression throughputs within omega -> keep the lower CF.
        ideal = self.throughput.saturated_cf(self.omega, min_cf=self.theta_min)
        if ideal is not None:
            candidate = max(ideal, self.theta_min)
        if candidate != self.candidate_cf:
            self.candidate_cf = candidate
            self._gain_candidate.reset(g_c if candidate == evaluated else None)
        self._record_check(evaluated, g_min, g_c, saturated_at=ideal)
