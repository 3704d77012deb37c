"""Gradient coherence (``coherence.py``) and the predictive rule set's hold on it."""
import math

import pytest
import torch

from horovod_gravac.coherence import (SAMPLE_MAX, CoherenceSampler, coherence, hold_coherence, mean_coherence,
                                      mean_upper_bound, sample_stride, signal_share)
from horovod_gravac.controllers import GraVAC, StepObservation


def test_sample_stride_keeps_at_most_sample_max_coordinates():
    assert sample_stride(10) == 1 and sample_stride(SAMPLE_MAX) == 1
    for numel in (SAMPLE_MAX + 1, 1_438_026, 6_553_600):
        assert torch.zeros(numel)[::sample_stride(numel)].numel() <= SAMPLE_MAX


def _sums(sampler, grads, scale=1.0, key=0):
    """Feed ``grads`` through error feedback's arithmetic (g_ef = residual * scale + g, then a
    residual left behind) and return each step's cosine."""
    residual, out = None, []
    for g in grads:
        before = sampler.before(residual, g.numel())
        g_ef = (residual * scale if residual is not None else torch.zeros_like(g)) + g * scale
        out.append(coherence(*sampler.measure(key, g_ef, before, scale).tolist()))
        residual = g_ef / scale * 0.7   # what was not sent (any residual: it must cancel out)
    return out


@pytest.mark.parametrize("scale", [1.0, 1024.0])
def test_the_cosine_of_consecutive_raw_gradients_whatever_the_residual(scale):
    gen = torch.Generator().manual_seed(0)
    signal = torch.randn(200_000, generator=gen)
    grads = [signal + 0.5 * torch.randn(200_000, generator=gen) for _ in range(4)]
    got = _sums(CoherenceSampler(), grads, scale)
    assert got[0] is None   # nothing to compare on a bucket's first step
    for t in range(1, 4):
        a, b = grads[t][::sample_stride(200_000)], grads[t - 1][::sample_stride(200_000)]
        want = float(a.double().dot(b.double()) / (a.double().norm() * b.double().norm()))
        assert got[t] == pytest.approx(want, abs=1e-5)
    assert 0.75 < got[-1] < 0.85   # signal share 1 / (1 + 0.25)


def test_noise_reads_near_zero_and_signal_near_one():
    gen = torch.Generator().manual_seed(1)
    noise = _sums(CoherenceSampler(), [torch.randn(100_000, generator=gen) for _ in range(5)])
    same = torch.randn(100_000, generator=gen)
    signal = _sums(CoherenceSampler(), [same.clone() for _ in range(5)])
    assert all(abs(c) < 0.02 for c in noise[1:])
    assert all(c == pytest.approx(1.0) for c in signal[1:])


def test_a_bucket_that_changes_size_starts_again():
    sampler = CoherenceSampler()
    sampler.measure(0, torch.ones(100), None, 1.0)
    assert sampler.measure(0, torch.ones(50), None, 1.0).tolist() == [0.0, 0.0, 0.0]
    assert sampler.before(torch.ones(100), 50) is None   # a residual of another layout


def test_coherence_and_its_mean_skip_what_has_no_value():
    assert coherence(0.0, 0.0, 1.0) is None and coherence(math.nan, 1.0, 1.0) is None
    assert coherence(1.0, 4.0, 1.0) == pytest.approx(0.5)
    assert mean_coherence([None, 0.2, 0.4]) == pytest.approx(0.3) and mean_coherence([None]) is None


# -- the predictive rule set's hold -------------------------------------------------------
def _observe(ctrl, steps, coherence_value, gain=0.999):
    """Communication-bound steps (comm 1 s x 10 / CF) whose window gain would let it climb;
    ``coherence_value``: a reading, or a function of the step number."""
    sent = []
    for _ in range(steps):
        cf = ctrl.decision.send_cf
        sent.append(cf)
        at_check = ctrl.interval_ends_at(ctrl.step + 1)
        sums = dict(accumulated_sq=1.0, window_sent_sq=1.0, window_dot=math.sqrt(gain)) if at_check else {}
        value = coherence_value(ctrl.step + 1) if callable(coherence_value) else coherence_value
        ctrl.observe(StepObservation(ef_sq=1.0, min_sq=0.9, candidate_sq=0.9, step_time=0.025 + 1.0 / cf,
                                     samples=2.0, comm_time=1.0 / cf, coherence=value, **sums))
    return sent


