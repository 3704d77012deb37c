"""GraVAC (paper section III, Algorithm 1): what every rule set shares.

``GraVAC(..., variant=...)`` builds the rule set named by ``variant``: ``GraVAC.__new__``
looks the name up among the subclasses (each names its own: ``class PaperGraVAC(GraVAC,
variant="paper")``) and returns an instance of that class, so ``GraVAC(...)`` keeps one
signature for users, checkpoints and the start-up check (``config()["type"]`` is "GraVAC"
for every rule set), and ``isinstance(c, GraVAC)`` holds for each of them.  To change a
rule set's behaviour, subclass its class (``PaperGraVAC``, ``LadderGraVAC``,
``DeliveredGraVAC``); a subclass of ``GraVAC`` itself has no rules and is refused.

The shared part here: the settings and their validation, the two gains' EWMAs, the
compression-throughput table, the world size, the history of window checks, the ladder of
the scaling policy, and the checkpoint state of those.  Each rule set (``paper.py``,
``ladder.py``, ``delivered.py``) owns its own fields, when it sends what, and its window
check.
"""
from __future__ import annotations

import inspect
import math
from typing import Dict, Optional

from ..cf import check_cf
from ..gain import EWMA, compression_gain, paper_alpha
from ..policy import make_policy
from ..throughput import ThroughputTable
from .base import DENSE, Controller, Decision, StepObservation, bounded_history

#: The rule set ``GraVAC()`` uses when none is given: the predictive one (``predictive.py``),
#: which moves to the CF its step-time model predicts fastest in one move instead of one rung
#: per window, and holds theta_min while the gradient is mostly signal.
#: ``variant="paper"`` is Algorithm 1 exactly as published.
DEFAULT_VARIANT = "predictive"

#: GraVAC's rule sets: Algorithm 1 as published, the ladder, the delivered gain.
VARIANTS = ("paper", "ladder", "delivered", "predictive")

#: epsilon when none is given.  "paper" and "ladder" compare the paper's per-step gain with it
#: (0.7, the paper's default).  "delivered" and "predictive" compare another quantity, the
#: share of a window's debt that error feedback delivered (cos^2 of what was sent against what
#: was owed, ``delivered.window_gain``).  It reads higher than the paper's gain for the same CF
#: because error feedback sends later what one step drops; 0.9 asks that at most a tenth of a
#: window's gradient is still held back at its end.  A CF that passed is kept while it reads at
#: least epsilon squared (``predictive.py``).  Tuning: raise it toward 1 to trade speed for a
#: closer trajectory to dense SGD; lower it for more compression.
DEFAULT_EPSILON = {"paper": 0.7, "ladder": 0.7, "delivered": 0.9, "predictive": 0.9}


#: The scaling policy when none is given.
DEFAULT_POLICY = {"paper": "exponential", "ladder": "exponential", "delivered": "exponential",
                  "predictive": "geometric"}


def _check_int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


