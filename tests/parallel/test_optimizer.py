"""The optimizer on real ranks (2 and 3, launched by tests/integration/test_parallel.py).

Horovod registers no hooks with one rank, so only these prove anything about
communication.
"""
import pytest
import torch

import horovod.torch as hvd
import horovod_gravac as hg
from horovod_gravac.compressors import TopKCompressor, RandomKCompressor

from ranks import RANK, SIZE, batch, flat_params, hg_opt, make_model, release


def train(model, opt, steps, hook=None):
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if hook:
            hook(step, opt)
    return opt


def assert_identical_across_ranks(model, what):
    flat = flat_params(model)
    everyone = hvd.allgather(flat.unsqueeze(0), name=f"check.{what}")
    for r in range(SIZE):
        if not torch.equal(everyone[r], everyone[0]):
            raise AssertionError(f"{what}: parameters of rank {r} differ from rank 0 by "
                                 f"{(everyone[r] - everyone[0]).abs().max().item():.3e}")


# ---------------------------------------------------------------------------------------------
def test_dense_matches_horovod():
    a, b = make_model(), make_model()
    ref = hvd.DistributedOptimizer(torch.optim.SGD(a.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=a.named_parameters())
    ours = hg_opt(b, controller=hg.Dense())
    train(a, ref, 10)
    train(b, ours, 10)
    diff = (flat_params(a) - flat_params(b)).abs().max().item()
    # Same sums; only the reduction order inside Gloo's ring may differ (3+ ranks).
    assert diff <= 1e-6, f"Dense differs from hvd.DistributedOptimizer by {diff}"
    assert ours.stats["cf"] == 1.0 and ours.stats["level"] == "dense"
    assert ours.stats["bytes_sent"] == 4 * sum(p.numel() for p in b.parameters())
    release(ours)


def test_static_cf1_is_dense():
    a, b = make_model(), make_model()
    oa, ob = hg_opt(a, controller=hg.Dense()), hg_opt(b, controller=hg.StaticCF(1), compressor=TopKCompressor)
    train(a, oa, 10)
    train(b, ob, 10)
    # CF 1 takes the dense path. Two separate runs can differ in the last bit with 3+
    # ranks: Horovod fuses ready tensors by timing, which changes the ring's sum order.
    diff = (flat_params(a) - flat_params(b)).abs().max().item()
    assert diff <= 1e-6, f"StaticCF(1) differs from Dense by {diff}"
    assert ob.stats["level"] == "dense" and ob.stats["bytes_sent"] == oa.stats["bytes_sent"]
    release(oa); release(ob)


def _local_grads(model, step):
    x, y = batch(step)
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def test_sparse_aggregate_by_hand():
    """At CF 100 the averaged gradient equals the mean of every rank's decompressed
    Top-k payload, computed here by hand (one bucket holding every parameter)."""
    for cf in (100.0, 1.0001):
        model = make_model()
        probe = make_model()
        g_local = _local_grads(probe, 0)
        comp = TopKCompressor(cf=cf)
        payload, ctx = comp.compress(g_local)
        mine = comp.decompress(payload, ctx)
        expected = hvd.allgather(mine.unsqueeze(0), name=f"hand.{cf}").sum(0) / SIZE
        opt = hg_opt(model, controller=hg.StaticCF(cf), bucket_cap_mb=64, exchange="allgather")   # the paper's path
        x, y = batch(0)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.synchronize()
        got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        # buckets flatten parameters in reverse order; compare per parameter
        exp_parts = list(torch.split(expected, [p.numel() for p in model.parameters()]))
        got_parts = [p.grad.reshape(-1) for p in model.parameters()]
        for e, g in zip(exp_parts, got_parts):
            err = (e - g).abs().max().item()
            assert err <= 1e-6, f"CF {cf}: aggregated gradient differs from hand average by {err}"
        assert opt.stats["bytes_sent"] == 8 * payload.values.numel(), opt.stats
        with opt.skip_synchronize():
            opt.step()
        release(opt)
    # Note: single bucket ordered [last layer ... first layer] holds the same entries
    # as the hand concatenation, so Top-k selects the same set.


def test_identical_after_training():
    modes = {
        "dense": dict(controller=hg.Dense()),
        "static-topk-100": dict(controller=hg.StaticCF(100)),
        "static-randomk-10": dict(controller=hg.StaticCF(10), compressor=RandomKCompressor),
        "gravac-exp": dict(controller=hg.GraVAC(theta_min=2, theta_max=200, epsilon=0.3, window=4)),
        "gravac-geo-randomk": dict(controller=hg.GraVAC(theta_min=1.5, theta_max=100, epsilon=0.2,
                                                        window=3, policy="geometric"),
                                   compressor=RandomKCompressor(cf=2, seed=7)),
        "accordion": dict(controller=hg.Accordion(low_cf=4, high_cf=64, interval=5)),
        "dgc-momentum-correction-clipping": dict(controller=hg.StaticCF(50), momentum_correction=0.9,
                                                 local_clip_norm=0.5),
    }
    for name, kw in modes.items():
        model = make_model()
        opt = train(model, hg_opt(model, **kw), 20)
        assert_identical_across_ranks(model, name)
        release(opt)


def test_uneven_k():
    """Each rank keeps a different number of entries (CF 20 x (rank + 1))."""
    model = make_model()
    opt = hg_opt(model, controller=hg.StaticCF(20), check_consistency=False,
                 compressor=lambda cf: TopKCompressor(cf=cf * (RANK + 1)))
    sent = []
    train(model, opt, 20, hook=lambda s, o: sent.append(o.stats["bytes_sent"]))
    assert_identical_across_ranks(model, "uneven-k")
    everyone = hvd.allgather_object(sent[-1])
    assert len(set(everyone)) == SIZE, f"expected a different k per rank, got bytes {everyone}"
    release(opt)


def test_randomk_shared_sends_no_indices():
    model = make_model()
    opt = hg_opt(model, controller=hg.StaticCF(10), compressor=RandomKCompressor, bucket_cap_mb=64)
    train(model, opt, 3)
    n = sum(p.numel() for p in model.parameters())
    assert opt.stats["bytes_sent"] == 4 * int(n / 10), opt.stats
    assert_identical_across_ranks(model, "randomk-shared")
    release(opt)


def test_gravac_changes_cf_without_hang():
    """Ranks see different gradients (hence different local gains); the CF still moves
    and every rank calls the same collectives."""
    model = make_model()
    # The ladder: its moves follow the gains.  The default rule set's follow measured step
    # times, which on a loaded machine may keep it at one CF (its own test is further down).
    ctrl = hg.GraVAC(theta_min=2, theta_max=256, epsilon=0.2, window=3, policy="geometric", variant="ladder")
    cfs = []
    opt = train(model, hg_opt(model, controller=ctrl), 24, hook=lambda s, o: cfs.append(o.stats["cf"]))
    assert len(set(cfs)) >= 3, f"GraVAC never changed CF: {cfs}"
    everyone = hvd.allgather_object(cfs)
    assert all(c == everyone[0] for c in everyone), "ranks used different CFs"
    assert_identical_across_ranks(model, "gravac-cf-moves")
    release(opt)


def test_mismatched_config_fails_everywhere():
    model = make_model()
    ctrl = hg.StaticCF(10 if RANK == 0 else 20)
    try:
        hg_opt(model, controller=ctrl)
    except ValueError as exc:
        assert "differs from rank 0" in str(exc) and "controller" in str(exc), exc
    else:
        raise AssertionError("mismatched controllers were not detected")
    # a rank whose Top-k leaves zeros out (send_zeros=False) is named too
    try:
        hg_opt(make_model(), controller=hg.StaticCF(10),
               compressor=lambda cf: TopKCompressor(cf=cf, send_zeros=RANK == 0))
    except ValueError as exc:
        assert "differs from rank 0" in str(exc) and "send_zeros" in str(exc), exc
    else:
        raise AssertionError("mismatched send_zeros was not detected")


def test_nan_gradient_keeps_ranks_identical():
    model = make_model()
    ctrl = hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3)
    opt = hg_opt(model, controller=ctrl, nonfinite="zero")   # the default propagates, as Horovod
    for step in range(8):
        x, y = batch(step)
        if step == 4 and RANK == SIZE - 1:
            x = x * float("nan")
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if step == 4:
            flagged = hvd.allgather_object(opt.stats["nonfinite_buckets"])
            assert flagged[-1] > 0 and all(f == 0 for f in flagged[:-1]), flagged
    for res in opt.residuals().values():
        assert torch.isfinite(res).all(), "a residual was poisoned by NaN"
    assert opt.controller.gain_min is not None and opt.controller.gain_min == opt.controller.gain_min
    assert torch.isfinite(flat_params(model)).all()
    assert_identical_across_ranks(model, "nan")
    release(opt)