def _gravac(world=2, **kwargs):
    ctrl = GraVAC(window=100, **kwargs)
    ctrl.set_world_size(world)
    return ctrl


def test_signal_share_of_the_averaged_gradient_and_the_coherence_where_it_is_one_half():
    assert signal_share(0.0, 8) == 0.0 and signal_share(1.0, 8) == 1.0
    assert signal_share(0.25, 1) == pytest.approx(0.25)   # one rank: its own share
    assert signal_share(0.2, 8) == pytest.approx(1.6 / 2.4)   # 8 ranks average 7/8 of the noise away
    for n in (1, 2, 3, 8, 64):
        assert hold_coherence(n) == pytest.approx(1 / (n + 1))
        assert signal_share(hold_coherence(n), n) == pytest.approx(0.5)
    assert signal_share(-0.3, 2) == 0.0 and signal_share(1.7, 2) == 1.0   # clipped readings


def test_a_signal_rich_gradient_holds_theta_min_and_a_noisy_one_climbs():
    rich = _gravac()
    assert rich.coherence_max is None and rich.needs_coherence and rich.config()["coherence_max"] is None
    assert rich.hold_threshold == pytest.approx(1 / 3)
    sent = _observe(rich, 200, coherence_value=0.4)
    assert set(sent) == {10.0}
    assert {h["move"] for h in rich.history} == {"hold"} and rich.coherence == pytest.approx(0.4)
    assert rich.signal_share == pytest.approx(0.8 / 1.4) and rich.history[-1]["signal_share"] == rich.signal_share
    assert len(rich.history) == 200 // 25   # held: checked again after a probe interval, not a window
    noisy = _gravac()
    sent = _observe(noisy, 50, coherence_value=0.05)
    assert max(sent) > 10.0 and noisy.history[0]["move"] == "up"


def test_the_hold_brings_a_climbed_cf_back_to_theta_min_and_lets_go_when_the_noise_returns():
    ctrl = _gravac()
    _observe(ctrl, 25, coherence_value=0.05)
    assert ctrl.decision.send_cf > 10.0 and not ctrl.holding
    _observe(ctrl, 25, coherence_value=0.8)   # the window's mean: (25 x 0.05 + 25 x 0.8) / 50 = 0.425
    assert ctrl.decision.send_cf == 10.0 and ctrl.history[-1]["move"] == "hold" and ctrl.holding
    sent = _observe(ctrl, 25, coherence_value=0.05)   # (25 x 0.05 + 25 x 0.8 + 25 x 0.05) / 75 = 0.3
    assert set(sent) == {10.0} and not ctrl.holding and ctrl.coherence == pytest.approx(0.3)
    # the climbed CF was sent while the cosine rose: it failed on the coherence, so the rungs
    # above theta_min wait before the released hold may climb again
    assert ctrl.history[1]["delayed_signal"] and ctrl.decision.send_cf == 10.0
    sent = _observe(ctrl, 400, coherence_value=0.05)
    assert set(sent[:370]) == {10.0} and not ctrl.holding and ctrl.decision.send_cf > 10.0


