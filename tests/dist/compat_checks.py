"""Drop-in checks: ``horovod_gravac.DistributedOptimizer`` against ``hvd.DistributedOptimizer``.

Run on every rank under horovodrun (see tests/test_horovod_compat.py):

    python compat_checks.py CHECK [CHECK ...]

Each check builds fresh models and optimizers and raises AssertionError on failure.
A failed check prints ``FAIL <name> [rank r]: <message>`` on the failing rank; after
each check the ranks agree on the outcome and rank 0 prints ``PASS <name>`` or
``FAILED <name>``.  The process exits 1 if any check failed.

Where a check compares with Horovod, the Horovod run and the horovod_gravac run use
the same script, seed and data, one after the other in the same process.
Bitwise comparisons are made on 2 ranks (a sum of two floats does not depend on
the order); with 3 or more ranks Horovod's ring may sum in another order, so those
comparisons use a tight tolerance and say so.
"""
import contextlib
import inspect
import os
import sys
import tempfile
import traceback
import warnings

import torch
import torch.nn.functional as F

import horovod.torch as hvd
import horovod_gravac as hg

hvd.init()
torch.set_num_threads(1)
RANK, SIZE = hvd.rank(), hvd.size()
TIMEOUT_S = float(os.environ.get("COMPAT_TIMEOUT_S", "60"))   # per collective, in our optimizer
BITWISE = SIZE == 2
warnings.filterwarnings("ignore", message=".*num_groups.*")