class GraVAC(Controller):
    """Algorithm 1 of the paper: adapt the CF online from compression gain and
    compression throughput.

    Args:
        theta_min: lowest CF, the first compression level (>= 1).
        theta_max: highest CF a candidate may reach (>= theta_min).
        epsilon: minimum smoothed gain for a CF to be sent, in (0, 1]; by default
            ``DEFAULT_EPSILON[variant]``: 0.7, and 0.9 for ``"delivered"`` and ``"predictive"``
            (``"predictive"``: what a trial of a higher CF must pass; a CF that passed is kept
            while its gain is above epsilon squared)
            (their gain is another quantity).
        omega: relative tolerance for "gains equal" (theta_min scale-up) and
            "throughput saturated" (stop rule), >= 0.
        window: steps per evaluation window (>= 1).
        policy: "exponential" | "geometric" | a ScalingPolicy; None: the rule set's own
            (``DEFAULT_POLICY``: exponential, as in the paper; geometric for "predictive",
            whose one move may skip rungs, so finer rungs cost no climbing time).
        ewma_alpha: gain smoothing factor; None = the paper's N/100 for N ranks
            (set by the optimizer through ``set_world_size``).
        batch_size: per-rank samples per step, for T_sys in samples/s (else steps/s x N).
        variant: the rule set, one of ``VARIANTS``: ``"ladder"`` (:class:`~.ladder.LadderGraVAC`),
            ``"paper"`` (Algorithm 1 as published, :class:`~.paper.PaperGraVAC`), ``"delivered"``
            (:class:`~.delivered.DeliveredGraVAC`) or ``"predictive"``
            (:class:`~.predictive.PredictiveGraVAC`); ``DEFAULT_VARIANT`` names the default.
            None: ``DEFAULT_VARIANT`` for ``GraVAC(...)``, a rule set's own for its class.
        remeasure_windows: ``"ladder"``: a CF whose compression throughput is older than
            this many windows is sent again for a window before it is compared.
            ``"delivered"`` (``"predictive"``: checks): windows before a CF that failed is tried again, doubled after
            each further failure of that CF, and reset when it passes.
        hold_windows: ``"delivered"``: windows a theta_min must pass, sent as theta_min,
            before the rung above it is tried (>= 0).
        split_rungs: ``"ladder"`` only: measure CFs between two rungs of the policy when the
            candidate fails epsilon (off by default).
        coherence_max: ``"predictive"`` only: hold theta_min while the gradient coherence (the
            cosine of a rank's consecutive gradients, ``coherence.py``), averaged over the
            last window, is at least this, in (0, 1].  None (the default): ``1 / (N + 1)``
            for N ranks, where the rank-averaged gradient is half signal
            (``coherence.hold_coherence``); 1.0 turns the hold off.  A hold may send a CF
            that delivered all it owed (window gain 1).  A lossy CF above theta_min sent
            while not holding, under which that mean reaches it, fails as a trial below
            epsilon does, and every lossy rung above theta_min waits with it, the wait
            doubled after each such failure in the run.

    Every rule set takes every setting (they are one signature and one ``config()``), and
    reads those it names.

    Readable state: ``theta_min``, ``candidate_cf``, ``gain_min``, ``gain_candidate``,
    ``throughput`` (a ThroughputTable), ``history`` (one entry per window check, the last
    ``HISTORY_MAXLEN`` of them; ``history_count`` counts all), and each rule set's own.
    """

    needs_consensus = True
    needs_multilevel = True
    #: This rule set's name (``config()["variant"]``); set by ``class X(GraVAC, variant=...)``.
    variant: str = ""
    #: How the rule set smooths gains and reduces a window's throughputs.
    warm_start_gains = False
    throughput_statistic = "mean"
    #: Counters of moves only the ladder makes (see ``ladder.py``): 0 in the other rule sets.
    early_steps_down = 0
    splits = 0

    _rule_sets: Dict[str, type] = {}

    def __init_subclass__(cls, variant: Optional[str] = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if variant is not None:
            cls.variant = variant
            GraVAC._rule_sets[variant] = cls

    def __new__(cls, *args, **kwargs):
        if cls is GraVAC:   # GraVAC(..., variant=...): the rule set's class
            variant = _SIGNATURE.bind(None, *args, **kwargs).arguments.get("variant")
            variant = DEFAULT_VARIANT if variant is None else variant
            if variant not in VARIANTS:
                raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
            cls = GraVAC._rule_sets[variant]
        return super().__new__(cls)

    def __init__(self, theta_min: float = 10.0, theta_max: float = 1000.0, epsilon: Optional[float] = None,
                 omega: float = 0.01, window: int = 500, policy=None,
                 ewma_alpha: Optional[float] = None, batch_size: Optional[int] = None,
                 variant: Optional[str] = None, remeasure_windows: int = 4, hold_windows: int = 1,
                 split_rungs: bool = False, coherence_max: Optional[float] = None):
        super().__init__()
        if not self.variant:
            raise TypeError(f"{type(self).__name__} subclasses GraVAC without a rule set: subclass "
                            f"PaperGraVAC, LadderGraVAC or DeliveredGraVAC instead")
        variant = self.variant if variant is None else variant
        if variant != self.variant:
            raise ValueError(f"variant must be {self.variant!r} for {type(self).__name__}, got {variant!r}")
        if epsilon is None:
            epsilon = DEFAULT_EPSILON[variant]
        self.remeasure_windows = _check_int(remeasure_windows, "remeasure_windows", 1)
        self.hold_windows = _check_int(hold_windows, "hold_windows", 0)
        if not isinstance(split_rungs, bool):
            raise ValueError(f"split_rungs must be True or False, got {split_rungs!r}")
        if split_rungs and variant != "ladder":
            raise ValueError(f"split_rungs applies to variant='ladder' only, not {variant!r}")
        self.split_rungs = split_rungs
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
        self.window = _check_int(window, "window", 1)
        if ewma_alpha is not None and (isinstance(ewma_alpha, bool) or not isinstance(ewma_alpha, (int, float))
                                       or not 0.0 < ewma_alpha <= 1.0):
            raise ValueError(f"ewma_alpha must be in (0, 1] or None, got {ewma_alpha!r}")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size!r}")
        if coherence_max is not None and (
                isinstance(coherence_max, bool) or not isinstance(coherence_max, (int, float))
                or math.isnan(coherence_max) or not (0.0 < coherence_max <= 1.0)):
            raise ValueError(f"coherence_max must be in (0, 1] or None, got {coherence_max!r}")
        self.coherence_max = None if coherence_max is None else float(coherence_max)
        self.epsilon = float(epsilon)
        self.omega = float(omega)
        self.policy = make_policy(DEFAULT_POLICY.get(variant, "exponential") if policy is None else policy)
        self.ewma_alpha = ewma_alpha
        self.batch_size = batch_size
        self.world_size = 1

        self.theta_min = self.theta_min0
        self.candidate_cf = self.theta_min0
        alpha = ewma_alpha if ewma_alpha is not None else paper_alpha(1)
        self._gain_min = EWMA(alpha, warm_start=self.warm_start_gains)
        self._gain_candidate = EWMA(alpha, warm_start=self.warm_start_gains)
        self.throughput = ThroughputTable(self.throughput_statistic)
        self.history = bounded_history()
        self.history_count = 0
        # Nothing is known before the first step: send dense once (gain 1 by definition).
        self.decision = Decision(DENSE, self.theta_min, self.candidate_cf)
        self._start_rule_set()

    def _start_rule_set(self) -> None:
        """The rule set's own fields and first decision (the shared ones are set)."""

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
                "split_rungs": self.split_rungs, "coherence_max": self.coherence_max}

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
        if obs.finite:
            # Algorithm 1 lines 7 and 9: smoothed gains of theta_min and of the candidate.
            self._gain_min.update(compression_gain(obs.min_sq, obs.ef_sq))
            self._gain_candidate.update(compression_gain(obs.candidate_sq, obs.ef_sq))
            # UpdateStep: T_sys and T_compress for the CF actually sent (dense: gain 1).
            samples = obs.samples if self.batch_size is None else self.batch_size * self.world_size
            t_sys = samples / obs.step_time if obs.step_time > 0 else 0.0
            t_comp = self._record_throughput(self.decision, t_sys)
            self.last = {"system_throughput": t_sys, "compression_throughput": t_comp}
        self._decide(obs, window_end=self.step % self.window == 0)
        return self.decision

    def _record_throughput(self, sent: Decision, t_sys: float) -> Optional[float]:
        """Add this step to the throughput table; its compression throughput (T_sys times the
        smoothed gain of the level sent)."""
        gain_sent = {"dense": 1.0, "min": self.gain_min, "candidate": self.gain_candidate}[sent.level]
        return self.throughput.record(sent.send_cf, t_sys, gain_sent)

    def _decide(self, obs: StepObservation, window_end: bool) -> None:
        """The rule set: set ``self.decision`` for the next step (and check at a window's end)."""
        raise NotImplementedError

    # -- Algorithm 1's per-step choice ("paper" and "ladder") --------------------------
    def _choose(self) -> Decision:
        """Algorithm 1 lines 10-24: the candidate if its gain >= epsilon (and it pays, see
        ``_candidate_pays``), else theta_min if its gain does, else dense."""
        g_c, g_min = self.gain_candidate, self.gain_min
        if g_c is not None and g_c >= self.epsilon and self._candidate_pays():
            send = self.candidate_cf
        elif g_min is not None and g_min >= self.epsilon:
            send = self.theta_min
        else:
            send = DENSE
        return Decision(send, self.theta_min, self.candidate_cf)

    def _candidate_pays(self) -> bool:
        """Whether a candidate that passes epsilon is worth sending: always, as published
        (the ladder also asks its measured compression throughput)."""
        return True

    # -- the policy's ladder -------------------------------------------------------
    def _rung_above(self, cf: float) -> float:
        return self.policy.next_cf(cf, self.theta_min0, self.theta_max)

    def _rung_below(self, cf: float) -> float:
        lower = [r for r in self.policy.ladder(self.theta_min0, self.theta_max) if r < cf * (1 - 1e-9)]
        return lower[-1] if lower else cf

    def _record_check(self, evaluated, g_min, g_c, **extra) -> None:
        """One ``history`` entry per window check."""
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
                      "history_count": self.history_count})
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.theta_min, self.candidate_cf = state["theta_min"], state["candidate_cf"]
        self.world_size = state["world_size"]
        self._gain_min.load_state_dict(state["gain_min"])
        self._gain_candidate.load_state_dict(state["gain_candidate"])
        self.throughput.load_state_dict(state["throughput"])
        self.history = bounded_history(state["history"])
        self.history_count = int(state.get("history_count", len(state["history"])))


_SIGNATURE = inspect.signature(GraVAC.__init__)
