"""GraVAC's predictive rule set (``controllers/predictive.py``), driven by scripted steps:
a compute time, a communication time per CF and a delivered gain per CF."""
import math
import pickle

import pytest

from horovod_gravac.controllers import DENSE, GraVAC, PredictiveGraVAC, StepObservation
from horovod_gravac.controllers.predictive import fit_comm_model


def step(gain, step_time, comm_time, at_check):
    """One observation; at a check, window sums whose cos^2(D, G) is ``gain``."""
    sums = dict(accumulated_sq=1.0, window_sent_sq=1.0, window_dot=math.sqrt(gain)) if at_check else {}
    return StepObservation(ef_sq=1.0, min_sq=0.9, candidate_sq=0.9, step_time=step_time, samples=2.0,
                           comm_time=comm_time, **sums)


def drive(ctrl, steps, gain_of, comm_of, compute=0.025):
    """Run ``steps`` steps; returns the CF sent in each."""
    sent = []
    for _ in range(steps):
        cf = ctrl.decision.send_cf
        sent.append(cf)
        comm = comm_of(cf)
        at_check = ctrl.interval_ends_at(ctrl.step + 1)
        ctrl.observe(step(gain_of(cf), compute + comm, comm, at_check))
    return sent


def test_fit_comm_model_recovers_latency_and_volume():
    assert fit_comm_model({10.0: 0.1}) == (0.0, pytest.approx(1.0))
    lat, vol = fit_comm_model({10.0: 0.005 + 1.0 / 10, 40.0: 0.005 + 1.0 / 40, 160.0: 0.005 + 1.0 / 160})
    assert lat == pytest.approx(0.005) and vol == pytest.approx(1.0)
    lat, vol = fit_comm_model({10.0: 0.1, 20.0: 0.04})   # would need a negative latency: through 0
    assert lat == 0.0 and vol > 0


def test_variant_builds_the_rule_set_with_its_own_epsilon():
    ctrl = GraVAC(variant="predictive", window=100)
    assert isinstance(ctrl, PredictiveGraVAC) and ctrl.epsilon == 0.9
    assert ctrl.config()["variant"] == "predictive" and ctrl.config()["type"] == "GraVAC"
    assert not ctrl.needs_multilevel and ctrl.tracks_delivery and ctrl.needs_accumulation
    assert ctrl.decision.send_cf == 10.0   # the first CF is sent from the first step


def test_the_default_ladder_is_geometric():
    assert GraVAC(variant="predictive").rungs == [10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1000.0]
    assert GraVAC(variant="predictive", policy="exponential").rungs == [10.0, 20.0, 40.0, 160.0, 1000.0]


def test_communication_bound_climbs_in_one_move_as_far_as_the_gain_allows():
    ctrl = GraVAC(variant="predictive", window=100, policy="exponential", epsilon=0.9)
    # comm 1 s x 10 / CF; the loss of a full window grows with the CF: 1 - gain = 0.002 x CF.
    # A quarter-window interval reads four times the loss (judged_gain scales it back).
    full = lambda cf: 1 - 0.002 * cf                      # noqa: E731
    quarter = lambda cf: 1 - 4 * 0.002 * cf               # noqa: E731
    sent = drive(ctrl, 25, quarter, lambda cf: 1.0 / cf)
    assert set(sent) == {10.0}
    # At 10x the loss 0.02 predicts 40x at 0.92 and 160x at 0.68: 40x, the first check's move
    # (the step is fastest at the highest rung allowed).
    assert ctrl.history[-1]["judged_gain"] == pytest.approx(full(10))
    assert ctrl.decision.send_cf == 40.0 and ctrl.history[-1]["move"] == "up"
    sent = drive(ctrl, 25, quarter, lambda cf: 1.0 / cf)
    assert set(sent) == {40.0}   # passed (0.92): a full window at it
    assert ctrl.decision.send_cf == 40.0
    assert ctrl.interval_ends_at(ctrl.step + 100) and not ctrl.interval_ends_at(ctrl.step + 25)


