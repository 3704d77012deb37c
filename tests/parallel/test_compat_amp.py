"""Drop-in checks on 2 ranks (launched by tests/integration/test_horovod_compat.py): Horovod's
GradScaler recipe for mixed precision.
"""
import pytest
import torch

import horovod.torch as hvd
import horovod_gravac as hg

from compat_helpers import (RANK, SIZE, StepTimedGraVAC, assert_ranks_identical, assert_same, flat, hg_opt,
                           hvd_opt, loss_of, make, record_failure, release)

pytestmark = [pytest.mark.sizes(2),
              # (torch < 2.3 has no device-generic GradScaler, and none on the CPU these tests run on)
              pytest.mark.skipif(not hasattr(torch.amp, "GradScaler"), reason="no torch.amp.GradScaler")]


def _amp_train(model, opt, steps, scaler, blowup_step=None, blowup_rank=1, recipe=True, first=0):
    scales = []
    for step in range(first, first + steps):
        opt.zero_grad()
        loss = loss_of(model, step)
        if step == blowup_step and RANK == blowup_rank % SIZE:
            loss = loss * 1e38
        scaler.scale(loss).backward()
        if recipe:
            opt.synchronize()
            scaler.unscale_(opt)
            with opt.skip_synchronize():
                scaler.step(opt)
        else:
            scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def _scaler(init=2.0 ** 100, growth_interval=2):
    return torch.amp.GradScaler("cpu", init_scale=init, growth_interval=growth_interval)


def test_amp_overflow_on_one_rank_dense_matches_hvd():
    a, b = make(), make()
    s_ref = _amp_train(a, hvd_opt(a), 8, _scaler(), blowup_step=3)
    ours = hg_opt(b, controller=hg.Dense())
    s_hg = _amp_train(b, ours, 8, _scaler(), blowup_step=3)
    assert s_ref[3] < s_ref[2], f"control: Horovod's scaler did not back off: {s_ref}"
    everyone = hvd.allgather_object(s_hg)
    assert all(s == everyone[0] for s in everyone), f"GradScaler scales differ across ranks: {everyone}"
    assert s_hg == s_ref, f"scale sequence {s_hg} != Horovod's {s_ref}"
    assert_same(flat(a), flat(b), "GradScaler recipe + Dense (overflow on rank 1 at step 3)")
    assert_ranks_identical(flat(b), "GradScaler recipe + Dense")
    release(ours)


def test_amp_natural_overflow_dense_matches_hvd():
    a, b = make(), make()
    s_ref = _amp_train(a, hvd_opt(a), 6, _scaler(init=2.0 ** 127, growth_interval=1))
    ours = hg_opt(b, controller=hg.Dense())
    s_hg = _amp_train(b, ours, 6, _scaler(init=2.0 ** 127, growth_interval=1))
    everyone = hvd.allgather_object(s_hg)
    assert all(s == everyone[0] for s in everyone), f"GradScaler scales differ across ranks: {everyone}"
    assert s_hg == s_ref, f"scale sequence {s_hg} != Horovod's {s_ref}"
    assert_same(flat(a), flat(b), "GradScaler(init 2**127) + Dense")


def test_amp_overflow_on_one_rank_compressed_every_rank_skips():
    failures = []
    for name, ctrl_fn in (("StaticCF(10)", lambda: hg.StaticCF(10)),
                          ("GraVAC", lambda: hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3)),
                          ("Accordion", lambda: hg.Accordion(low_cf=4, high_cf=64, threshold=0.5, interval=3))):
        try:
            model = make()
            scaler = _scaler()
            opt = hg_opt(model, controller=ctrl_fn(), grad_scaler=scaler)
            before = None
            scales = []
            for step in range(7):
                if step == 3:
                    before = flat(model).clone()
                scales += _amp_train(model, opt, 1, scaler, blowup_step=3, first=step)
                if step == 3:
                    assert torch.equal(before, flat(model)), f"{name}: the overflow step changed parameters"
            assert scales[3] < scales[2], f"{name}: the scaler did not back off on the overflow step: {scales}"
            everyone = hvd.allgather_object(scales)
            assert all(s == everyone[0] for s in everyone), f"{name}: scales differ across ranks {everyone}"
            assert torch.isfinite(flat(model)).all(), f"{name}: parameters not finite"
            assert_ranks_identical(flat(model), f"GradScaler + {name}")
            release(opt)
        except Exception as exc:
            record_failure(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


def test_amp_grad_scaler_scale_invariant_compressed():
    """With grad_scaler=scaler, a scale changing by powers of two gives bitwise the
    parameters of a constant scale (error feedback kept in unscaled units)."""
    failures = []
    # The two runs are compared bitwise, so GraVAC gets a constant step time: measured ones differ
    # between runs, and its throughput rules (Algorithm 1's stop rule too) would then decide
    # differently now and then.  "paper" climbs a rung per window, so 8 steps send several CFs.
    for name, ctrl_fn in (("StaticCF(10)", lambda: hg.StaticCF(10)),
                          ("GraVAC", lambda: StepTimedGraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3,
                                                             variant="paper"))):
        try:
            results = []
            for growth_interval in (1, 10 ** 9):          # doubles every step / constant
                model = make()
                scaler = _scaler(init=2.0 ** 8, growth_interval=growth_interval)
                opt = hg_opt(model, controller=ctrl_fn(), grad_scaler=scaler)
                scales = _amp_train(model, opt, 8, scaler)
                results.append((flat(model), scales))
                release(opt)
            (p_var, s_var), (p_const, s_const) = results
            assert len(set(s_var)) > 3 and len(set(s_const)) == 1, (s_var, s_const)
            assert torch.equal(p_var, p_const), \
                f"{name}: growing scale {s_var[:4]}... differs from constant scale by {(p_var - p_const).abs().max():.3e}"
            assert_ranks_identical(p_var, f"grad_scaler + {name}")
        except Exception as exc:
            record_failure(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))
