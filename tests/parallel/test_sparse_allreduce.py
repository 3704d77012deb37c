"""The sparse allreduce (``transfers.SparseAllreduce``) and the choice of exchange
(``exchange.py``) on real Horovod ranks: every rank runs this file under

    horovodrun -np N -H localhost:N --gloo python -m pytest tests/parallel/test_sparse_allreduce.py

(tests/integration/test_sparse_allreduce_ranks.py launches it: 4 ranks in the default run, 2, 3, 5
and 8 with ``-m scale``).  Checked: ranks bitwise identical under every sparsifier and
controller; the same bits as the allgather path when the global selection drops nothing, and
the same training within a stated tolerance when it does; uneven payloads, an empty payload
on one rank, float64 buckets, ``join_safe``; the exchange ``"auto"`` picks at this world size."""
import math

import pytest
import torch

import horovod.torch as hvd
import horovod_gravac as hg
from horovod_gravac import transfers

hvd.init()
torch.set_num_threads(1)
RANK, SIZE = hvd.rank(), hvd.size()
SPARSIFIERS = {
    "topk": hg.TopKCompressor, "dgc": hg.DGCCompressor, "redsync": hg.RedSyncCompressor,
    "sidco": hg.SIDCoCompressor, "randomk": lambda cf: hg.RandomKCompressor(cf=cf, seed=None),
}


def make_model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 5)).to(dtype)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


def batch(step, dtype=torch.float32, rank=None):
    g = torch.Generator().manual_seed(1000 * step + (RANK if rank is None else rank))
    x = torch.randn(32, 32, generator=g)
    return x.to(dtype), (x[:, :5].argmax(1))   # a learnable task: the largest of the first five inputs


def train(model, opt, steps, dtype=torch.float32, zero_grad_rank=None, losses=None):
    for step in range(steps):
        x, y = batch(step, dtype)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if RANK == zero_grad_rank:
            loss = loss * 0.0   # this rank's gradient is all zeros: an empty payload
        loss.backward()
        opt.step()
        if losses is not None:
            losses.append(float(loss.detach()))
    return opt


def flat(model):
    return torch.cat([p.detach().double().reshape(-1) for p in model.parameters()])


def assert_identical(tensor, what):
    everyone = hvd.allgather(tensor.unsqueeze(0), name=f"sar.{what}")
    for r in range(SIZE):
        assert torch.equal(everyone[r], everyone[0]), \
            f"{what}: rank {r} differs from rank 0 by {(everyone[r] - everyone[0]).abs().max().item():.3e}"


def opt_for(model, exchange, compressor=hg.TopKCompressor, controller=None, lr=0.1, momentum=0.9, **kw):
    kw.setdefault("bucket_cap_mb", 0.02)   # several buckets, one of them large
    return hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum),
                                   named_parameters=model.named_parameters(), compressor=compressor,
                                   controller=controller or hg.StaticCF(10), exchange=exchange, **kw)


@pytest.mark.parametrize("name", list(SPARSIFIERS))
def test_ranks_stay_bitwise_identical_under_every_sparsifier(name):
    model = make_model()
    opt = train(model, opt_for(model, "sparse_allreduce", SPARSIFIERS[name]), 6)
    assert_identical(flat(model), f"params.{name}")
    assert opt.stats["transfers"] == "sparse_allreduce" if SIZE > 1 else True
    assert 0.0 < opt.stats["kept_share"] <= 1.0
    opt.close()


@pytest.mark.parametrize("variant", ["ladder", "delivered", "predictive"])
def test_ranks_stay_identical_under_gravac(variant):
    model = make_model()
    opt = opt_for(model, "sparse_allreduce",
                  controller=hg.GraVAC(theta_min=2, theta_max=32, epsilon=0.3, window=3, variant=variant))
    train(model, opt, 10)
    assert_identical(flat(model), f"params.gravac.{variant}")
    assert_identical(torch.tensor([opt.controller.decision.send_cf]), f"cf.{variant}")
    opt.close()


