"""The thresholds read off a sample: ``sampling.sample_rank_values`` sorts once on accelerators
and runs ``kthvalue`` per rank on the CPU; both must give the same values, NaN counted as
largest, ranks clamped to the sample, and neither may make the device wait for the host."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from horovod_gravac.selection import sampling


def _both(sample, ranks, monkeypatch):
    out = {}
    for sorts in (True, False):
        monkeypatch.setattr(sampling, "_sorts", lambda s, sorts=sorts: sorts)
        out[sorts] = [float(v) for v in sampling.sample_rank_values(sample, ranks)]
    return out[True], out[False]


@pytest.mark.parametrize("kind", ["laplace", "ties", "nan"])
def test_sort_and_kthvalue_agree_on_every_rank(kind, monkeypatch):
    g = torch.Generator().manual_seed(3)
    x = torch.distributions.Laplace(0.0, 1.0).sample((5000,)).abs()
    if kind == "ties":
        x = torch.randint(0, 7, (5000,), generator=g).float()
    if kind == "nan":
        x[torch.randperm(5000, generator=g)[:40]] = float("nan")
    ranks = [1, 2, 39, 40, 41, 400, 2500, 4999, 5000]
    by_sort, by_select = _both(x, ranks, monkeypatch)
    want = torch.sort(x, descending=False).values          # NaN sorts last: largest
    for r, a, b in zip(ranks, by_sort, by_select):
        w = float(want[5000 - r])
        assert (a == b == w) or (a != a and b != b and w != w), (r, a, b, w)
    if kind == "nan":
        assert all(v != v for v in by_sort[:4]) and by_sort[4] == by_sort[4]   # the 40 NaN are the top 40


def test_ranks_are_clamped_to_the_sample(monkeypatch):
    x = torch.tensor([3.0, 1.0, 2.0])
    by_sort, by_select = _both(x, [0, -5, 1, 3, 4, 100], monkeypatch)
    assert by_sort == by_select == [3.0, 3.0, 3.0, 1.0, 1.0, 1.0]


def test_sample_quantiles_reads_ranks_scaled_to_the_sample(monkeypatch):
    monkeypatch.setattr(sampling, "_sorts", lambda s: True)
    x = torch.arange(1, 1001, dtype=torch.float32)           # rank r from the top is 1001 - r
    lo, hi = sampling.sample_quantiles(x, 100_000, [5000, 1000])   # counts of 100k -> ranks 50, 10
    assert (float(lo), float(hi)) == (951.0, 991.0)
    assert float(sampling.sample_quantile(x, 100_000, 5000)) == 951.0


class _Syncs(TorchDispatchMode):
    SYNC = {"aten::_local_scalar_dense", "aten::nonzero", "aten::item", "aten::is_nonzero", "aten::equal"}

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func._schema.name in self.SYNC
        return func(*args, **(kwargs or {}))


def test_reading_ranks_off_the_sort_does_not_sync(monkeypatch):
    monkeypatch.setattr(sampling, "_sorts", lambda s: True)
    x = torch.rand(131072)
    with _Syncs() as c:
        values = sampling.sample_rank_values(x, [100, 5000])
    assert c.n == 0 and all(v.dim() == 0 for v in values)


def test_accelerators_sort_and_the_cpu_selects():
    assert not sampling._sorts(torch.zeros(3))
    assert sampling._sorts(torch.zeros(3, device="meta"))


# -- the strata of a stratified sample are kept between calls -------------------------------------
def _fresh_indices(numel, k, seed):
    sampling._STRATA.clear()
    return sampling.stratified_indices(numel, k, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("numel,k", [(1000, 10), (1003, 10), (1_000_003, 4096), (70_000, 7)])
def test_kept_strata_give_the_same_draws_as_fresh_ones(numel, k):
    want = [_fresh_indices(numel, k, seed) for seed in range(3)]
    for seed in range(3):   # now from the kept strata
        got = sampling.stratified_indices(numel, k, torch.Generator().manual_seed(seed))
        assert torch.equal(got, want[seed])
    size = numel // k
    assert all(((w >= torch.arange(k) * size) & (w < numel)).all() for w in want)


def test_kept_strata_stay_under_their_byte_budget(monkeypatch):
    monkeypatch.setattr(sampling, "_STRATA_BYTES", 200_000)
    sampling._STRATA.clear()
    g = torch.Generator().manual_seed(0)
    for numel in range(50_000, 60_000, 1_001):   # unequal strata: three tensors of 4096 each
        sampling.stratified_indices(numel, 4096, g)
        assert sum(map(sampling._nbytes, sampling._STRATA.values())) <= 200_000
    assert 1 <= len(sampling._STRATA) < 10
    last = (59_009, 4096, torch.float32, "cpu")
    assert last in sampling._STRATA                  # the most recent one is kept
    sampling._STRATA.clear()


def test_a_kept_stratified_sample_runs_five_operations():
    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += not func.is_view
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(0)
    for numel in (40_960, 40_963):   # equal and unequal strata
        sampling.stratified_indices(numel, 4096, g)
        with Ops() as ops:
            sampling.stratified_indices(numel, 4096, g)
        assert ops.n <= 5, (numel, ops.n)
