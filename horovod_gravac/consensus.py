"""Rank consensus: every rank runs the same collectives because every rank follows
rank 0's decision.

Adaptive controllers (GraVAC, Accordion) decide each step from rank-averaged norms
(they arrive with the last bucket's collective, the same bits on every rank) and,
at their checks only, from the step time, which each rank measures for itself
(``Controller.checks_at``: GraVAC's window checks, Accordion's interval ends).  So:

* between checks, every rank observes its step itself, with no collective: the same
  averaged statistics into the same controller state give the same decision (its own
  step time only goes into throughput samples that are replaced at the next check);
* at a check, rank 0 observes and decides, and sends its whole controller state in
  one blocking ``broadcast_object`` from the training thread, inside ``step()``; the
  other ranks load it, so every rank leaves the check with rank 0's state.

A blocking broadcast every step would add a round trip to every step, a large share of a
small model's step (docs/benchmarks.md); one per window is negligible.  Were a
rank's arithmetic ever to differ between checks, the ranks would still aggregate the same
allgathered payloads (the same update everywhere) as long as their CFs go through the same
kind of collective; collectives of two kinds under one name (a dense step on one rank
against a sparse one on another, or two exchanges ``exchange="auto"`` chose for two CFs)
are neither matched nor refused by Horovod 0.28.1, and end in the bounded wait's
``CollectiveTimeoutError``.  The next check puts every rank back on rank 0's state.

Submitting from the training thread, in program order, matters: Horovod numbers
every collective a process submits, and a user's unnamed ``hvd.allreduce(loss)``
after ``step()`` is named after that number.  A collective submitted from a helper
thread would take a number in a rank-dependent order and the user's collective
would get different names on different ranks (a hang).

Once per optimizer, before its first bucket, ``sync_state`` broadcasts rank 0's
controller state and step index, so a checkpoint loaded on rank 0 alone (Horovod's
resume recipe: rank 0 loads, then ``hvd.broadcast_optimizer_state``) is followed by
every rank.
"""
from __future__ import annotations

import math
import warnings
from typing import Optional

import torch

from .backend import CollectiveBackend, ReduceOp
from .coherence import coherence
from .controllers import Controller, Dense, StepObservation
from .wire import StepStats

# Keys of ``optimizer.stats`` filled in by the exchange (None until it completes).
# ``coherence`` is the step's own rank-averaged cosine (None where none was measured), so a
# run's log can show what a window mean was made of.
CONSENSUS_STATS = ("gain_min", "gain_candidate", "system_throughput", "compression_throughput", "next_cf",
                   "coherence")


def ends_interval(controller: Controller) -> bool:
    """Whether the step the controller observes next closes its accumulation interval
    (Accordion's interval, GraVAC "delivered"'s window, the interval ends "predictive" sets
    itself): its statistics then carry the interval's sums."""
    return controller.interval_ends_at(controller.step + 1)


def observation(step_stats: StepStats, step_time: float, world: int, at_boundary: bool,
                comm_time: float = 0.0) -> StepObservation:
    """The controller's view of one step, from the rank-averaged statistics."""
    s = step_stats
    return StepObservation(
        ef_sq=s.ef_sq, min_sq=s.min_sq, candidate_sq=s.candidate_sq,
        step_time=step_time, samples=float(world), grad_sq=s.grad_sq, comm_time=comm_time,
        accumulated_sq=s.accumulated_sq if at_boundary else None,
        window_dot=s.window_dot if at_boundary else None,
        window_sent_sq=s.window_sent_sq if at_boundary else None,
        coherence=coherence(s.lag_dot, s.lag_now_sq, s.lag_prev_sq),
        # Not finite: a rank saw NaN/Inf, or a float32-carried statistic overflowed.
        finite=s.nonfinite == 0.0 and all(map(math.isfinite, s.to_list())))


class _Exchange:
    """What both ways of agreeing share: the controller, the collective's name and bound,
    the backend, and (join-safe mode) the step whose observation is still pending."""

    def __init__(self, controller: Controller, name: str, timeout: float, backend: CollectiveBackend):
        self.controller = controller
        self.name = name
        self.timeout = timeout
        self.backend = backend
        self._pending = None

    def drop(self) -> None:
        """Forget a pending observation (elastic recovery: it belongs to the old world)."""
        self._pending = None

    def _fill_stats(self, stats: dict, obs: Optional[StepObservation]) -> None:
        """The consensus keys of ``optimizer.stats`` (``CONSENSUS_STATS``), once decided;
        ``obs``: the step's observation (None: not observed)."""
        ctrl = self.controller
        stats.update({"gain_min": ctrl.gain_min, "gain_candidate": ctrl.gain_candidate,
                      "system_throughput": ctrl.last.get("system_throughput"),
                      "compression_throughput": ctrl.last.get("compression_throughput"),
                      "next_cf": ctrl.decision.send_cf,
                      "coherence": obs.coherence if obs is not None and obs.finite else None})