def test_backward_passes_per_step():
    a, b = make_model(), make_model()
    ref = hvd.DistributedOptimizer(torch.optim.SGD(a.parameters(), lr=0.05),
                                   named_parameters=a.named_parameters(), backward_passes_per_step=2)
    ours = hg.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.05),
                                   named_parameters=b.named_parameters(), backward_passes_per_step=2)
    for model, opt in ((a, ref), (b, ours)):
        for step in range(4):
            opt.zero_grad()
            for micro in range(2):
                x, y = batch(10 * step + micro)
                torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    diff = (flat_params(a) - flat_params(b)).abs().max().item()
    assert diff <= 1e-6, f"backward_passes_per_step=2 differs from Horovod by {diff}"
    release(ours)


def test_powersgd_full_rank_equals_dense_and_accordion_switches():
    from horovod_gravac.compressors import PowerSGDCompressor
    a, b = make_model(), make_model()
    oa = hg_opt(a, controller=hg.Dense())
    ob = hg_opt(b, controller=hg.StaticCF(2), compressor=PowerSGDCompressor(cf=2, rank=64))
    train(a, oa, 3)
    train(b, ob, 3)
    diff = (flat_params(a) - flat_params(b)).abs().max().item()
    assert diff <= 1e-4, f"full-rank PowerSGD differs from dense by {diff}"
    release(oa); release(ob)
    # Accordion with rank 4 in critical regimes and rank 1 otherwise (paper Table 4)
    model = make_model()
    ctrl = hg.Accordion(low_cf=2, high_cf=8, threshold=0.5, interval=3)
    opt = hg_opt(model, controller=ctrl,
                 compressor=lambda cf: PowerSGDCompressor(cf=cf, rank=4 if cf == 2 else 1))
    sent = []
    train(model, opt, 15, hook=lambda s, o: sent.append(o.stats["bytes_sent"]))
    assert_identical_across_ranks(model, "accordion-powersgd")
    assert len(opt.controller.history) == 5 and opt.stats["level"] != "dense"
    n_dense = sum(p.numel() for p in model.parameters())
    assert max(sent) < 4 * n_dense, "PowerSGD sent as much as dense"
    release(opt)


