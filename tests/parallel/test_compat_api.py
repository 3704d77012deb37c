"""Drop-in checks on 2 ranks (launched by tests/integration/test_horovod_compat.py): the API surface,
the Dense controller bitwise equal to Horovod, sparse gradients, compression keeping ranks
identical (also on 3 ranks), freezing, unfreezing and add_param_group after wrapping.
"""
import inspect

import pytest
import torch

import horovod.torch as hvd
import horovod_gravac as hg

from compat_helpers import (TIMEOUT_S, EmbNet, Net, assert_ranks_identical, assert_same, batch, emb_batch,
                           flat, hg_opt, hvd_opt, loss_of, make, note, rank0_restores, record_failure, release,
                           sgd, train)

pytestmark = pytest.mark.sizes(2)


# API surface
HVD_POSITIONAL = ["optimizer", "named_parameters", "compression", "backward_passes_per_step", "op",
                  "gradient_predivide_factor", "num_groups", "groups", "sparse_as_dense",
                  "process_set"]
HG_KEYWORD_ONLY = ["compressor", "controller", "bucket_cap_mb", "check_consistency",
                   "momentum_correction", "local_clip_norm", "timeout_s",
                   "nonfinite", "grad_scaler"]


def test_api_signature():
    theirs = list(inspect.signature(hvd.DistributedOptimizer).parameters)
    assert theirs == HVD_POSITIONAL, f"unexpected Horovod signature {theirs}"
    sig = inspect.signature(hg.DistributedOptimizer)
    params = list(sig.parameters.values())
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert positional == HVD_POSITIONAL, \
        f"hg.DistributedOptimizer's positional parameters {positional} != Horovod's {HVD_POSITIONAL}"
    hvd_defaults = {k: v.default for k, v in inspect.signature(hvd.DistributedOptimizer).parameters.items()}
    for p in params:
        if p.name in HVD_POSITIONAL[1:]:
            ok = p.default is hvd_defaults[p.name] or p.default == hvd_defaults[p.name]
            assert ok, f"default of {p.name}: {p.default!r}, Horovod's is {hvd_defaults[p.name]!r}"
    kwonly = [p.name for p in params if p.kind == p.KEYWORD_ONLY]
    missing = [n for n in HG_KEYWORD_ONLY if n not in kwonly]
    assert not missing, f"keyword-only options missing: {missing} (keyword-only are {kwonly})"


def test_api_methods_and_positional_construction():
    model = make()
    # exactly Horovod's positional order
    opt = hg.DistributedOptimizer(sgd(model), model.named_parameters(), hvd.Compression.none, 1,
                                  hvd.Average, 1.0, 0, None, False, hvd.global_process_set,
                                  controller=hg.Dense(), timeout_s=TIMEOUT_S)
    for name in ("set_backward_passes_per_step", "synchronize", "skip_synchronize", "step",
                 "zero_grad", "state_dict", "load_state_dict", "add_param_group"):
        assert callable(getattr(opt, name, None)), f"hg optimizer has no method {name}()"
    assert isinstance(opt, torch.optim.SGD), "the wrapped optimizer's class is not preserved"
    assert isinstance(getattr(opt, "stats", None), dict), "opt.stats is not a dict"
    train(model, opt, 2)
    assert "cf" in opt.stats, f"opt.stats has no 'cf' after a step: {opt.stats}"
    assert_ranks_identical(flat(model), "positional construction")
    # every keyword of Horovod, by keyword
    model = make()
    opt = hg.DistributedOptimizer(optimizer=sgd(model), named_parameters=model.named_parameters(),
                                  compression=hvd.Compression.none, backward_passes_per_step=1,
                                  op=hvd.Average, gradient_predivide_factor=1.0, num_groups=0,
                                  groups=None, sparse_as_dense=False, process_set=hvd.global_process_set,
                                  timeout_s=TIMEOUT_S)
    train(model, opt, 2)
    assert_ranks_identical(flat(model), "keyword construction")
    release(opt)


