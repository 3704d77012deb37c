"""Float64 models under compression, on real ranks (launched by tests/integration/test_parallel.py
on 2 and 3 Gloo ranks).

A bucket of float64 parameters is compressed, sent and remembered in float64: float64 values
with int32 indices (12 bytes an entry), float64 residuals.  Checked for every controller and
compressor (every pairing on 2 ranks; on 3, each at least once: ``ON_MORE_RANKS``):

* a finite gradient entry beyond float32's range (1e39) on one rank is an ordinary gradient:
  every rank ends finite and identical, and where the compressor sends it at once (the
  magnitude selectors), the spiked parameter moves as with ``hvd.DistributedOptimizer``;
* the values that arrive are the gradient's own float64 digits (1.0000000001 and the like,
  which float32 would round), and the byte counts are float64's;
* a true NaN or Inf still reaches every rank (``nonfinite="propagate"``, as Horovod);
* a model mixing float32 and float64 parameters gets a bucket of each (Dense still equals
  Horovod bitwise on 2 ranks); ranks that disagree on a bucket's dtype fail, naming it.
"""
import math

import torch

import horovod.torch as hvd
import horovod_gravac as hg
from compat_helpers import (BITWISE, RANK, SIZE, Net, assert_ranks_identical, assert_same, batch, flat,
                            hg_opt, hvd_opt, make, record_failure, release)
from horovod_gravac.cf import kept_count
from horovod_gravac.compressors import (DGCCompressor, PowerSGDCompressor, RandomKCompressor,
                                        RedSyncCompressor, SIDCoCompressor, TopKCompressor)
from horovod_gravac.wire import N_STATS, slot_rows

COMPRESSORS = {
    "topk": TopKCompressor, "dgc": DGCCompressor, "redsync": RedSyncCompressor, "sidco": SIDCoCompressor,
    "randomk": RandomKCompressor,                                         # shared seed: allreduce of values
    "randomk_unseeded": lambda cf: RandomKCompressor(cf=cf, seed=None),  # own indices: allgather
    "powersgd": PowerSGDCompressor,
}
MAGNITUDE = ("topk", "dgc", "redsync", "sidco")   # they send a 1e39 entry the step it appears
CONTROLLERS = {
    "dense": hg.Dense,
    "static": lambda: hg.StaticCF(4),
    "gravac": lambda: hg.GraVAC(theta_min=2, theta_max=16, epsilon=0.3, window=2),
    "gravac_paper": lambda: hg.GraVAC(theta_min=2, theta_max=16, epsilon=0.3, window=2, variant="paper"),
    "gravac_delivered": lambda: hg.GraVAC(theta_min=2, theta_max=16, epsilon=0.3, window=2,
                                          variant="delivered", hold_windows=0),
    "gravac_split": lambda: hg.GraVAC(theta_min=2, theta_max=16, epsilon=0.3, window=2, split_rungs=True,
                                      policy="geometric", variant="ladder"),   # split rungs: the ladder's
    "accordion": lambda: hg.Accordion(low_cf=2, high_cf=8, threshold=0.3, interval=2),
}
SPIKE, SPIKE_STEP, LR = 1e39, 2, 0.05
CAP_MB = 0.002   # several buckets: fc1's weight, fc2's weight and the rest


# On more than 2 ranks, a set that still has every compressor and every controller (each
# compressor under another controller, GraVAC's rule sets each with another selector), join_safe's
# wire (slots in an allreduce, shared-seed and own indices) and DGC's momentum correction.  What
# 3 ranks add is the three-way split of uneven payloads and another order of adding; that
# depends on the compressor's wire and the controller's decisions, not on their pairing, which
# the full cross product checks on 2 ranks (launched by tests/integration/test_parallel.py).
# 10 cases instead of 44: the file's 3-rank run takes ~15 s instead of ~70 s on 2 cores.
ON_MORE_RANKS = {"dense/topk", "static/powersgd", "accordion/randomk_unseeded", "gravac/randomk",
                 "gravac_paper/dgc", "gravac_delivered/redsync", "gravac_split/sidco",
                 "static/randomk/join_safe", "gravac/topk/join_safe", "static/dgc/momentum_correction"}


