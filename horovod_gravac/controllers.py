"""Controllers: who decides each step's compression factor.

A controller is plain Python (no Horovod, no tensors) so it can be unit-tested
with scripted gains and timings.  The optimizer drives it:

    decision = controller.decision          # what to do in the coming step
    ... backward, compress, communicate ...
    controller.observe(StepObservation(...)) # global (rank-averaged) measurements
    controller.decision                      # decision for the next step

Every rank feeds its controller identical, rank-averaged observations, so every
rank computes the same decision.  Only step times differ by rank, and a controller
reads them only at its checks (``checks_at``, e.g. GraVAC's window checks): there
rank 0's controller state is sent to the others (``consensus.py``), so every rank
leaves each check with rank 0's state and decision.

Decisions are made from measurements up to the previous step: that lets
communication start from the backward hooks, as in ``hvd.DistributedOptimizer``.
Gains are EWMA-smoothed anyway (the paper's factor N/100 gives the newest step a
weight of N %), so the one-step lag changes the choice very rarely.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Dict, Optional

from .cf import check_cf
from .gain import EWMA, compression_gain, paper_alpha
from .policy import make_policy
from .throughput import ThroughputTable

DENSE = 1.0

#: Most recent entries kept in a controller's ``history`` (GraVAC: one per window check,
#: Accordion: one per interval).  Older entries are dropped, so a checkpoint's size does
#: not grow with the number of steps (a GraVAC entry is ~130 bytes pickled, so the
#: history costs at most ~35 KB).  ``history_count`` still counts every entry ever made.
HISTORY_MAXLEN = 256

#: GraVAC's rule sets: Algorithm 1 as published, the ladder variant, and the delivered gain.
VARIANTS = ("paper", "ladder", "delivered")

#: The rule set ``GraVAC()`` uses when none is given.  "ladder" is Algorithm 1 with one change the
#: traces asked for: a step sends the highest CF known to pass epsilon, not theta_min once a
#: higher rung has failed.  Against "paper" (adaptivity benchmark, four workloads, two link
#: rates, three seeds) its median time to dense accuracy was shorter on all eight, by the most on
#: the word LSTM (1.43x against 1.05x Top-k 10x's), and every run reached it (README, "The ladder
#: as the default").
#: ``variant="paper"`` is Algorithm 1 exactly as published.
DEFAULT_VARIANT = "ladder"

#: epsilon when none is given.  "paper" and "ladder" compare the paper's per-step gain with it
#: (0.7, the paper's default).  "delivered" compares a different quantity, the share of a window's
#: debt that error feedback delivered, which reads higher: at 0.7 each "delivered" configuration
#: missed dense accuracy on 2 or 3 of its 12 benchmark runs, at 0.9 (with the hold) none of 40 did
#: (README, "Which controller when").
DEFAULT_EPSILON = {"paper": 0.7, "ladder": 0.7, "delivered": 0.9}


def window_gain(obs: "StepObservation") -> Optional[float]:
    """cos^2(D, G) of a window's sums, G what was owed and D what was sent (see the
    "delivered" variant's notes above ``GraVAC._check_delivered``):
    1 when no gradient arrived, 0 when D points away from G; None without the sums."""
    if not obs.finite or obs.accumulated_sq is None or obs.window_dot is None or obs.window_sent_sq is None:
        return None
    g_sq, dot, d_sq = obs.accumulated_sq, obs.window_dot, obs.window_sent_sq
    if g_sq <= 0.0:
        return 1.0
    if d_sq <= 0.0 or dot <= 0.0:
        return 0.0
    return min(1.0, dot * dot / (g_sq * d_sq))


def _history(entries=()) -> deque:
    return deque(entries, maxlen=HISTORY_MAXLEN)


@dataclass(frozen=True)
class Decision:
    """What one step does.

    ``theta_min`` is the first compression level (applied to the error-fed gradient),
    ``candidate_cf`` the second (reached by compressing the theta_min payload further:
    multi-level compression).  ``send_cf`` is one of 1.0 (dense allreduce),
    ``theta_min`` or ``candidate_cf``.  ``theta_min == 1`` means nothing is compressed.
    """

    send_cf: float
    theta_min: float = DENSE
    candidate_cf: float = DENSE

    @property
    def level(self) -> str:
        if self.send_cf == DENSE:
            return "dense"
        return "candidate" if self.send_cf == self.candidate_cf != self.theta_min else "min"


@dataclass
class StepObservation:
    """Global measurements of one step (squared norms summed over all parameters and
    averaged across ranks; times averaged across ranks)."""

    ef_sq: float                 # ||g_ef||^2
    min_sq: float                # ||C(g_ef, theta_min)||^2
    candidate_sq: float          # ||C(C(g_ef, theta_min), theta_s)||^2
    step_time: float             # seconds for the whole iteration
    samples: float = 1.0         # samples processed by all ranks in the step (N * b)
    grad_sq: float = 0.0         # ||g_o||^2 of the raw gradient (Accordion)
    accumulated_sq: Optional[float] = None  # ||G||^2, G = sum of g_o over the interval (Accordion;
    #                                        GraVAC "delivered": plus the residual at its start)
    window_dot: Optional[float] = None      # <D, G>, D = sum of what was sent over the interval
    window_sent_sq: Optional[float] = None  # ||D||^2   (both: GraVAC variant "delivered")
    finite: bool = True          # False if any rank saw a NaN/Inf gradient


class Controller:
    """Base class. Subclasses set ``self.decision`` and may override ``observe``."""

    #: True when the controller needs rank-averaged observations every step (they ride
    #: in the last bucket's collective) and rank 0's decision each step.
    needs_consensus = False
    #: True when the optimizer must keep a running sum G of raw gradients over each
    #: ``accumulation_interval`` steps (Accordion; GraVAC "delivered").
    needs_accumulation = False
    #: True when it must also sum what each rank sent, D (GraVAC "delivered").
    tracks_delivery = False
    #: True when it compares two compression levels per step (GraVAC's multi-level
    #: compression), which a low-rank compressor cannot give.
    needs_multilevel = False
    #: Steps per accumulation interval (None: no interval sums).
    accumulation_interval: Optional[int] = None

    def __init__(self):
        self.step = 0
        self.decision = Decision(DENSE)
        self.last: Dict[str, float] = {}

    def observe(self, obs: StepObservation) -> Decision:
        self.step += 1
        return self.decision

    def adopt(self, decision: Decision) -> None:
        """Set the decision for the next step (the benchmarks use it to pin a controller;
        ranks themselves agree through ``load_state_dict``, see ``consensus.py``)."""
        self.decision = decision

    def checks_at(self, step: int) -> bool:
        """Whether observing step number ``step`` (1-based, as ``self.step`` will count it)
        may decide from something a rank measures for itself (its step time).  Only there
        must the ranks take rank 0's decision; in between, every rank observes the same
        rank-averaged statistics and decides alike.  True (every step) unless a subclass
        knows better."""
        return True

    def config(self) -> dict:
        """Settings that must match on every rank (checked at start-up)."""
        return {"type": type(self).__name__}

    def state_dict(self) -> dict:
        return {"step": self.step, "decision": asdict(self.decision)}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.decision = Decision(**state["decision"])

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "type")
        return f"{type(self).__name__}({args})"


class Dense(Controller):
    """Plain allreduce of the full gradient, every step (dense SGD)."""


class StaticCF(Controller):
    """One fixed compression factor for the whole run (CF 1 is dense)."""

    def __init__(self, cf: float):
        super().__init__()
        self.cf = check_cf(cf, "cf")
        self.decision = Decision(self.cf, self.cf, self.cf)

    def config(self) -> dict:
        return {"type": "StaticCF", "cf": self.cf}


class GraVAC(Controller):
    """Algorithm 1 of the paper: adapt the CF online from compression gain and
    compression throughput.

    Args:
        theta_min: lowest CF, the first compression level (>= 1).
        theta_max: highest CF a candidate may reach (>= theta_min).
        epsilon: minimum smoothed gain for a CF to be sent, in (0, 1]; by default
            ``DEFAULT_EPSILON[variant]``: 0.7, and 0.9 for ``"delivered"`` (its gain is another
            quantity, see ``DEFAULT_EPSILON``).
        omega: relative tolerance for "gains equal" (theta_min scale-up) and
            "throughput saturated" (stop rule), >= 0.
        window: steps per evaluation window (>= 1).
        policy: "exponential" | "geometric" | a ScalingPolicy.
        ewma_alpha: gain smoothing factor; None = the paper's N/100 for N ranks
            (set by the optimizer through ``set_world_size``).
        batch_size: per-rank samples per step, for T_sys in samples/s (else steps/s x N).
        variant: ``"ladder"`` (default, ``DEFAULT_VARIANT``) or ``"paper"``: Algorithm 1 as
            published.  ``"ladder"``: theta_min and the
            candidate move along the ladder together (see ``_check_ladder``): theta_min is
            the highest CF known to pass epsilon and is what a step sends when the
            candidate does not pay; gains start as running means; window throughputs
            are medians and are re-measured when stale.  ``"delivered"``: the gain of a
            CF is measured over a whole window in which it is sent, on what error feedback
            actually delivered (``delivered_gain``); each window sends one CF, and the rung
            above theta_min is tried for a window when theta_min passes (see ``_check_delivered``).
        remeasure_windows: ``"ladder"``: a CF whose compression throughput is older than
            this many windows is sent again for a window before it is compared.
            ``"delivered"``: windows before a CF that failed is tried again, doubled after
            each further failure of that CF (up to ``RETRY_BACKOFF_MAX`` times), and reset
            when it passes.
        hold_windows: ``"delivered"``: windows a theta_min must pass, sent as theta_min,
            before the rung above it is tried (>= 0).  0 tries the next rung right after a
            trial that passed, so the ladder can climb a rung per window.
        split_rungs: ``"ladder"`` only: when the candidate fails epsilon over a window, the
            next window measures the CF halfway (geometric mean) between theta_min and it, and
            so on down to steps of ``SPLIT_MIN_RATIO`` (see ``_split_candidate``), so the ladder
            finds the highest CF that passes between two rungs of the policy.  Off by default:
            on the adaptivity benchmark it was not better on every workload (README, "Split
            rungs").

    Readable state: ``theta_min``, ``candidate_cf``, ``gain_min``, ``gain_candidate``,
    ``throughput`` (a ThroughputTable), ``history`` (one entry per window check, the last
    ``HISTORY_MAXLEN`` of them; ``history_count`` counts all); ``"delivered"``:
    ``delivered_gain`` (CF -> the last window gain measured for it); ``"ladder"``:
    ``early_steps_down`` (theta_min stepped down between window checks), ``splits`` (window
    checks that moved the candidate between two rungs).
    """

    needs_consensus = True
    needs_multilevel = True
    # "delivered": the longest wait before a CF that keeps failing is tried again, in units of
    # remeasure_windows (4 -> at most 32 windows between trials).
    RETRY_BACKOFF_MAX = 8
    # "ladder" with split_rungs: the smallest step between theta_min and a split candidate (a CF
    # 20 % above theta_min sends 17 % fewer floats; each finer split is one more window of
    # measuring for a smaller saving).
    SPLIT_MIN_RATIO = 1.2

    def __init__(self, theta_min: float = 10.0, theta_max: float = 1000.0, epsilon: Optional[float] = None,
                 omega: float = 0.01, window: int = 500, policy="exponential",
                 ewma_alpha: Optional[float] = None, batch_size: Optional[int] = None,
                 variant: str = DEFAULT_VARIANT, remeasure_windows: int = 4, hold_windows: int = 1,
                 split_rungs: bool = False):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if epsilon is None:
            epsilon = DEFAULT_EPSILON[variant]
        if isinstance(remeasure_windows, bool) or not isinstance(remeasure_windows, int) \
                or remeasure_windows < 1:
            raise ValueError(f"remeasure_windows must be an integer >= 1, got {remeasure_windows!r}")
        if isinstance(hold_windows, bool) or not isinstance(hold_windows, int) or hold_windows < 0:
            raise ValueError(f"hold_windows must be an integer >= 0, got {hold_windows!r}")
        if not isinstance(split_rungs, bool):
            raise ValueError(f"split_rungs must be True or False, got {split_rungs!r}")
        if split_rungs and variant != "ladder":
            raise ValueError(f"split_rungs applies to variant='ladder' only, not {variant!r}")
        self.theta_min0 = check_cf(theta_min, "theta_min")
        self.theta_max = check_cf(theta_max, "theta_max")
        if self.theta_max < self.theta_min0:
            raise ValueError(f"theta_max ({theta_max}) must be >= theta_min ({theta_min})")
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) \
                or math.isnan(epsilon) or not (0.0 < epsilon <= 1.0):
            raise ValueError(f"epsilon must be in (0, 1], got {epsilon!r}")
        if isinstance(omega, bool) or not isinstance(omega, (int, float)) \
                or not math.isfinite(omega) or omega < 0.0:
            raise ValueError(f"omega must be a finite number >= 0, got {omega!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an integer >= 1, got {window!r}")
        if ewma_alpha is not None and (isinstance(ewma_alpha, bool) or not isinstance(ewma_alpha, (int, float))
                                       or not 0.0 < ewma_alpha <= 1.0):
            raise ValueError(f"ewma_alpha must be in (0, 1] or None, got {ewma_alpha!r}")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        self.epsilon = float(epsilon)
        self.omega = float(omega)
        self.window = window
        self.policy = make_policy(policy)
        self.ewma_alpha = ewma_alpha
        self.batch_size = batch_size
        self.variant = variant
        self.remeasure_windows = remeasure_windows
        self.hold_windows = hold_windows
        self.split_rungs = split_rungs
        self.world_size = 1
        ladder = variant == "ladder"

        self.theta_min = self.theta_min0
        # paper: theta_s = 1 in the first window; ladder: the candidate is always the next rung.
        self.candidate_cf = self._rung_above(self.theta_min0) if ladder else self.theta_min0
        alpha = ewma_alpha if ewma_alpha is not None else paper_alpha(1)
        self._gain_min = EWMA(alpha, warm_start=ladder)
        self._gain_candidate = EWMA(alpha, warm_start=ladder)
        self.throughput = ThroughputTable("median" if ladder else "mean")
        self.history: deque = _history()
        self.history_count = 0
        # Nothing is known before the first step: send dense once (gain 1 by definition).
        self.decision = Decision(DENSE, self.theta_min, self.candidate_cf)
        self.delivered_gain: Dict[float, float] = {}
        self._retry_at: Dict[float, int] = {}   # "delivered": CF -> first window it may be tried again
        self._failures: Dict[float, int] = {}   # "delivered": CF -> failed checks since it last passed
        self._held = 0   # "delivered": windows the current theta_min has passed, sent as theta_min
        self.early_steps_down = 0   # "ladder": _step_down_if_failing moves between window checks
        self.splits = 0   # "ladder" with split_rungs: checks that moved the candidate between two rungs
        self._gain_when_left: Dict[float, float] = {}   # "ladder": theta_min's gain when it climbed
        if variant == "delivered":
            # Window sums of the raw gradient (G) and of what was sent (D), every window.
            self.needs_accumulation = self.tracks_delivery = True
            self.accumulation_interval = window
            self.candidate_cf = self._rung_above(self.theta_min0)
            self.decision = Decision(self.theta_min0, self.theta_min0, self.candidate_cf)

    # -- configuration -------------------------------------------------------------
    def set_world_size(self, n: int) -> None:
        self.world_size = max(1, int(n))
        if self.ewma_alpha is None:
            self._gain_min.alpha = self._gain_candidate.alpha = paper_alpha(self.world_size)

    def config(self) -> dict:
        return {"type": "GraVAC", "theta_min": self.theta_min0, "theta_max": self.theta_max,
                "epsilon": self.epsilon, "omega": self.omega, "window": self.window,
                "policy": repr(self.policy), "ewma_alpha": self.ewma_alpha,
                "batch_size": self.batch_size, "variant": self.variant,
                "remeasure_windows": self.remeasure_windows, "hold_windows": self.hold_windows,
                "split_rungs": self.split_rungs}

    @property
    def gain_min(self) -> Optional[float]:
        return self._gain_min.value

    @property
    def gain_candidate(self) -> Optional[float]:
        return self._gain_candidate.value

    # -- per step ------------------------------------------------------------------
    def checks_at(self, step: int) -> bool:
        # Step times enter only the throughput table, which is read at window checks;
        # between them a decision follows from the (rank-averaged) gains alone.
        return step % self.window == 0

    def observe(self, obs: StepObservation) -> Decision:
        self.step += 1
        sent = self.decision
        if obs.finite:
            # Algorithm 1 lines 7 and 9: smoothed gains of theta_min and of the candidate.
            self._gain_min.update(compression_gain(obs.min_sq, obs.ef_sq))
            self._gain_candidate.update(compression_gain(obs.candidate_sq, obs.ef_sq))
            # UpdateStep: T_sys and T_compress for the CF actually sent (dense: gain 1).
            samples = obs.samples if self.batch_size is None else self.batch_size * self.world_size
            t_sys = samples / obs.step_time if obs.step_time > 0 else 0.0
            if self.variant == "delivered":   # the gain is known once the window ends
                self.throughput.record(sent.send_cf, t_sys, 1.0)
                gain = self.delivered_gain.get(sent.send_cf, 1.0 if sent.send_cf == DENSE else None)
                t_comp = None if gain is None else t_sys * gain
            else:
                gain_sent = {"dense": 1.0, "min": self.gain_min,
                             "candidate": self.gain_candidate}[sent.level]
                t_comp = self.throughput.record(sent.send_cf, t_sys, gain_sent)
            self.last = {"system_throughput": t_sys, "compression_throughput": t_comp}
        if self.variant == "delivered":
            if self.step % self.window == 0:
                self._check_delivered(window_gain(obs))
            return self.decision   # one CF per window
        if self.step % self.window == 0:
            if self.variant == "ladder":
                self._check_ladder()
            else:
                self._check_gravac()
        elif self.variant == "ladder" and self._step_down_if_failing():
            self.early_steps_down += 1
        self.decision = self._choose()
        return self.decision

    def _choose(self) -> Decision:
        """Algorithm 1 lines 10-24: candidate if its gain >= epsilon, else theta_min, else dense.
        The ladder variant also asks that the candidate pays (``_candidate_pays``)."""
        g_c, g_min = self.gain_candidate, self.gain_min
        if g_c is not None and g_c >= self.epsilon \
                and (self.variant != "ladder" or self._candidate_pays()):
            send = self.candidate_cf
        elif g_min is not None and g_min >= self.epsilon:
            send = self.theta_min
        else:
            send = DENSE
        return Decision(send, self.theta_min, self.candidate_cf)

    def _check_gravac(self) -> None:
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

    # -- the "ladder" variant ------------------------------------------------------
    # Measured with the paper's rules (issue traces of a 1D CNN, epsilon 0.7): the
    # candidate climbs 10 -> 20 -> 40 -> 160 -> 1000, 20 and 40 pass epsilon, 160 and
    # 1000 do not, and every later step is sent at theta_min = 10, because nothing
    # returns to the CFs that passed (theta_min only moves when two gains are within
    # omega).  Here theta_min is instead the highest CF that passed, so a failed rung
    # costs one window, not the rest of training.

    def _rung_above(self, cf: float) -> float:
        return self.policy.next_cf(cf, self.theta_min0, self.theta_max)

    def _rung_below(self, cf: float) -> float:
        lower = [r for r in self.policy.ladder(self.theta_min0, self.theta_max) if r < cf * (1 - 1e-9)]
        return lower[-1] if lower else cf

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

    def _check_ladder(self) -> None:
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
        gain crosses epsilon lies between two of them (a 1D CNN over 1200 steps: 10x read
        0.74-0.83, 20x 0.59-0.68 at every window), so the ladder sent up to 2x more than
        epsilon allows.  Measured there, the split found 14.1x at 0.69-0.72, on epsilon: 9-17 %
        fewer floats, and one seed of three ended under the accuracy target."""
        middle = float(f"{math.sqrt(self.theta_min * failed):.3g}")
        if middle >= self.theta_min * self.SPLIT_MIN_RATIO:   # (then also well below failed)
            return middle
        return self._rung_above(self.theta_min)

    def _step_down_if_failing(self) -> bool:
        """A theta_min above the first rung whose gain fell below epsilon: the rung below becomes
        theta_min, and the old one the candidate again, with the gain just measured for it.

        At window checks and, since the row LSTM's trace, between them too: every step until the
        next check went dense before (a 20x theta_min at 0.70-0.71 sent 10-11 % of the steps
        dense), while the rung below passed before the ladder left it and costs less.  Only the
        rank-averaged gains decide this, no step time, so between checks every rank does the
        same (``consensus``: there the ranks observe for themselves).

        The new theta_min starts from the gain it had when the ladder climbed off it, counted as
        one observation, so the next step's measurement weighs as much.  Left unknown, the next
        step went dense (0-2 step-downs a run in the benchmark), though that rung passed epsilon
        when it was left, and a lower CF keeps at least as much of the gradient (Top-k exactly)
        as the rung that has just failed.  Returns whether it moved."""
        g_min = self.gain_min
        if g_min is None or g_min >= self.epsilon or self.theta_min <= self.theta_min0:
            return False
        self.candidate_cf, self.theta_min = self.theta_min, self._rung_below(self.theta_min)
        self._gain_candidate.reset(g_min, self._gain_min.count)
        self._gain_min.reset(self._gain_when_left.get(self.theta_min))
        return True

    # -- the "delivered" variant -----------------------------------------------------
    # The paper's gain ||C(g_ef)||^2 / ||g_ef||^2 is taken per step, before error feedback
    # delivers what a step leaves out: Top-k keeps 0.6-0.85 of it at 10x on dense CNN and
    # LSTM gradients and 0.1 at 100x, though 100x trains to dense accuracy there.  Over a
    # window, what a rank owes is G = the residual it started with plus its raw gradients,
    # and what it sent is D = G - the residual it ends with; cos^2(D, G) is the fraction of
    # that debt delivered within the window (for a single step without residual it is the
    # paper's gain).  It can only be measured for the CF actually sent, so a candidate is
    # tried by sending it.  Counting the starting residual in G matters after a change of
    # CF: a window that flushes the backlog of a tried higher CF is credited for delivering
    # it.  Measured on a 1D CNN with G = raw gradients only, 40x read 0.19-0.67 right after
    # a 160x window and 0.77-0.95 otherwise, and 160x read 0.40 and 0.58 in the two windows
    # after a 1000x trial: theta_min stepped down (160 -> 40, 80 -> 40) on flushes alone.

    # A failed trial is not free: a window at a CF whose gain is too low sets training back
    # (on the 1D CNN a 160x window took test accuracy from 99.2 to 96.9 %, and three of them
    # plus a last 1000x window left it 1.1 pp under dense), and where a higher CF does not pay,
    # every trial window costs a window of compression throughput.  A rung that keeps failing
    # is therefore tried less and less often (4, 8, 16, 32 windows apart by default), and
    # as often as before again once it passes.

    # A new theta_min is held (sent as theta_min) for ``hold_windows`` windows before the rung
    # above it is tried.  Without the hold, the row LSTM's early gains (0.97-1.00 up to 40x,
    # 0.81-0.84 at 160x) let the ladder climb 10 -> 20 -> 40 -> 160 -> 1000 in five windows,
    # and 160x then failed as theta_min a window or two later: three of its first seven
    # windows at 160x or more.  Measured at epsilon 0.9 over five seeds, holding one window
    # reached dense accuracy in all 40 runs (Exponential and Geometric, four workloads)
    # against 37 of 40 without it, at the same speed, and left the row LSTM 0.40 pp under
    # dense (mean of the last four evaluations) instead of 0.50-0.68 pp
    # (benchmarks/results/adaptivity_hold_seeds.md).  Suggestive, not conclusive: 3 misses
    # against 0 has a one-sided Fisher p of 0.12, and at epsilon 0.7 the benchmark was mixed
    # (the offline benchmarks/controller_study.py sees the hold help at 0.7, not at 0.9).
    # It never cost speed there, and it keeps one window of evidence from lifting two rungs.

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

    def _check_delivered(self, gain: Optional[float]) -> None:
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

    def _record_check(self, evaluated, g_min, g_c, **extra) -> None:
        """One ``history`` entry per window check (both variants)."""
        self.history.append({"step": self.step, "evaluated_cf": evaluated, "theta_min": self.theta_min,
                             "next_candidate_cf": self.candidate_cf, "gain_min": g_min,
                             "gain_candidate": g_c, **extra,
                             "compression_throughput": dict(self.throughput.compression)})
        self.history_count += 1

    def adopt(self, decision: Decision) -> None:
        """The decision, with its two levels as theta_min and the candidate."""
        self.decision = decision
        self.theta_min, self.candidate_cf = decision.theta_min, decision.candidate_cf

    # -- checkpointing -------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update({"theta_min": self.theta_min, "candidate_cf": self.candidate_cf,
                      "world_size": self.world_size,
                      "gain_min": self._gain_min.state_dict(),
                      "gain_candidate": self._gain_candidate.state_dict(),
                      "throughput": self.throughput.state_dict(), "history": list(self.history),
                      "history_count": self.history_count, "delivered_gain": dict(self.delivered_gain),
                      "retry_at": dict(self._retry_at), "failures": dict(self._failures),
                      "held": self._held, "early_steps_down": self.early_steps_down,
                      "gain_when_left": dict(self._gain_when_left), "splits": self.splits})
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.theta_min, self.candidate_cf = state["theta_min"], state["candidate_cf"]
        self.world_size = state["world_size"]
        self._gain_min.load_state_dict(state["gain_min"])
        self._gain_candidate.load_state_dict(state["gain_candidate"])
        self.throughput.load_state_dict(state["throughput"])
        self.history = _history(state["history"])
        self.history_count = int(state.get("history_count", len(state["history"])))
        self.delivered_gain = {float(k): v for k, v in state.get("delivered_gain", {}).items()}
        self._retry_at = {float(k): int(v) for k, v in state.get("retry_at", {}).items()}
        self._failures = {float(k): int(v) for k, v in state.get("failures", {}).items()}
        self._held = int(state.get("held", 0))
        self.early_steps_down = int(state.get("early_steps_down", 0))
        self._gain_when_left = {float(k): float(v) for k, v in state.get("gain_when_left", {}).items()}
        self.splits = int(state.get("splits", 0))


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
        self.history: deque = _history()   # the last HISTORY_MAXLEN interval checks
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
        self.history = _history(state["history"])
        self.history_count = int(state.get("history_count", len(state["history"])))