def test_broadcast_object_small_and_large():
    """Rank 0's object arrives intact whether it fits the inline header or needs a
    second broadcast; other ranks' objects are ignored."""
    from horovod_gravac.backend import INLINE_OBJECT_BYTES
    from horovod_gravac.horovod_backend import HorovodBackend
    backend = HorovodBackend()
    for i, size in enumerate((0, 10, INLINE_OBJECT_BYTES - 40, INLINE_OBJECT_BYTES + 1, 50_000)):
        mine = {"rank": RANK, "blob": bytes([RANK % 256]) * size}
        got = backend.broadcast_object(mine, name=f"check.bcast.{i}", timeout=60)
        assert got == {"rank": 0, "blob": b"\x00" * size}, (size, got["rank"], len(got["blob"]))


def test_two_optimizers_in_flight():
    """Two GraVAC optimizers stepped alternately (a GAN's generator and discriminator):
    each one's overlapped decision broadcast is still in flight while the other steps,
    so their collectives need distinct names (``gravac.``, ``gravac<n>.``)."""
    a, b = make_model(1), make_model(2)
    oa = hg_opt(a, controller=hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3))
    ob = hg_opt(b, controller=hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3))
    assert oa.collective_prefix != ob.collective_prefix, (oa.collective_prefix, ob.collective_prefix)
    for step in range(10):
        for model, opt in ((a, oa), (b, ob)):
            x, y = batch(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert_identical_across_ranks(a, "two-optimizers-a")
    assert_identical_across_ranks(b, "two-optimizers-b")
    release(oa); release(ob)


class HeadRegisteredFirst(torch.nn.Module):
    """The output layer is registered first, so it lands in the last bucket (the one
    that carries the step's statistics) although backward reaches it first."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.head = torch.nn.Linear(128, 5)
        self.body = torch.nn.Linear(32, 128)
        hvd.broadcast_parameters(self.state_dict(), root_rank=0)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


def test_ranks_exchange_controller_state_only_at_window_checks():
    """Between GraVAC's window checks no collective is added to a step: every rank decides
    itself from the same averaged statistics.  At each check rank 0's whole controller
    state reaches every rank, even when the ranks' step times differ (rank 1 is made
    slower, so its own throughput figures would differ): every step's decision is the
    same everywhere, and after each check every rank holds rank 0's state."""
    window = 3
    model = make_model(seed=5)
    ctrl = hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=window, variant="ladder")
    opt = hg_opt(model, controller=ctrl)
    backend = opt.backend
    exchanges, original = [], backend.broadcast_object

    def counted(obj, name, *a, **k):
        if name.endswith(".decision"):
            exchanges.append(ctrl.step)
        return original(obj, name, *a, **k)
    backend.broadcast_object = counted
    decisions, states = [], []
    try:
        def hook(step, o):
            if RANK == 1:
                import time
                time.sleep(0.002 * (step % 2))   # rank 1's own step times differ from rank 0's
            decisions.append(tuple(o.stats[k] for k in ("cf", "theta_min", "candidate_cf", "next_cf")))
            if ctrl.step % window == 0:
                states.append(ctrl.state_dict())
        train(model, opt, 4 * window, hook=hook)
    finally:
        del backend.broadcast_object   # (the class's method again)
    # One exchange per check (the observed step count is then a multiple of the window).
    assert exchanges == [window * i for i in range(1, 5)], exchanges
    everyone = hvd.allgather_object((decisions, states), name="check.window_consensus")
    for r, (d, st) in enumerate(everyone):
        assert d == everyone[0][0], f"rank {r} decided {d}, rank 0 {everyone[0][0]}"
        assert st == everyone[0][1], f"rank {r} left a check with another state than rank 0"
    assert len({row[0] for row in decisions}) >= 2, decisions   # the CF moved during the run
    assert_identical_across_ranks(model, "window-consensus")
    release(opt)


