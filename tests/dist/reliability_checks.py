"""Reliability checks run on every rank under horovodrun (see tests/test_reliability.py).

Usage: python reliability_checks.py CHECK [ARG ...]

- ``all``: every check in ``CHECKS`` (each raises on failure; rank 0 prints ``PASS <name>``).
- ``ckpt_reference DIR`` / ``ckpt_resume DIR``: checkpoint/resume across two separate jobs.
- ``fault_<kind> TIMEOUT``: rank 1 dies or stalls; rank 0 prints ``FAILED_AFTER <s> <error>``
  and the job fails (the pytest side checks the error and the time).
"""
import dataclasses
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch

import horovod.torch as hvd
import horovod_gravac as hg
from horovod_gravac import comm, compressors
from horovod_gravac.compressors import RandomKCompressor, TopKCompressor, kept_count
from horovod_gravac.elastic import TorchState

hvd.init()
torch.set_num_threads(1)
RANK, SIZE = hvd.rank(), hvd.size()


def say(msg):
    if RANK == 0:
        print(msg, flush=True)


def make_model(seed=0, out=5):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, out))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


def batch(step, rank=None):
    g = torch.Generator().manual_seed(1000 * step + (RANK if rank is None else rank))
    return torch.randn(24, 32, generator=g), torch.randint(0, 5, (24,), generator=g)


def train_steps(model, opt, steps, start=0):
    for step in range(start, start + steps):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return opt


def flat_params(model):
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def assert_identical_across_ranks(tensor, what):
    everyone = hvd.allgather(tensor.unsqueeze(0), name=f"rel.{what}")
    for r in range(SIZE):
        if not torch.equal(everyone[r], everyone[0]):
            raise AssertionError(f"{what}: rank {r} differs from rank 0 by "
                                 f"{(everyone[r] - everyone[0]).abs().max().item():.3e}")


def hg_opt(model, **kw):
    kw.setdefault("bucket_cap_mb", 0.01)   # several buckets even for a small model
    return hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(), **kw)


def release(opt):
    for h in opt._hooks:
        h.remove()


class StepTimedGraVAC(hg.GraVAC):
    """GraVAC fed a constant step time (1 s): throughput is then N * gain, so every
    decision depends on gradients only and a resumed run can be compared bit for bit
    with an uninterrupted one.  (Real GraVAC measures step times, which differ
    between any two runs.)"""

    def observe(self, obs):
        return super().observe(dataclasses.replace(obs, step_time=1.0))


# ------------------------------------------------------------------ item 2: non-finite
def _poison_hook(value, when_step, ranks):
    state = {"step": -1}

    def hook(grad):
        if state["step"] == when_step and RANK in ranks:
            grad = grad.clone()
            grad.view(-1)[0] = value
        return grad
    return state, hook


def _nonfinite_run(value, ranks, controller):
    """nonfinite="zero": the poisoned rank contributes zeros, training goes on."""
    model = make_model()
    first = next(model.parameters())
    state, hook = _poison_hook(value, 4, ranks)
    handle = first.register_hook(hook)   # runs before accumulation, so the optimizer sees it
    opt = hg_opt(model, controller=controller, nonfinite="zero")
    gains = []
    for step in range(8):
        state["step"] = step
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        ctrl = opt.controller   # through the optimizer: waits for the exchange in flight
        gains.append((getattr(ctrl, "gain_min", None), getattr(ctrl, "gain_candidate", None)))
        if step == 4:
            flagged = hvd.allgather_object(opt.stats["nonfinite_buckets"], name=f"flag.{value}.{len(ranks)}")
            for r in range(SIZE):
                assert (flagged[r] > 0) == (r in ranks), f"nonfinite_buckets per rank {flagged}"
    handle.remove()
    for res in opt._memory.residuals.values():
        assert torch.isfinite(res).all(), "a residual was poisoned"
    assert torch.isfinite(flat_params(model)).all(), "parameters became non-finite"
    if isinstance(controller, hg.GraVAC):
        assert gains[4] == gains[3], f"gains changed in the non-finite step: {gains[3]} -> {gains[4]}"
        assert all(g is None or math.isfinite(g) for pair in gains for g in pair), gains   # None: reset at a window
    assert_identical_across_ranks(flat_params(model), f"nonfinite.{value}.{len(ranks)}")
    release(opt)


