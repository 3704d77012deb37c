"""The sparse allreduce (``transfers.SparseAllreduce``, ``regions.py``) and the choice of exchange
(``exchange.py``), on one process: P ranks' transfers run side by side on an in-process
backend that answers each collective once every rank has submitted it."""
import math
import threading
import time

import pytest
import torch

from horovod_gravac import exchange, regions, wire
from horovod_gravac.backend import CollectiveBackend
from horovod_gravac.comm import MismatchedShapesError
from horovod_gravac.compressors import SparsePayload
from horovod_gravac.error_feedback import ErrorFeedback
from horovod_gravac.transfers import DenseAllreduce, Link, PairExchange, SparseAllgather, SparseAllreduce


class World:
    """Collectives of ``size`` in-process ranks: a result is computed when a rank waits,
    from every rank's submission under that name."""

    def __init__(self, size):
        self.size = size
        self.calls = {}   # name -> {rank: (op, tensor, splits)}
        self.lock = threading.Lock()

    def backend(self, rank):
        return _Rank(self, rank)


class _Rank(CollectiveBackend):
    def __init__(self, world, rank):
        self.world, self.me = world, rank

    def rank(self):
        return self.me

    def size(self):
        return self.world.size

    def _submit(self, op, tensor, name, splits=None):
        with self.world.lock:
            self.world.calls.setdefault(name, {})[self.me] = (op, tensor.clone(), splits)
        return name

    def allreduce_async(self, tensor, name, op=None, prescale_factor=1.0, postscale_factor=1.0):
        return self._submit("allreduce", tensor, name)

    def allgather_async(self, tensor, name):
        return self._submit("allgather", tensor, name)

    def alltoall_async(self, tensor, splits, name):
        assert len(splits) == self.world.size and sum(splits) == tensor.shape[0]
        return self._submit("alltoall", tensor, name, list(splits))

    def pair_exchange_async(self, block, name):
        return self._submit("pair", block, name)

    def broadcast_async_(self, tensor, name, root=0):
        raise NotImplementedError

    def wait(self, handle, name, timeout=None):
        deadline = time.monotonic() + 10   # (ranks on threads: wait for the others' submissions)
        while len(self.world.calls.get(handle, ())) < self.world.size and time.monotonic() < deadline:
            time.sleep(0.001)
        calls = self.world.calls[handle]
        assert len(calls) == self.world.size, f"{handle}: only ranks {sorted(calls)} submitted"
        op = calls[0][0]
        if any(c[0] != op for c in calls.values()):   # as Horovod: refused on every rank
            raise MismatchedShapesError(f"Mismatched operations ({handle})")
        if op == "allgather":
            return torch.cat([calls[r][1] for r in range(self.world.size)])
        parts = []
        for r in range(self.world.size):
            _, t, splits = calls[r]
            start = sum(splits[:self.me])
            parts.append(t[start:start + splits[self.me]])
        return torch.cat(parts)


def payload(values, indices, dtype=torch.float32):
    return SparsePayload(torch.tensor(values, dtype=dtype), torch.tensor(indices, dtype=torch.int32))


def run(payloads, numel, cf, cls=SparseAllreduce, stats=None, partition=None, average=True, dtype=torch.float32):
    """Every rank's transfer of its payload through one in-process world; the aggregates
    (one per rank) and the transfers."""
    world = World(len(payloads))
    transfers = []
    for r, p in enumerate(payloads):
        link = Link(world.backend(r), average, 1.0, world.size, 10.0)
        if cls is SparseAllreduce:
            part = partition[r] if partition is not None else regions.RegionPartition()
            t = cls(link, "b.0", p, numel, "cpu", stats is not None, cf, part, torch.Generator().manual_seed(0))
        else:
            t = cls(link, "b.0", p, numel, "cpu", stats is not None)
        transfers.append(t)
    for r, t in enumerate(transfers):
        t.start(None if stats is None else stats[r])
    for t in transfers:
        t.advance()
    return [t.finish() for t in transfers], transfers


