"""The controller interface and the two static controllers.

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

from collections import deque
from dataclasses import asdict, dataclass
from typing import Dict, Optional

from ..cf import check_cf
from ..throughput import ThroughputTable

DENSE = 1.0

#: Most recent entries kept in a controller's ``history`` (GraVAC: one per window check,
#: Accordion: one per interval).  Older entries are dropped, so a checkpoint's size does
#: not grow with the number of steps (a GraVAC entry is ~130 bytes pickled, so the
#: history costs at most ~35 KB).  ``history_count`` still counts every entry ever made.
HISTORY_MAXLEN = 256


def bounded_history(entries=()) -> deque:
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
    comm_time: float = 0.0       # seconds of the step spent waiting for communication (this rank)
    coherence: Optional[float] = None   # cos(g_t, g_t-1), rank-averaged sums (coherence.py)


class Controller:
    """Base class. Subclasses set ``self.decision`` and may override ``observe``.

    The class attributes and the methods below are everything the optimizer asks of a
    controller; their defaults suit a controller that needs nothing more."""

    #: True when the controller needs rank-averaged observations every step (they ride
    #: in the last bucket's collective) and rank 0's decision each step.
    needs_consensus = False
    #: True when the optimizer must report ``accumulated_sq``, the squared norm of what each
    #: ``accumulation_interval`` steps owed, G: a running sum of raw gradients (Accordion).
    needs_accumulation = False
    #: True when it must also sum what each rank sent, D; G is then what was sent plus what
    #: error feedback still holds at the interval's end (GraVAC "delivered", "predictive").
    tracks_delivery = False
    #: True when it reads the gradient coherence (``coherence.py``; ``StepObservation.coherence``).
    needs_coherence = False
    #: True when it compares two compression levels per step (GraVAC's multi-level
    #: compression), which a low-rank compressor cannot give.
    needs_multilevel = False
    #: Steps per accumulation interval (None: no interval sums).
    accumulation_interval: Optional[int] = None
    #: The smoothed gains of theta_min and of the candidate (``optimizer.stats``); None when
    #: the controller measures none.
    gain_min: Optional[float] = None
    gain_candidate: Optional[float] = None
    #: Compression throughput per CF, measured under the current world; None when the
    #: controller keeps none.  A new world size makes its figures stale (``elastic.py``).
    throughput: Optional[ThroughputTable] = None

    def __init__(self):
        self.step = 0
        self.decision = Decision(DENSE)
        self.last: Dict[str, float] = {}

    def set_world_size(self, n: int) -> None:
        """Take ``n`` ranks as the world (at start-up and after a membership change)."""

    def observe(self, obs: StepObservation) -> Decision:
        self.step += 1
        return self.decision

    def adopt(self, decision: Decision) -> None:
        """Set the decision for the next step (the benchmarks use it to pin a controller;
        ranks themselves agree through ``load_state_dict``, see ``consensus.py``)."""
        self.decision = decision

    def interval_ends_at(self, step: int) -> bool:
        """Whether an accumulation interval ends with step number ``step`` (1-based): every
        ``accumulation_interval`` steps unless a subclass sets its own boundaries."""
        return self.accumulation_interval is not None and step % self.accumulation_interval == 0

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
        config = self.config()
        args = ", ".join(f"{k}={v!r}" for k, v in config.items() if k != "type")
        return f"{config['type']}({args})"


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