def test_a_cf_that_turns_the_gradient_mostly_signal_fails_at_once_and_is_not_climbed_back_to():
    ctrl = _gravac(theta_max=160)
    _observe(ctrl, 50, coherence_value=0.05)   # climbs at step 25, passes its trial at step 50
    high = ctrl.decision.send_cf
    assert high == 160.0 and ctrl.history[-1]["move"] == "stay" and ctrl.history[-1]["step"] == 50
    sent = _observe(ctrl, 30, coherence_value=0.6)
    # judged after a probe interval of readings (step 76), not at the window's end (step 150)
    check = ctrl.history[-1]
    assert check["step"] == 76 and check["evaluated_cf"] == high and check["delayed_signal"]
    assert check["move"] == "hold" and check["interval_coherence"] == pytest.approx(0.6)
    assert sent[:26] == [high] * 26 and set(sent[26:]) == {10.0} and high in ctrl._failures
    assert ctrl.coherence_failures == 1
    # every rung above theta_min waits remeasure_windows windows, not just the failed CF and
    # those above it: the noise returns and the hold lets go, but nothing climbs until step 477
    sent = _observe(ctrl, 300, coherence_value=0.05)
    assert not ctrl.holding and set(sent) == {10.0}
    assert all(ctrl._retry_at[cf] == 76 + 1 + 4 * 100 for cf in ctrl.rungs if cf > 10.0)
    sent = _observe(ctrl, 200, coherence_value=0.05)
    assert max(sent) > 10.0
    assert not any(h["delayed_signal"] for h in ctrl.history if h["step"] > 76)


def test_each_coherence_failure_in_the_run_doubles_the_wait_of_every_rung_above_theta_min():
    """The walk down the rungs: a model whose gradient turns mostly signal under any CF above
    theta_min fails a lower rung each time the hold lets go.  The run's count of such failures
    sets the wait, so the second failure, at a lower CF, waits twice the first's."""
    ctrl = _gravac(theta_max=160)
    _observe(ctrl, 50, coherence_value=0.05)
    _observe(ctrl, 30, coherence_value=0.6)   # 160x fails at step 76
    first = max(ctrl._retry_at.values())
    _observe(ctrl, 450, coherence_value=0.05)   # waits to step 477, then climbs
    climbed = ctrl.decision.send_cf
    assert climbed > 10.0 and ctrl.coherence_failures == 1
    _observe(ctrl, 30, coherence_value=0.6)
    check = ctrl.history[-1]
    assert check["delayed_signal"] and check["evaluated_cf"] == climbed and ctrl.coherence_failures == 2
    wait = {cf: ctrl._retry_at[cf] - (check["step"] + 1) for cf in ctrl.rungs if cf > 10.0}
    assert set(wait.values()) == {2 * 4 * 100} and first == 477
    state = ctrl.state_dict()
    copy = _gravac(theta_max=160)
    copy.load_state_dict(state)
    assert copy.coherence_failures == 2 and copy._retry_at == ctrl._retry_at
    del state["coherence_failures"]   # a checkpoint from before the count: none counted
    copy.load_state_dict(state)
    assert copy.coherence_failures == 0


def test_a_coherence_failure_leaves_a_rung_measured_lossless_free():
    """A CF that sent all it owed delays nothing, so the run-wide wait passes it by."""
    ctrl = _gravac(theta_max=160)
    _observe(ctrl, 50, coherence_value=0.05)
    ctrl.delivered_gain[20.0] = 1.0
    _observe(ctrl, 30, coherence_value=0.6)
    assert ctrl.history[-1]["delayed_signal"] and 20.0 not in ctrl._retry_at
    assert all(ctrl._retry_at[cf] > ctrl.step for cf in ctrl.rungs if cf not in (10.0, 20.0))


def test_the_wait_ends_early_once_the_rise_the_failed_cf_caused_would_stay_under_the_threshold():
    """160x raised the cosine from 0.1 at theta_min to 0.6 (a rise of 6): once theta_min's own
    cosine, over a window after the failure, reads 0.05 (0.3 with the rise), 160x and the
    rungs below it are free again; the rungs above wait on."""
    ctrl = _gravac()
    _observe(ctrl, 25, coherence_value=0.1)
    assert ctrl.decision.send_cf == 160.0
    _observe(ctrl, 25, coherence_value=0.6)   # fails at step 50
    check = ctrl.history[-1]
    assert check["step"] == 50 and check["delayed_signal"] and check["evaluated_cf"] == 160.0
    assert ctrl.signal_rise == pytest.approx(6.0) and check["signal_rise"] == ctrl.signal_rise
    until = 50 + 1 + 4 * 100
    sent = _observe(ctrl, 200, coherence_value=0.05)
    released = [h for h in ctrl.history if h.get("signal_wait_released")]
    assert [h["step"] for h in released] == [175]   # the first check with a window read after step 50
    assert set(sent[:125]) == {10.0} and max(sent) == 160.0 and ctrl.signal_rise is None
    assert all(ctrl._retry_at.get(cf, 0) <= 175 for cf in ctrl.rungs if cf <= 160.0)
    assert all(ctrl._retry_at[cf] == until for cf in ctrl.rungs if cf > 160.0)


