"""The DDP comm hook (``horovod_gravac.ddp``) on real ranks: every rank runs this file under

    torchrun --standalone --nproc_per_node 2 --tee 3 --no-python python -m pytest test_ddp_hook.py

(``tests/test_ddp.py`` launches it on 2 and 3 Gloo ranks under a timeout).  Each test builds
its own DDP models; ``Dense()`` is compared bit for bit with DDP's own reductions, the
compressed controllers by ranks staying identical and agreeing on every decision."""
import copy
import datetime
import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import horovod_gravac as hg
from horovod_gravac import checkpoint

if "TORCHELASTIC_RUN_ID" in os.environ and not dist.is_initialized():
    # A rank that waits longer than this on a peer fails instead of hanging.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
RANK = dist.get_rank() if dist.is_initialized() else 0
SIZE = dist.get_world_size() if dist.is_initialized() else 1


class Net(torch.nn.Module):
    """A small MLP; ``unused`` is a branch that takes no part in the loss."""

    def __init__(self, seed=0, with_unused=False):
        super().__init__()
        torch.manual_seed(seed)
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                        torch.nn.ReLU(), torch.nn.Linear(64, 5))
        self.unused = torch.nn.Linear(8, 8) if with_unused else None

    def forward(self, x):
        return self.body(x)


def batch(step, micro=0):
    g = torch.Generator().manual_seed(10000 * micro + 100 * step + RANK)
    return torch.randn(24, 32, generator=g), torch.randint(0, 5, (24,), generator=g)


def train(state=None, hook=None, steps=6, accumulate=1, with_unused=False, lr=0.05, **ddp_kw):
    """Train a fresh Net under DDP (``hook(state, bucket)`` registered if given); returns
    the flat parameters and the DDP model."""
    ddp_kw.setdefault("bucket_cap_mb", 0.01)   # several buckets for this small model
    model = Net(with_unused=with_unused)
    ddp = DDP(model, **ddp_kw)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for step in range(steps):
        opt.zero_grad()
        for micro in range(accumulate - 1):
            with ddp.no_sync():
                x, y = batch(step, micro + 1)
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
        x, y = batch(step)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    return flat(model), ddp


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def gathered(obj):
    out = [None] * SIZE
    dist.all_gather_object(out, obj)
    return out


def assert_ranks_identical(tensor, what):
    everyone = gathered(tensor)
    for r, t in enumerate(everyone):
        assert torch.equal(t, everyone[0]), f"{what}: rank {r} differs from rank 0 by {(t - everyone[0]).abs().max()}"


def state(**kw):
    return hg.ddp.GravacState(None, **kw)


# -- Dense and the wire: DDP's own arithmetic, bit for bit --------------------------------

@pytest.mark.parametrize("ddp_kw", [{}, {"gradient_as_bucket_view": True}, {"static_graph": True}],
                         ids=["plain", "bucket_view", "static_graph"])
def test_dense_is_bitwise_ddps_default(ddp_kw):
    want, _ = train(**ddp_kw)
    got, ddp = train(state(), hg.ddp.gravac_hook, **ddp_kw)
    assert torch.equal(got, want), f"max difference {(got - want).abs().max()}"


def test_fp16_wire_is_bitwise_fp16_compress_hook():
    want, _ = train(None, default_hooks.fp16_compress_hook)
    st = state(compression="fp16")
    got, _ = train(st, hg.ddp.gravac_hook)
    assert torch.equal(got, want), f"max difference {(got - want).abs().max()}"
    assert st.stats["bytes_sent"] == 2 * st.stats["dense_floats"]


def test_dense_with_no_sync_accumulation_is_bitwise_ddps():
    want, _ = train(accumulate=3)
    got, _ = train(state(), hg.ddp.gravac_hook, accumulate=3)
    assert torch.equal(got, want)


def test_dense_with_find_unused_parameters_is_bitwise_ddps():
    want, ddp_ref = train(with_unused=True, find_unused_parameters=True)
    got, ddp = train(state(), hg.ddp.gravac_hook, with_unused=True, find_unused_parameters=True)
    assert torch.equal(got, want)
    assert ddp.module.unused.weight.grad is None   # DDP leaves a globally unused gradient alone