def test_a_rank_whose_arithmetic_differs_is_named_and_put_back_on_rank_zeros_state():
    """Safety net for deciding alone between checks: if a rank's decisions ever differ
    from rank 0's (here rank 1 is made to refuse the candidate), the ranks still apply the
    same update (every rank aggregates every rank's allgathered payload), the next check
    says so in a warning that names the rank, and rank 1 continues from rank 0's state."""
    import warnings
    from horovod_gravac.controllers import Decision
    window = 3
    model = make_model(seed=6)
    # The ladder: rank 1 is made to diverge through its _choose() (no argument, between checks).
    ctrl = hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.01, window=window, variant="ladder")
    # The paper's path: every CF goes through one kind of collective there, so the ranks'
    # different CFs are different sizes of it.  Under "auto" rank 1's CF 2 would go dense and
    # rank 0's candidate through the pair exchange: collectives of two kinds under one name,
    # which Horovod leaves waiting until the bounded wait ends the job (docs/reliability.md).
    opt = hg_opt(model, controller=ctrl, exchange="allgather")
    if RANK == 1:
        ctrl._choose = lambda: Decision(ctrl.theta_min, ctrl.theta_min, ctrl.candidate_cf)
    sent = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(model, opt, 3 * window, hook=lambda s, o: sent.append(o.stats["cf"]))
    named = [str(w.message) for w in caught if "taking rank 0's controller state" in str(w.message)]
    everyone = hvd.allgather_object((sent, ctrl.state_dict(), len(named)), name="check.divergent")
    assert everyone[1][0] != everyone[0][0], "rank 1's decisions did not differ: nothing was tested"
    assert everyone[0][2] == 0 and everyone[1][2] >= 1, [e[2] for e in everyone]
    if RANK == 1:
        assert "rank 1 sent" in named[0], named
    assert everyone[1][1] == everyone[0][1], "rank 1 left the last check with another state"
    assert_identical_across_ranks(model, "divergent")
    release(opt)