def cases():
    """(name, controller factory, compressor, extra optimizer options) of every combination on
    2 ranks; on more, the cases of ``ON_MORE_RANKS``."""
    out = []
    for cname, comp in COMPRESSORS.items():
        for kname, ctrl in CONTROLLERS.items():
            if cname == "powersgd" and kname.startswith("gravac"):
                continue   # GraVAC needs a sparsifier
            out.append((f"{kname}/{cname}", ctrl, comp, {}))
        # join_safe's sparse wire (slots in an allreduce) and DGC's momentum correction
        out.append((f"static/{cname}/join_safe", CONTROLLERS["static"], comp, {"join_safe": True}))
    out.append(("gravac/topk/join_safe", CONTROLLERS["gravac"], TopKCompressor, {"join_safe": True}))
    out.append(("static/dgc/momentum_correction", CONTROLLERS["static"], DGCCompressor,
                {"momentum_correction": 0.9}))
    if SIZE > 2:
        out = [case for case in out if case[0] in ON_MORE_RANKS]
        assert len(out) == len(ON_MORE_RANKS)
    return out


def cname_of(name):
    """The compressor's part of a case's name."""
    return name.split("/")[1]


def data64(step):
    x, y = batch(step)
    return x.double(), y


def model64():
    return make().double()


def opt64(model, ctrl, comp, **kw):
    kw.setdefault("bucket_cap_mb", CAP_MB)
    base = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.0 if "momentum_correction" in kw else 0.9)
    return hg_opt(model, base, controller=ctrl(), compressor=comp, **kw)


def step_with(model, opt, step, entry=None, ranks=()):
    """One forward/backward of ``step``'s batch; on ``ranks``, fc1.weight's gradient entry 0
    is ``entry`` (a tensor hook runs before accumulation, so the optimizer's hooks see it).
    Synchronizes, and returns whether this rank's gradients came back finite."""
    def spike(grad):
        grad = grad.clone()
        grad.view(-1)[0] = entry
        return grad
    handle = model.fc1.weight.register_hook(spike) if entry is not None and RANK in ranks else None
    x, y = data64(step)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    if handle is not None:
        handle.remove()
    opt.synchronize()
    return all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())


def apply(opt):
    with opt.skip_synchronize():
        opt.step()


def residuals_of(opt):
    return list(opt.residuals().values())


# -- a finite spike beyond float32's range ------------------------------------------------------
def test_a_finite_spike_beyond_float32_leaves_every_rank_finite_and_identical():
    """1e39 on the last rank at step 2, five steps, for every controller and compressor:
    no bucket is flagged non-finite, every gradient, residual and parameter stays finite,
    float64 throughout, and the ranks are bitwise identical."""
    failures = []
    for name, ctrl, comp, kw in cases():
        try:
            model = model64()
            opt = opt64(model, ctrl, comp, **kw)
            for step in range(5):
                finite = step_with(model, opt, step, SPIKE if step == SPIKE_STEP else None, {SIZE - 1})
                assert finite, f"step {step}: a gradient arrived non-finite"
                assert opt.stats["nonfinite_buckets"] == 0, opt.stats
                apply(opt)
            assert all(p.dtype == torch.float64 and p.grad.dtype == torch.float64 for p in model.parameters())
            for res in residuals_of(opt):
                assert res.dtype == torch.float64, f"a residual is {res.dtype}"
                assert torch.isfinite(res).all(), "a residual is non-finite"
            params = flat(model)
            assert torch.isfinite(params).all(), "parameters are non-finite"
            assert_ranks_identical(params, name)
            release(opt)
        except Exception as exc:
            record_failure(failures, name, exc)
    assert not failures, "\n".join(failures)