def check_inf_gradient_on_one_rank():
    for ctrl in (hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3), hg.StaticCF(10)):
        _nonfinite_run(float("inf"), {SIZE - 1}, ctrl)
        _nonfinite_run(float("-inf"), {0}, ctrl)


def check_nonfinite_propagates_to_every_rank():
    """Default policy, as Horovod: a NaN/Inf on one rank reaches every rank's gradient
    (so a loss scaler skips the step everywhere); residuals and controller stay finite."""
    for ctrl in (hg.Dense(), hg.StaticCF(10), hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3),
                 hg.Accordion(2, 16, 0.5, 2)):
        model = make_model()
        first = next(model.parameters())
        state, hook = _poison_hook(float("inf"), 3, {SIZE - 1})
        handle = first.register_hook(hook)
        opt = hg_opt(model, controller=ctrl)
        for step in range(6):
            state["step"] = step
            x, y = batch(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.synchronize()
            bad = not all(torch.isfinite(p.grad).all() for p in model.parameters())
            seen = hvd.allgather_object(bad, name=f"propagate.{type(ctrl).__name__}.{step}")
            assert seen == [step == 3] * SIZE, f"{ctrl}: step {step} non-finite per rank {seen}"
            if bad:   # skip the step, as GradScaler does
                continue
            with opt.skip_synchronize():
                opt.step()
        handle.remove()
        for res in opt._memory.residuals.values():
            assert torch.isfinite(res).all(), f"{ctrl}: a residual was poisoned"
        assert torch.isfinite(flat_params(model)).all()
        assert_identical_across_ranks(flat_params(model), f"propagate.{type(ctrl).__name__}")
        release(opt)


def check_nan_gradient_on_all_ranks():
    for ctrl in (hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3), hg.Dense()):
        _nonfinite_run(float("nan"), set(range(SIZE)), ctrl)


# ------------------------------------------------------------------ item 3: consistency
def _expect_failure_everywhere(build, key):
    try:
        build()
        outcome = None
    except ValueError as exc:
        outcome = str(exc)
    everyone = hvd.allgather_object(outcome, name=f"outcome.{key}")
    failed = [o is not None for o in everyone]
    assert all(failed), f"mismatch in {key!r} not detected on ranks {[r for r, f in enumerate(failed) if not f]}"
    assert all(f"'{key}'" in o and "differs from rank 0" in o for o in everyone), everyone


def check_mismatch_parameter_shape():
    model = _unbroadcast_model(out=5 if RANK == 0 else 6)   # no broadcast: shapes differ
    _expect_failure_everywhere(lambda: hg_opt(model, controller=hg.StaticCF(10)), "parameters")


def _unbroadcast_model(out):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, out))


def check_mismatch_parameter_names():
    model = make_model()
    named = list(model.named_parameters())
    if RANK == SIZE - 1:
        named = [("renamed." + n, p) for n, p in named]
    _expect_failure_everywhere(
        lambda: hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        named_parameters=named, controller=hg.StaticCF(10)), "parameters")


def check_mismatch_compressor():
    model = make_model()
    comp = TopKCompressor if RANK == 0 else RandomKCompressor
    _expect_failure_everywhere(lambda: hg_opt(model, controller=hg.StaticCF(10), compressor=comp), "compressor")


def check_mismatch_gravac_settings():
    model = make_model()
    ctrl = hg.GraVAC(theta_min=10, theta_max=1000, epsilon=0.7 if RANK == 0 else 0.9)
    _expect_failure_everywhere(lambda: hg_opt(model, controller=ctrl), "controller")


def check_mismatch_backward_passes():
    model = make_model()
    _expect_failure_everywhere(lambda: hg_opt(model, controller=hg.StaticCF(10),
                                              backward_passes_per_step=1 + (RANK == 1)),
                               "backward_passes_per_step")