def test_a_small_rise_keeps_the_wait_where_theta_min_itself_stays_near_the_threshold():
    """0.3 at theta_min, 0.4 under the failed CF: a rise of 4/3, so 0.28 at theta_min (0.37
    with it) releases nothing and the wait runs its course; 0.2 (0.27) would have."""
    ctrl = _gravac(theta_max=160)
    _observe(ctrl, 50, coherence_value=0.3)
    _observe(ctrl, 30, coherence_value=0.4)
    assert ctrl.history[-1]["delayed_signal"] and ctrl.signal_rise == pytest.approx(4 / 3)
    sent = _observe(ctrl, 400, coherence_value=0.28)
    assert set(sent) == {10.0} and not any(h.get("signal_wait_released") for h in ctrl.history)
    early = _gravac(theta_max=160)
    _observe(early, 50, coherence_value=0.3)
    _observe(early, 30, coherence_value=0.4)
    sent = _observe(early, 400, coherence_value=0.2)
    assert max(sent) > 10.0 and any(h.get("signal_wait_released") for h in early.history)


def test_a_rise_that_came_with_the_phase_of_training_is_read_against_theta_min_after_the_failure():
    """0.1 at theta_min before the climb, 0.5 under 160x: a rise of 5 against that reading.  But
    theta_min reads 0.45 right after the failure, so the cosine rose with training, and 160x
    raised it only 0.5 / 0.45.  Once theta_min reads 0.2 (0.22 with that rise), 160x is free
    again, where the rise of 5 would have kept the wait to its end (step 451)."""
    ctrl = _gravac()
    _observe(ctrl, 25, coherence_value=0.1)
    _observe(ctrl, 25, coherence_value=0.5)   # fails at step 50
    assert ctrl.history[-1]["delayed_signal"] and ctrl.signal_rise == pytest.approx(5.0)
    _observe(ctrl, 25, coherence_value=0.45)   # theta_min's first interval after it
    assert ctrl.history[-1]["step"] == 75 and ctrl.signal_rise == pytest.approx(0.5 / 0.45)
    sent = _observe(ctrl, 200, coherence_value=0.2)
    released = [h["step"] for h in ctrl.history if h.get("signal_wait_released")]
    assert len(released) == 1 and released[0] < 451 and max(sent) == 160.0
    # the first steps after the failure still deliver its backlog: the median reads past them
    ctrl = _gravac()
    _observe(ctrl, 25, coherence_value=0.1)
    _observe(ctrl, 25, coherence_value=0.5)
    _observe(ctrl, 5, coherence_value=0.5)
    _observe(ctrl, 20, coherence_value=0.1)
    assert ctrl.signal_rise == pytest.approx(5.0)


def test_the_upper_bound_of_a_window_mean_counts_correlated_readings_as_fewer():
    assert mean_upper_bound([0.3] * 50, 2.0) == pytest.approx(0.3)
    assert mean_upper_bound([0.3], 2.0) is None and mean_upper_bound([None, 0.2, None], 2.0) is None
    alternating = [0.2, 0.4] * 50   # anticorrelated: taken as independent
    sd = math.sqrt(sum((v - 0.3) ** 2 for v in alternating) / 99)
    assert mean_upper_bound(alternating + [None], 2.0) == pytest.approx(0.3 + 2 * sd / 10)
    blocks = ([0.2] * 10 + [0.4] * 10) * 5   # the same readings in runs of ten: far fewer independent ones
    assert mean_upper_bound(blocks, 2.0) > 0.3 + 3 * (2 * sd / 10)
    assert mean_upper_bound(blocks, 0.0) == pytest.approx(0.3)


