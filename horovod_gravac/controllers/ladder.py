"""The ladder (``GraVAC()``, ``variant="ladder"``): Algorithm 1 with theta_min on the ladder.

Under the published rules theta_min only moves when two gains are within omega, so once
the candidate has climbed past the CFs that pass epsilon, every later step is sent at the
first theta_min: a failed rung costs the rest of training.  Here theta_min is the highest
CF known to pass epsilon, the candidate is always the rung above it, and a step sends the
candidate only when it passes epsilon *and* its measured compression throughput beats
theta_min's; a theta_min whose gain falls below epsilon steps down a rung.

Gains start as running means (a new CF's gain is not one noisy step for most of a short
window), window throughputs are medians (the odd slow step does not decide), and a
throughput older than ``remeasure_windows`` windows is measured again before it is
compared.
"""
from __future__ import annotations

import math
from typing import Dict

from .base import DENSE, Decision, StepObservation
from .gravac import GraVAC


class LadderGraVAC(GraVAC, variant="ladder"):
    """Readable state besides GraVAC's: ``early_steps_down`` (theta_min stepped down between
    window checks), ``splits`` (window checks that moved the candidate between two rungs)."""

    warm_start_gains = True
    throughput_statistic = "median"
    #: With ``split_rungs``: the smallest step between theta_min and a split candidate (a CF
    #: 20 % above theta_min sends 17 % fewer floats; each finer split is one more window of
    #: measuring for a smaller saving).
    SPLIT_MIN_RATIO = 1.2

    def _start_rule_set(self) -> None:
        self.candidate_cf = self._rung_above(self.theta_min0)
        self.decision = Decision(DENSE, self.theta_min, self.candidate_cf)
        self.early_steps_down = 0
        self.splits = 0
        self._gain_when_left: Dict[float, float] = {}   # theta_min's gain when the ladder climbed off it

    def _decide(self, obs: StepObservation, window_end: bool) -> None:
        if window_end:
            self._check_window()
        elif self._step_down_if_failing():
            self.early_steps_down += 1
        self.decision = self._choose()

    def _fresh(self, cf: float) -> bool:
        age = self.throughput.age(cf)
        return age is not None and age < self.remeasure_windows

    def _candidate_pays(self) -> bool:
        """Send the candidate rather than theta_min?  theta_min's compression throughput is
        measured first (a window), then the candidate's whenever it is unknown or stale;
        once both are known, only if the candidate's beats theta_min's by omega."""
        c, m = self.candidate_cf, self.theta_min
        if c == m:
            return True
        if not self._fresh(m):
            return False
        if not self._fresh(c):
            return True
        return self.throughput.compression[c] > self.throughput.compression[m] * (1 + self.omega)

    def _check_window(self) -> None:
        """Every ``window`` steps: step down if theta_min lost too much, up if the candidate
        passes epsilon and its measured compression throughput beats theta_min's."""
        evaluated = self.candidate_cf
        g_min, g_c = self.gain_min, self.gain_candidate
        self.throughput.close_window()
        move = "stay"
        if self._step_down_if_failing():
            move = "down"
        elif g_c is not None and g_c >= self.epsilon and evaluated > self.theta_min \
                and self.throughput.age(evaluated) == 0 and self._fresh(self.theta_min) \
                and self.throughput.compression[evaluated] \
                > self.throughput.compression[self.theta_min] * (1 + self.omega):
            # The candidate passed and was sent in this window at a better compression
            # throughput: it becomes theta_min, the next rung the candidate.
            if g_min is not None:
                self._gain_when_left[self.theta_min] = g_min
            self.theta_min = evaluated
            self._gain_min.reset(g_c, self._gain_candidate.count)
            self.candidate_cf = self._rung_above(evaluated)
            if self.candidate_cf != evaluated:
                self._gain_candidate.reset(None)
            move = "up"
        elif self.split_rungs and g_c is not None and g_c < self.epsilon and evaluated > self.theta_min:
            candidate = self._split_candidate(evaluated)
            if candidate != evaluated:
                self.candidate_cf = candidate
                self._gain_candidate.reset(None)
                move = "split" if candidate < evaluated else "rung"   # a CF between rungs / the rung again
                self.splits += move == "split"
        self._record_check(evaluated, g_min, g_c, move=move, early_steps_down=self.early_steps_down)

    def _split_candidate(self, failed: float) -> float:
        """The candidate after ``failed`` did not pass epsilon over a window: the CF halfway
        between theta_min and it (geometric mean, three significant digits), while that is at
        least ``SPLIT_MIN_RATIO`` above theta_min; else the policy's rung above theta_min
        again (so a rung whose gain rises later is still found), which splits again if it
        fails.  A candidate that fails is never sent, and its gain comes from theta_min's
        payload (multi-level), so measuring one costs no window of training.

        Why: the policy's rungs are 2x or more apart, and on dense gradients the CF where the
        gain crosses epsilon often lies between two of them, so the rungs alone can send up
        to 2x more than epsilon allows."""
        middle = float(f"{math.sqrt(self.theta_min * failed):.3g}")
        if middle >= self.theta_min * self.SPLIT_MIN_RATIO:   # (then also well below failed)
            return middle
        return self._rung_above(self.theta_min)

    def _step_down_if_failing(self) -> bool:
        """A theta_min above the first rung whose gain fell below epsilon: the rung below becomes
        theta_min, and the old one the candidate again, with the gain just measured for it.

        At window checks and between them: otherwise every step until the next check goes
        dense, while the rung below passed before the ladder left it and costs less.  Only the
        rank-averaged gains decide this, no step time, so between checks every rank does the
        same (``consensus``: there the ranks observe for themselves).

        The new theta_min starts from the gain it had when the ladder climbed off it, counted as
        one observation, so the next step's measurement weighs as much; left unknown, the next
        step would go dense, though a lower CF keeps at least as much of the gradient (Top-k
        exactly) as the rung that has just failed.  Returns whether it moved."""
        g_min = self.gain_min
        if g_min is None or g_min >= self.epsilon or self.theta_min <= self.theta_min0:
            return False
        self.candidate_cf, self.theta_min = self.theta_min, self._rung_below(self.theta_min)
        self._gain_candidate.reset(g_min, self._gain_min.count)
        self._gain_min.reset(self._gain_when_left.get(self.theta_min))
        return True

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update({"early_steps_down": self.early_steps_down, "splits": self.splits,
                      "gain_when_left": dict(self._gain_when_left)})
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.early_steps_down = int(state.get("early_steps_down", 0))
        self.splits = int(state.get("splits", 0))
        self._gain_when_left = {float(k): float(v) for k, v in state.get("gain_when_left", {}).items()}
