"""The delivered gain (``GraVAC(variant="delivered")``): judge a CF by what error feedback
delivered over a window in which it was sent.

The paper's gain ||C(g_ef)||^2 / ||g_ef||^2 is taken per step, before error feedback
delivers what a step leaves out: Top-k keeps a small share of it at high CFs that still
train to dense accuracy.  Over a window, what a rank owes is G = the residual it started
with plus its raw gradients, and what it sent is D = G - the residual it ends with;
cos^2(D, G) (:func:`window_gain`) is the share of that debt delivered within the window
(for a single step without residual it is the paper's gain).  It can only be measured for
the CF actually sent, so each window sends one CF, and a candidate is tried by sending it.
Counting the starting residual in G credits a window that flushes the backlog of a higher
CF tried before it, so theta_min does not step down on flushes alone.

A failed trial is not free (a window at a CF whose gain is too low sets training back), so a
rung that keeps failing is tried less and less often (``remeasure_windows`` windows apart,
doubled after each further failure up to ``RETRY_BACKOFF_MAX`` times), and as often as
before again once it passes.  A new theta_min is held (sent as theta_min) for
``hold_windows`` windows before the rung above it is tried, so that one window of evidence
cannot lift the ladder two rungs while early gains are still high.
"""
from __future__ import annotations

from typing import Dict, Optional

from .base import DENSE, Decision, StepObservation
from .gravac import GraVAC


def window_gain(obs: StepObservation) -> Optional[float]:
    """cos^2(D, G) of a window's sums, G what was owed and D what was sent:
    1 when no gradient arrived, 0 when D points away from G; None without the sums."""
    if not obs.finite or obs.accumulated_sq is None or obs.window_dot is None or obs.window_sent_sq is None:
        return None
    g_sq, dot, d_sq = obs.accumulated_sq, obs.window_dot, obs.window_sent_sq
    if g_sq <= 0.0:
        return 1.0
    if d_sq <= 0.0 or dot <= 0.0:
        return 0.0
    return min(1.0, dot * dot / (g_sq * d_sq))


class DeliveredGraVAC(GraVAC, variant="delivered"):
    """Readable state besides GraVAC's: ``delivered_gain`` (CF -> the last window gain
    measured for it)."""

    # Window sums of the raw gradient (G) and of what was sent (D), every window.
    needs_accumulation = True
    tracks_delivery = True
    #: The longest wait before a CF that keeps failing is tried again, in units of
    #: ``remeasure_windows`` (4 -> at most 32 windows between trials).
    RETRY_BACKOFF_MAX = 8

    def _start_rule_set(self) -> None:
        self.accumulation_interval = self.window
        self.candidate_cf = self._rung_above(self.theta_min0)
        self.decision = Decision(self.theta_min0, self.theta_min0, self.candidate_cf)
        self.delivered_gain: Dict[float, float] = {}
        self._retry_at: Dict[float, int] = {}   # CF -> first window it may be tried again
        self._failures: Dict[float, int] = {}   # CF -> failed checks since it last passed
        self._held = 0   # windows the current theta_min has passed, sent as theta_min

    def _record_throughput(self, sent: Decision, t_sys: float) -> Optional[float]:
        # The gain is known once the window ends (``close_window``); until then the CF's last one.
        self.throughput.record(sent.send_cf, t_sys, 1.0)
        gain = self.delivered_gain.get(sent.send_cf, 1.0 if sent.send_cf == DENSE else None)
        return None if gain is None else t_sys * gain

    def _decide(self, obs: StepObservation, window_end: bool) -> None:
        if window_end:   # one CF per window
            self._check_window(window_gain(obs))

    def _may_try(self, cf: float) -> bool:
        return self.throughput.windows >= self._retry_at.get(cf, 0)

    def _may_climb(self) -> bool:
        """Try the rung above theta_min now?  There is one, its backoff is over, and theta_min
        has been held long enough (with ``hold_windows`` 0: right after it was adopted)."""
        return self.candidate_cf > self.theta_min and self._may_try(self.candidate_cf) \
            and self._held >= self.hold_windows

    def _failed(self, cf: float, this_window: int) -> None:
        n = self._failures.get(cf, 0) + 1
        self._failures[cf] = n
        wait = self.remeasure_windows * min(2 ** (n - 1), self.RETRY_BACKOFF_MAX)
        self._retry_at[cf] = this_window + 1 + wait

    def _check_window(self, gain: Optional[float]) -> None:
        """Every ``window`` steps, from the gain of the CF sent in the window: theta_min
        that fails steps down a rung (below the lowest: dense for a while); a theta_min
        that passes tries the rung above for a window; a tried rung that passes and raises
        the compression throughput by omega becomes theta_min, else it waits
        ``remeasure_windows`` windows before it is tried again (longer after repeated
        failures, see ``_failed``)."""
        sent, base, cand = self.decision.send_cf, self.theta_min, self.candidate_cf
        this_window = self.throughput.windows
        self.throughput.close_window({sent: gain} if gain is not None else {})
        if gain is not None:
            self.delivered_gain[sent] = gain
        send, move = sent, "stay"
        if gain is None:
            pass   # a non-finite step ended the window: send the same CF again
        elif sent == DENSE:
            send = base if self._may_try(base) else DENSE
        elif sent == base and gain < self.epsilon:
            self._failed(base, this_window)
            self._held = 0
            if base > self.theta_min0:
                self.candidate_cf, self.theta_min = base, self._rung_below(base)
                send, move = self.theta_min, "down"
            else:
                send, move = DENSE, "dense"
        elif sent == base:
            self._failures.pop(base, None)
            self._held += 1
            if self._may_climb():
                send, move = cand, "try"
        elif sent == cand:
            t = self.throughput.compression
            if gain >= self.epsilon and t[cand] > t.get(base, 0.0) * (1 + self.omega):
                self._failures.pop(cand, None)
                self.theta_min = cand
                self.candidate_cf = self._rung_above(cand)
                self._held = 0
                send, move = self.theta_min, "up"
                if self._may_climb():
                    send = self.candidate_cf   # theta_min was just measured: try the next rung now
            else:
                self._failed(cand, this_window)
                send, move = base, "back"
        else:
            send = base   # (a CF this controller did not choose, e.g. after a restored state)
        self.decision = Decision(send, self.theta_min, self.candidate_cf)
        self._record_check(sent, self.gain_min, self.gain_candidate, move=move, window_gain=gain)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update({"delivered_gain": dict(self.delivered_gain), "retry_at": dict(self._retry_at),
                      "failures": dict(self._failures), "held": self._held})
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.delivered_gain = {float(k): v for k, v in state.get("delivered_gain", {}).items()}
        self._retry_at = {float(k): int(v) for k, v in state.get("retry_at", {}).items()}
        self._failures = {float(k): int(v) for k, v in state.get("failures", {}).items()}
        self._held = int(state.get("held", 0))