def test_the_spike_moves_its_parameter_as_with_horovod():
    """Horovod averages the spike in float64 and applies a finite, large update.  Dense does
    the same bitwise (2 ranks) through all five steps; a magnitude selector sends the 1e39 entry
    the step it appears, so right after that step the spiked weight equals Horovod's to 1e-12
    (the other rank's contribution there is ~1, so the compressed and dense updates
    differ only in digits the spike swamps)."""
    def run(make_opt, steps):
        model = model64()
        opt = make_opt(model)
        for step in range(steps):
            assert step_with(model, opt, step, SPIKE if step == SPIKE_STEP else None, {SIZE - 1}), step
            apply(opt)
        release(opt)
        return flat(model), float(model.fc1.weight.view(-1)[0])

    def horovod(model):
        return hvd_opt(model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9))
    ref5, _ = run(horovod, 5)
    ref3, spiked = run(horovod, SPIKE_STEP + 1)
    assert torch.isfinite(ref5).all() and abs(spiked) > LR * SPIKE / SIZE / 2, spiked
    dense, _ = run(lambda m: opt64(m, CONTROLLERS["dense"], TopKCompressor), 5)
    if BITWISE:
        assert_same(ref5, dense, "Dense with a 1e39 gradient entry")
    else:   # 3 ranks: Horovod's ring may add in another order
        assert torch.isfinite(dense).all() and torch.allclose(dense, ref5, rtol=1e-9, atol=1e-12), \
            f"Dense with a 1e39 gradient entry differs from Horovod by {(dense - ref5).abs().max():.3e}"
    failures = []
    for cname in MAGNITUDE:
        for kname in ("static", "gravac", "accordion"):
            try:
                _, got = run(lambda m: opt64(m, CONTROLLERS[kname], COMPRESSORS[cname]), SPIKE_STEP + 1)
                assert math.isclose(got, spiked, rel_tol=1e-12), f"spiked weight {got!r}, Horovod's {spiked!r}"
            except Exception as exc:
                record_failure(failures, f"{kname}/{cname}", exc)
    assert not failures, "\n".join(failures)


# -- the sent values are float64 ---------------------------------------------------------------
def exact_digits(numel, salt):
    """Gradient values float32 cannot hold: 1 + 1e-10 * (i + 1), varied in size and sign."""
    i = torch.arange(numel, dtype=torch.float64)
    scale = 10.0 ** (torch.remainder(i * 7 + salt, 5) - 2)
    sign = 1.0 - 2.0 * torch.remainder(i + salt, 2)
    return (1.0 + 1e-10 * (i + 1)) * scale * sign


def test_the_values_that_arrive_are_the_gradients_own_float64_digits():
    """Every rank's gradient is replaced by the same exact_digits values.  Whatever entries
    a compressor keeps arrive as those values times (ranks that sent them) / N, to float64
    precision: ratio * N is an integer to 1e-12, where float32 would be off by ~1e-8.  PowerSGD
    sends vectors (biases) as they are; its matrices are checked for float64 traffic by bytes."""
    failures = []
    for name, ctrl, comp, kw in cases():
        try:
            model = model64()
            opt = opt64(model, ctrl, comp, **kw)
            want = {n: exact_digits(p.numel(), j).view(p.shape) for j, (n, p) in enumerate(model.named_parameters())}
            assert all(not torch.equal(w.float().double(), w) for w in want.values())   # float32 would round
            handles = [p.register_hook(lambda g, w=want[n]: w.clone()) for n, p in model.named_parameters()]
            x, y = data64(0)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            for h in handles:
                h.remove()
            opt.synchronize()
            arrived = 0
            for n, p in model.named_parameters():
                if cname_of(name) == "powersgd" and p.dim() > 1:
                    continue
                got, w = p.grad.reshape(-1), want[n].reshape(-1)
                assert got.dtype == torch.float64
                sent = got != 0
                ratio = got[sent] / w[sent] * SIZE
                off = (ratio - ratio.round()).abs().max().item() if sent.any() else 0.0
                assert off < 1e-12, f"{n}: an arriving value is off its float64 digits by {off:.3e} of an entry"
                assert ((ratio.round() >= 1) & (ratio.round() <= SIZE)).all(), f"{n}: {ratio}"
                arrived += int(sent.sum())
            assert arrived > 0, "nothing arrived"
            # float64 on the wire: 12 bytes a value with its index, 8 without
            per_float = opt.stats["bytes_sent"] / max(1, opt.stats["floats_sent"])
            assert per_float in (6.0, 8.0) or kw.get("join_safe"), opt.stats
            apply(opt)
            release(opt)
        except Exception as exc:
            record_failure(failures, name, exc)
    assert not failures, "\n".join(failures)