def test_carried_stats_are_complete_averages():
    """The statistics that ride in the carrier bucket equal a direct average of every
    rank's whole-step norms, also when the carrier's gradients are ready first (its
    collective is then held until every other bucket is compressed), on the dense
    first step (allreduce path) and on sparse steps (allgather path)."""
    model = HeadRegisteredFirst()
    # The ladder: its dense first step gives the allreduce path, then two-level sparse steps.
    opt = hg_opt(model, controller=hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3,
                                             variant="ladder"))
    layout = opt.bucket_layout
    carrier = layout[-1]   # (the last bucket carries the statistics)
    assert len(layout) >= 3 and set(carrier.names) == {"head.weight", "head.bias"}, [b.names for b in layout]
    # The order in which the buckets' gradients are all in, from hooks of the test's own...
    accumulated, hooks = [], []
    for name, p in model.named_parameters():
        hooks.append(p.register_post_accumulate_grad_hook(lambda p, name=name: accumulated.append(name)))
    # ... and the order in which their collectives start, from the backend's calls.
    backend, started, bucket_prefix = opt.backend, [], opt.collective_prefix + ".bucket."
    for method in ("allreduce_async", "allgather_async", "pair_exchange_async"):
        def start(tensor, name, *args, original=getattr(backend, method), **kw):
            if name.startswith(bucket_prefix) and name[len(bucket_prefix):].isdigit():   # a first phase
                started.append(int(name[len(bucket_prefix):]))
            return original(tensor, name, *args, **kw)
        setattr(backend, method, start)
    ready, launched, finished = [], [], []

    def record_step(step, o):
        done, complete = set(), []
        for name in accumulated:
            done.add(name)
            complete += [b.index for b in layout if b.index not in complete and set(b.names) <= done]
        ready.append(complete)
        launched.append(list(started))
        accumulated.clear()
        started.clear()
        # this rank's whole-step norms before averaging, and what the carrier brought
        record = o.last_step_record
        n = record.norms
        finished.append(([float(n[0]), float(n[1]), float(n[2]), record.grad_sq], record.step_stats.to_list(),
                         o.stats["level"]))
    control = []

    def hook(step, o):
        control.append((o.stats["level"], o.stats["control_bytes"]))
        record_step(step, o)
    try:
        train(model, opt, 8, hook=hook)
    finally:
        for h in hooks:
            h.remove()
        for method in ("allreduce_async", "allgather_async", "pair_exchange_async"):
            delattr(backend, method)   # (the class's methods again)
    # 23 header rows of 8 bytes in an allgather, 11 float32 in an allreduce (docs/architecture.md)
    assert all(b == (44 if level == "dense" else 184) for level, b in control), control
    # The carrier's gradients were in first, and its collective, held until every other
    # bucket was compressed, started last: every step.
    assert all(order[0] == carrier.index for order in ready), f"the carrier was not ready first: {ready}"
    assert all(order[-1] == carrier.index and sorted(order) == sorted(b.index for b in layout)
               for order in launched), f"the carrier started early: {launched}"
    levels = {level for _, _, level in finished}
    assert {"dense", "min"} <= levels or {"dense", "candidate"} <= levels, levels
    for step, (local, carried, level) in enumerate(finished):
        expected = hvd.allreduce(torch.tensor(local, dtype=torch.float64), op=hvd.Average,
                                 name=f"check.stats.{step}")
        # float64 through the allgather header; float32 through the dense allreduce.
        rtol = 1e-12 if level != "dense" else 1e-6
        assert torch.allclose(torch.tensor(carried[:4], dtype=torch.float64), expected, rtol=rtol, atol=0), \
            (step, level, carried, expected.tolist())
        # no window sums and no coherence sums (paper variant), all finite
        assert carried[5:] == [0.0] * 6, carried
    assert_identical_across_ranks(model, "carried-stats")
    release(opt)


def _bucket_flat(opt, tensors_by_name):
    return torch.cat([tensors_by_name[n].reshape(-1) for b in opt.bucket_layout for n in b.names])