def check_mismatch_bucket_cap_mb():
    """A rank-dependent bucket_cap_mb cuts different buckets; it must not pass the
    start-up check (when it did, one rank later failed with an IndexError)."""
    model = make_model()
    cap = 0.01 if RANK == 0 else 64.0   # several buckets on rank 0, one elsewhere
    _expect_failure_everywhere(lambda: hg_opt(model, controller=hg.StaticCF(10), bucket_cap_mb=cap),
                               "bucket_cap_mb")


def check_mismatch_randomk_seed():
    """Ranks whose Random-k seeds differ pick different indices; with shared indices
    the values are summed position-blind, so this must be detected at start-up."""
    model = make_model()
    comp = RandomKCompressor(cf=10, seed=1 + RANK)
    _expect_failure_everywhere(lambda: hg_opt(model, controller=hg.StaticCF(10), compressor=comp), "compressor")


# ------------------------------------------------------------------ item 1: odd tensors
class OddModel(torch.nn.Module):
    """Tiny, empty, scalar, non-contiguous, fp16 and bf16 parameters in one model."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.w = torch.nn.Parameter(torch.randn(8, 6).t())            # (6, 8), non-contiguous
        self.tiny = torch.nn.Parameter(torch.randn(1))
        self.scalar = torch.nn.Parameter(torch.tensor(0.5))
        self.empty = torch.nn.Parameter(torch.randn(0))
        self.h = torch.nn.Parameter(torch.randn(8, 40, dtype=torch.float16))
        self.b = torch.nn.Parameter(torch.randn(40, dtype=torch.bfloat16))
        self.out = torch.nn.Parameter(torch.randn(40, 3) * 0.1)

    def forward(self, x):
        y = torch.tanh(x @ self.w) * self.tiny + self.scalar + self.empty.sum()
        z = (y.half() @ self.h).float() + self.b.float()
        return torch.tanh(z) @ self.out


def _odd_grads(model, step):
    g = torch.Generator().manual_seed(77 + 1000 * step + RANK)
    x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
    return torch.nn.functional.cross_entropy(model(x), y)


def check_odd_tensors():
    assert not OddModel().w.is_contiguous()
    # One bucket per parameter: the tiny (numel 1 < CF) and empty buckets are sent alone.
    for ctrl, cf in ((hg.Dense(), None), (hg.StaticCF(100), 100.0), (hg.StaticCF(4), 4.0)):
        model, probe = OddModel(), OddModel()
        opt = hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                      named_parameters=model.named_parameters(), controller=ctrl,
                                      bucket_cap_mb=1e-6)
        assert len(opt._buckets) == 7, [b.names for b in opt._buckets]
        # By hand: each rank's fp32 gradient, compressed alone (first step: no residual).
        probe.zero_grad()
        _odd_grads(probe, 0).backward()
        expected = {}
        for name, p in probe.named_parameters():
            g = p.grad.float().reshape(-1) if p.grad is not None else torch.zeros(p.numel())
            if cf is not None and g.numel():
                comp = TopKCompressor(cf=cf)
                payload, ctx = comp.compress(g)
                g = comp.decompress(payload, ctx)
                assert payload.values.numel() == kept_count(g.numel(), cf) >= 1
            everyone = hvd.allgather(g.unsqueeze(0), name=f"odd.{name}.{cf}")
            expected[name] = (everyone.sum(0) / SIZE).to(p.dtype).view(p.shape)
        opt.zero_grad()
        _odd_grads(model, 0).backward()
        opt.synchronize()
        for name, p in model.named_parameters():
            assert p.grad is not None and p.grad.dtype == p.dtype and p.grad.shape == p.shape, name
            err = (p.grad.float() - expected[name].float()).abs().max().item() if p.numel() else 0.0
            assert err <= 1e-6, f"{type(ctrl).__name__}: gradient of {name} differs from the hand average by {err}"
        with opt.skip_synchronize():
            opt.step()
        for step in range(1, 6):
            opt.zero_grad()
            _odd_grads(model, step).backward()
            opt.step()
        flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
        assert torch.isfinite(flat).all()
        assert_identical_across_ranks(flat, f"odd.{cf}")
        release(opt)
    # GraVAC across CFs on the same odd model.
    model = OddModel()
    ctrl = hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.2, window=2, policy="geometric")
    opt = hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(), controller=ctrl,
                                  bucket_cap_mb=1e-6)
    cfs = []
    for step in range(12):
        opt.zero_grad()
        _odd_grads(model, step).backward()
        opt.step()
        cfs.append(opt.stats["cf"])
    assert len(set(cfs)) >= 2, cfs
    assert_identical_across_ranks(torch.cat([p.detach().float().reshape(-1) for p in model.parameters()]),
                                  "odd.gravac")
    release(opt)


# ------------------------------------------------------------------ item 4: normal use
def check_bounded_waits_in_normal_training():
    for timeout in (30.0, math.inf):
        model = make_model()
        opt = hg_opt(model, timeout_s=timeout,
                     controller=hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3))
        assert opt._timeout == timeout
        train_steps(model, opt, 8)
        assert_identical_across_ranks(flat_params(model), f"bounded.{timeout}")
        release(opt)


# ------------------------------------------------------------------ item 5: checkpoints
N_STEPS, M_STEPS = 7, 6


def _ckpt_configs():
    configs = {
        "static_topk": lambda: dict(controller=hg.StaticCF(20), compressor=TopKCompressor),
        "gravac_topk": lambda: dict(controller=StepTimedGraVAC(theta_min=2, theta_max=256, epsilon=0.2,
                                                               window=3, policy="geometric")),
        "static_randomk": lambda: dict(controller=hg.StaticCF(10), compressor=RandomKCompressor(cf=10, seed=5)),
        "gravac_randomk": lambda: dict(controller=StepTimedGraVAC(theta_min=1.5, theta_max=100, epsilon=0.2,
                                                                  window=3, policy="geometric"),
                                       compressor=RandomKCompressor(cf=2, seed=7)),
        # saved mid-interval (interval 3, checkpoint after step 7): the running sum matters
        "accordion": lambda: dict(controller=hg.Accordion(low_cf=4, high_cf=64, threshold=0.3, interval=3)),
    }
    extra = {"PowerSGDCompressor": ("powersgd_static", lambda c: dict(controller=hg.StaticCF(4), compressor=c)),
             "SIDCoCompressor": ("sidco_static", lambda c: dict(controller=hg.StaticCF(20), compressor=c)),
             "DGCCompressor": ("dgc_static", lambda c: dict(controller=hg.StaticCF(20), compressor=c)),
             "RedSyncCompressor": ("redsync_static", lambda c: dict(controller=hg.StaticCF(20), compressor=c))}
    if hasattr(compressors, "DGCCompressor"):
        dgc = compressors.DGCCompressor
        extra["DGCCompressor-sampled"] = (   # a sample smaller than the bucket: the generator matters
            "dgc_sampled", lambda c: dict(controller=hg.StaticCF(20), bucket_cap_mb=64, compressor=lambda cf: dgc(
                cf=cf, sample_ratio=0.05, min_sample_hits=10)))   # 6.8k entries, sample of 4096
        extra["RedSyncCompressor-sampled"] = (
            "redsync_sampled", lambda c: dict(controller=hg.StaticCF(20), bucket_cap_mb=64, compressor=lambda cf: c(
                cf=cf, sample_ratio=0.05, min_sample_hits=10)))
        extra["DGCCompressor-momentum"] = (
            "dgc_momentum", lambda c: dict(controller=hg.StaticCF(20), compressor=dgc, momentum_correction=0.9))
    for cls_name, (cfg, make) in extra.items():
        if hasattr(compressors, cls_name.split("-")[0]):
            configs[cfg] = (lambda make=make, c=getattr(compressors, cls_name.split("-")[0]): make(c))
    return configs


# Known resume gaps, in code these checks do not own: the check prints GAP while the resumed
# run differs and fails once it is identical, so the entry gets removed then.
KNOWN_RESUME_GAPS = {}


def _ckpt_path(root, cfg, what):
    return Path(root) / f"{cfg}.{what}.rank{RANK}.pt"


def check_ckpt_reference(root):
    """Uninterrupted N+M steps; the checkpoint at N is saved on the way (each rank its own
    file: residuals differ per rank)."""
    for cfg, make in _ckpt_configs().items():
        model = make_model()
        opt = hg_opt(model, **make())
        cfs = []
        for step in range(N_STEPS + M_STEPS):
            if step == N_STEPS:
                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()},
                           _ckpt_path(root, cfg, "ckpt"))
            train_steps(model, opt, 1, start=step)
            cfs.append(opt.stats["cf"])
        if cfg.startswith("gravac"):
            assert len(set(cfs)) >= 3, f"{cfg}: the CF should move for a meaningful test: {cfs}"
        assert opt.residual_bytes() > 0
        torch.save({"params": flat_params(model), "cfs": cfs,
                    "controller": opt.controller.state_dict(), "step": opt._step_index},
                   _ckpt_path(root, cfg, "final"))
        release(opt)


def _resume(root, cfg, make, tamper=None):
    model = make_model(seed=123)                     # fresh objects, different initial weights
    opt = hg_opt(model, **make())
    ckpt = torch.load(_ckpt_path(root, cfg, "ckpt"), weights_only=False)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    if tamper:
        tamper(opt)
    cfs = []
    for step in range(N_STEPS, N_STEPS + M_STEPS):
        train_steps(model, opt, 1, start=step)
        cfs.append(opt.stats["cf"])
    result = (flat_params(model), cfs, opt.controller.state_dict(), opt._step_index)
    release(opt)
    return result


def check_ckpt_resume(root):
    for cfg, make in _ckpt_configs().items():
        ref = torch.load(_ckpt_path(root, cfg, "final"), weights_only=False)
        params, cfs, ctrl_state, step = _resume(root, cfg, make)
        if cfg in KNOWN_RESUME_GAPS:
            identical = hvd.allgather_object(torch.equal(params, ref["params"]), name=f"gap.{cfg}")
            assert not all(identical), f"{cfg} now resumes bit for bit: remove it from KNOWN_RESUME_GAPS"
            say(f"GAP {cfg}: resumed parameters differ by {(params - ref['params']).abs().max().item():.2e} "
                f"({KNOWN_RESUME_GAPS[cfg]})")
            continue
        assert cfs == ref["cfs"][N_STEPS:], f"{cfg}: CFs after resume {cfs} vs {ref['cfs'][N_STEPS:]}"
        diff = (params - ref["params"]).abs().max().item()
        assert torch.equal(params, ref["params"]), f"{cfg}: resumed parameters differ by {diff}"
        assert step == ref["step"] and ctrl_state == ref["controller"], f"{cfg}: controller state differs"
        assert_identical_across_ranks(params, f"resume.{cfg}")
        say(f"RESUMED {cfg} bitwise identical after {N_STEPS}+{M_STEPS} steps; CFs {ref['cfs']}")
    # The test is sensitive: dropping the residuals or the step index changes the result.
    configs = _ckpt_configs()
    for cfg, tamper in (("static_topk", lambda o: o._memory.reset()),
                        ("static_randomk", lambda o: setattr(o, "_step_index", 0))):
        ref = torch.load(_ckpt_path(root, cfg, "final"), weights_only=False)
        params = _resume(root, cfg, configs[cfg], tamper)[0]
        assert not torch.equal(params, ref["params"]), f"{cfg}: tampering went unnoticed"


def check_ckpt_rank0_load_then_broadcast():
    """The Horovod habit (save on rank 0; load on rank 0; broadcast) still
    works with the checked state: hvd.broadcast_optimizer_state reads only 'state' and
    'param_groups' (every rank's wrapped optimizer has state here), and
    elastic.sync_optimizer_state serves optimizers that are still empty on other ranks."""
    import tempfile
    from horovod_gravac import checkpoint
    from horovod_gravac.elastic import sync_optimizer_state
    model = make_model()
    opt = train_steps(model, hg_opt(model, controller=hg.StaticCF(4)), 3)
    path = Path(tempfile.gettempdir()) / f"gravac_rank0_ckpt_{os.getppid()}.pt"
    if RANK == 0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    hvd.allreduce(torch.zeros(1), name="ckpt.rank0.saved")
    if RANK == 0:   # into an optimizer that has state on every rank
        ckpt = checkpoint.load(path)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    momentum = torch.cat([v["momentum_buffer"].reshape(-1) for v in opt.state.values()])
    assert_identical_across_ranks(momentum, "ckpt.rank0.bcast")
    release(opt)
    fresh_model = make_model(seed=9)   # fresh optimizers, empty state on every rank
    fresh = hg_opt(fresh_model, controller=hg.StaticCF(4))
    if RANK == 0:
        ckpt = checkpoint.load(path)
        fresh_model.load_state_dict(ckpt["model"])
        fresh.load_state_dict(ckpt["optimizer"])
    hvd.broadcast_parameters(fresh_model.state_dict(), root_rank=0)
    sync_optimizer_state(fresh)
    assert fresh._step_index == 3
    train_steps(fresh_model, fresh, 2, start=3)
    assert_identical_across_ranks(flat_params(fresh_model), "ckpt.rank0.sync")
    release(fresh)
    hvd.allreduce(torch.zeros(1), name="ckpt.rank0.done")
    if RANK == 0:
        path.unlink()


# ------------------------------------------------------------------ item 6: elastic
def _gravac_state(opt):
    s = opt.gravac_state_dict()
    return s["controller"], s["step"], {k: v.clone() for k, v in s["residuals"].items()}


def _same_residuals(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def check_elastic_save_restore():
    model = make_model()
    ctrl = StepTimedGraVAC(theta_min=2, theta_max=128, epsilon=0.2, window=3, policy="geometric")
    opt = hg_opt(model, controller=ctrl)
    state = TorchState(model=model, optimizer=opt, batch=0)
    state.sync()
    train_steps(model, opt, 5)
    state.batch = 5
    state.commit()
    saved_params, saved = flat_params(model), _gravac_state(opt)
    saved_momentum = [v["momentum_buffer"].clone() for v in opt.state.values()]
    train_steps(model, opt, 4, start=5)
    # An interrupted step: hooks fired, collectives launched, never synchronized.
    x, y = batch(9)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert any(b.handle is not None for b in opt._buckets)
    for b in opt._buckets:        # drain so Horovod is not left with open handles
        if b.handle is not None:
            comm.wait(b.handle)
    state.restore()
    assert state.batch == 5 and torch.equal(flat_params(model), saved_params)
    ctrl_state, step, residuals = _gravac_state(opt)
    assert ctrl_state == saved[0] and step == saved[1] and _same_residuals(residuals, saved[2])
    assert all(torch.equal(v["momentum_buffer"], m) for v, m in zip(opt.state.values(), saved_momentum))
    # Continue after restore == a run that never took the detour; restoring twice works
    # (the snapshot is not aliased by the optimizer).
    for _ in range(2):
        train_steps(model, opt, 4, start=5)
        after = flat_params(model)
        state.restore()
    ref_model = make_model()
    ref = hg_opt(ref_model, controller=StepTimedGraVAC(theta_min=2, theta_max=128, epsilon=0.2,
                                                       window=3, policy="geometric"))
    train_steps(ref_model, ref, 9)
    assert torch.equal(after, flat_params(ref_model)), "restore + 4 steps != 9 uninterrupted steps"
    release(ref)
    release(opt)


def check_elastic_sync():
    model = make_model()
    opt = hg_opt(model, controller=StepTimedGraVAC(theta_min=2, theta_max=128, epsilon=0.2, window=3))
    state = TorchState(model=model, optimizer=opt)
    train_steps(model, opt, 5)
    mine = _gravac_state(opt)[2]
    if RANK != 0:   # a rank that drifted (or a worker that just joined)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        opt.controller.load_state_dict(hg.GraVAC(theta_min=2, theta_max=128, epsilon=0.2,
                                                 window=3).state_dict())
        opt.controller.set_world_size(SIZE)
        opt._step_index = 99
        opt.state.clear()   # empty optimizer state: hvd's own handler would call step() here
    state.sync()
    ctrl_state, step, residuals = _gravac_state(opt)
    everyone = hvd.allgather_object((ctrl_state, step), name="elastic.sync")
    assert all(e == everyone[0] for e in everyone), "controller state differs after sync"
    assert _same_residuals(residuals, mine), "sync must keep each rank's own residuals"
    assert_identical_across_ranks(flat_params(model), "elastic.sync")
    momentum = torch.cat([v["momentum_buffer"].reshape(-1) for v in opt.state.values()])
    assert_identical_across_ranks(momentum, "elastic.sync.momentum")
    train_steps(model, opt, 4, start=5)
    assert_identical_across_ranks(flat_params(model), "elastic.sync.after")
    release(opt)


def check_elastic_reset_world_size():
    model = make_model()
    ctrl = hg.GraVAC(theta_min=2, theta_max=128, epsilon=0.2, window=3)
    opt = hg_opt(model, controller=ctrl)
    state = TorchState(model=model, optimizer=opt)
    train_steps(model, opt, 7)
    assert opt.residual_bytes() > 0 and opt.controller.throughput.compression
    x, y = batch(7)   # a step interrupted by the membership change
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    for b in opt._buckets:
        if b.handle is not None:
            comm.wait(b.handle)
    ladder = (ctrl.theta_min, ctrl.candidate_cf)
    real_size = comm.size
    comm.size = lambda: SIZE + 3          # what hvd.size() says after the new rendezvous
    try:
        state.on_reset()
        assert opt.world_size == SIZE + 3 and ctrl.world_size == SIZE + 3
        assert abs(ctrl._gain_min.alpha - (SIZE + 3) / 100) < 1e-12, ctrl._gain_min.alpha
        assert not ctrl.throughput.compression, "throughput measured with another N was kept"
        assert (ctrl.theta_min, ctrl.candidate_cf) == ladder
        assert all(float(r.abs().max()) == 0.0 for r in opt._memory.residuals.values())
        assert all(b.handle is None for b in opt._buckets)
    finally:
        comm.size = real_size
    state.on_reset()                      # back to the real world size
    assert opt.world_size == SIZE and abs(ctrl._gain_min.alpha - SIZE / 100) < 1e-12
    state.sync()
    train_steps(model, opt, 6, start=8)   # zero_grad works, no hang, ranks agree
    assert_identical_across_ranks(flat_params(model), "elastic.reset")
    release(opt)


def check_elastic_real_reinit():
    """The sequence hvd.elastic.run goes through after a failure: restore, shutdown +
    init (a new Horovod world), on_reset, sync; then training goes on."""
    model = make_model()
    opt = hg_opt(model, controller=StepTimedGraVAC(theta_min=2, theta_max=128, epsilon=0.2, window=3))
    state = TorchState(model=model, optimizer=opt)
    state.sync()
    train_steps(model, opt, 4)
    state.commit()
    train_steps(model, opt, 2, start=4)
    state.restore()
    hvd.shutdown()
    hvd.init()
    state.on_reset()
    state.sync()
    assert all(float(r.abs().max()) == 0.0 for r in opt._memory.residuals.values())
    train_steps(model, opt, 5, start=4)
    assert_identical_across_ranks(flat_params(model), "elastic.reinit")
    release(opt)


def elastic_driver_run(steps=24, fail_at=8, grow_at=14):
    """Under a real elastic driver (horovodrun --min-np 1 --max-np 2, a discovery script
    listing localhost:1 and 127.0.0.1:1, then localhost:2 once $GRAVAC_ELASTIC_FLAG exists):
    the worker on 127.0.0.1 dies at step ``fail_at``; the survivor restores its last
    commit, gets a 1-rank world, resets and trains on; at ``grow_at`` it asks for a second
    slot, a new worker joins (its optimizer state is empty) and syncs from rank 0.  Every
    worker prints what it saw; tests/test_reliability.py checks it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    # No collective outside the elastic run function: a joining worker would call it alone.
    opt = hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=model.named_parameters(), bucket_cap_mb=0.01,
                                  controller=hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.2, window=3),
                                  check_consistency=False, timeout_s=60)
    state = TorchState(model=model, optimizer=opt, step=0)
    host = os.environ.get("HOROVOD_HOSTNAME", "?")
    seen = []

    @hvd.elastic.run
    def train(state):
        while state.step < steps:
            if state.step == fail_at and host == "127.0.0.1":
                print(f"worker on {host} dies at step {state.step}", flush=True)
                os._exit(1)
            if state.step == grow_at and hvd.size() == 1 and os.environ.get("GRAVAC_ELASTIC_FLAG"):
                Path(os.environ["GRAVAC_ELASTIC_FLAG"]).touch()   # discovery now offers 2 slots
                for _ in range(600):   # until the driver notices: HostsUpdatedInterrupt
                    state.check_host_updates()
                    time.sleep(0.1)
            residual_max = max((float(r.abs().max()) for r in opt._memory.residuals.values()), default=0.0)
            seen.append((state.step, hvd.size(), opt.world_size, opt.controller.world_size,
                         opt.controller._gain_min.alpha, residual_max))
            train_steps(model, opt, 1, start=state.step)
            state.step += 1
            state.commit()

    train(state)
    sizes = [s[1] for s in seen]
    shrunk = next((s for s in seen if s[1] == 1), None)
    grown = next((s for s in seen if s[1] == 2 and shrunk and s[0] > shrunk[0]), None)
    flat = flat_params(model)
    everyone = hvd.allgather(flat.unsqueeze(0), name="elastic.final")
    same = all(torch.equal(everyone[r], everyone[0]) for r in range(hvd.size()))
    print(f"ELASTIC host={host} rank={hvd.rank()} size={hvd.size()} first_step={seen[0][0]} "
          f"sizes={sorted(set(sizes))} final_step={state.step} shrunk={shrunk} grown={grown} "
          f"identical={same} finite={bool(torch.isfinite(flat).all())}", flush=True)