def random_payloads(world, numel, k, seed=0, dtype=torch.float32, spread=None):
    g = torch.Generator().manual_seed(seed)
    out = []
    for r in range(world):
        kr = k if spread is None else int(torch.randint(0, 2 * k, (1,), generator=g))
        # (spread: uneven sizes, rank 0's crowded into the bucket's first eighth)
        idx = torch.randperm(numel if spread is None or r else numel // 8, generator=g)[:kr].to(torch.int32)
        out.append(SparsePayload(torch.randn(idx.numel(), generator=g, dtype=torch.float64).to(dtype), idx))
    return out


@pytest.mark.parametrize("world", [2, 3, 4, 5, 8])
def test_when_nothing_is_dropped_the_sum_is_the_allgathers_bit_for_bit(world, monkeypatch):
    """With a quota no region can exceed, every sum survives: the aggregate equals the
    allgather path's bit for bit (the owners add in source-rank order, as unpack_sum does)."""
    monkeypatch.setattr(SparseAllreduce, "KEEP", 1e9)
    numel = 5000
    payloads = random_payloads(world, numel, 600, seed=world, spread=True)
    ours, transfers = run(payloads, numel, cf=10)
    theirs, _ = run(payloads, numel, cf=10, cls=SparseAllgather)
    for r in range(world):
        assert torch.equal(ours[r], theirs[r])
        assert torch.equal(ours[r], ours[0])
        assert transfers[r].delivered_indices().numel() == payloads[r].indices.numel()


@pytest.mark.parametrize("world", [3, 4, 8])
def test_the_selection_keeps_k_sums_and_the_residual_keeps_the_rest(world):
    numel, cf = 8000, 10
    k = numel // cf
    payloads = random_payloads(world, numel, k, seed=1)
    out, transfers = run(payloads, numel, cf)
    for r in range(1, world):
        assert torch.equal(out[r], out[0])   # every rank builds the same aggregate
    quota = math.ceil(k / world)
    assert (out[0] != 0).sum() <= world * quota
    # the aggregate is the average of the ranks' payloads at the selected indices
    full = sum(torch.zeros(numel).index_add_(0, p.indices.long(), p.values) for p in payloads) / world
    selected = out[0] != 0
    assert torch.equal(out[0][selected], full[selected])
    # error feedback: sent + new residual == g_ef, on every rank
    for r, (p, t) in enumerate(zip(payloads, transfers)):
        g_ef = torch.zeros(numel).index_put_((p.indices.long(),), p.values)
        memory = ErrorFeedback()
        memory.residuals[0] = g_ef.clone()
        t.commit(memory, 0)
        delivered = t.delivered_indices().long()
        sent = torch.zeros(numel).index_put_((delivered,), g_ef[delivered])
        assert torch.equal(sent + memory.residuals[0], g_ef)
        assert bool(selected[delivered].all())   # what counts as sent was selected
        values, indices = t.dropped()
        assert not bool(selected[indices.long()].any())
        assert values.numel() + delivered.numel() == p.values.numel()


def test_the_kept_sums_are_the_largest_of_each_region():
    world, numel = 4, 4000
    payloads = random_payloads(world, numel, 400, seed=2)
    out, transfers = run(payloads, numel, cf=10)
    full = sum(torch.zeros(numel).index_add_(0, p.indices.long(), p.values) for p in payloads) / world
    bounds = [0] + regions.even_boundaries(numel, world).tolist() + [numel]   # the first step's regions
    for j in range(world):
        region = full[bounds[j]:bounds[j + 1]]
        kept = out[0][bounds[j]:bounds[j + 1]] != 0
        if kept.any():
            assert float(region[kept].abs().min()) >= float(region[~kept].abs().max())


def test_an_empty_payload_on_one_rank_and_float64_values():
    numel = 3000
    payloads = random_payloads(3, numel, 200, seed=3, dtype=torch.float64)
    payloads[1] = payload([], [], dtype=torch.float64)
    out, transfers = run(payloads, numel, cf=15, dtype=torch.float64)
    assert out[0].dtype == torch.float64 and all(torch.equal(o, out[0]) for o in out)
    assert transfers[1].delivered_indices().numel() == 0
    assert transfers[0].row_bytes == 12


def test_statistics_ride_in_the_gather_and_average_as_the_allgathers():
    numel, world = 2000, 3
    payloads = random_payloads(world, numel, 100, seed=4)
    stats = [torch.arange(wire.N_STATS, dtype=torch.float64) * (r + 1.5) + 1e-300 for r in range(world)]
    _, ours = run(payloads, numel, cf=20, stats=stats)
    _, theirs = run(payloads, numel, cf=20, cls=SparseAllgather, stats=stats)
    for a, b in zip(ours, theirs):
        assert torch.equal(a.stats, b.stats)


def test_a_nan_reaches_every_rank():
    numel = 1000
    payloads = random_payloads(3, numel, 50, seed=5)
    payloads[2] = SparsePayload(torch.tensor([float("nan")]), torch.tensor([7], dtype=torch.int32))
    out, _ = run(payloads, numel, cf=20)
    assert all(torch.isnan(o).any() for o in out)


def test_the_boundaries_follow_the_payloads_and_stay_the_same_on_every_rank():
    """After one exchange every rank holds the same boundaries, which split the payloads'
    indices evenly; ranks that disagree on them (an elastic joiner) still sum every entry once."""
    world, numel = 4, 40000
    g = torch.Generator().manual_seed(6)
    payloads = []
    for r in range(world):   # every rank's entries crowd into the first tenth of the bucket
        idx = torch.randperm(numel // 10, generator=g)[:400].to(torch.int32)
        payloads.append(SparsePayload(torch.randn(400, generator=g), idx))
    parts = [regions.RegionPartition() for _ in range(world)]
    run(payloads, numel, cf=100, partition=parts)
    bounds = [p.boundaries("b.0", numel, world) for p in parts]
    assert all(torch.equal(b, bounds[0]) for b in bounds)
    assert int(bounds[0][-1]) <= numel // 10 + numel // regions.PROPOSAL_BINS + 1
    _, transfers = run(payloads, numel, cf=100, partition=parts)
    splits = [t.splits for t in transfers]
    assert max(max(s) for s in splits) <= 2 * 400 // world   # balanced: about k/P to each owner
    parts[2].reset()   # one rank forgets: the sums are still complete and identical
    monkey = SparseAllreduce.KEEP
    SparseAllreduce.KEEP = 1e9
    try:
        out, _ = run(payloads, numel, cf=100, partition=parts)
    finally:
        SparseAllreduce.KEEP = monkey
    full = sum(torch.zeros(numel).index_add_(0, p.indices.long(), p.values) for p in payloads) / world
    assert all(torch.equal(o, out[0]) for o in out)
    assert torch.allclose(out[0], full, atol=1e-6)


def test_bytes_a_rank_sends_stay_near_two_k_whatever_the_world():
    numel, cf = 80000, 10
    k = numel // cf
    for world in (4, 8, 16):
        payloads = random_payloads(world, numel, k, seed=world)
        _, transfers = run(payloads, numel, cf)
        for t in transfers:
            words = t.wire_bytes / 4
            assert words <= 6 * k * (world - 1) / world + 2 * (world + 1) * world   # Ok-Topk's bound + headers
        _, gathered = run(payloads, numel, cf, cls=SparseAllgather)
        assert transfers[0].wire_bytes < gathered[0].wire_bytes


def test_ranks_that_picked_different_exchanges_regather_and_stay_identical():
    """Decisions that diverged between two consensus checks pick different exchanges for one
    bucket: the library refuses the mismatched collectives on every rank, and every rank sends
    its contribution again with one allgather; the ranks add the same rows."""

    class Plain:
        @staticmethod
        def compress(t):
            return t, None

        @staticmethod
        def decompress(t, ctx):
            return t

    numel, world = 3000, 4
    payloads = random_payloads(world, numel, 300, seed=7)
    dense = torch.randn(numel, generator=torch.Generator().manual_seed(8))
    w = World(world)
    stats = [torch.full((wire.N_STATS,), float(r + 1), dtype=torch.float64) for r in range(world)]
    made = []
    for r in range(world):
        link = Link(w.backend(r), True, 1.0, world, 10.0)
        args = (link, "b.0", payloads[r], numel, "cpu", True)
        made.append([lambda: DenseAllreduce(link, "b.0", dense.clone(), True, Plain),
                     lambda: SparseAllgather(*args),
                     lambda: SparseAllreduce(*args, 10.0, regions.RegionPartition()),
                     lambda: PairExchange(*args)][r]())
    for r, t in enumerate(made):
        t.start(stats[r])
    out = [None] * world

    def rank(r):   # each rank on its own thread, as real ranks wait for each other
        made[r].advance()
        out[r] = made[r].finish()
    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(o is not None for o in out), "a rank did not finish"
    assert all(torch.equal(o, out[0]) for o in out)
    want = (dense + sum(torch.zeros(numel).index_add_(0, p.indices.long(), p.values) for p in payloads[1:])) / world
    assert torch.allclose(out[0], want, atol=1e-6)
    assert all(t.kind == "sparse" for t in made)
    assert all(torch.equal(t.stats, torch.stack(stats).sum(0) / world) for t in made)
    assert made[2].delivered_indices().numel() == payloads[2].indices.numel()   # all of it went out


# -- the choice of exchange ------------------------------------------------------------------
LINK = exchange.LinkModel.from_rate("100mbit")


def test_the_paper_path_is_chosen_as_before_in_allgather_mode():
    assert exchange.choose("allgather", 10 ** 6, 10 ** 5, 2, LINK).kind == "pair"
    assert exchange.choose("allgather", 10 ** 6, 10 ** 5, 2, LINK, fixed_count=False).kind == "sparse"
    assert exchange.choose("allgather", 10 ** 6, 10 ** 5, 16, LINK).kind == "sparse"
    assert exchange.choose("allgather", 10 ** 6, 10 ** 5, 4, LINK, join_safe=True).kind == "slotted"
    assert exchange.choose("auto", 10 ** 6, 10 ** 5, 4, LINK, shared_indices=True).kind == "shared"


@pytest.mark.parametrize("world", [2, 3, 4, 8, 16, 32, 64, 256])
@pytest.mark.parametrize("cf", [2, 10, 100, 1000])
def test_auto_is_never_modelled_slower_than_dense_and_scales(world, cf):
    for link in (LINK, exchange.LinkModel(), exchange.LinkModel.from_rate("100gbit")):
        numel = 1_340_000
        auto = exchange.choose("auto", numel, numel // cf, world, link)
        dense = exchange.exchange_cost("dense", numel, numel, world, link)
        assert auto.seconds <= dense.seconds
        if world == 2:
            assert auto.kind in ("pair", "dense")
        if link is LINK and world >= 4 and cf in (10, 100):
            assert auto.kind == "sparse_allreduce"
            assert auto.wire_bytes <= 2 * 8 * (numel // cf) + 8 * world


def test_the_comm_model_ranks_cfs_with_dense_among_them():
    model = exchange.CommModel("auto", LINK, 16, [exchange.BucketShape(1_340_000)])
    table = model.table([1, 10, 100])
    assert table[1.0]["kinds"] == ["dense"] and table[10.0]["kinds"] == ["sparse_allreduce"]
    assert table[100.0]["seconds"] < table[10.0]["seconds"] < table[1.0]["seconds"]
    assert model.fastest([1, 10]) == 10.0
    paper = exchange.CommModel("allgather", LINK, 64, [exchange.BucketShape(1_340_000)])
    assert paper.fastest([1, 10]) == 1.0   # an allgather at 64 ranks loses to dense at 10x
    model.observe("sparse_allreduce", 10, 0.5)
    model.observe("sparse_allreduce", 10, 0.3)
    model.observe("sparse_allreduce", 10, 0.4)
    assert model.measured[("sparse_allreduce", 10.0)] == 0.4


def test_link_and_mode_arguments_are_checked(monkeypatch):
    assert exchange.check_link("10gbit").bandwidth == 1.25e9
    assert exchange.LinkModel().bandwidth == 1.25e8   # 1 Gbit/s unless told
    monkeypatch.setenv(exchange.LINK_ENV, "100mbit")
    assert exchange.check_link(None).bandwidth == 1.25e7
    with pytest.raises(ValueError, match="link"):
        exchange.check_link("fast")
    with pytest.raises(ValueError, match="exchange must be one of"):
        exchange.check_mode("ring")
