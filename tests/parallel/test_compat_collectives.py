"""Drop-in checks prone to hangs, on 2 ranks and some on 3 (launched by
tests/integration/test_horovod_compat.py; one also under MPI): user collectives between and during
steps, broadcast_optimizer_state on a fresh optimizer, the resume recipe, hvd.join() with
uneven data.
"""
import os
import tempfile

import pytest
import torch

import horovod.torch as hvd
import horovod_gravac as hg

from compat_helpers import (BITWISE, RANK, SIZE, StepTimedGraVAC, assert_ranks_identical, assert_same, flat,
                           hg_opt, hvd_opt, loss_of, make, rank0_restores, record_failure, release, sgd, train)

pytestmark = pytest.mark.sizes(2)


# User collectives between steps: no hang
def _user_ops(step, loss):
    t = loss.detach().reshape(1)
    ops = [("allreduce", lambda: hvd.allreduce(t)),
           ("allgather", lambda: hvd.allgather(t)),
           ("broadcast", lambda: hvd.broadcast(t, root_rank=0)),
           ("barrier", lambda: hvd.barrier()),
           ("allreduce_sum", lambda: hvd.allreduce(t * 2, op=hvd.Sum)),
           ("join", lambda: hvd.join()),
           ("allgather_object", lambda: hvd.allgather_object(step)),
           ("broadcast_object", lambda: hvd.broadcast_object({"s": step}, root_rank=0))]
    k = step % len(ops)
    return ops[k:] + ops[:k] if step % 2 == 0 else list(reversed(ops[k:] + ops[:k]))


def _train_with_user_collectives(model, opt, steps):
    for step in range(steps):
        opt.zero_grad()
        loss = loss_of(model, step)
        hvd.allreduce(loss.detach())                       # unnamed, before backward
        loss.backward()
        hvd.allgather(loss.detach().reshape(1))            # unnamed, while gradients are in flight
        opt.step()
        for _, op in _user_ops(step, loss)[: 2 + step % 4]:
            op()                                           # unnamed, between steps, varying order
        avg = hvd.allreduce(loss.detach(), name="metric.loss")   # named metric, as in the examples
        assert torch.isfinite(avg)


@pytest.mark.sizes(2, 3)
def test_no_hang_user_collectives():
    model = make()
    _train_with_user_collectives(model, hvd_opt(model), 8)    # control: Horovod itself
    for name, ctrl in (("GraVAC", hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3)),
                       ("Accordion", hg.Accordion(low_cf=4, high_cf=64, threshold=0.5, interval=3)),
                       ("StaticCF(10)", hg.StaticCF(10)), ("Dense", hg.Dense())):
        model = make()
        opt = hg_opt(model, controller=ctrl)
        _train_with_user_collectives(model, opt, 12)
        assert_ranks_identical(flat(model), f"user collectives + {name}")
        release(opt)


def test_no_hang_two_gravac_optimizers_and_user_collectives():
    a, b = make(seed=1), make(seed=2)
    oa = hg_opt(a, controller=hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3))
    ob = hg_opt(b, controller=hg.Accordion(low_cf=4, high_cf=64, threshold=0.5, interval=3))
    for step in range(8):
        for model, opt in ((a, oa), (b, ob)):
            opt.zero_grad()
            loss = loss_of(model, step)
            loss.backward()
            opt.step()
            hvd.allreduce(loss.detach())
    assert_ranks_identical(flat(a), "two optimizers a")
    assert_ranks_identical(flat(b), "two optimizers b")
    release(oa); release(ob)


# ---------------------------------------------------------------------------------------------
# broadcast_optimizer_state / resume recipe
# Two runs are compared bitwise, so GraVAC gets a constant step time (measured ones differ between
# runs, and its throughput rules, Algorithm 1's stop rule too, would then decide differently now
# and then); "paper" climbs a rung per window, so short runs send several CFs.
def _controllers():
    return {"GraVAC": lambda: StepTimedGraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3, variant="paper"),
            "Accordion": lambda: hg.Accordion(low_cf=4, high_cf=64, threshold=0.5, interval=3),
            "StaticCF(10)": lambda: hg.StaticCF(10),
            "Dense": lambda: hg.Dense()}