# ------------------------------------------------------------------ item 4: faults
def _stall(seconds=300):
    print(f"rank {RANK} stalls", flush=True)
    time.sleep(seconds)


def fault_run(kind, timeout):
    """Rank 1 misbehaves at step 3; rank 0 must fail with a clear error within ``timeout``."""
    timeout_s = None if os.environ.get(comm.TIMEOUT_ENV) else float(timeout)
    model = make_model()
    t0 = time.monotonic()
    try:
        if kind == "startup" and RANK == 1:
            _stall()
        opt = hg_opt(model, timeout_s=timeout_s,
                     controller=hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=2))
    except Exception as exc:
        print(f"FAILED_AFTER {time.monotonic() - t0:.2f} {type(exc).__name__}: {exc}", flush=True)
        raise
    if RANK == 1 and kind in ("stats", "decision"):
        # stats: stall just before the statistics-carrying bucket starts its collective;
        # decision: in the decision broadcast.
        owner, target = {"stats": (opt._encoder, "local_stats"), "decision": (comm, "broadcast_async_")}[kind]
        original = getattr(owner, target)

        def late(*a, **k):
            if opt._step_index == 3:
                _stall()
            return original(*a, **k)
        setattr(owner, target, late)
    try:
        for step in range(6):
            if step == 3 and RANK == 1:
                if kind == "bucket":
                    _stall()
                elif kind == "exit":
                    print("rank 1 exits", flush=True)
                    os._exit(0)
                elif kind == "freeze":     # the whole process stops, Horovod's thread too
                    print("rank 1 freezes", flush=True)
                    os.kill(os.getpid(), signal.SIGSTOP)
            t0 = time.monotonic()
            train_steps(model, opt, 1, start=step)
    except Exception as exc:
        print(f"FAILED_AFTER {time.monotonic() - t0:.2f} {type(exc).__name__}: {exc}", flush=True)
        raise
    print(f"rank {RANK} finished without error", flush=True)


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items()
          if name.startswith("check_") and name not in ("check_ckpt_reference", "check_ckpt_resume")}
ALL = list(CHECKS)

if __name__ == "__main__":
    what, args = sys.argv[1], sys.argv[2:]
    if what == "elastic_driver":
        elastic_driver_run()
        sys.exit(0)
    if what.startswith("fault_"):
        fault_run(what[len("fault_"):], *args)
        sys.exit(0)
    if what == "ckpt_reference":
        check_ckpt_reference(*args)
        names = []
    elif what == "ckpt_resume":
        check_ckpt_resume(*args)
        names = []
    else:
        names = ALL if what == "all" else [what] + args
    for name in names:
        CHECKS[name]()
        hvd.allreduce(torch.zeros(1), name=f"sync.{name}")
        say(f"PASS {name}")
    if what.startswith("ckpt_"):
        say(f"PASS {what}")