def test_a_noisy_cosine_just_under_the_threshold_does_not_end_the_wait_early():
    """The rise read again is 1 (theta_min reads as high after the failure as the failed CF
    did), and theta_min's cosine then swings between 0.22 and 0.42: a window mean of 0.32,
    under the threshold of 1/3 by less than its standard error.  The wait runs its course.
    A cosine that swings as much around 0.2 ends it early."""
    swinging = lambda centre: (lambda step: centre + (0.1 if step % 2 else -0.1))
    for centre, releases in ((0.32, False), (0.2, True)):
        ctrl = _gravac(theta_max=160)
        _observe(ctrl, 50, coherence_value=0.3)
        _observe(ctrl, 30, coherence_value=0.4)
        assert ctrl.history[-1]["delayed_signal"]
        _observe(ctrl, 25, coherence_value=0.42)   # theta_min's first interval after the failure
        assert ctrl.signal_rise == pytest.approx(1.0)
        until = ctrl._signal_wait["until"]
        sent = _observe(ctrl, until - ctrl.step - 1, coherence_value=swinging(centre))
        released = any(h.get("signal_wait_released") for h in ctrl.history)
        assert released == releases and (max(sent) > 10.0) == releases
        if not releases:
            assert ctrl.coherence < ctrl.hold_threshold and not ctrl.holding   # not held: waiting


def test_only_the_runs_first_coherence_failure_may_end_its_wait_early():
    """After a second coherence failure the doubled wait runs its course, however low the
    cosine at theta_min reads."""
    ctrl = _gravac()
    _observe(ctrl, 25, coherence_value=0.1)
    _observe(ctrl, 25, coherence_value=0.6)   # the first failure, at step 50
    _observe(ctrl, 125, coherence_value=0.05)   # released at step 175, 160x sent again
    assert ctrl.decision.send_cf == 160.0
    _observe(ctrl, 25, coherence_value=0.6)   # the second failure, at step 200
    check = ctrl.history[-1]
    assert check["delayed_signal"] and ctrl.coherence_failures == 2 and ctrl.signal_rise is None
    until = check["step"] + 1 + 2 * 4 * 100
    sent = _observe(ctrl, 900, coherence_value=0.01)
    assert set(sent[:until - check["step"] - 1]) == {10.0} and max(sent) > 10.0
    assert [h["step"] for h in ctrl.history if h.get("signal_wait_released")] == [175]


def test_a_wait_that_may_end_early_survives_a_checkpoint():
    ctrl = _gravac()
    _observe(ctrl, 25, coherence_value=0.1)
    _observe(ctrl, 25, coherence_value=0.6)
    _observe(ctrl, 40, coherence_value=0.05)
    state = ctrl.state_dict()
    copy = _gravac()
    copy.load_state_dict(state)
    assert copy.signal_rise == ctrl.signal_rise and copy._signal_wait == ctrl._signal_wait
    a, b = _observe(ctrl, 200, coherence_value=0.05), _observe(copy, 200, coherence_value=0.05)
    assert a == b and list(ctrl.history)[-3:] == list(copy.history)[-3:] and max(a) == 160.0
    for key in ("theta_min_coherence", "signal_wait"):   # a checkpoint from before the release
        del state[key]
    old = _gravac()
    old.load_state_dict(state)
    assert set(_observe(old, 200, coherence_value=0.05)) == {10.0}   # the wait runs its course


def test_a_cf_that_leaves_the_gradient_noise_and_theta_min_itself_are_never_failed_for_it():
    ctrl = _gravac(theta_max=160)
    _observe(ctrl, 150, coherence_value=0.3)   # under 1/3: kept, checked a window apart
    assert [h["step"] for h in ctrl.history] == [25, 50, 150] and not ctrl._failures
    assert not any(h["delayed_signal"] for h in ctrl.history)
    held = _gravac()
    _observe(held, 100, coherence_value=0.9)   # theta_min held: a hold, not a failure
    assert {h["move"] for h in held.history} == {"hold"} and not held._failures