def test_float64_payloads_are_counted_at_twelve_bytes_an_entry():
    """bytes_sent: 8 + 4 per kept entry (value + index) for an allgather, 8 per value for the
    shared-seed allreduce, 8 per float for PowerSGD and Dense; join_safe's slots at 12 bytes a
    row.  The same runs on a float32 model count 8, 4, 4 and 4."""
    for dtype, value in ((torch.float64, 8), (torch.float32, 4)):
        for cname, kname, per_float in (("topk", "static", value + 4), ("randomk", "static", value),
                                        ("powersgd", "static", value), ("topk", "dense", value)):
            model = make().to(dtype)
            base = torch.optim.SGD(model.parameters(), lr=LR)
            opt = hg_opt(model, base, controller=CONTROLLERS[kname](), compressor=COMPRESSORS[cname],
                         bucket_cap_mb=CAP_MB)
            x, y = batch(0)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x.to(dtype)), y).backward()
            opt.step()
            s = opt.stats
            entries = s["floats_sent"] // 2 if per_float == value + 4 else s["floats_sent"]
            assert s["bytes_sent"] == per_float * entries, (dtype, cname, kname, s)
            release(opt)
        model = model64() if dtype == torch.float64 else make()
        # The slots themselves: under exchange="auto" a bucket at CF 4 goes dense, which costs
        # less than 2k + 1 rows from every rank.
        opt = hg_opt(model, torch.optim.SGD(model.parameters(), lr=LR), controller=hg.StaticCF(4),
                     bucket_cap_mb=CAP_MB, join_safe=True, exchange="allgather")
        x, y = batch(0)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x.to(dtype)), y).backward()
        opt.step()
        rows = sum(SIZE * slot_rows(2 * kept_count(b.numel, 4) + 1, N_STATS) for b in opt.bucket_layout)
        assert opt.stats["bytes_sent"] == (value + 4) * rows, (dtype, opt.stats)
        release(opt)


# -- true NaN/Inf ------------------------------------------------------------------------------
def test_a_true_nan_or_inf_still_reaches_every_rank():
    """nonfinite="propagate" (the default), as Horovod: a NaN or Inf in a float64 gradient on
    one rank makes that step's gradients non-finite on every rank, and no residual takes it."""
    failures = []
    for bad in (float("nan"), float("inf")):
        for name, ctrl, comp, kw in cases():
            if "/join_safe" in name or "momentum" in name:
                continue
            try:
                model = model64()
                opt = opt64(model, ctrl, comp, **kw)
                # (PowerSGD's residual and warm start take the NaN on the ranks whose own bucket
                # was finite, in float32 as in float64, unless a grad_scaler rolls the step back;
                # so only the non-finite step itself is checked there)
                low_rank = cname_of(name) == "powersgd"
                for step in range(2 if low_rank else 3):
                    finite = step_with(model, opt, step, bad if step == 1 else None, {SIZE - 1})
                    seen = hvd.allgather_object(finite, name=f"f64.nan.{bad}.{name}.{step}")
                    assert seen == [step != 1] * SIZE, f"gradients finite per rank at step {step}: {seen}"
                    if finite:
                        apply(opt)
                for res in residuals_of(opt):
                    assert res.dtype == torch.float64 and (low_rank or torch.isfinite(res).all()), \
                        "a residual took it"
                assert_ranks_identical(flat(model), f"{name} after a {bad}")
                release(opt)
            except Exception as exc:
                record_failure(failures, f"{name} ({bad})", exc)
    assert not failures, "\n".join(failures)


def test_nonfinite_zero_keeps_the_float64_wire_on_the_rank_that_zeroes():
    """nonfinite="zero": the rank with an Inf sends zeros, still as float64 (Horovod fails a
    collective whose dtype differs between ranks); every rank gets the same finite update."""
    failures = []
    for name, ctrl, comp, kw in cases():
        try:
            model = model64()
            opt = opt64(model, ctrl, comp, nonfinite="zero", **kw)
            for step in range(3):
                assert step_with(model, opt, step, float("inf") if step == 1 else None, {SIZE - 1}), step
                apply(opt)
            assert_ranks_identical(flat(model), f"{name}, nonfinite='zero'")
            release(opt)
        except Exception as exc:
            record_failure(failures, name, exc)
    assert not failures, "\n".join(failures)