# -- compressed controllers: ranks identical, decisions shared -----------------------------

def controllers():
    return {"static_topk": lambda: (hg.TopKCompressor, hg.StaticCF(10)),
            # theta_min 4: at 2x two ranks' pair exchange sends dense's bytes, and GraVAC sends dense
            "gravac": lambda: (hg.TopKCompressor, hg.GraVAC(theta_min=4, theta_max=64, epsilon=0.7, window=2)),
            "accordion": lambda: (hg.TopKCompressor, hg.Accordion(2, 20, 0.5, 2)),
            "dgc_gravac": lambda: (hg.DGCCompressor, hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.5, window=3)),
            "powersgd": lambda: (hg.PowerSGDCompressor, hg.StaticCF(4))}


def recording(decisions):
    """gravac_hook, keeping every step's decision (``state.stats``) in ``decisions``."""
    def recording_hook(st, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        fut = hg.ddp.gravac_hook(st, bucket)
        if bucket.is_last():
            s = st.stats
            decisions.append((s["step"], s["cf"], s["candidate_cf"], s.get("next_cf")))
        return fut
    return recording_hook


@pytest.mark.parametrize("name", sorted(controllers()))
@pytest.mark.parametrize("ddp_kw", [{}, {"static_graph": True}], ids=["plain", "static_graph"])
def test_compressed_ranks_identical_and_decide_alike(name, ddp_kw):
    compressor, controller = controllers()[name]()
    # the paper's path: "auto" would send 2x dense (as many bytes, and exact)
    st = state(compressor=compressor, controller=controller, exchange="allgather")
    decisions = []
    got, _ = train(st, recording(decisions), steps=8, **ddp_kw)
    assert torch.isfinite(got).all()
    assert_ranks_identical(got, name)
    everyone = gathered(decisions)
    assert all(d == everyone[0] for d in everyone), f"decisions differ: {everyone}"
    assert len(decisions) == 8
    if name in ("static_topk", "gravac", "accordion"):
        assert st.stats["bytes_sent"] < 4 * st.stats["dense_floats"], st.stats
    if name in ("gravac", "dgc_gravac"):
        assert st.stats["gain_min"] is not None


def test_compressed_with_no_sync_and_find_unused():
    st = state(compressor=hg.TopKCompressor, controller=hg.GraVAC(theta_min=2, theta_max=64, window=2))
    got, ddp = train(st, hg.ddp.gravac_hook, steps=6, accumulate=2, with_unused=True, find_unused_parameters=True)
    assert_ranks_identical(got, "no_sync + find_unused")
    assert ddp.module.unused.weight.grad is None


def test_residuals_follow_ddps_rebucketing():
    """DDP re-buckets after its first iteration (bucket_cap_mb=0.01 gives a new layout): the
    residuals move by name, so nothing the first step left unsent is lost."""
    st = state(compressor=hg.TopKCompressor, controller=hg.StaticCF(10))
    model = Net()
    ddp = DDP(model, bucket_cap_mb=0.01)
    ddp.register_comm_hook(st, hg.ddp.gravac_hook)
    x, y = batch(0)
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    before = checkpoint.gravac_state(st.controller, 0, st.memory, st.interval, st.powersgd, st._buckets(),
                                     {})["residuals"]
    assert before and sum(float(t.abs().sum()) for t in before.values()) > 0
    layout = {i: tuple(b.names) for i, b in st.layout.items()}
    for p in model.parameters():
        p.grad = None
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    after = {i: tuple(b.names) for i, b in st.layout.items()}
    assert sorted(n for names in after.values() for n in names) == sorted(before)
    assert st.stats["step"] == 1, (layout, after)


# -- mixed precision: an overflow on one rank reaches every rank ------------------------

@pytest.mark.parametrize("name", ["dense", "static_topk", "gravac"])
def test_grad_scaler_overflow_on_one_rank_skips_the_step_everywhere(name):
    compressor, controller = {"dense": (None, hg.Dense()),
                              "static_topk": (hg.TopKCompressor, hg.StaticCF(10)),
                              "gravac": (hg.TopKCompressor, hg.GraVAC(theta_min=2, theta_max=64, window=2))}[name]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    st = state(compressor=compressor, controller=controller, grad_scaler=scaler)
    model = Net()
    ddp = DDP(model, bucket_cap_mb=0.01)
    ddp.register_comm_hook(st, hg.ddp.gravac_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    skipped = []
    for step in range(5):
        opt.zero_grad()
        x, y = batch(step)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        if step == 2 and RANK == SIZE - 1:
            loss = loss * float("inf")
        before = flat(model).clone()
        residuals = {k: v.clone() for k, v in st.memory.residuals.items()}
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        skipped.append(st.stats["skipped"])
        if step == 2:
            assert torch.equal(flat(model), before)   # the scaler skipped the step here too
            assert residuals.keys() == st.memory.residuals.keys()
            assert all(torch.equal(v, st.memory.residuals[k]) for k, v in residuals.items())
    assert skipped == [False, False, True, False, False]
    assert scaler.get_scale() == 2.0 ** 9
    assert st.stats["step"] == 3   # the skipped step is not counted
    assert_ranks_identical(flat(model), "after an overflow on one rank")


# -- errors, not hangs ------------------------------------------------------------------------

def test_mismatched_settings_fail_on_every_rank():
    st = state(compressor=hg.TopKCompressor, controller=hg.StaticCF(10 if RANK == 0 else 20))
    with pytest.raises(Exception, match="differs from rank 0 in 'controller'"):
        train(st, hg.ddp.gravac_hook, steps=1)


@pytest.mark.parametrize("kw, match", [({"compression": "int8"}, "compression must be"),
                                       ({"controller": "gravac"}, "controller must be"),
                                       ({"nonfinite": "ignore"}, "nonfinite must be"),
                                       ({"timeout_s": -1}, "timeout_s"),
                                       ({"compressor": hg.PowerSGDCompressor,   # (the ladder compresses twice)
                                         "controller": hg.GraVAC(variant="ladder")}, "multi-level")])
def test_bad_arguments_are_refused(kw, match):
    with pytest.raises(ValueError, match=match):
        state(**kw)


# -- state_dict / load_state_dict ----------------------------------------------------------

def test_resume_from_state_dict_continues_bitwise():
    """One bucket (the default cap): a resumed DDP's first iteration has DDP's initial
    bucket layout, the uninterrupted one its rebuilt layout, and Top-k selects per bucket;
    with one bucket both select the same entries."""
    def build():
        model = Net()
        ddp = DDP(model)
        st = state(compressor=hg.TopKCompressor, controller=hg.StaticCF(10))
        ddp.register_comm_hook(st, hg.ddp.gravac_hook)
        return model, ddp, st, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def steps(ddp, opt, start, n):
        for step in range(start, start + n):
            opt.zero_grad()
            x, y = batch(step)
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()

    model, ddp, st, opt = build()
    steps(ddp, opt, 0, 3)
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "hook": st.state_dict()})
    steps(ddp, opt, 3, 3)
    want = flat(model)

    model2, ddp2, st2, opt2 = build()
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    st2.load_state_dict(saved["hook"])
    steps(ddp2, opt2, 3, 3)
    assert st2.stats["step"] == 5
    assert torch.equal(flat(model2), want)

    other = state(compressor=hg.TopKCompressor, controller=hg.StaticCF(20))
    with pytest.raises(ValueError, match="controller"):
        other.load_state_dict(saved["hook"])
    damaged = dict(saved["hook"], residuals={k: v + 1 for k, v in saved["hook"]["residuals"].items()})
    with pytest.raises(ValueError, match="corrupted"):
        state(compressor=hg.TopKCompressor, controller=hg.StaticCF(10)).load_state_dict(damaged)