def note(msg):
    if RANK == 0:
        print(f"NOTE {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# Models, data, loops
class Net(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 32)
        self.fc3 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class EmbNet(torch.nn.Module):
    """An nn.Embedding(sparse=True) followed by a dense head (Horovod's sparse test pattern)."""

    def __init__(self, seed=0, sparse=True, head=True):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(50, 8, sparse=sparse)
        self.head = torch.nn.Linear(8, 4) if head else None

    def forward(self, idx):
        h = self.emb(idx).mean(1)
        return self.head(h) if self.head is not None else h[:, :4]


def make(cls=Net, **kw):
    model = cls(**kw)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


def batch(step, rank=None):
    g = torch.Generator().manual_seed(1000 * step + (RANK if rank is None else rank))
    return torch.randn(12, 16, generator=g), torch.randint(0, 4, (12,), generator=g)


def emb_batch(step):
    g = torch.Generator().manual_seed(7000 + 1000 * step + RANK)
    # few distinct rows per batch, with repeats: duplicated sparse indices on a rank
    return torch.randint(0, 50, (6, 5), generator=g), torch.randint(0, 4, (6,), generator=g)


def loss_of(model, step, data=batch):
    x, y = data(step)
    return F.cross_entropy(model(x), y)


def train(model, opt, steps, data=batch, bpps=1, first=0):
    for step in range(first, first + steps):
        opt.zero_grad()
        for micro in range(bpps):
            loss_of(model, step * bpps + micro, data).backward()
        opt.step()
    return opt


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def sgd(model, lr=0.05, momentum=0.9, params=None):
    return torch.optim.SGD(model.parameters() if params is None else params, lr=lr, momentum=momentum)


def hvd_opt(model, base=None, **kw):
    return hvd.DistributedOptimizer(base or sgd(model), named_parameters=model.named_parameters(), **kw)


def hg_opt(model, base=None, **kw):
    kw.setdefault("timeout_s", TIMEOUT_S)
    return hg.DistributedOptimizer(base or sgd(model), named_parameters=model.named_parameters(), **kw)


_tag = [0]


def assert_ranks_identical(tensor, what, process_set=None):
    _tag[0] += 1
    kw = {} if process_set is None else {"process_set": process_set}
    everyone = hvd.allgather(tensor.detach().reshape(1, -1), name=f"compat.ident.{_tag[0]}", **kw)
    for r in range(everyone.shape[0]):
        if not torch.equal(everyone[r], everyone[0]):
            diff = (everyone[r] - everyone[0]).abs().max().item()
            raise AssertionError(f"{what}: parameters of rank {r} differ from rank 0 by {diff:.3e} "
                                 f"(ranks must stay bitwise identical)")


def assert_same(ref, got, what, bitwise=None, atol=1e-6):
    """``got`` (horovod_gravac) equals ``ref`` (Horovod): bitwise on 2 ranks, else within atol."""
    bitwise = BITWISE if bitwise is None else bitwise
    if not torch.isfinite(got).all():
        raise AssertionError(f"{what}: horovod_gravac's parameters hold NaN/Inf")
    if bitwise:
        if not torch.equal(ref, got):
            diff = (ref - got).abs().max().item()
            n = int((ref != got).sum())
            raise AssertionError(f"{what}: differs from hvd.DistributedOptimizer (bitwise required) "
                                 f"in {n}/{ref.numel()} entries, max |diff| {diff:.3e}")
    else:
        diff = (ref - got).abs().max().item()
        if not diff <= atol:
            raise AssertionError(f"{what}: differs from hvd.DistributedOptimizer by {diff:.3e} > {atol}")


def _record(failures, name, exc):
    """Keep going after a failed variant; print where it failed (this rank)."""
    failures.append(f"{name}: {type(exc).__name__}: {exc}")
    tb = traceback.format_exception(exc)
    print(f"TRACE [{name}] [rank {RANK}]:\n  " + "  ".join(tb[-4:]).rstrip()[-1500:], flush=True)


def release(opt):
    """Remove hooks where the optimizer exposes them (old and new implementation)."""
    for h in getattr(opt, "_hooks", []) or []:
        with contextlib.suppress(Exception):
            h.remove()


# ---------------------------------------------------------------------------------------------
# API surface
HVD_POSITIONAL = ["optimizer", "named_parameters", "compression", "backward_passes_per_step", "op",
                  "gradient_predivide_factor", "num_groups", "groups", "sparse_as_dense",
                  "process_set"]
HG_KEYWORD_ONLY = ["compressor", "controller", "bucket_cap_mb", "check_consistency",
                   "momentum_correction", "local_clip_norm", "timeout_s", "overlap_consensus",
                   "nonfinite", "grad_scaler"]


def check_api_signature():
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


def check_api_methods_and_positional_construction():
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


def check_adasum_rejected_at_construction():
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


def check_dense_bitwise_variants():
    failures = []
    for name, kwfn in _dense_variants().items():
        try:
            a, b, _ = _dense_pair(kwfn)
            assert_same(flat(a), flat(b), f"Dense[{name}]")
            assert_ranks_identical(flat(b), f"Dense[{name}]")
        except Exception as exc:  # keep going: report every variant
            _record(failures, name, exc)
    if failures:
        raise AssertionError("Dense != hvd.DistributedOptimizer for: " + " | ".join(failures))


def check_dense_fp16_is_fp16_on_the_wire():
    """compression=fp16 must round like fp16 on the wire: differs from the fp32 run."""
    a, b, _ = _dense_pair(lambda m: dict(compression=hvd.Compression.fp16))
    c, d, _ = _dense_pair(lambda m: {})
    assert not torch.equal(flat(b), flat(d)), "compression=hvd.Compression.fp16 gave the fp32 result"


def check_set_backward_passes_per_step():
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


def check_sparse_embedding_sgd_dense_controller():
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


def check_sparse_embedding_sparseadam_dense_controller():
    for sad in (False, True):
        a, b = _sparse_pair(lambda m: torch.optim.SparseAdam(list(m.parameters()), lr=0.05), sad,
                            hg.Dense(), head=False)
        what = f"Embedding(sparse=True)+SparseAdam sparse_as_dense={sad}"
        # SparseAdam coalesces Horovod's gradient: sums in another order than an allreduce.
        assert_same(flat(a), flat(b), what, bitwise=False, atol=1e-6)
        note(f"{what}: bitwise equal to Horovod: {torch.equal(flat(a), flat(b))}")
        assert_ranks_identical(flat(b), what)


def check_sparse_embedding_compressed_ranks_identical():
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


def check_compressed_ranks_identical():
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
            _record(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


# ---------------------------------------------------------------------------------------------
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


def check_no_hang_user_collectives():
    model = make()
    _train_with_user_collectives(model, hvd_opt(model), 8)    # control: Horovod itself
    for name, ctrl in (("GraVAC", hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3)),
                       ("Accordion", hg.Accordion(low_cf=4, high_cf=64, threshold=0.5, interval=3)),
                       ("StaticCF(10)", hg.StaticCF(10)), ("Dense", hg.Dense())):
        model = make()
        opt = hg_opt(model, controller=ctrl, overlap_consensus=True)
        _train_with_user_collectives(model, opt, 12)
        assert_ranks_identical(flat(model), f"user collectives + {name}")
        release(opt)


def check_no_hang_two_gravac_optimizers_and_user_collectives():
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
def _controllers():
    return {"GraVAC": lambda: hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3),
            "Accordion": lambda: hg.Accordion(low_cf=4, high_cf=64, threshold=0.5, interval=3),
            "StaticCF(10)": lambda: hg.StaticCF(10),
            "Dense": lambda: hg.Dense()}