def test_adasum_rejected_at_construction():
    model = make()
    try:
        opt = hg.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                      op=hvd.Adasum, timeout_s=TIMEOUT_S)
    except ValueError as exc:
        assert "adasum" in str(exc).lower(), f"ValueError does not name Adasum: {exc}"
    else:
        release(opt)
        raise AssertionError("op=hvd.Adasum was accepted at construction (expected ValueError naming Adasum)")


# ---------------------------------------------------------------------------------------------
# Dense controller == Horovod
def _dense_variants():
    def groups_list(m):
        return dict(groups=[[m.fc1.weight, m.fc1.bias], [m.fc3.weight, m.fc2.weight]])
    return {
        "sgd_momentum": lambda m: {},
        "op_sum": lambda m: dict(op=hvd.Sum),
        "op_average_explicit": lambda m: dict(op=hvd.Average),
        "predivide_2": lambda m: dict(op=hvd.Average, gradient_predivide_factor=2.0),
        "fp16_compression": lambda m: dict(compression=hvd.Compression.fp16),
        "fp16_predivide_4": lambda m: dict(compression=hvd.Compression.fp16, gradient_predivide_factor=4.0),
        "bpps_2": lambda m: dict(backward_passes_per_step=2),
        "groups_2": lambda m: dict(groups=2),
        "groups_list": groups_list,
        "num_groups_2": lambda m: dict(num_groups=2),
        "sum_bpps_2_fp16": lambda m: dict(op=hvd.Sum, backward_passes_per_step=2,
                                          compression=hvd.Compression.fp16),
    }


def _dense_pair(kwfn, steps=5, hg_extra=None):
    a, b = make(), make()
    kw_a, kw_b = kwfn(a), kwfn(b)
    bpps = kw_a.get("backward_passes_per_step", 1)
    ref = hvd_opt(a, **kw_a)
    train(a, ref, steps, bpps=bpps)
    ours = hg_opt(b, controller=hg.Dense(), **kw_b, **(hg_extra or {}))
    train(b, ours, steps, bpps=bpps)
    release(ours)
    return a, b, ours


def test_dense_bitwise_variants():
    failures = []
    for name, kwfn in _dense_variants().items():
        try:
            a, b, _ = _dense_pair(kwfn)
            assert_same(flat(a), flat(b), f"Dense[{name}]")
            assert_ranks_identical(flat(b), f"Dense[{name}]")
        except Exception as exc:  # keep going: report every variant
            record_failure(failures, name, exc)
    if failures:
        raise AssertionError("Dense != hvd.DistributedOptimizer for: " + " | ".join(failures))


def test_dense_fp16_is_fp16_on_the_wire():
    """compression=fp16 must round like fp16 on the wire: differs from the fp32 run."""
    a, b, _ = _dense_pair(lambda m: dict(compression=hvd.Compression.fp16))
    c, d, _ = _dense_pair(lambda m: {})
    assert not torch.equal(flat(b), flat(d)), "compression=hvd.Compression.fp16 gave the fp32 result"


def test_set_backward_passes_per_step():
    a, b = make(), make()
    ref, ours = hvd_opt(a), hg_opt(b, controller=hg.Dense())
    ref.set_backward_passes_per_step(2)
    ours.set_backward_passes_per_step(2)
    train(a, ref, 4, bpps=2)
    train(b, ours, 4, bpps=2)
    assert_same(flat(a), flat(b), "set_backward_passes_per_step(2)")
    # back to 1 mid-training
    ref.set_backward_passes_per_step(1)
    ours.set_backward_passes_per_step(1)
    train(a, ref, 2, first=20)
    train(b, ours, 2, first=20)
    assert_same(flat(a), flat(b), "set_backward_passes_per_step(2) then (1)")
    assert_ranks_identical(flat(b), "set_backward_passes_per_step")
    release(ours)