@pytest.mark.parametrize("name", ["topk", "dgc"])
def test_when_nothing_is_dropped_it_trains_bit_for_bit_as_the_allgather(name, monkeypatch):
    """Where the semantics agree (the global selection keeps every sum: a quota no region
    can exceed), the sparse allreduce delivers exactly what the allgather path does."""
    monkeypatch.setattr(transfers.SparseAllreduce, "KEEP", 1e9)
    runs = {}
    for exchange in ("allgather", "sparse_allreduce"):
        model = make_model()
        opt = train(model, opt_for(model, exchange, SPARSIFIERS[name]), 8)
        runs[exchange] = flat(model)
        opt.close()
    assert torch.equal(runs["allgather"], runs["sparse_allreduce"])


def test_with_the_global_selection_it_trains_as_the_allgather_within_tolerance():
    """The stated tolerance: Top-k 10x for 60 steps on a learnable task; the mean loss over
    the last 20 steps within 30 % of the allgather path's (or below it), and well below the
    first steps' loss.  (The allgather delivers up to P k entries a step, the sparse allreduce
    the k largest sums; error feedback delivers the rest later.  Seen: 10 % above on 2 ranks,
    22 % on 8.)"""
    means = {}
    for exchange in ("allgather", "sparse_allreduce"):
        model = make_model()
        losses = []
        opt = train(model, opt_for(model, exchange, lr=0.05), 60, losses=losses)
        loss = torch.tensor([sum(losses[-20:]) / 20, sum(losses[:5]) / 5], dtype=torch.float64)
        means[exchange] = hvd.allreduce(loss, name=f"sar.loss.{exchange}", op=hvd.Average)
        opt.close()
    ours, theirs = means["sparse_allreduce"], means["allgather"]
    print(f"mean loss of the last 20 steps, first 5: sparse allreduce {ours.tolist()}, allgather {theirs.tolist()}")
    assert float(ours[0]) <= 1.3 * float(theirs[0]), (ours.tolist(), theirs.tolist())
    assert float(ours[0]) < 0.7 * float(ours[1]), ours.tolist()


def test_uneven_payloads_and_an_empty_payload_on_one_rank():
    """DGC keeps a different number of entries on every rank; with Top-k that leaves zeros
    out (``send_zeros=False``), the last rank's all-zero gradient sends nothing at all."""
    for name, comp in (("dgc", hg.DGCCompressor), ("topk-nozeros", lambda cf: hg.TopKCompressor(cf, send_zeros=False))):
        model = make_model()
        opt = opt_for(model, "sparse_allreduce", comp)
        train(model, opt, 5, zero_grad_rank=SIZE - 1)
        assert_identical(flat(model), f"params.uneven.{name}")
        if name == "topk-nozeros" and RANK == SIZE - 1:
            assert opt.stats["floats_sent"] == 0
        opt.close()


def test_float64_buckets_travel_in_float64():
    model = make_model(torch.float64)
    opt = opt_for(model, "sparse_allreduce", controller=hg.GraVAC(theta_min=2, theta_max=16, epsilon=0.3, window=2))
    train(model, opt, 6, dtype=torch.float64)
    assert_identical(flat(model), "params.f64")
    assert all(r.dtype == torch.float64 for r in opt.residuals().values())
    kinds = {kind for kind, _, _ in opt.last_collectives}
    assert kinds <= {"sparse_allreduce", "dense"}, kinds
    opt.close()