def test_a_failed_trial_steps_down_after_a_short_interval_and_waits_before_a_retry():
    ctrl = GraVAC(variant="predictive", window=100, remeasure_windows=2, policy="exponential", epsilon=0.9)
    gains = {10.0: 0.98, 20.0: 0.99, 40.0: 0.97, 160.0: 0.5, 1000.0: 0.1}
    drive(ctrl, 25, gains.get, lambda cf: 1.0 / cf)
    assert ctrl.decision.send_cf == 160.0   # predicted from 10x's loss: 1 - 0.005 x 16 = 0.92
    drive(ctrl, 25, gains.get, lambda cf: 1.0 / cf)
    assert ctrl.decision.send_cf == 40.0 and ctrl.history[-1]["move"] == "down"
    assert ctrl.delivered_gain[160.0] == pytest.approx(1 - 0.5 * 25 / 100)   # a quarter window, judged as a whole one
    # 40x passes, but 160x waits out its backoff: 40x is held, then tried again later.
    sent = drive(ctrl, 25 + 100 * 3, gains.get, lambda cf: 1.0 / cf)
    assert 160.0 not in sent[:25 + 100]
    assert ctrl.decision.send_cf in (40.0, 160.0)


def test_a_trial_must_pass_epsilon_and_a_kept_cf_fails_only_below_epsilon_squared():
    """Gains are given as a full window reads them; a quarter-window interval reads four times
    the loss (``judged_gain`` scales it back)."""
    def climb_to_40(trial_gain):
        ctrl = GraVAC(variant="predictive", window=100, coherence_max=1.0, epsilon=0.95)
        full = {10.0: 0.99, 40.0: trial_gain}
        reads = lambda cf: 1 - 4 * (1 - full[cf]) if ctrl._next_check - ctrl._interval_start < 100 else full[cf]  # noqa: E731
        drive(ctrl, 25, reads, lambda cf: 1.0 / cf)
        # 10x's loss 0.01 predicts 40x at 0.96 and 80x at 0.92: 40x
        assert ctrl.decision.send_cf == 40.0 and ctrl.history[-1]["move"] == "up"
        drive(ctrl, 25, reads, lambda cf: 1.0 / cf)
        return ctrl, full, reads

    ctrl, _, _ = climb_to_40(trial_gain=0.92)   # a trial at 0.92 fails epsilon
    assert ctrl.history[-1]["move"] == "down" and ctrl.history[-1]["threshold"] == 0.95
    assert ctrl.decision.send_cf == 20.0

    ctrl, full, reads = climb_to_40(trial_gain=0.96)   # passed: kept at 40x
    assert ctrl.history[-1]["move"] == "stay" and ctrl.decision.send_cf == 40.0
    assert ctrl.keep_epsilon == pytest.approx(0.9025) and GraVAC().keep_epsilon == pytest.approx(0.81)
    full[40.0] = 0.92   # a later window reads 0.92: kept
    drive(ctrl, 100, reads, lambda cf: 1.0 / cf)
    assert ctrl.history[-1]["move"] == "stay" and ctrl.history[-1]["threshold"] == pytest.approx(0.9025)
    assert ctrl.decision.send_cf == 40.0
    full[40.0] = 0.89   # below epsilon squared: fails, one rung down
    drive(ctrl, 100, reads, lambda cf: 1.0 / cf)
    assert ctrl.history[-1]["move"] == "down" and ctrl.decision.send_cf == 20.0
    assert ctrl.kept == {10.0}   # 40x failed; 20x has not passed anything yet
    full[20.0] = 0.99
    drive(ctrl, 25, reads, lambda cf: 1.0 / cf)   # stepped down to, never passed: a trial
    assert ctrl.history[-1]["threshold"] == 0.95 and ctrl.kept == {10.0, 20.0}


def test_compute_bound_stays_at_the_first_cf():
    ctrl = GraVAC(variant="predictive", window=100)
    sent = drive(ctrl, 400, lambda cf: 0.99, lambda cf: 0.00001 * 10 / cf, compute=0.1)
    assert set(sent) == {10.0}