# ---------------------------------------------------------------------------------------------
# Sparse gradients (nn.Embedding(sparse=True))
def _sparse_pair(base_fn, sparse_as_dense, controller, steps=4, head=True):
    a, b = make(EmbNet, head=head), make(EmbNet, head=head)
    ref = hvd_opt(a, base_fn(a), sparse_as_dense=sparse_as_dense)
    train(a, ref, steps, data=emb_batch)
    ours = hg_opt(b, base_fn(b), sparse_as_dense=sparse_as_dense, controller=controller)
    train(b, ours, steps, data=emb_batch)
    release(ours)
    return a, b


def test_sparse_embedding_sgd_dense_controller():
    for sad in (True, False):
        a, b = _sparse_pair(lambda m: sgd(m, lr=0.5, momentum=0.0), sad, hg.Dense())
        what = f"Embedding(sparse=True)+SGD sparse_as_dense={sad}"
        if sad:
            assert_same(flat(a), flat(b), what)
        else:
            # Horovod hands SGD an uncoalesced sparse gradient (allgathered rows / size);
            # a different but equivalent summation order is allowed here.
            assert_same(flat(a), flat(b), what, bitwise=False, atol=1e-6)
            note(f"{what}: bitwise equal to Horovod: {torch.equal(flat(a), flat(b))}")
        assert_ranks_identical(flat(b), what)


def test_sparse_embedding_sparseadam_dense_controller():
    for sad in (False, True):
        a, b = _sparse_pair(lambda m: torch.optim.SparseAdam(list(m.parameters()), lr=0.05), sad,
                            hg.Dense(), head=False)
        what = f"Embedding(sparse=True)+SparseAdam sparse_as_dense={sad}"
        # SparseAdam coalesces Horovod's gradient: sums in another order than an allreduce.
        assert_same(flat(a), flat(b), what, bitwise=False, atol=1e-6)
        note(f"{what}: bitwise equal to Horovod: {torch.equal(flat(a), flat(b))}")
        assert_ranks_identical(flat(b), what)


def test_sparse_embedding_compressed_ranks_identical():
    for sad in (False, True):
        for cname, ctrl in (("StaticCF(10)", lambda: hg.StaticCF(10)),
                            ("GraVAC", lambda: hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3))):
            _, b = _sparse_pair(lambda m: sgd(m, lr=0.5, momentum=0.0), sad, ctrl(), steps=6)
            assert_ranks_identical(flat(b), f"Embedding(sparse=True)+SGD {cname} sparse_as_dense={sad}")
        _, b = _sparse_pair(lambda m: torch.optim.SparseAdam(list(m.parameters()), lr=0.05), sad,
                            hg.StaticCF(10), steps=6, head=False)
        assert_ranks_identical(flat(b), f"Embedding(sparse=True)+SparseAdam StaticCF(10) sparse_as_dense={sad}")


# ---------------------------------------------------------------------------------------------
# Compression keeps ranks identical
def _compressed_modes():
    return {
        "StaticCF(10)+TopK": dict(controller=hg.StaticCF(10), compressor=hg.TopKCompressor),
        "StaticCF(10)+RandomK(shared seed)": dict(controller=hg.StaticCF(10),
                                                   compressor=hg.RandomKCompressor(cf=10, seed=3)),
        "GraVAC(window=5)": dict(controller=hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=5)),
        "GraVAC(geometric)": dict(controller=hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=5,
                                                       policy="geometric")),
        "Accordion": dict(controller=hg.Accordion(low_cf=4, high_cf=64, threshold=0.5, interval=4)),
        "StaticCF(10)+predivide_2": dict(controller=hg.StaticCF(10), gradient_predivide_factor=2.0),
    }