def test_delivered_window_gain_is_cos2_of_the_window_sums():
    """GraVAC "delivered": at each window's end the controller's gain for the CF sent in the
    window is cos^2(D, G) of the rank-averaged window sums, where G is what this rank owed
    (its residual at the window's start plus its raw gradients) and D what it sent,
    D = G - r_end (error feedback), computed here independently from the gradients and
    residuals; every rank holds the same controller."""
    window = 4
    model = make_model(seed=3)
    ctrl = hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=window, variant="delivered")
    opt = hg_opt(model, controller=ctrl)
    params = dict(model.named_parameters())

    def residual():
        saved = opt.residuals()
        return torch.cat([saved[n] if n in saved else torch.zeros(params[n].numel())
                          for b in opt.bucket_layout for n in b.names])

    G, checked = None, []
    for step in range(3 * window):
        if step % window == 0:
            G = residual()   # owed at the window's start
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        G += _bucket_flat(opt, {n: p.grad.detach().clone() for n, p in params.items()})   # raw local gradients
        sent_cf = ctrl.decision.send_cf
        opt.step()
        if (step + 1) % window == 0:
            D = G - residual()
            local = torch.tensor([float(G.double() @ G.double()), float(D.double() @ G.double()),
                                  float(D.double() @ D.double())], dtype=torch.float64)
            g_sq, dot, d_sq = hvd.allreduce(local, op=hvd.Average, name=f"check.window.{step}").tolist()
            expected = max(0.0, dot) ** 2 / (g_sq * d_sq)
            assert opt.controller.delivered_gain[sent_cf] == pytest.approx(expected, rel=1e-5), step
            assert ctrl.history[-1]["window_gain"] == ctrl.delivered_gain[sent_cf]
            checked.append((sent_cf, expected))
    assert len(checked) == 3 and all(0.0 < g <= 1.0 for _, g in checked), checked
    assert float(residual().abs().max()) > 0   # (the owed residual is not trivially zero)
    assert len({cf for cf, _ in checked}) >= 2, checked   # it moved: 2 passes epsilon 0.3, then 4 is tried
    states = hvd.allgather_object(ctrl.state_dict(), name="check.delivered.state")
    assert all(s == states[0] for s in states), "controllers differ across ranks"
    assert_identical_across_ranks(model, "delivered")
    release(opt)