@pytest.mark.sizes(2, 3)
def test_broadcast_optimizer_state_fresh_does_not_step():
    failures = []
    for name, ctrl_fn in _controllers().items():
        try:
            runs = []
            for do_broadcast in (False, True):
                model = make()
                ctrl = ctrl_fn()
                opt = hg_opt(model, controller=ctrl)
                if do_broadcast:
                    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
                    hvd.broadcast_optimizer_state(opt, root_rank=0)
                    stats = getattr(opt, "stats", {}) or {}
                    live = getattr(opt, "controller", None) or ctrl
                    assert not stats or live.step == 0, \
                        f"broadcast_optimizer_state advanced the optimizer: controller step {live.step}, stats {stats}"
                    for p in model.parameters():
                        assert p.grad is None or not torch.any(p.grad), "broadcast left a nonzero gradient"
                seen = []
                for step in range(7):
                    train(model, opt, 1, first=step)
                    seen.append((opt.stats.get("cf"), opt.stats.get("level")))
                runs.append((flat(model), seen))
                release(opt)
            (p0, s0), (p1, s1) = runs
            assert s0 == s1, f"(cf, level) per step without broadcast {s0} != with broadcast {s1}"
            # bitwise on 2 ranks; on 3+, two runs may fuse tensors differently (ring sum order)
            ok = torch.equal(p0, p1) if BITWISE else torch.allclose(p0, p1, rtol=0, atol=1e-6)
            assert ok, f"parameters differ after a broadcast_optimizer_state on a fresh optimizer " \
                       f"by {(p0 - p1).abs().max():.3e} ({'bitwise' if BITWISE else 'atol 1e-6'} required)"
            assert_ranks_identical(p1, f"broadcast_optimizer_state + {name}")
        except Exception as exc:
            record_failure(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


def _shared_tmpdir():
    path = tempfile.mkdtemp(prefix="hg_compat_") if RANK == 0 else None
    return hvd.broadcast_object(path, root_rank=0, name="compat.tmpdir")


def _save(path, model, opt):
    """Rank 0 writes the checkpoint the others will read (after the barrier)."""
    if RANK == 0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    hvd.barrier()


def _load(path):
    ckpt = torch.load(path, weights_only=False)
    return ckpt["model"], ckpt["optimizer"]


def _resume(make_opt, label):
    path = os.path.join(_shared_tmpdir(), "checkpoint.pt")
    model = make()
    opt = make_opt(model)
    train(model, opt, 5)
    _save(path, model, opt)
    release(opt)
    # fresh model and optimizer on every rank; only rank 0 restores
    model2 = make(seed=99)
    opt2 = make_opt(model2)
    rank0_restores(model2, opt2, lambda: _load(path))
    assert torch.equal(flat(model2), flat(model)), f"{label}: the restored model differs from the saved one"
    train(model2, opt2, 6, first=5)
    assert_ranks_identical(flat(model2), f"resume recipe {label}")
    release(opt2)


@pytest.mark.sizes(2, 3)
def test_resume_recipe():
    _resume(lambda m: hvd_opt(m), "hvd (control)")
    failures = []
    for name, ctrl_fn in _controllers().items():
        try:
            _resume(lambda m: hg_opt(m, controller=ctrl_fn()), name)
        except Exception as exc:
            record_failure(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))



def test_switch_from_hvd_checkpoint():
    """Adopting horovod_gravac mid-training: a checkpoint written with hvd.DistributedOptimizer
    is resumed with hg.DistributedOptimizer by Horovod's recipe (rank 0 loads, then both
    broadcasts), and the other way round.  Every controller trains on with ranks identical;
    Dense continues exactly as Horovod's own optimizer continues."""
    path = os.path.join(_shared_tmpdir(), "hvd_checkpoint.pt")
    model = make()
    opt = hvd_opt(model)
    train(model, opt, 4)
    _save(path, model, opt)
    train(model, opt, 3, first=4)   # Horovod's own continuation: the reference for Dense
    failures = []
    for name, ctrl_fn in _controllers().items():
        try:
            resumed = make(seed=99)
            ours = hg_opt(resumed, controller=ctrl_fn())
            rank0_restores(resumed, ours, lambda: _load(path))
            train(resumed, ours, 3, first=4)
            assert_ranks_identical(flat(resumed), f"hvd checkpoint resumed with {name}")
            if name == "Dense":
                assert_same(flat(model), flat(resumed), "Dense from hvd's checkpoint against hvd's own continuation")
            # and back: our checkpoint into Horovod's optimizer
            state = ours.state_dict()
            release(ours)
            back = make(seed=98)
            theirs = hvd_opt(back)
            rank0_restores(back, theirs, lambda: (resumed.state_dict(), state))
            train(back, theirs, 2, first=7)
            assert_ranks_identical(flat(back), f"{name}'s checkpoint resumed with hvd.DistributedOptimizer")
        except Exception as exc:
            record_failure(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))

# ---------------------------------------------------------------------------------------------
# hvd.join() with uneven data (last: if Horovod shuts down on a join failure, the
# tests after it cannot run)
def _uneven(model, opt):
    for step in range(3 + RANK):
        train(model, opt, 1, first=step)
    last = hvd.join()
    # Horovod's recipe after uneven data: take the parameters of the rank that joined last
    # (plain SGD, so there is no optimizer state that could differ).
    hvd.broadcast_parameters(model.state_dict(), root_rank=last)
    return last


def _join_ref():
    model = make()
    last = _uneven(model, hvd_opt(model, sgd(model, momentum=0.0)))     # control: Horovod
    return model, last


def test_join_uneven_dense_matches_hvd():
    """Horovod's semantics of a step that some ranks joined out of: the joined ranks
    contribute zeros.  Dense must give Horovod's parameters."""
    ref, _ = _join_ref()
    model = make()
    opt = hg_opt(model, sgd(model, momentum=0.0), controller=hg.Dense())
    _uneven(model, opt)
    assert_same(flat(ref), flat(model), "join + Dense")
    release(opt)


@pytest.mark.sizes(2, 3)
def test_join_uneven_data():
    """Rank r trains 3 + r steps, then hvd.join(); then all train 2 steps together."""
    _, last_ref = _join_ref()
    failures = []
    for name, ctrl_fn in (("Dense", hg.Dense), ("StaticCF(10)", lambda: hg.StaticCF(10)),
                          ("GraVAC", lambda: hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=2))):
        try:
            model = make()
            # Horovod's join allows allreduce only: compressed steps need join_safe=True
            # (Dense runs as in Horovod either way).
            opt = hg_opt(model, sgd(model, momentum=0.0), controller=ctrl_fn(), join_safe=name != "Dense")
            last = _uneven(model, opt)
            assert last == last_ref == SIZE - 1, f"hvd.join() returned {last}, Horovod's run {last_ref}"
            assert_ranks_identical(flat(model), f"join + {name} (after broadcast from the last rank)")
            train(model, opt, 2, first=50)
            assert_ranks_identical(flat(model), f"join + {name} + 2 more steps")
            release(opt)
        except Exception as exc:
            record_failure(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))