# -- float32 next to float64, and ranks that disagree ------------------------------------------
class Mixed(Net):
    """Net with fc2 in float64 between float32 layers."""

    def __init__(self, seed=0):
        super().__init__(seed)
        self.fc2.double()

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc3(torch.relu(self.fc2(h.double())).float())


def test_a_model_mixing_float32_and_float64_gets_a_bucket_of_each():
    failures = []
    ref = make(Mixed)
    ref_opt = hvd_opt(ref)
    for step in range(3):
        x, y = batch(step)
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x), y).backward()
        ref_opt.step()
    release(ref_opt)
    for kname, cname in (("dense", "topk"), ("static", "topk"), ("gravac", "topk"), ("static", "randomk"),
                         ("static", "powersgd"), ("accordion", "dgc")):
        try:
            model = make(Mixed)
            opt = hg_opt(model, controller=CONTROLLERS[kname](), compressor=COMPRESSORS[cname], bucket_cap_mb=1.0)
            kinds = {tuple(sorted(set(b.parameter_dtypes), key=str)) for b in opt.bucket_layout}
            assert kinds == {(torch.float32,), (torch.float64,)}, kinds
            for step in range(3):
                entry = SPIKE if step == SPIKE_STEP else None
                handle = model.fc2.weight.register_hook(
                    lambda g: g.clone().index_fill_(1, torch.tensor([0]), entry)) \
                    if entry is not None and RANK == SIZE - 1 else None
                x, y = batch(step)
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                if handle is not None:
                    handle.remove()
                opt.step()
                assert opt.stats["nonfinite_buckets"] == 0, opt.stats
            saved = opt.residuals()
            for b in opt.bucket_layout:
                for name in b.names:
                    res = saved.get(name)
                    assert res is None or res.dtype == b.value_dtype, (name, res.dtype)
            params = torch.cat([p.detach().double().reshape(-1) for p in model.parameters()])
            assert torch.isfinite(params).all()
            assert_ranks_identical(params, f"mixed {kname}/{cname}")
            release(opt)
        except Exception as exc:
            record_failure(failures, f"{kname}/{cname}", exc)
    # Dense: Horovod sends each parameter in its dtype, and so does a bucket of each
    model = make(Mixed)
    opt = hg_opt(model, controller=hg.Dense(), bucket_cap_mb=1.0)
    for step in range(3):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    release(opt)
    assert_same(torch.cat([p.detach().double().reshape(-1) for p in ref.parameters()]),
                torch.cat([p.detach().double().reshape(-1) for p in model.parameters()]),
                "Dense on a float32/float64 model")
    assert not failures, "\n".join(failures)


def test_ranks_that_disagree_on_a_buckets_dtype_fail_naming_it():
    """Without the start-up check, rank 0 in float32 and the others in float64: Horovod refuses
    the collective (dtypes or row widths differ) and every rank's error names the bucket."""
    for kname, cname in (("dense", "topk"), ("static", "topk"), ("static", "randomk")):
        model = make() if RANK == 0 else model64()
        dtype = model.fc1.weight.dtype
        opt = hg_opt(model, controller=CONTROLLERS[kname](), compressor=COMPRESSORS[cname],
                     check_consistency=False, bucket_cap_mb=1.0)
        x, y = batch(0)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x.to(dtype)), y).backward()
        try:
            opt.synchronize()
        except Exception as exc:
            assert "gravac" in str(exc) and ".bucket." in str(exc), str(exc)
            assert "same parameter dtypes" in str(exc), str(exc)
        else:
            raise AssertionError(f"{kname}/{cname}: ranks with float32 and float64 buckets did not fail")
        release(opt)   # (and forgets the failed step's transfers; the next optimizer is fresh)
    hvd.allreduce(torch.zeros(1), name="f64.after.mismatch")   # Horovod still works