@pytest.mark.sizes(2, 3)
def test_compressed_ranks_identical():
    failures = []
    for name, kw in _compressed_modes().items():
        try:
            model = make()
            cfs = []
            opt = hg_opt(model, **kw)
            for step in range(12):
                train(model, opt, 1, first=step)
                cfs.append(opt.stats.get("cf"))
            assert_ranks_identical(flat(model), name)
            everyone = hvd.allgather_object(cfs)
            assert all(c == everyone[0] for c in everyone), f"{name}: ranks report different CFs {everyone}"
            if name.startswith("StaticCF"):
                assert cfs[-1] == 10, f"{name}: stats['cf'] {cfs}"
            release(opt)
        except Exception as exc:
            record_failure(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


# ---------------------------------------------------------------------------------------------
# Freezing, unfreezing, add_param_group
def _ctrl3():
    return (("Dense", hg.Dense), ("StaticCF(10)", lambda: hg.StaticCF(10)),
            ("GraVAC", lambda: hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3)))


def test_freeze_mid_training():
    failures = []
    for name, ctrl_fn in _ctrl3():
        try:
            model = make()
            opt = hg_opt(model, controller=ctrl_fn())
            train(model, opt, 3)
            model.fc1.requires_grad_(False)
            opt.zero_grad(set_to_none=True)
            frozen = torch.cat([model.fc1.weight.detach().reshape(-1), model.fc1.bias.detach()]).clone()
            train(model, opt, 6, first=3)
            now = torch.cat([model.fc1.weight.detach().reshape(-1), model.fc1.bias.detach()])
            assert torch.equal(frozen, now), \
                f"{name}: frozen layer changed by {(frozen - now).abs().max():.3e}"
            assert_ranks_identical(flat(model), f"freeze + {name}")
            release(opt)
        except Exception as exc:
            record_failure(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


def test_unfreeze_layer_frozen_at_wrap_time():
    failures = []
    for name, ctrl_fn in _ctrl3():
        try:
            model = make()
            model.fc1.requires_grad_(False)
            opt = hg_opt(model, controller=ctrl_fn())
            train(model, opt, 3)
            model.fc1.requires_grad_(True)
            before = model.fc1.weight.detach().clone()
            train(model, opt, 5, first=3)
            assert_ranks_identical(flat(model), f"unfreeze + {name}")
            note(f"unfreeze + {name}: the unfrozen layer was trained: "
                 f"{not torch.equal(before, model.fc1.weight.detach())}")
            release(opt)
        except Exception as exc:
            record_failure(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


def test_unfrozen_layer_steps_with_its_averaged_gradient_at_once():
    """The first step after unfreezing a layer frozen at wrap time sends that layer's gradient:
    ``p.grad`` after ``step()`` is the ranks' average of their local gradients, whether the
    layer's gradient comes last in the backward (fc1) or first (fc3).  It used to be zeros
    on every rank: the bucket launched before the new hook existed."""
    for name in ("fc1", "fc3"):
        model = make()
        layer = getattr(model, name)
        layer.requires_grad_(False)
        opt = hg_opt(model, controller=hg.Dense())   # one bucket: the other layers launch it
        train(model, opt, 2)
        layer.requires_grad_(True)
        opt.zero_grad()
        loss_of(model, 2).backward()
        local = layer.weight.grad.clone()   # not yet replaced: that happens in synchronize
        want = hvd.allreduce(local, name=f"compat.unfreeze.{name}")
        opt.step()
        assert_same(want, layer.weight.grad, f"the first averaged gradient of the unfrozen {name}", bitwise=False)
        assert local.abs().sum() > 0
        release(opt)


class Grown(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = Net()
        torch.manual_seed(5)
        self.extra = torch.nn.Linear(4, 4)
        self.use_extra = False

    def forward(self, x):
        out = self.body(x)
        return self.extra(out) if self.use_extra else out


def test_add_param_group_after_wrapping():
    failures = []
    for name, ctrl_fn in _ctrl3():
        try:
            model = make(Grown)
            opt = hg.DistributedOptimizer(sgd(None, params=model.body.parameters()),
                                          named_parameters=model.body.named_parameters(),
                                          controller=ctrl_fn(), timeout_s=TIMEOUT_S)
            train(model, opt, 3)
            opt.add_param_group({"params": list(model.extra.parameters())})
            # filled from the wrapped SGD's own values, as plain SGD's add_param_group does
            assert (opt.param_groups[-1]["lr"], opt.param_groups[-1]["momentum"]) == (0.05, 0.9), \
                opt.param_groups[-1]
            model.use_extra = True
            before = model.extra.weight.detach().clone()
            train(model, opt, 5, first=3)
            assert_ranks_identical(flat(model), f"add_param_group + {name}")
            note(f"add_param_group + {name}: the new layer was trained: "
                 f"{not torch.equal(before, model.extra.weight.detach())}")
            release(opt)
        except Exception as exc:
            record_failure(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


# ---------------------------------------------------------------------------------------------
# Dynamic graphs: parameters that get no gradient on some ranks, or on every rank
class Branchy(torch.nn.Module):
    """Two alternative first layers and a shared head.  Which branches run is chosen per rank
    and per backward pass, as in stochastic depth or mixture-of-experts routing."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.left = torch.nn.Linear(16, 32)
        self.right = torch.nn.Linear(16, 32)
        self.head = torch.nn.Linear(32, 4)
        self.route = ("left",)

    def forward(self, x):
        h = sum(getattr(self, name)(x) for name in self.route)
        return self.head(torch.relu(h))


def _route(step, micro):
    """Rank-dependent routes; on odd steps no rank uses ``right`` at all."""
    if step % 2:
        return ("left",)
    return (("left",), ("right",), ("left", "right"))[(hvd.rank() + step // 2 + micro) % 3]


def _train_branchy(model, opt, steps, bpps):
    for step in range(steps):
        opt.zero_grad()
        for micro in range(bpps):
            model.route = _route(step, micro)
            loss_of(model, step * bpps + micro).backward()
        opt.step()


def _branchy_sgd(model):
    # weight decay and momentum: a zero gradient and no gradient step differently
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-2)


@pytest.mark.sizes(2, 3)
def test_parameters_without_gradients_on_some_ranks():
    """A parameter that gets no gradient on a rank still takes part in its bucket there, as
    Horovod's optimizer submits zeros for it: with Dense the parameters (and which
    ``p.grad`` are None) equal hvd.DistributedOptimizer's, with every bucket layout and with
    gradient accumulation; compressed, the ranks stay identical and a branch that only one
    rank ran is still trained.  A step where no rank ran a branch leaves it as Horovod does."""
    failures = []
    for bpps in (1, 2):
        a = make(Branchy)
        ref = hvd_opt(a, base=_branchy_sgd(a), backward_passes_per_step=bpps)
        _train_branchy(a, ref, 6, bpps)
        ref_none = [p.grad is None for p in a.parameters()]
        layouts = {"one bucket": {}, "a bucket per tensor": dict(bucket_cap_mb=1e-6)}
        for layout, extra in layouts.items():
            for name, ctrl_fn in _ctrl3():
                what = f"{name}, {layout}, backward_passes_per_step={bpps}"
                try:
                    b = make(Branchy)
                    before = b.right.weight.detach().clone()
                    opt = hg_opt(b, base=_branchy_sgd(b), controller=ctrl_fn(),
                                 backward_passes_per_step=bpps, **extra)
                    _train_branchy(b, opt, 6, bpps)
                    release(opt)
                    assert_ranks_identical(flat(b), what)
                    if name == "Dense":
                        assert_same(flat(a), flat(b), what)
                        got_none = [p.grad is None for p in b.parameters()]
                        assert got_none == ref_none, f"{what}: p.grad is None {got_none}, Horovod's {ref_none}"
                    assert not torch.equal(before, b.right.weight.detach()), f"{what}: right was not trained"
                except Exception as exc:
                    record_failure(failures, what, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


# ---------------------------------------------------------------------------------------------
# torch's optimizer step hooks, and Horovod's state-creating step
def _hook_calls(opt):
    calls = []
    opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    return calls


def test_step_hooks_run_once_a_step():
    """``register_step_pre_hook`` / ``register_step_post_hook`` run once per ``step()``, as on
    the plain optimizer (an EMA kept by a post hook must move once a step), also through
    ``synchronize()`` + ``skip_synchronize()``, and not at all in ``broadcast_optimizer_state``,
    which is not a step.  Horovod's optimizer runs them twice a step (noted, not asserted)."""
    reference = make()
    theirs = hvd_opt(reference)
    their_calls = _hook_calls(theirs)
    train(reference, theirs, 1)
    note(f"hvd.DistributedOptimizer: {their_calls} for one step")
    for name, ctrl_fn in _ctrl3():
        model = make()
        opt = hg_opt(model, controller=ctrl_fn())
        calls = _hook_calls(opt)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
        assert calls == [], f"{name}: broadcast_optimizer_state ran the step hooks: {calls}"
        train(model, opt, 2)
        assert calls == ["pre", "post"] * 2, f"{name}: hooks ran {calls} in two steps"
        opt.zero_grad()
        loss_of(model, 9).backward()
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
        assert calls == ["pre", "post"] * 3, f"{name}: hooks ran {calls} in three steps"
        release(opt)


def test_broadcast_optimizer_state_leaves_parameters_alone_with_weight_decay():
    """``broadcast_optimizer_state`` creates missing state with the wrapped optimizer's step on
    zero gradients; with weight decay that step moved the parameters.  In the resume recipe
    only the ranks that did not load a checkpoint take it, so with Horovod's optimizer the
    ranks end up apart (noted); here every rank keeps rank 0's parameters, and a fresh
    optimizer's parameters do not move."""
    def decayed(model):
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)

    ref = make()
    theirs = hvd_opt(ref, base=decayed(ref))
    train(ref, theirs, 1)
    saved_model, saved_opt = ref.state_dict(), theirs.state_dict()
    for impl in ("hvd", "Dense", "StaticCF(10)"):
        model = make(seed=7)
        if impl == "hvd":
            opt = hvd_opt(model, base=decayed(model))
        else:
            opt = hg_opt(model, base=decayed(model),
                         controller=hg.Dense() if impl == "Dense" else hg.StaticCF(10))
        fresh = flat(model).clone()
        hvd.broadcast_optimizer_state(opt, root_rank=0)   # every rank fresh
        moved = (flat(model) - fresh).abs().max().item()
        if hvd.rank() != 0:
            opt.state.clear()   # the ranks that do not load start from an empty state
        rank0_restores(model, opt, lambda: (saved_model, saved_opt))   # the resume recipe
        if impl == "hvd":
            everyone = hvd.allgather(flat(model).reshape(1, -1), name="compat.resume.hvd")
            note(f"hvd.DistributedOptimizer: a fresh broadcast_optimizer_state moved the parameters "
                 f"by {moved:.3e}; after the resume the ranks are apart by "
                 f"{(everyone - everyone[0]).abs().max().item():.3e}")
        else:
            assert moved == 0.0, f"{impl}: broadcast_optimizer_state moved a fresh model by {moved:.3e}"
            assert_ranks_identical(flat(model), f"{impl}: resume recipe with weight decay")
            assert torch.equal(flat(model), flat(ref)), f"{impl}: the resumed model is not rank 0's checkpoint"
            train(model, opt, 2, first=1)
            assert_ranks_identical(flat(model), f"{impl}: two steps after the resume")
        release(opt)


def test_parameter_dtypes_against_horovod():
    """Models held in fp16, bf16 or float64.  Compressed fp16/bf16 gradients travel in float32
    and error feedback keeps float32 residuals for them, float64 in float64
    (test_float64_buckets.py); a dense send travels in fp16 for fp16 parameters and in
    float64 for float64 ones, as Horovod's.  So Dense equals Horovod bitwise, with Horovod's
    bytes, for fp16 and float64; bf16, which Horovod 0.28.1 refuses on the CPU, trains with
    ranks identical (4 bytes an entry).  The README's compatibility table quotes
    this."""
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        try:   # torch 2.0 has no fp16 matmul on the CPU
            torch.nn.Linear(2, 2).to(dtype)(torch.zeros(1, 2, dtype=dtype))
        except RuntimeError as exc:
            note(f"{dtype} skipped: this torch cannot run the model in it on the CPU ({exc})")
            continue

        def data(step):
            return tuple(t.to(dtype) if t.is_floating_point() else t for t in batch(step))
        ref = make().to(dtype)
        try:
            train(ref, hvd_opt(ref), 3, data=data)
            ref_flat = flat(ref).double()
        except ValueError as exc:   # Horovod has no allreduce for this dtype here
            note(f"hvd.DistributedOptimizer with {dtype}: {exc}")
            ref_flat = None
        for name, ctrl_fn in _ctrl3():
            model = make().to(dtype)
            opt = hg_opt(model, controller=ctrl_fn())
            train(model, opt, 3, data=data)
            assert all(p.dtype == dtype for p in model.parameters())
            assert_ranks_identical(flat(model).double(), f"{name} with {dtype}")   # no bf16 allgather
            if name == "Dense" and ref_flat is not None:
                assert_same(ref_flat, flat(model).double(), f"Dense with {dtype} parameters")
                per_entry = {torch.float64: 8, torch.float16: 2}.get(dtype, 4)   # as Horovod sends
                assert opt.stats["bytes_sent"] == per_entry * sum(p.numel() for p in model.parameters()), \
                    f"Dense with {dtype} parameters sent {opt.stats['bytes_sent']} bytes"
            release(opt)


def test_float64_dense_fallback_steps_average_in_float64():
    """GraVAC's dense steps on float64 parameters send g + residual in float64: with the
    residual zero (a Dense-like start) the first step equals Horovod's bitwise; with a
    residual from compressed steps every rank still ends identical."""
    def data(step):
        return tuple(t.double() if t.is_floating_point() else t for t in batch(step))
    ref = make().double()
    train(ref, hvd_opt(ref), 1, data=data)
    model = make().double()
    # theta_min 1: dense until the ladder's first check, then compressed candidates
    opt = hg_opt(model, controller=hg.GraVAC(theta_min=1, theta_max=16, epsilon=0.3, window=2))
    train(model, opt, 1, data=data)
    assert opt.stats["cf"] == 1, opt.stats
    assert_same(flat(ref), flat(model), "GraVAC's first (dense) step on float64 parameters")
    train(model, opt, 8, data=data, first=1)
    assert_ranks_identical(flat(model), "GraVAC on float64 parameters")
    release(opt)


class _Checkpointed(torch.nn.Module):
    """The middle layer under activation checkpointing (its forward runs again in backward)."""

    def __init__(self, reentrant):
        super().__init__()
        torch.manual_seed(4)
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)
        self.reentrant = reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        if self.reentrant:   # the reentrant variant needs an input that requires grad
            x = x.requires_grad_()
        h = checkpoint(lambda t: torch.relu(self.fc2(t)), torch.relu(self.fc1(x)), use_reentrant=self.reentrant)
        return self.fc3(h)


def test_activation_checkpointing():
    """``torch.utils.checkpoint`` (both variants): each gradient still arrives once per
    backward, so Dense equals Horovod bitwise and compressed ranks stay identical."""
    for reentrant in (False, True):
        ref = make(_Checkpointed, reentrant=reentrant)
        train(ref, hvd_opt(ref), 4)
        for name, ctrl_fn in _ctrl3():
            model = make(_Checkpointed, reentrant=reentrant)
            opt = hg_opt(model, controller=ctrl_fn())
            train(model, opt, 4)
            assert_ranks_identical(flat(model), f"{name}, use_reentrant={reentrant}")
            if name == "Dense":
                assert_same(flat(ref), flat(model), f"Dense, use_reentrant={reentrant}")
            release(opt)