def test_theta_min_failing_sends_dense_then_retries():
    ctrl = GraVAC(variant="predictive", window=100, remeasure_windows=1)
    sent = drive(ctrl, 25, lambda cf: 0.5 if cf != DENSE else 1.0, lambda cf: 1.0 / cf)
    assert ctrl.decision.send_cf == DENSE and ctrl.history[-1]["move"] == "dense"
    sent = drive(ctrl, 400, lambda cf: 0.5 if cf != DENSE else 1.0, lambda cf: 1.0 / cf)
    assert DENSE in sent and 10.0 in sent   # retried after its backoff


def test_non_finite_interval_keeps_the_cf():
    ctrl = GraVAC(variant="predictive", window=100)
    for _ in range(24):
        ctrl.observe(step(0.99, 0.125, 0.1, False))
    ctrl.observe(StepObservation(1.0, 1.0, 1.0, 0.125, comm_time=0.1, finite=False))
    assert ctrl.decision.send_cf == 10.0 and ctrl.history[-1]["move"] == "stay"


def test_state_round_trips_and_a_restored_controller_decides_alike():
    a = GraVAC(variant="predictive", window=100)
    drive(a, 60, lambda cf: 1 - 0.0005 * cf, lambda cf: 1.0 / cf)
    b = GraVAC(variant="predictive", window=100)
    b.load_state_dict(pickle.loads(pickle.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict()
    sa = drive(a, 300, lambda cf: 1 - 0.0005 * cf, lambda cf: 1.0 / cf)
    sb = drive(b, 300, lambda cf: 1 - 0.0005 * cf, lambda cf: 1.0 / cf)
    assert sa == sb and a.decision == b.decision


def test_a_new_world_forgets_the_step_time_model():
    ctrl = GraVAC(variant="predictive", window=100)
    ctrl.set_world_size(2)
    drive(ctrl, 25, lambda cf: 0.99, lambda cf: 1.0 / cf)
    assert ctrl.comm_time and ctrl.compute_time is not None
    ctrl.set_world_size(2)   # the same world: kept
    assert ctrl.comm_time
    ctrl.set_world_size(3)
    assert not ctrl.comm_time and ctrl.compute_time is None and ctrl.predict_step(10.0) is None


# -- the exchange's cost model: dense as a rung, exchanges that change with the CF ----------------
from horovod_gravac.exchange import BucketShape, CommModel, LinkModel   # noqa: E402


def _model(world, mode="allgather", numel=1_000_000, rate="100mbit"):
    return CommModel(mode, LinkModel.from_rate(rate), world, [BucketShape(numel)])


def _paths(world, mode, gains, coherence=None, steps=150):
    """CFs sent by a controller with and without the comm model, each step's comm as modelled."""
    out = []
    for with_model in (False, True):
        model = _model(world, mode)
        ctrl = GraVAC(variant="predictive", window=100, epsilon=0.9, coherence_max=1.0 if coherence is None else None)
        ctrl.set_world_size(world)
        if with_model:
            ctrl.set_comm_model(model)
        sent = []
        for _ in range(steps):
            cf = ctrl.decision.send_cf
            sent.append(cf)
            comm = model.step_seconds(cf)
            at_check = ctrl.interval_ends_at(ctrl.step + 1)
            # ``gains`` as a full window reads them: a shorter interval reads the loss scaled up
            steps_in = ctrl._next_check - ctrl._interval_start
            read = max(0.0, 1 - (1 - gains(cf)) * 100 / steps_in)
            sums = dict(accumulated_sq=1.0, window_sent_sq=1.0, window_dot=math.sqrt(read)) if at_check else {}
            ctrl.observe(StepObservation(ef_sq=1.0, min_sq=0.9, candidate_sq=0.9, step_time=0.025 + comm,
                                         samples=2.0, comm_time=comm, coherence=coherence, **sums))
        out.append((sent, ctrl))
    return out


def test_at_two_ranks_the_comm_model_changes_no_choice():
    """Every CF takes the pair exchange at two ranks and, from 10x up, dense costs more: the
    rule's path is the same with the model as without it."""
    for gains in (lambda cf: 0.99, lambda cf: 1 - 0.004 * cf):
        (plain, _), (modelled, ctrl) = _paths(2, "auto", gains, steps=400)
        assert plain == modelled and DENSE not in modelled
        assert ctrl.comm_model is not None


def test_dense_is_a_rung_where_theta_min_is_slower_than_dense():
    """16 ranks, the paper's allgather: 10x sends 15 x 8 bytes x 100k = 12 MB a rank, dense
    7.5 MB.  When the gain allows nothing above 10x, the rule sends dense rather than a
    theta_min that is slower than not compressing; without the model it stays at 10x."""
    gains = lambda cf: 1 - 0.006 * cf   # 10x: 0.94; 20x predicted 0.88 < 0.9      # noqa: E731
    (plain, _), (modelled, ctrl) = _paths(16, "allgather", gains, steps=300)
    assert set(plain) == {10.0}
    assert modelled[:25] == [10.0] * 25 and set(modelled[26:]) == {DENSE}
    assert ctrl.dense_by_cost and ctrl.history[0]["move"] == "dense"
    assert ctrl.history[-1]["move"] == "stay" and ctrl.predicted_step[DENSE] < ctrl.predicted_step[10.0]


def test_a_hold_holds_dense_when_theta_min_is_slower():
    (plain, _), (modelled, ctrl) = _paths(16, "allgather", lambda cf: 0.99, coherence=0.9, steps=200)
    assert set(plain) == {10.0}   # held at theta_min
    assert set(modelled[26:]) == {DENSE} and ctrl.holding
    assert [h["move"] for h in ctrl.history] == ["hold", "stay", "stay"]   # then dense is kept


def test_where_the_cf_is_worth_it_dense_is_left_and_the_choice_differs_from_two_ranks():
    """At 16 ranks a gain that allows 160x: the allgather at 160x (750 kB) beats dense, so
    the rule climbs; the same readings at 2 ranks climb as well, and neither sends dense."""
    (_, _), (sixteen, _) = _paths(16, "allgather", lambda cf: 0.99)
    assert DENSE not in sixteen and max(sixteen) > 10.0


def test_a_rung_whose_buckets_all_go_dense_is_predicted_as_dense_measured():
    model = CommModel("auto", LinkModel(), 16, [BucketShape(10_000)])   # 1 Gbit/s
    assert model.kinds(10.0) == ["dense"] and model.kinds(20.0) != ["dense"]
    ctrl = GraVAC(variant="predictive", window=100)
    ctrl.set_world_size(16)
    ctrl.set_comm_model(model)
    ctrl.compute_time, ctrl.comm_time = 0.01, {10.0: 0.004}
    assert ctrl.predict_comm(10.0) == ctrl.predict_comm(DENSE) == pytest.approx(0.004)   # dense either way
    # 20x takes the allgather: no measurement of it, so 10x's scaled by the modelled ratio
    assert ctrl.predict_comm(20.0) == pytest.approx(0.004 * model.step_seconds(20.0) / model.step_seconds(10.0))


def test_the_dense_choice_survives_a_checkpoint():
    (_, _), (_, ctrl) = _paths(16, "allgather", lambda cf: 1 - 0.006 * cf, steps=300)
    fresh = GraVAC(variant="predictive", window=100, epsilon=0.9, coherence_max=1.0)
    fresh.load_state_dict(pickle.loads(pickle.dumps(ctrl.state_dict())))
    assert fresh.dense_by_cost and fresh.decision.send_cf == DENSE


def test_noisy_times_do_not_send_dense_where_the_model_ranks_dense_slower():
    """Two ranks, a tiny latency-bound model: every step's wait is noise around 5 ms whatever
    the CF, dense included.  The exchange model ranks dense above every CF from 10x, so the
    rule never sends dense for its cost, whatever the measured times say."""
    import random
    rnd = random.Random(0)
    model = CommModel("auto", LinkModel(), 2, [BucketShape(4485), BucketShape(2112)])
    ctrl = GraVAC(variant="predictive", window=8, coherence_max=1.0)
    ctrl.set_world_size(2)
    ctrl.set_comm_model(model)
    ctrl.comm_time[DENSE] = 0.001   # dense once measured far faster than any CF
    sent = drive(ctrl, 400, lambda cf: 0.99, lambda cf: rnd.uniform(0.002, 0.008), compute=0.002)
    assert DENSE not in sent and not any(h["move"] == "dense" for h in ctrl.history)