def test_join_safe_keeps_every_collective_an_allreduce():
    """``join_safe=True``: the sparse allreduce's alltoall and allgather are not allowed
    under ``hvd.join()``, so payloads travel in allreduce slots (or dense, when the model says
    that is cheaper); uneven data with ``hvd.join()`` still leaves identical ranks."""
    for exchange in ("auto", "sparse_allreduce"):
        model = make_model()
        opt = opt_for(model, exchange, join_safe=True, momentum=0.0)   # (no momentum that differs by rank)
        for step in range(2 + RANK):
            x, y = batch(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            assert set(opt.stats["transfers"].split("+")) <= {"slotted", "dense"}, opt.stats["transfers"]
        hvd.join()
        hvd.broadcast_parameters(model.state_dict(), SIZE - 1)
        train(model, opt, 2)
        assert_identical(flat(model), f"params.join.{exchange}")
        opt.close()


def test_auto_picks_by_modelled_cost_at_this_world_size():
    """On a 100 Mbit/s link model a large bucket at 10x takes the pair exchange between two
    ranks and the sparse allreduce beyond; at CF 1.5 the dense allreduce costs less than any
    sparse send and is sent instead; the stats and ``comm_model`` say so on every rank."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 5))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for cf, want in ((10, "pair" if SIZE == 2 else "sparse_allreduce"), (1.5, "dense")):
        opt = hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                      named_parameters=model.named_parameters(), controller=hg.StaticCF(cf),
                                      link="100mbit")
        x = torch.randn(8, 256)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        assert opt.stats["transfers"] == want and opt.stats["exchange"] == "auto", opt.stats
        table = opt.comm_model.table([1, cf])
        assert table[float(cf)]["kinds"] == [want]
        assert table[float(cf)]["seconds"] <= table[1.0]["seconds"]
        assert opt.stats["comm_model_s"] == pytest.approx(table[float(cf)]["seconds"])
        assert opt.stats["dense_model_s"] == pytest.approx(table[1.0]["seconds"])
        if want == "sparse_allreduce":
            k = math.ceil(model[0].weight.numel() + model[0].bias.numel() + model[2].weight.numel()
                          + model[2].bias.numel()) // cf
            assert opt.stats["wire_bytes"] <= 24 * k * (SIZE - 1) / SIZE + 8 * (SIZE + 1) * SIZE + 400
        opt.close()


def test_the_paper_path_is_kept_and_selectable():
    model = make_model()
    opt = train(model, opt_for(model, "allgather", bucket_cap_mb=25), 3)
    assert opt.stats["transfers"] == ("pair" if SIZE == 2 else "sparse") and opt.stats["exchange"] == "allgather"
    opt.close()


def test_gravac_sends_dense_where_every_rung_is_slower_than_dense(monkeypatch):
    """The paper's allgather, CFs 3 and 3.5: a rank sends (P-1) x 8 bytes x n/CF against
    dense's 2 (P-1)/P x 4n.  Two ranks (the pair exchange, 2.7n bytes at 3x against 4n)
    compress; from four ranks on (8n at 3x against 6n) both rungs cost more than dense.  On
    an emulated 20 Mbit/s link GraVAC() measures theta_min, predicts dense from it through
    the exchange model and sends dense from its first check on; at two ranks it keeps
    compressing (three ranks, a tie in bytes, is not asserted).  Ranks agree on every step's
    CF and stay identical."""
    from horovod_gravac.exchange import LINK_ENV
    from horovod_gravac.link_emulation import EMULATE_ENV
    monkeypatch.setenv(EMULATE_ENV, "20mbit")
    monkeypatch.setenv(LINK_ENV, "20mbit")
    model = make_model()
    ctrl = hg.GraVAC(theta_min=3, theta_max=3.5, window=16, coherence_max=1.0)
    opt = hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                  named_parameters=model.named_parameters(), compressor=hg.TopKCompressor,
                                  controller=ctrl, exchange="allgather")
    cfs = []
    for step in range(12):   # one check (step 4): the next, a window later, reads noisy timings
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        cfs.append(float(opt.stats["cf"]))
    assert cfs[:4] == [3.0] * 4   # theta_min until the first check (a quarter window)
    if SIZE == 2:
        assert 1.0 not in cfs, cfs
    elif SIZE >= 4:
        assert set(cfs[5:]) == {1.0}, cfs
        if RANK == 0:
            assert ctrl.dense_by_cost and ctrl.history[0]["move"] == "dense"
            assert ctrl.predicted_step[1.0] < ctrl.predicted_step[3.0]
    everyone = hvd.allgather_object(cfs)
    assert all(c == cfs for c in everyone)
    assert_identical(flat(model), "params.dense_rung")
    opt.close()