def test_a_hold_climbs_through_lossless_cfs_and_comes_back_below_the_first_lossy_one():
    """A sparse gradient whose nonzeros fit in what a CF sends loses nothing at it (window
    gain 1): the hold lets such a CF be sent, and returns below the first CF that is lossy,
    without failing it, since the gradient was mostly signal before it was sent."""
    ctrl = _gravac()
    sent = _observe(ctrl, 25, coherence_value=0.6, gain=1.0)
    assert set(sent) == {10.0} and ctrl.holding and ctrl.history[-1]["move"] == "up"
    high = ctrl.decision.send_cf
    assert high == 160.0   # the predictive rule's first move, as without a hold
    sent = _observe(ctrl, 25, coherence_value=0.6, gain=1.0)
    assert set(sent) == {high} and ctrl.holding and ctrl.decision.send_cf > high
    top = ctrl.decision.send_cf
    assert not any(h["delayed_signal"] for h in ctrl.history)
    _observe(ctrl, 25, coherence_value=0.6, gain=0.99)   # lossy at `top`: back to the highest lossless
    check = ctrl.history[-1]
    assert check["evaluated_cf"] == top and not check["delayed_signal"] and check["move"] == "down"
    assert ctrl.decision.send_cf == high and top not in ctrl._failures
    sent = _observe(ctrl, 100, coherence_value=0.6, gain=1.0)   # lossless again: never back up to `top`
    assert max(sent) < top and all(h["step"] - ctrl.history[i - 1]["step"] <= 25
                                   for i, h in enumerate(ctrl.history) if i)   # a hold's probe cadence
    sent = _observe(ctrl, 75, coherence_value=0.05, gain=0.999)   # the noise returns: released
    assert not ctrl.holding and max(sent) >= top


def test_a_lossy_cf_the_hold_did_not_send_still_fails_on_the_coherence_when_lossless_before():
    ctrl = _gravac(theta_max=160)
    _observe(ctrl, 50, coherence_value=0.05, gain=1.0)   # not holding: climbs, 160x passes
    assert ctrl.decision.send_cf == 160.0 and not ctrl.holding
    _observe(ctrl, 30, coherence_value=0.6, gain=0.99)
    check = next(h for h in ctrl.history if h["step"] == 76)
    assert check["delayed_signal"] and check["move"] == "hold" and 160.0 in ctrl._failures


def test_a_dense_gradient_never_lossless_keeps_theta_min_held():
    ctrl = _gravac()
    sent = _observe(ctrl, 200, coherence_value=0.6, gain=1.0 - 1e-6)
    assert set(sent) == {10.0} and {h["move"] for h in ctrl.history} == {"hold"}


def test_a_delayed_signal_check_survives_a_checkpoint():
    ctrl = _gravac()
    _observe(ctrl, 60, coherence_value=0.05)
    _observe(ctrl, 10, coherence_value=0.9)   # 10 of the interval's 20 readings
    copy = _gravac()
    copy.load_state_dict(ctrl.state_dict())
    a, b = _observe(ctrl, 60, coherence_value=0.9), _observe(copy, 60, coherence_value=0.9)
    assert a == b and ctrl.history[-1] == copy.history[-1] and ctrl._retry_at == copy._retry_at
    assert ctrl.coherence_failures == copy.coherence_failures == 1
    assert any(h["delayed_signal"] for h in ctrl.history)


def test_a_checkpoint_that_counted_the_retry_wait_in_checks():
    ctrl = _gravac()
    _observe(ctrl, 60, coherence_value=0.05)
    state = ctrl.state_dict()
    state["retry_at"] = {40.0: state["checks"] + 2}
    del state["retry_at_step"], state["interval_coherence"]
    copy = _gravac()
    copy.load_state_dict(state)
    assert copy._retry_at == {40.0: ctrl.step + 2 * ctrl.window} and copy._interval_coherence == []