class DecisionExchange(_Exchange):
    """Rank 0's controller state at each check, observation without a collective in
    between (see module doc).  Nothing is left in flight between steps."""

    def is_root(self) -> bool:
        return self.backend.rank() == 0

    def start(self, step_stats: StepStats, step_time: float, world: int, at_boundary: bool,
              observe: bool, stats: dict, comm_time: float = 0.0) -> None:
        """Observe this step.  ``observe=False``: the step is not fed to the controller
        (every rank skipped it: a loss-scaler overflow, or no statistics arrived)."""
        ctrl = self.controller
        obs = None
        if observe:
            check = ctrl.checks_at(ctrl.step + 1)
            sent = ctrl.decision   # what this step did: the same on every rank since the last check
            obs = observation(step_stats, step_time, world, at_boundary, comm_time)
            ctrl.observe(obs)
            if check:   # rank 0's state (and decision) on every rank
                root = self.is_root()
                state, root_sent = self.backend.broadcast_object((ctrl.state_dict(), sent) if root else None,
                                                                 name=self.name, timeout=self.timeout)
                if not root:
                    if sent != root_sent:   # arithmetic that differs by rank: say so, then follow rank 0
                        warnings.warn(f"horovod_gravac: rank {self.backend.rank()} sent {sent} in step {ctrl.step} but "
                                      f"rank 0 sent {root_sent}; taking rank 0's controller state")
                    ctrl.load_state_dict(state)
        self._fill_stats(stats, obs)

    def sync_state(self, step_index: int, name: str) -> int:
        """Every rank takes rank 0's controller state and step index (once, before the
        first bucket).  Returns the step index to use."""
        ctrl = self.controller
        state = self.backend.broadcast_object((ctrl.state_dict(), step_index) if self.is_root() else None,
                                              name=name, timeout=self.timeout)
        if not self.is_root():
            ctrl.load_state_dict(state[0])
        return int(state[1])


def sync_step_index(step_index: int, name: str, timeout: float, backend: CollectiveBackend) -> int:
    """Rank 0's step index on every rank (static controllers: shared-seed draws depend on it)."""
    buf = torch.tensor([float(step_index)], dtype=torch.float64)
    backend.wait(backend.broadcast_async_(buf, name), name, timeout)
    return int(buf.item())


class JoinSafeExchange(_Exchange):
    """Consensus that ``hvd.join()`` allows (``DistributedOptimizer(join_safe=True)``).

    Horovod's join lets a rank that ran out of data sit out the others' allreduces (it
    adds zeros) but not broadcasts or allgathers.  So instead of rank 0's broadcast, at
    the start of every step each rank adds ``[its last step time, 1, its controller step
    at its own slot]`` into one small allreduce (blocking: one latency per step, the
    price of this mode).  Every rank that took part then sees the same mean step time
    and the same averaged norms, and makes the same decision itself.  If the ranks'
    step indices differ (a rank sat out steps in ``hvd.join()``, or rank 0 alone loaded
    a checkpoint), every rank takes the controller state and step index of the one
    furthest ahead first.  Static controllers with a shared-seed compressor use it for
    the step index alone.  Statistics of step t are filled in when step t+1 starts.
    Pending: (step_stats, step_time, world, at_boundary, observe, stats, comm_time); the
    step and communication times observed are means over the ranks that took part."""

    def start(self, step_stats: StepStats, step_time: float, world: int, at_boundary: bool,
              observe: bool, stats: dict, comm_time: float = 0.0) -> None:
        self._pending = (step_stats, step_time, world, at_boundary, observe, stats, comm_time)

    def begin_step(self, step_index: int, world: int) -> int:
        """The collective part (every rank, before its step's first bucket).  Returns the
        step index to use (the furthest rank's, after a resync).  Ranks are compared by
        step index, which also seeds shared-seed compressors (Random-k)."""
        backend = self.backend
        me = backend.rank()
        ctrl = self.controller
        step_time = self._pending[1] if self._pending is not None else 0.0
        comm_time = self._pending[6] if self._pending is not None else 0.0
        buf = torch.zeros(3 + world, dtype=torch.float64)
        buf[0], buf[1], buf[2], buf[3 + me] = step_time, 1.0, comm_time, float(step_index + 1)
        backend.wait(backend.allreduce_async(buf, self.name, ReduceOp.SUM), self.name, self.timeout)
        active, steps = buf[1].item(), buf[3:].tolist()
        present = [s for s in steps if s > 0]
        if any(s != present[0] for s in present):
            src = max(range(world), key=lambda r: (steps[r], -r))
            state = backend.broadcast_object((ctrl.state_dict(), step_index) if me == src else None,
                                             name=self.name + ".resync", timeout=self.timeout, root=src)
            if me != src:
                ctrl.load_state_dict(state[0])
            self._pending = None   # observed with a step time the others do not share
            return int(state[1])
        if self._pending is not None:
            step_stats, _, world_, at_boundary, observe, stats, _ = self._pending
            self._pending = None
            obs = None
            if observe:
                obs = observation(step_stats, buf[0].item() / max(active, 1.0), world_, at_boundary,
                                  buf[2].item() / max(active, 1.0))
                ctrl.observe(obs)
            self._fill_stats(stats, obs)
        return step_index


