"""The predictive rule set (``GraVAC(variant="predictive")``): climb to the CF that makes the
step as fast as it can get, in one move, as long as the gain measured so far predicts that CF
passes epsilon.

The gain is the delivered gain of ``delivered.py`` (cos^2 of what a window sent against what
it owed, :func:`~.delivered.window_gain`), measured for the one CF a window sends.  The
ladder and delivered rule sets try one rung per window; on a communication-bound job most of
the run then goes by at CFs far below the one a hindsight choice would make.  Here each
check predicts two things for every rung of the policy:

* the step time, from a model fitted to the steps measured so far: the compute part of a
  step (its period less the time spent waiting for communication, ``comm_time``) plus
  ``latency + volume / CF`` (fitted over the CFs measured; one CF measured: latency 0);
* the gain, from the loss ``1 - gain`` measured at the CF sent, taken to grow in proportion
  to the CF (``1 - (1 - g) * cf / sent``).  Error feedback holds back about the last
  ``cf`` steps' worth of the coordinates it has not sent yet, so the share of a window's
  debt still undelivered at its end grows with the CF.

The exchange a CF takes can change with it past two ranks (``exchange.py``: the sparse
allreduce at low CFs, the allgather at high ones, dense where a payload would cost more), and
so can the form of its communication time.  Given the optimizer's ``comm_model``
(:meth:`set_comm_model`; the optimizer and the DDP hook hand it over), the fit above runs
over the measured CFs whose buckets take the same exchanges as the rung predicted (a rung
whose buckets all go dense costs what dense measured, whatever its CF); a rung with no such
measurement is predicted from the nearest measured CF, scaled by the modelled ratio.  Dense
is then a rung too: a check sends dense when its predicted step is faster than that of the CF
it would send by more than ``omega`` (the gain of dense is 1), and a hold at theta_min holds
dense instead when theta_min is the slower, so theta_min is never a floor slower than not
compressing; the CF dense replaced is tried again after ``remeasure_windows`` windows, since
its gain may have grown.  At two ranks every CF takes the pair exchange, which costs less
than dense above about 3x, so from theta_min's default of 10 up none of this changes a
choice there; at 8 or 16 ranks it can.

The next CF is the lowest rung whose predicted step is within ``omega`` of the fastest
predicted step among the rungs predicted to pass epsilon (and at most ``max_jump`` times the
CF sent).  Compression throughput (samples/s x gain) is what the paper maximises; with the
gain held above epsilon, the fastest step within omega is that choice without letting a
noisy gain estimate trade accuracy for speed.  On a compute-bound job every rung is within
omega of the fastest, so the first CF stays; on a communication-bound one the first move
goes most of the way.

A move is a trial: its check comes ``probe_steps`` steps later (a quarter window by
default), so a CF that fails costs a short interval, and a CF that fails steps down to the
highest rung below it not known to fail.  A CF on trial (any CF that has not passed a check
since it last failed) must pass epsilon; a CF that passed is kept (``kept``) while its gain
is at least ``keep_epsilon`` = epsilon squared (about twice the loss a trial may show).  The
window gain of a CF that is kept moves from window to window with the gradient's noise, and
drifts down as the run converges; one threshold for both would step a good CF down and back
on that noise, each time paying a trial.  A failed CF is not tried again for
``remeasure_windows`` windows, doubled after each further failure (as in ``delivered``).
The first CF is judged after ``probe_steps`` too.  A check without a move, or one that sends
dense for its cost (dense needs no trial), comes a full ``window`` later.

The gain cannot tell whether what a CF drops matters; the signal share of the gradient can
(``coherence.py``).  While the gradient the ranks average is at least half signal (the mean
coherence over the last ``window`` steps at least ``coherence.hold_coherence(N)`` =
``1 / (N + 1)`` for N ranks, or ``coherence_max`` when set), the CF is held at theta_min: a
check that would climb stays there (or comes back down), with move "hold", and the next check
comes ``probe_steps`` later.  The run starts held, until the first reading.  The threshold is
where the global batch is the critical batch size: below it, compression's error is one more
noise next to the sampling noise SGD already averages out; above it, it delays information.
It depends on N: more ranks average more noise away, so the same per-rank reading is more
signal at 8 ranks than at 2.  There is no hysteresis: the window mean is already smoothed
over ``window`` steps, and a hold that was not needed costs one probe interval at theta_min.

What the hold guards against is delay, and a CF that sends all a window owes delays nothing:
a sparse gradient (an embedding table's rows, a hashed feature model) can have fewer nonzero
coordinates than a CF keeps.  So a hold sends the CF its rule would choose when the interval
just judged was lossless (window gain 1, ``LOSSLESS_GAIN``), limited to the rungs below the
lowest one measured lossy, and checks it after a probe interval as any trial; when the
interval was lossy it sends the highest rung below it measured lossless, or theta_min.  A CF
fails on the coherence only when it was lossy and sent while not holding: what a hold sends
meets a gradient that was already mostly signal, so its readings say nothing about the CF.
On a dense gradient no CF is lossless and the hold is theta_min's, as above.

The coherence also judges a CF above theta_min by what it does to the gradient.  Above the
threshold it was held; below it, at theta_min, the averaged gradient was mostly noise.  If,
while a higher CF is sent, the mean coherence of the steps since the last check reaches the
threshold, the gradient turned mostly signal under that CF: the model did not move along
what the CF held back, so consecutive gradients keep pointing the same way.  That is the
harm the gain cannot see (what error feedback delivers late still counts as delivered), so
the CF fails as a trial that failed epsilon does, and theta_min is held until the backlog is
delivered.  The check comes at the step after the interval's mean first reaches the
threshold, once it has ``probe_steps`` readings, rather than at the end of a window.

Such a failure says more about the run than about the CF: the gradient is in a phase where
what any CF holds back is signal.  A lower CF holds back less, but it holds back too, and
trying the rungs below one at a time (each failure making only the failed CF and the rungs
above it wait) spends an interval at a CF the model cannot take for every rung on the way
down.  So a coherence failure makes every rung above theta_min wait (``coherence_failures``
counts them): ``remeasure_windows`` windows of steps, doubled after each further coherence
failure in the run.  The phase ends as training goes on (the gradient's noise grows against
its signal as the loss falls), and the doubling keeps a run whose gradient stays signal-rich
to a few failed intervals in all, however long it is.  A rung measured lossless is exempt:
it sends all it owes and delays nothing (the hold's own argument above).

The failure also measured how much the CF raised the cosine: the failed interval's mean
against the window mean at theta_min that the climb was decided on (``signal_rise``, at least
1).  That reading comes from before the failed interval.  Early in training the cosine rises
at any CF, and a rise read against it would blame the CF for the phase.  So the rise is read
again at the first check of theta_min after the failure, against the median cosine of that
interval, and the smaller one is kept.  That interval is the theta_min reading nearest the
failed one in time.  The median is used, not the mean, because the interval's first steps
still deliver the failed CF's backlog.  The wait ends early once the cosine at theta_min,
read over a whole window after the failure, times that rise is under the threshold with
confidence: the window's mean plus ``RELEASE_Z`` standard errors of it
(:func:`~horovod_gravac.coherence.mean_upper_bound`), times the rise.  The failed CF would
then leave the gradient mostly noise, so the phase that failed it has passed.  The release
frees the failed CF and the rungs below it; the rungs above stay waiting, since what they
would do to the cosine was not measured.  Where theta_min's own cosine stays near the
threshold (a model that only theta_min keeps), the rise read again is about 1, and a window
mean just under the threshold is one noisy reading of a cosine at it: the bound keeps such a
run waiting to the wait's end, and a rise near 1 ends the wait early only on a cosine that
fell clearly under the threshold.  Only the run's first coherence failure can be
released this way: a second one shows that the phase came back after a wait had ended, which
one reading of the rise cannot foresee, so from then on the doubled waits run their course.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Dict, List, Optional, Tuple

from ..coherence import hold_coherence, mean_coherence, mean_upper_bound, signal_share
from .base import DENSE, Decision, StepObservation
from .delivered import window_gain
from .gravac import GraVAC


#: A window gain at least this is lossless: the CF sent all the window owed (every nonzero
#: coordinate of a sparse gradient), up to float64 rounding of the gain's sums.
LOSSLESS_GAIN = 1.0 - 1e-9


def fit_comm_model(measured: Dict[float, float]) -> Tuple[float, float]:
    """``(latency, volume)`` with ``comm(cf) = latency + volume / cf`` fitted by least squares to
    ``measured`` (CF -> seconds of communication per step); both >= 0.  One CF: latency 0."""
    points = [(1.0 / cf, t) for cf, t in measured.items() if cf > 0]
    if not points:
        return 0.0, 0.0
    if len(points) == 1:
        x, t = points[0]
        return 0.0, max(t, 0.0) / x
    n = len(points)
    mx = sum(x for x, _ in points) / n
    mt = sum(t for _, t in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (t - mt) for x, t in points) / sxx if sxx > 0 else 0.0
    slope = max(slope, 0.0)
    latency = mt - slope * mx
    if latency < 0.0:   # through the origin instead
        slope, latency = sum(x * t for x, t in points) / sum(x * x for x, _ in points), 0.0
    return latency, max(slope, 0.0)


class PredictiveGraVAC(GraVAC, variant="predictive"):
    """Readable state besides GraVAC's: ``delivered_gain`` (CF -> last window gain measured),
    ``compute_time`` (the step's compute estimate, s), ``comm_time`` (CF -> median
    communication wait per step measured at it, s), ``predicted_step`` (CF -> the step time
    predicted at the last check, s), ``kept`` (the CFs that passed a check and have not failed
    since: judged against ``keep_epsilon`` rather than epsilon), ``coherence_failures`` (the
    checks that failed a CF on the coherence, each making every rung above theta_min wait
    longer than the last), ``signal_rise`` (how many times the run's first such failure
    raised the cosine over theta_min's reading, while its wait runs and may be released; else
    None), ``coherence`` and
    ``signal_share`` (the last window's mean coherence and the rank-averaged gradient's signal
    share from it, at the last check), ``interval_coherence`` (the mean over the steps of the
    interval the last check judged), ``hold_threshold`` and ``holding``.  A check's ``history``
    entry says ``delayed_signal`` when the CF it judged failed on the coherence, and
    ``signal_wait_released`` when it ended that failure's wait early."""

    needs_accumulation = True
    tracks_delivery = True
    needs_multilevel = False   # one CF per interval, sent as is: no second level to compress
    #: The longest wait before a CF that keeps failing is tried again, in units of
    #: ``remeasure_windows``.
    RETRY_BACKOFF_MAX = 8
    #: Standard errors above a window's mean cosine that the early end of a coherence
    #: failure's wait reads (module doc): a one-sided bound that a window of readings whose
    #: cosine is at the threshold crosses by chance about 2 % of the time.
    RELEASE_Z = 2.0

    def _start_rule_set(self) -> None:
        self.needs_coherence = self.coherence_max is None or self.coherence_max < 1.0
        self.coherence: Optional[float] = None   # the mean over the last window's steps, at the last check
        self.signal_share: Optional[float] = None   # of the rank-averaged gradient, from that mean
        self.holding = self.needs_coherence      # held at theta_min by the coherence
        self._coherence_steps: deque = deque(maxlen=self.window)   # per step (None: not measured)
        self._interval_coherence: List[Optional[float]] = []   # per step since the last check
        self.interval_coherence: Optional[float] = None   # their mean, at the last check
        self._signal_seen = False   # their mean reached the threshold: the check was brought forward
        self.probe_steps = max(1, self.window // 4)
        self.rungs: List[float] = self.policy.ladder(self.theta_min0, self.theta_max)
        self.decision = Decision(self.theta_min0, self.theta_min0, self.theta_min0)
        self.candidate_cf = self.theta_min0
        self.delivered_gain: Dict[float, float] = {}
        self.comm_time: Dict[float, float] = {}
        self.compute_time: Optional[float] = None
        self.predicted_step: Dict[float, float] = {}
        self._next_check = self.probe_steps
        self._interval_start = 0
        self._checks = 0
        self._retry_at: Dict[float, int] = {}   # CF -> first step it may be sent again
        self._failures: Dict[float, int] = {}   # CF -> failed checks since it last passed
        self.coherence_failures = 0   # checks in this run that failed a CF on the coherence
        self._theta_min_coherence: Optional[float] = None   # the window mean at the last check of theta_min
        self._signal_wait: Optional[dict] = None   # the first coherence failure's rise, step and the waits it replaced
        self._interval: List[Tuple[float, float]] = []   # (step time, comm time) since the last check
        self.comm_model = None          # the optimizer's exchange.CommModel (set_comm_model)
        self.dense_by_cost = False      # sending dense because it is predicted fastest ...
        self._dense_instead_of = self.theta_min0   # ... than this CF (the one it replaced)
        self._dense_until = 0           # the check at which that CF is tried again

    def set_comm_model(self, model) -> None:
        """The optimizer's :class:`~horovod_gravac.exchange.CommModel`: which exchange each CF's
        buckets take at this world size, and their modelled cost (module doc)."""
        self.comm_model = model

    @property
    def signal_rise(self) -> Optional[float]:
        """How many times the run's first coherence failure raised the cosine over theta_min's
        reading, while its wait may still end early; else None (module doc)."""
        return None if self._signal_wait is None else self._signal_wait["rise"]

    def set_world_size(self, n: int) -> None:
        if max(1, int(n)) != self.world_size:   # times measured in another world predict nothing here
            self.comm_time.clear()
            self.compute_time = None
            self.predicted_step = {}
            self._interval = []
        super().set_world_size(n)

    # -- when -------------------------------------------------------------------------
    def checks_at(self, step: int) -> bool:
        return step == self._next_check

    def interval_ends_at(self, step: int) -> bool:
        return step == self._next_check

    # -- per step ---------------------------------------------------------------------
    def _record_throughput(self, sent: Decision, t_sys: float) -> Optional[float]:
        self.throughput.record(sent.send_cf, t_sys, 1.0)
        gain = self.delivered_gain.get(sent.send_cf, 1.0 if sent.send_cf == DENSE else None)
        return None if gain is None else t_sys * gain

    def observe(self, obs: StepObservation) -> Decision:
        if obs.finite and obs.step_time > 0:
            self._interval.append((obs.step_time, min(max(obs.comm_time, 0.0), obs.step_time)))
        if obs.finite:
            self._coherence_steps.append(obs.coherence)
            self._interval_coherence.append(obs.coherence)
        decision = super().observe(obs)
        if self.step < self._next_check - 1 and self._delaying_signal(self._interval_coherence):
            self._next_check = self.step + 1   # judge the CF now, not at the window's end (module doc)
            self._signal_seen = True           # ... as delaying, whatever the next reading adds
        return decision

    def _delaying_signal(self, readings: List[Optional[float]]) -> bool:
        """Whether the CF sent over an interval with these coherence readings turned the
        averaged gradient mostly signal: a CF above theta_min sent while not holding, at least
        ``probe_steps`` readings, and their mean at least ``hold_threshold`` (module doc)."""
        sent = self.decision.send_cf
        if not self.needs_coherence or sent == DENSE or sent <= self.theta_min0 * (1 + 1e-9) or self.holding:
            return False   # (a hold sent it while the gradient was already mostly signal)
        values = [c for c in readings if c is not None]
        return len(values) >= self.probe_steps and mean_coherence(values) >= self.hold_threshold

    @property
    def kept(self) -> set:
        """The CFs whose last check passed: measured (``delivered_gain``) and not failed since."""
        return {cf for cf in self.delivered_gain if cf not in self._failures}

    @property
    def keep_epsilon(self) -> float:
        """The gain below which a CF that passed its trial fails (module doc)."""
        return self.epsilon ** 2

    @property
    def hold_threshold(self) -> float:
        """The mean coherence at or above which theta_min is held: ``coherence_max`` when set,
        else ``1 / (N + 1)`` for this world size (module doc)."""
        return self.coherence_max if self.coherence_max is not None else hold_coherence(self.world_size)

    def _signal_rich(self) -> bool:
        """Whether to hold theta_min: the mean coherence of the last ``window`` steps against
        ``hold_threshold`` (module doc).  Unmeasured: no hold."""
        self.coherence = mean_coherence(self._coherence_steps)
        self.signal_share = None if self.coherence is None else signal_share(self.coherence, self.world_size)
        self.holding = bool(self.needs_coherence and self.coherence is not None
                            and self.coherence >= self.hold_threshold)
        return self.holding

    def _decide(self, obs: StepObservation, window_end: bool) -> None:
        if self.step == self._next_check:
            self._check(window_gain(obs))

    # -- the model --------------------------------------------------------------------
    def _measure(self, sent: float) -> None:
        """Fold the interval's steps into the step-time model (the first step after a check
        carries the change of CF and is left out when there are others)."""
        steps = self._interval[1:] if len(self._interval) > 1 else self._interval
        self._interval = []
        if not steps:
            return
        self.compute_time = statistics.median(t - c for t, c in steps)
        self.comm_time[sent] = statistics.median(c for _, c in steps)

    def predict_step(self, cf: float) -> Optional[float]:
        """Predicted seconds per step at ``cf`` (``DENSE``: dense; None before anything was
        measured, or for dense without a ``comm_model``)."""
        comm = self.predict_comm(cf)
        return None if comm is None or self.compute_time is None else self.compute_time + comm

    def predict_comm(self, cf: float) -> Optional[float]:
        """Predicted seconds of communication per step at ``cf`` (module doc)."""
        model = self.comm_model
        if model is None or not model.buckets:
            sparse = {c: t for c, t in self.comm_time.items() if c != DENSE}
            if cf == DENSE or not sparse:
                return None
            latency, volume = fit_comm_model(sparse)
            return latency + volume / cf
        if not self.comm_time:
            return None
        kinds = tuple(model.kinds(cf))
        same = {c: t for c, t in self.comm_time.items() if tuple(model.kinds(c)) == kinds}
        if same:
            if all(k == "dense" for k in kinds):   # dense whatever the CF
                return statistics.median(same.values())
            latency, volume = fit_comm_model(same)
            return latency + volume / cf
        nearest = min(self.comm_time, key=lambda c: abs(math.log(c / cf)))
        modelled = model.step_seconds(nearest)
        return self.comm_time[nearest] * model.step_seconds(cf) / modelled if modelled > 0 else None

    def _dense_faster(self, than: List[float]) -> bool:
        """Whether dense is predicted faster than every CF in ``than`` by more than omega, where
        the exchange model too ranks dense below each of them: where it does not (two ranks,
        a CF above about 3x), measured times that say otherwise are noise, not a reason to
        stop compressing."""
        model = self.comm_model
        if model is None or not model.buckets \
                or any(model.step_seconds(DENSE) >= model.step_seconds(cf) for cf in than):
            return False
        dense = self.predict_step(DENSE)
        times = [self.predict_step(cf) for cf in than]
        if dense is None or not times or any(t is None for t in times):
            return False
        self.predicted_step[DENSE] = dense
        return dense * (1 + self.omega) < min(times)

    def _blocked(self, cf: float) -> bool:
        return self.step < self._retry_at.get(cf, 0)

    def _hold_choice(self, sent: float, gain: float, lossless: bool) -> float:
        """What a hold sends: a CF that delivers everything it owes delays nothing, so it may be
        sent however much of the gradient is signal.  After a lossless interval, the choice
        among the rungs below the lowest one measured lossy; after a lossy one, the highest
        rung below it measured lossless; theta_min when there is none (module doc)."""
        if lossless:
            lossy = [cf for cf, g in self.delivered_gain.items() if g < LOSSLESS_GAIN]   # (dense is never measured)
            return self._choose(sent, gain, below=min(lossy, default=math.inf))
        safe = [cf for cf in self.rungs
                if cf < sent and self.delivered_gain.get(cf, 0.0) >= LOSSLESS_GAIN and not self._blocked(cf)]
        return max(safe, default=self.theta_min0)

    def _choose(self, sent: float, gain: float, below: float = math.inf) -> float:
        """The lowest rung within omega of the fastest predicted step among the rungs predicted
        to pass epsilon, at most ``max_jump`` above ``sent``, below any rung waiting after a
        failure (and below ``below``)."""
        loss = max(1.0 - gain, 0.0)
        admissible = []
        for cf in self.rungs:
            if cf > sent * (1 + 1e-9):
                if self._blocked(cf) or cf > sent * self.MAX_JUMP * (1 + 1e-9) or cf >= below \
                        or 1.0 - loss * cf / sent < self.epsilon:
                    break
            admissible.append(cf)
        times = {cf: self.predict_step(cf) for cf in admissible}
        if any(t is None for t in times.values()):
            return sent
        self.predicted_step = dict(times)
        fastest = min(times.values())
        return next(cf for cf in admissible if times[cf] <= fastest * (1 + self.omega))

    #: The largest factor one move may climb (an exponential ladder's 10 -> 160).
    MAX_JUMP = 16.0

    def _retry_wait(self, n: int) -> int:
        """Steps before a CF is sent again after its ``n``-th failure (or the run's ``n``-th
        coherence failure): ``remeasure_windows`` windows, doubled per failure, capped."""
        return self.window * self.remeasure_windows * min(2 ** (n - 1), self.RETRY_BACKOFF_MAX)

    def _failed(self, cf: float) -> None:
        n = self._failures.get(cf, 0) + 1
        self._failures[cf] = n
        self._retry_at[cf] = self.step + 1 + self._retry_wait(n)

    def _failed_on_coherence(self, cf: float, interval_coherence: Optional[float]) -> None:
        """``cf`` turned the gradient mostly signal: it fails, and every lossy rung above
        theta_min waits with it, for a wait that doubles per coherence failure in the run;
        the rise it caused in the cosine decides when the wait may end early (module doc)."""
        before = {rung: self._retry_at.get(rung, 0) for rung in self.rungs if rung <= cf}
        self._failed(cf)
        self.coherence_failures += 1
        until = self.step + 1 + self._retry_wait(self.coherence_failures)
        for rung in self.rungs:
            if rung > self.theta_min0 * (1 + 1e-9) and self.delivered_gain.get(rung, 0.0) < LOSSLESS_GAIN:
                self._retry_at[rung] = max(self._retry_at.get(rung, 0), until)
        reference = self._theta_min_coherence
        self._signal_wait = None
        # after a second failure the phase came back: no early end (module doc)
        if self.coherence_failures == 1 and interval_coherence is not None and reference is not None \
                and reference > 0:
            # what the release gives back: the wait each rung up to cf had before this failure
            # (a rung whose wait something else changes later keeps that one)
            restore = {rung: (at, self._retry_at[rung]) for rung, at in before.items()
                       if self._retry_at.get(rung, 0) != at}
            self._signal_wait = {"rise": max(1.0, interval_coherence / reference), "step": self.step,
                                 "until": until, "restore": restore, "failed": interval_coherence,
                                 "remeasured": False}

    def _remeasure_signal_rise(self, readings: List[float]) -> None:
        """At the first check of theta_min after the first coherence failure: read the rise
        against theta_min's cosine over that interval too, the reading nearest the failed
        interval in time, and keep the smaller.  A cosine that rose with the phase of training
        rose at theta_min as well, and is not the CF's doing.  The interval's median, not its
        mean: its first steps still deliver the failed CF's backlog (module doc)."""
        wait = self._signal_wait
        if wait is None or wait["remeasured"] or not readings:
            return
        wait["remeasured"] = True
        after = statistics.median(readings)
        if after > 0:
            wait["rise"] = max(1.0, min(wait["rise"], wait["failed"] / after))

    def _end_signal_wait_early(self) -> bool:
        """End the first coherence failure's wait now, if a whole window was read at theta_min
        since the failure and its mean cosine, plus ``RELEASE_Z`` standard errors, times
        ``signal_rise`` is under the threshold: the
        failed CF and the rungs below it get back the waits they had before it.  True when it
        ended (module doc)."""
        wait = self._signal_wait
        if wait is not None and self.step >= wait["until"]:   # the wait ran its course
            self._signal_wait = None
            return False
        if wait is None or self.step - wait["step"] < self.window:
            return False
        bound = mean_upper_bound(self._coherence_steps, self.RELEASE_Z)
        if bound is None or bound * wait["rise"] >= self.hold_threshold:
            return False
        for rung, (before, set_to) in wait["restore"].items():
            if self._retry_at.get(rung, 0) == set_to:
                self._retry_at[rung] = before
        self._signal_wait = None
        return True

    def judged_gain(self, gain: float, steps: int) -> float:
        """``gain`` measured over an interval of ``steps`` steps, read as over a full window:
        what the interval owed grows with its length, so the loss of a short interval is
        scaled by ``steps / window``.  That reads low after a move up (most likely because the
        new CF's backlog in error feedback is still growing when a probe interval ends): the
        window after a passed trial reads a larger loss than the one judged, which
        ``keep_epsilon`` allows for (docs/benchmarks.md has the ratio measured)."""
        return 1.0 - (1.0 - gain) * min(1.0, steps / self.window)

    def _check(self, gain: Optional[float]) -> None:
        sent = self.decision.send_cf
        self._checks += 1
        steps, self._interval_start = self.step - self._interval_start, self.step
        measured = gain
        if gain is not None:
            gain = self.judged_gain(gain, steps)
        self._measure(sent)
        self.throughput.close_window({sent: gain} if gain is not None else {})
        readings, self._interval_coherence = self._interval_coherence, []
        self.interval_coherence = mean_coherence(readings)
        # a CF that delivered all it owed delayed nothing, so it delayed no signal (module doc)
        lossless = gain is not None and gain >= LOSSLESS_GAIN
        delayed = gain is not None and not lossless and (self._signal_seen or self._delaying_signal(readings))
        self._signal_seen = False
        signal_rich = self._signal_rich()   # after _delaying_signal, which reads the last check's hold
        released = False
        if sent == self.theta_min0:   # (theta_min never fails on the coherence)
            self._theta_min_coherence = self.coherence
            self._remeasure_signal_rise([c for c in readings if c is not None])
            released = not signal_rich and self._end_signal_wait_early()
        threshold = self.keep_epsilon if sent in self.kept else self.epsilon
        move, send, by_cost = "stay", sent, False
        if gain is None:   # a non-finite step ended the interval: the same CF again
            by_cost = self.dense_by_cost
        elif sent == DENSE:
            if self.dense_by_cost:   # still faster than the CF it replaced: stay; else, or after
                # remeasure_windows windows (the gains may have grown meanwhile), try that CF again
                if self._checks >= self._dense_until or not self._dense_faster([self._dense_instead_of]):
                    send, move = self._dense_instead_of, "retry"
                else:
                    by_cost = True
            elif not self._blocked(self.theta_min0):
                send, move = self.theta_min0, "retry"
        elif gain < threshold and not delayed:
            self.delivered_gain[sent] = gain
            self._failed(sent)
            below = [cf for cf in self.rungs if cf < sent and not self._blocked(cf)]
            send, move = (below[-1], "down") if below else (DENSE, "dense")
        else:
            self.delivered_gain[sent] = gain
            if delayed:   # the CF turned the gradient mostly signal: it fails, theta_min holds
                self._failed_on_coherence(sent, self.interval_coherence)
            else:
                self._failures.pop(sent, None)
            if delayed:
                send = self.theta_min0
            elif signal_rich:
                send = self._hold_choice(sent, gain, lossless)
            else:
                send = self._choose(sent, gain)
            move = "hold" if (delayed or signal_rich) and send == self.theta_min0 \
                else "up" if send > sent else "down" if send < sent else "stay"
            if self._dense_faster([send]):
                self._dense_instead_of, self._dense_until = send, self._checks + self.remeasure_windows
                send, by_cost = DENSE, True
                move = "hold" if move == "hold" else "dense"
        self.dense_by_cost = by_cost
        # dense chosen for its cost needs no trial (its gain is 1): its next check is a window
        # away; a hold is checked again after a probe interval, whatever it sends
        settled = (move == "stay" and not self.holding) or (by_cost and move != "hold")
        self._next_check = self.step + (self.window if settled else self.probe_steps)
        self.theta_min = self.candidate_cf = send if send != DENSE else self.theta_min0
        self.decision = Decision(send, send, send) if send != DENSE else Decision(DENSE, self.theta_min0,
                                                                                  self.theta_min0)
        self._record_check(sent, self.gain_min, self.gain_candidate, move=move, window_gain=measured,
                           judged_gain=gain, interval_steps=steps,
                           compute_time=self.compute_time, predicted_step=dict(self.predicted_step),
                           coherence=self.coherence, signal_share=self.signal_share, threshold=threshold,
                           interval_coherence=self.interval_coherence, delayed_signal=delayed,
                           signal_wait_released=released, signal_rise=self.signal_rise)

    # -- checkpointing ----------------------------------------------------------------
    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update({"delivered_gain": dict(self.delivered_gain), "comm_time": dict(self.comm_time),
                      "compute_time": self.compute_time, "predicted_step": dict(self.predicted_step),
                      "next_check": self._next_check, "interval_start": self._interval_start, "checks": self._checks,
                      "retry_at_step": dict(self._retry_at), "failures": dict(self._failures),
                      "coherence_failures": self.coherence_failures,
                      "theta_min_coherence": self._theta_min_coherence,
                      "signal_wait": None if self._signal_wait is None else
                      dict(self._signal_wait, restore={k: list(v) for k, v in self._signal_wait["restore"].items()}),
                      "interval_coherence": list(self._interval_coherence), "signal_seen": self._signal_seen,
                      "interval": list(self._interval), "coherence": self.coherence,
                      "signal_share": self.signal_share,
                      "holding": self.holding, "coherence_steps": list(self._coherence_steps),
                      "dense_by_cost": self.dense_by_cost, "dense_instead_of": self._dense_instead_of,
                      "dense_until": self._dense_until})
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.delivered_gain = {float(k): v for k, v in state["delivered_gain"].items()}
        self.comm_time = {float(k): v for k, v in state["comm_time"].items()}
        self.compute_time = state["compute_time"]
        self.predicted_step = {float(k): v for k, v in state["predicted_step"].items()}
        self._next_check, self._checks = int(state["next_check"]), int(state["checks"])
        self._interval_start = int(state["interval_start"])
        if "retry_at_step" in state:
            self._retry_at = {float(k): int(v) for k, v in state["retry_at_step"].items()}
        else:   # a checkpoint that counted the wait in checks: about a window each
            self._retry_at = {float(k): self.step + (int(v) - self._checks) * self.window
                              for k, v in state["retry_at"].items()}
        self._interval_coherence = list(state.get("interval_coherence", []))
        self._signal_seen = bool(state.get("signal_seen", False))
        self._failures = {float(k): int(v) for k, v in state["failures"].items()}
        self.coherence_failures = int(state.get("coherence_failures", 0))
        self._theta_min_coherence = state.get("theta_min_coherence")
        wait = state.get("signal_wait")   # a checkpoint from before the early end: none pending
        self._signal_wait = None if wait is None else {
            "rise": float(wait["rise"]), "step": int(wait["step"]), "until": int(wait["until"]),
            "restore": {float(k): (int(v[0]), int(v[1])) for k, v in wait["restore"].items()},
            "failed": wait.get("failed"), "remeasured": bool(wait.get("remeasured", True))}
        self._interval = [tuple(x) for x in state["interval"]]
        self.coherence = state.get("coherence")
        self.signal_share = state.get("signal_share")
        self.holding = bool(state.get("holding", self.needs_coherence))
        self._coherence_steps = deque(state.get("coherence_steps", []), maxlen=self.window)
        self.dense_by_cost = bool(state.get("dense_by_cost", False))
        self._dense_instead_of = float(state.get("dense_instead_of", self.theta_min0))
        self._dense_until = int(state.get("dense_until", 0))