def test_the_threshold_follows_the_world_size():
    """The same per-rank reading is mostly noise at 2 ranks and mostly signal at 8, where the
    averaged gradient keeps an eighth of one rank's noise."""
    two, eight = _gravac(world=2), _gravac(world=8)
    assert max(_observe(two, 50, coherence_value=0.2)) > 10.0 and not two.holding
    assert set(_observe(eight, 50, coherence_value=0.2)) == {10.0} and eight.holding
    assert eight.signal_share == pytest.approx(1.6 / 2.4)
    fixed = _gravac(world=8, coherence_max=0.25)   # a threshold set by hand does not move
    assert fixed.hold_threshold == 0.25 and max(_observe(fixed, 50, coherence_value=0.2)) > 10.0


def test_no_coherence_measured_does_not_hold_and_coherence_max_1_turns_the_hold_off():
    ctrl = _gravac()
    assert max(_observe(ctrl, 50, coherence_value=None)) > 10.0
    off = _gravac(coherence_max=1.0)
    assert not off.needs_coherence and max(_observe(off, 50, coherence_value=0.9)) > 10.0


@pytest.mark.parametrize("bad", [0, -0.1, 1.5, math.nan, True, "0.2"])
def test_a_bad_coherence_max_is_refused(bad):
    with pytest.raises(ValueError, match="coherence_max"):
        GraVAC(coherence_max=bad)


def test_the_hold_survives_a_checkpoint():
    ctrl = _gravac()
    _observe(ctrl, 10, coherence_value=0.9)
    copy = _gravac()
    copy.load_state_dict(ctrl.state_dict())
    _observe(ctrl, 15, coherence_value=0.0)
    _observe(copy, 15, coherence_value=0.0)
    # the window's mean (10 x 0.9 + 15 x 0) / 25 = 0.36 keeps both held at 2 ranks
    assert ctrl.history[-1]["move"] == copy.history[-1]["move"] == "hold"
    assert ctrl.coherence == copy.coherence == pytest.approx(0.36)


@pytest.mark.parametrize("variant,accepted", [("ladder", True), ("paper", True), ("predictive", False)])
def test_a_checkpoint_from_before_coherence_max(variant, accepted):
    """A state written before ``coherence_max`` existed: the rule sets that do not read it
    resume as before; "predictive", which held nothing then, is told that it differs."""
    from horovod_gravac.checkpoint import CheckpointError, check_compatible, describe
    now = GraVAC(variant=variant).config()
    before = {k: v for k, v in now.items() if k != "coherence_max"}
    meta = lambda config: describe(config, "TopK", 2, 0, [("w", (3,), "torch.float32")])   # noqa: E731
    if accepted:
        check_compatible(meta(before), meta(now))
    else:
        with pytest.raises(CheckpointError, match="coherence_max"):
            check_compatible(meta(before), meta(now))
        check_compatible(meta(before), meta(GraVAC(variant=variant, coherence_max=1.0).config()))


def test_the_samples_survive_a_checkpoint_and_a_resumed_step_reads_the_same_coherence():
    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(100_000, generator=gen) for _ in range(2)]
    first = CoherenceSampler()
    first.measure("a|b", grads[0], None, 1.0)
    resumed = CoherenceSampler()
    resumed.load_state_dict(first.state_dict())
    assert torch.equal(resumed.measure("a|b", grads[1], None, 1.0), first.measure("a|b", grads[1], None, 1.0))
    fresh = CoherenceSampler()
    fresh.load_state_dict({})   # a state written before the samples were saved
    assert fresh.measure("a|b", grads[1], None, 1.0).tolist() == [0.0, 0.0, 0.0]


def test_retarget_drops_this_ranks_samples():
    from horovod_gravac.checkpoint import retarget
    state = {"residuals": {}, "residual_crc32": {}, "coherence_samples": {"w": torch.ones(3)}, "meta": None,
             "controller": None, "step": 0}
    assert retarget(state, rank=1)["coherence_samples"] == {}
