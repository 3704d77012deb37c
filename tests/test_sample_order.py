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