def test_predictive_checks_at_its_own_boundaries_and_ranks_agree():
    """GraVAC "predictive": intervals end where the controller says (a quarter window after a
    move, a window after a stay), the window sums arrive at exactly those steps, every check
    sees cos^2(D, G) of them, and the ranks (whose step and communication times differ) leave
    every check with rank 0's state."""
    window = 8
    model = make_model(seed=5)
    ctrl = hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=window, variant="predictive")
    opt = hg_opt(model, controller=ctrl)
    params = dict(model.named_parameters())

    def residual():
        saved = opt.residuals()
        return torch.cat([saved[n] if n in saved else torch.zeros(params[n].numel())
                          for b in opt.bucket_layout for n in b.names])

    G, ends = residual(), []
    for step in range(5 * window):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        G += _bucket_flat(opt, {n: p.grad.detach().clone() for n, p in params.items()})
        ends_here = ctrl.interval_ends_at(ctrl.step + 1)
        opt.step()
        if ends_here:
            D = G - residual()
            local = torch.tensor([float(G.double() @ G.double()), float(D.double() @ G.double()),
                                  float(D.double() @ D.double())], dtype=torch.float64)
            g_sq, dot, d_sq = hvd.allreduce(local, op=hvd.Average, name=f"check.pwindow.{step}").tolist()
            assert ctrl.history[-1]["window_gain"] == pytest.approx(max(0.0, dot) ** 2 / (g_sq * d_sq), rel=1e-5)
            ends.append(step + 1)
            G = residual()
    assert ends[0] == window // 4, ends   # the first CF is judged after a quarter window
    assert len(ends) >= 3 and all(b > a for a, b in zip(ends, ends[1:])), ends
    assert all(h["interval_steps"] in (window // 4, window) for h in ctrl.history), list(ctrl.history)
    states = hvd.allgather_object(ctrl.state_dict(), name="check.predictive.state")
    assert all(s["decision"] == states[0]["decision"] and s["history"] == states[0]["history"]
               for s in states), "controllers differ across ranks"
    assert_identical_across_ranks(model, "predictive")
    release(opt)


def test_topk_send_zeros_false_sends_the_nonzeros_alone():
    """An embedding whose gradient has fewer nonzeros than Top-k 10x keeps (each rank touches a
    different number of rows): with ``send_zeros=False`` every rank sends its nonzeros alone,
    8 bytes each, and the averaged gradient is dense SGD's (nothing was left behind), as
    hvd.DistributedOptimizer computes it on the same batches."""
    def make():
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.EmbeddingBag(2000, 16, mode="sum"), torch.nn.Linear(16, 5))
        hvd.broadcast_parameters(m.state_dict(), root_rank=0)
        return m

    def local_batch(step):
        g = torch.Generator().manual_seed(100 * step + RANK)
        rows = torch.randperm(2000, generator=g)[:10 * (RANK + 1)]
        return rows.view(-1, 2), torch.randint(0, 5, (rows.numel() // 2,), generator=g)

    ours, ref = make(), make()
    opt = hg_opt(ours, controller=hg.StaticCF(10), bucket_cap_mb=64,
                 compressor=lambda cf: TopKCompressor(cf=cf, send_zeros=False))
    ref_opt = hvd.DistributedOptimizer(torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9),
                                       named_parameters=ref.named_parameters())
    for step in range(3):
        x, y = local_batch(step)
        for model, o in ((ours, opt), (ref, ref_opt)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            o.synchronize()
        local = torch.cat([p.grad.reshape(-1) for p in ours.parameters()])   # (the averaged one now)
        for p, q in zip(ours.parameters(), ref.parameters()):
            err = (p.grad - q.grad).abs().max().item()
            assert err <= 1e-6, f"step {step}: Top-k 10x differs from dense by {err}"
        for o in (opt, ref_opt):
            with o.skip_synchronize():
                o.step()
        nonzeros = 16 * 10 * (RANK + 1) + 16 * 5 + 5   # touched rows, then the linear layer
        assert opt.stats["bytes_sent"] == 8 * nonzeros, (opt.stats["bytes_sent"], nonzeros, local.numel())
    sent = hvd.allgather_object(opt.stats["bytes_sent"])
    assert len(set(sent)) == SIZE, sent
    assert_identical_across_ranks(ours, "topk-send-zeros-false")
    release(opt)


# ---------------------------------------------------------------------------------------------
PAIR_CASES = {   # fresh controllers for each run
    "static-topk-10": lambda: dict(controller=hg.StaticCF(10)),
    "static-randomk-unshared": lambda: dict(controller=hg.StaticCF(10),
                                            compressor=lambda cf: RandomKCompressor(cf=cf, seed=None)),
    "gravac": lambda: dict(controller=hg.GraVAC(theta_min=2, theta_max=200, epsilon=0.3, window=4)),
    "accordion": lambda: dict(controller=hg.Accordion(low_cf=4, high_cf=64, interval=5)),
    "static-topk-nonfinite-zero": lambda: dict(controller=hg.StaticCF(10), nonfinite="zero"),
}


@pytest.mark.parametrize("case", sorted(PAIR_CASES))
def test_pair_exchange_equals_allgather(case):
    """Two ranks swap fixed-size payloads through one reducescatter (``PairExchange``); three
    or more ranks, or payloads whose size may differ between ranks, take the allgather.  The
    pair exchange lays the two blocks out in the allgather's order, so training is bitwise
    the same as through the allgather (``check_consistency=False`` forces that path)."""
    results, kinds = {}, {}
    for label, consistency in (("pair", True), ("allgather", False)):
        model = make_model()
        opt = hg_opt(model, check_consistency=consistency, **PAIR_CASES[case]())
        seen = set()
        train(model, opt, 12, hook=lambda step, o: seen.update(o.stats["transfers"].split("+")))
        assert_identical_across_ranks(model, f"pair.{case}.{label}")
        results[label], kinds[label] = flat_params(model), seen
        release(opt)
    used, unused = ("pair", "sparse") if SIZE == 2 else ("sparse", "pair")
    assert used in kinds["pair"] and unused not in kinds["pair"], kinds
    assert "sparse" in kinds["allgather"] and "pair" not in kinds["allgather"], kinds
    # Bitwise between the two runs on two ranks, where they take different collectives (with
    # three, a dense step's allreduce may fuse, and so add, differently in two runs).  Not
    # for Random-k without a seed (OS entropy) or GraVAC (its checks read step times).
    if SIZE == 2 and case not in ("static-randomk-unshared", "gravac"):
        assert torch.equal(results["pair"], results["allgather"]), \
            f"{case}: the pair exchange and the allgather trained differently"


def test_pair_exchange_leaves_variable_counts_to_the_allgather():
    """DGC keeps a different count on each rank: its payloads always take the allgather."""
    model = make_model()
    opt = hg_opt(model, controller=hg.StaticCF(10), compressor=hg.DGCCompressor)
    seen = set()
    train(model, opt, 4, hook=lambda step, o: seen.update(o.stats["transfers"].split("+")))
    assert seen == {"sparse"}, seen
    assert_identical_across_ranks(model, "pair.dgc")
    release(opt)