def make_exchange(controller: Controller, prefix: str, timeout: float, backend: CollectiveBackend,
                  join_safe: bool, shared_seed: bool):
    """How an optimizer's ranks agree (None: they need not): rank 0's controller state at
    each check for adaptive controllers, or in join_safe mode an allreduce every step that
    also aligns the step index (shared-seed compressors)."""
    if join_safe and (controller.needs_consensus or shared_seed):
        return JoinSafeExchange(controller, f"{prefix}.decision", timeout, backend)
    if controller.needs_consensus:
        return DecisionExchange(controller, f"{prefix}.decision", timeout, backend)
    return None


def sync_first_step(exchange, controller: Controller, step_index: int, name: str, link, join_safe: bool,
                    shared_seed: bool) -> int:
    """Before an optimizer's first bucket: rank 0's controller state and step index (or
    only its step index, which seeds shared-seed draws) on every rank; returns the index."""
    if link.world > 1 and exchange is not None and not join_safe:
        return exchange.sync_state(step_index, name)
    if link.world > 1 and shared_seed and not isinstance(controller, Dense):
        return sync_step_index(step_index, name, link.timeout, link.backend)
    return step_index


def observe_step(exchange, controller: Controller, step_stats, step_time: float, world: int,
                 at_boundary: bool, skipped: bool, stats: dict, comm_time: float = 0.0) -> None:
    """Feed the finished step to the controller: through the exchange (adaptive
    controllers), or directly (static ones; a skipped step is not fed)."""
    if exchange is not None and controller.needs_consensus:
        # No statistics arrived (no bucket, or the carrier changed mid-step because a
        # gradient turned out sparse): the step is not observed, on every rank alike.
        observed = not skipped and step_stats is not None
        stats.update(dict.fromkeys(CONSENSUS_STATS))   # filled in by the exchange
        exchange.start(step_stats if step_stats is not None else StepStats(), step_time, world, at_boundary,
                       observe=observed, stats=stats, comm_time=comm_time)
    elif not skipped:
        controller.observe(StepObservation(0.0, 0.0, 0.0, step_time, comm_time=comm_time))


#: The key a rank whose arguments were refused sends in the start-up check instead of its
#: settings (``optimizer.py``): the check then raises that rank's error on every rank.
ARGUMENT_ERROR = "argument_error"


def check_agreement(backend: CollectiveBackend, mine: dict, name: str, timeout: float, hints=None) -> None:
    """The start-up check of every backend: each rank's settings ``mine`` (the same keys on
    every rank) are gathered (one object allgather) and compared with rank 0's; any difference
    raises ``ValueError`` on every rank alike, naming the first rank and key that differ
    (``hints``: a sentence to add for a key).  A rank that sent ``{ARGUMENT_ERROR: message}``
    instead (its constructor refused an argument) makes every rank raise that message."""
    everyone = backend.allgather_object(mine, name=name, timeout=timeout)
    raise_argument_errors(everyone)
    for r, theirs in enumerate(everyone):
        for key in mine:
            if theirs.get(key) != everyone[0].get(key):
                raise ValueError(
                    f"horovod_gravac: rank {r} differs from rank 0 in '{key}': "
                    f"{_short(theirs.get(key))} vs {_short(everyone[0].get(key))}. All ranks must "
                    f"use the same model, compressor and controller settings.{(hints or {}).get(key, '')}")


def raise_argument_errors(everyone: list) -> None:
    """``ValueError`` with the lowest failing rank's message if any rank of the start-up
    check refused its arguments: verbatim when every rank refused them alike (the usual case,
    every rank running the same script), else naming the ranks that did."""
    failed = [(r, theirs[ARGUMENT_ERROR]) for r, theirs in enumerate(everyone) if ARGUMENT_ERROR in theirs]
    if not failed:
        return
    message = failed[0][1]
    if len(failed) < len(everyone) or any(m != message for _, m in failed):
        message = (f"{message} (raised on rank(s) {', '.join(str(r) for r, _ in failed)}; "
                   f"every rank stops at the start-up check)")
    raise ValueError(message)


def _short(x, limit=300):
    s = repr(x)
    return s if len(s) <= limit else s[:limit] + "..."