def check_broadcast_optimizer_state_fresh_does_not_step():
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
            _record(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


def _shared_tmpdir():
    path = tempfile.mkdtemp(prefix="hg_compat_") if RANK == 0 else None
    return hvd.broadcast_object(path, root_rank=0, name="compat.tmpdir")


def _resume(make_opt, label):
    path = os.path.join(_shared_tmpdir(), "checkpoint.pt")
    model = make()
    opt = make_opt(model)
    train(model, opt, 5)
    if RANK == 0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
    hvd.barrier()
    release(opt)
    # fresh model and optimizer on every rank; only rank 0 restores
    model2 = make(seed=99)
    opt2 = make_opt(model2)
    if RANK == 0:
        ckpt = torch.load(path, weights_only=False)
        model2.load_state_dict(ckpt["model"])
        opt2.load_state_dict(ckpt["optimizer"])
    hvd.broadcast_parameters(model2.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt2, root_rank=0)
    assert torch.equal(flat(model2), flat(model)), f"{label}: the restored model differs from the saved one"
    train(model2, opt2, 6, first=5)
    assert_ranks_identical(flat(model2), f"resume recipe {label}")
    release(opt2)


def check_resume_recipe():
    _resume(lambda m: hvd_opt(m), "hvd (control)")
    failures = []
    for name, ctrl_fn in _controllers().items():
        try:
            _resume(lambda m: hg_opt(m, controller=ctrl_fn()), name)
        except Exception as exc:
            _record(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


# ---------------------------------------------------------------------------------------------
# hvd.join() with uneven data
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


def check_join_uneven_data():
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
            _record(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


def check_join_uneven_dense_matches_hvd():
    """Horovod's semantics of a step that some ranks joined out of: the joined ranks
    contribute zeros.  Dense must give Horovod's parameters."""
    ref, _ = _join_ref()
    model = make()
    opt = hg_opt(model, sgd(model, momentum=0.0), controller=hg.Dense())
    _uneven(model, opt)
    assert_same(flat(ref), flat(model), "join + Dense")
    release(opt)


# ---------------------------------------------------------------------------------------------
# Mixed precision: Horovod's GradScaler recipe
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


def check_amp_overflow_on_one_rank_dense_matches_hvd():
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


def check_amp_natural_overflow_dense_matches_hvd():
    a, b = make(), make()
    s_ref = _amp_train(a, hvd_opt(a), 6, _scaler(init=2.0 ** 127, growth_interval=1))
    ours = hg_opt(b, controller=hg.Dense())
    s_hg = _amp_train(b, ours, 6, _scaler(init=2.0 ** 127, growth_interval=1))
    everyone = hvd.allgather_object(s_hg)
    assert all(s == everyone[0] for s in everyone), f"GradScaler scales differ across ranks: {everyone}"
    assert s_hg == s_ref, f"scale sequence {s_hg} != Horovod's {s_ref}"
    assert_same(flat(a), flat(b), "GradScaler(init 2**127) + Dense")


def check_amp_overflow_on_one_rank_compressed_every_rank_skips():
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
            _record(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


def check_amp_grad_scaler_scale_invariant_compressed():
    """With grad_scaler=scaler, a scale changing by powers of two gives bitwise the
    parameters of a constant scale (error feedback kept in unscaled units)."""
    failures = []
    for name, ctrl_fn in (("StaticCF(10)", lambda: hg.StaticCF(10)),
                          ("GraVAC", lambda: hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3))):
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
            _record(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


# ---------------------------------------------------------------------------------------------
# Freezing, unfreezing, add_param_group
def _ctrl3():
    return (("Dense", hg.Dense), ("StaticCF(10)", lambda: hg.StaticCF(10)),
            ("GraVAC", lambda: hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3)))


def check_freeze_mid_training():
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
            _record(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


def check_unfreeze_layer_frozen_at_wrap_time():
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
            _record(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


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


def check_add_param_group_after_wrapping():
    failures = []
    for name, ctrl_fn in _ctrl3():
        try:
            model = make(Grown)
            opt = hg.DistributedOptimizer(sgd(None, params=model.body.parameters()),
                                          named_parameters=model.body.named_parameters(),
                                          controller=ctrl_fn(), timeout_s=TIMEOUT_S)
            train(model, opt, 3)
            opt.add_param_group({"params": list(model.extra.parameters())})
            model.use_extra = True
            before = model.extra.weight.detach().clone()
            train(model, opt, 5, first=3)
            assert_ranks_identical(flat(model), f"add_param_group + {name}")
            note(f"add_param_group + {name}: the new layer was trained: "
                 f"{not torch.equal(before, model.extra.weight.detach())}")
            release(opt)
        except Exception as exc:
            _record(failures, name, exc)
    if failures:
        raise AssertionError(" | ".join(failures))


# ---------------------------------------------------------------------------------------------
# Stock Horovod optimizer with one of our compressors (last in its launch: may leave state)
def check_stock_hvd_optimizer_with_hg_compressor():
    model = make()
    try:
        opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                       compression=hg.TopKCompressor(cf=100))
        train(model, opt, 3)
    except Exception as exc:
        msg = f"{type(exc).__name__}: {exc}"
        assert "horovod_gravac.DistributedOptimizer" in msg, \
            f"hvd.DistributedOptimizer(compression=hg.TopKCompressor) failed without naming " \
            f"horovod_gravac.DistributedOptimizer: {msg}"
        note(f"stock hvd optimizer + TopKCompressor raises: {msg[:200]}")
        return
    assert_ranks_identical(flat(model), "hvd.DistributedOptimizer(compression=TopKCompressor)")
    note("stock hvd optimizer + TopKCompressor works (ranks identical)")


CHECKS = {name[len("check_"):]: fn for name, fn in list(globals().items()) if name.startswith("check_")}


def main(names):
    if RANK == 0:
        print(f"horovod_gravac from {os.path.dirname(hg.__file__)}; {SIZE} ranks", flush=True)
    failed = []
    for name in names:
        ok = 1
        try:
            CHECKS[name]()
        except Exception as exc:
            ok = 0
            tb = traceback.format_exc().strip().splitlines()
            print(f"FAIL {name} [rank {RANK}]: {type(exc).__name__}: {exc}", flush=True)
            print("  " + "\n  ".join(tb[-6:]), flush=True)
        everyone = hvd.allgather(torch.tensor([ok]), name=f"compat.outcome.{name}")
        if int(everyone.min()) == 1:
            if RANK == 0:
                print(f"PASS {name}", flush=True)
        else:
            failed.append(name)
            if RANK == 0:
                print(f"FAILED {name} (ranks {[r for r in range(SIZE) if not everyone[r]]})", flush=True)
    return failed


if __name__ == "__main__":
    wanted = sys.argv[1:] or ["all"]
    names = list(CHECKS) if wanted == ["all"] else wanted
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise SystemExit(f"unknown checks {unknown}")
    failed = main(names)
    sys.exit(1 if failed else 0)
