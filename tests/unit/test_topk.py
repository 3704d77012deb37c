"""Exactness of Top-k's sampled-threshold selection (``horovod_gravac.selection.topk``).

The CPU path (NumPy) is checked index for index against a reference that states its
rule: the k largest magnitudes, NaN largest, ties at the k-th magnitude resolved
towards the lowest flat index.  The accelerator path (torch ops; run here on CPU
tensors) is checked on the kept magnitudes.  Sizes straddle the thresholds of the
implementation (tiny / exact / sampled, chunk boundaries), inputs include heavy ties,
all-zero and mostly-zero tensors, NaN, k = 1 and k close to n, and both forced misses
of the sampled threshold.
"""
import collections

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.step_cost import SYNC_OPS
from horovod_gravac import native
from horovod_gravac.compressors import TopKCompressor, kept_count
from horovod_gravac.selection import sampling
from horovod_gravac.selection import topk as T
from horovod_gravac.selection.topk import topk_indices

CHUNK = T._CHUNK
SIZES = [T._TINY - 1, T._TINY + 1, T._SMALL, T._SMALL + 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 7, 300_001]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def native_mode(cpu_path):
    """Every test runs on each CPU path (the native kernels with and without SIMD, NumPy)."""
    return cpu_path


def reference(x: torch.Tensor, k: int) -> set:
    """Top-k of |x| by the stated rule: NaN largest, then magnitude, ties to the lowest index."""
    m = x.detach().reshape(-1).float().abs().numpy().astype(np.float64)
    nan = np.isnan(m)
    order = np.lexsort((np.arange(m.size), -np.where(nan, 0.0, m), -nan.astype(np.int8)))
    return set(order[:k].tolist())


def data(kind: str, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "laplace":
        return torch.distributions.Laplace(0.0, 1.0).sample((n,))
    if kind == "normal":
        return torch.randn(n, generator=g)
    if kind == "ties":        # magnitudes 0..3, heavy ties at every threshold
        return torch.randint(-3, 4, (n,), generator=g).float()
    if kind == "constant":
        return torch.full((n,), -1.5)
    if kind == "zeros":
        return torch.zeros(n)
    if kind == "sparse":      # 0.5 % nonzeros: below k at CF 10 and 100, above it at CF 1000
        return torch.randn(n, generator=g) * (torch.rand(n, generator=g) < 0.005)
    if kind == "blocky":      # large entries clustered in a few runs (like a layer of large gradients)
        x = torch.randn(n, generator=g) * 1e-3
        x[n // 3:n // 3 + n // 50] *= 1e4
        return x
    raise ValueError(kind)


def check_cpu(x: torch.Tensor, k: int, generator=None):
    got = topk_indices(x, k, generator)
    assert got.dtype == torch.int64 and got.numel() == k
    assert torch.unique(got).numel() == k, "repeated index"
    n = x.numel()
    if n > T._TINY:   # the NumPy path: index for index
        assert set(got.tolist()) == reference(x, k)
    else:             # torch.topk: same magnitudes
        want = torch.topk(x.abs().float(), k).values
        assert torch.equal(x.abs().float()[got].sort().values, want.sort().values)
    return got


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("cf", [1.5, 2, 10, 100, 1000])
def test_exact_across_sizes_and_cfs(n, cf):
    check_cpu(data("laplace", n), kept_count(n, cf))


@pytest.mark.parametrize("kind", ["normal", "ties", "constant", "zeros", "sparse", "blocky"])
@pytest.mark.parametrize("n", [T._TINY + 1, 2 * CHUNK + 7])
@pytest.mark.parametrize("cf", [2, 10, 1000])
def test_exact_on_ties_zeros_and_clusters(kind, n, cf):
    check_cpu(data(kind, n), kept_count(n, cf))


@pytest.mark.parametrize("n", [T._TINY + 1, 300_001])
def test_extreme_k(n):
    x = data("laplace", n)
    for k in (1, 2, n - 1000, n - 1):
        check_cpu(x, k)
    assert torch.equal(topk_indices(x, n), torch.arange(n))
    assert topk_indices(x, 0).numel() == 0


def test_few_nonzeros_are_all_kept_and_topped_up_with_the_first_zeros():
    n, k = 200_000, 20_000
    x = torch.zeros(n)
    nz = torch.randperm(n)[:300]
    x[nz] = torch.randn(300)
    got = check_cpu(x, k)
    assert set(nz.tolist()) <= set(got.tolist())


def test_first_zeros_come_from_the_nonzero_positions_without_reading_the_tensor():
    """``_zeros_first`` finds the first zeros as the positions missing from the ascending nonzero
    positions (O(k), the tensor is not read); the same as scanning the tensor for them."""
    import numpy as np
    rng = np.random.default_rng(4)
    for n, nonzeros in ((1000, 0), (1000, 999), (50_000, 300), (50_000, 20_000), (50_000, 49_000)):
        x = np.zeros(n, dtype=np.float32)
        x[rng.choice(n, nonzeros, replace=False)] = 1.0
        nonzero = np.flatnonzero(x)
        zeros = np.flatnonzero(x == 0)
        for count in {1, zeros.size // 2 or 1, zeros.size}:
            assert np.array_equal(T._zeros_first(nonzero, count), zeros[:count]), (n, nonzeros, count)


def test_nan_counts_as_largest():
    for n in (T._TINY - 1, 100_000):
        x = data("laplace", n)
        x[[5, 77, n - 1]] = float("nan")
        x[9] = float("inf")
        got = set(topk_indices(x, 10).tolist())
        assert {5, 77, n - 1, 9} <= got
        if n > T._TINY:
            assert got == reference(x, 10)
    x = torch.full((100_000,), float("nan"))
    x[:10] = 1.0
    assert set(topk_indices(x, 99_995).tolist()) == reference(x, 99_995)   # more NaNs than k


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes_and_views(dtype):
    x = data("laplace", 2 * CHUNK + 7).to(dtype)
    check_cpu(x, 3000)
    v = x[:x.numel() // 7 * 7].view(-1, 7)[:, 2]      # non-contiguous view
    check_cpu(v, 500)


def test_result_does_not_depend_on_the_sample():
    x = data("ties", 300_001)
    a = topk_indices(x, 30_000, torch.Generator().manual_seed(1))
    b = topk_indices(x, 30_000, torch.Generator().manual_seed(2))
    assert set(a.tolist()) == set(b.tolist())


def test_missed_thresholds_fall_back_exactly(monkeypatch, native_mode):
    x = data("laplace", 300_001)
    # Thresholds far above the k-th magnitude: both sampled attempts keep too few, then exact.
    monkeypatch.setattr(T, "_SIGMAS", (-50.0, -40.0))
    calls = []
    owner, name = (native, "select") if native_mode != "off" else (T, "_candidates")
    real = getattr(owner, name)
    monkeypatch.setattr(owner, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    check_cpu(x, 30_000)
    assert len(calls) == 3
    calls.clear()
    monkeypatch.setattr(T, "_SIGMAS", (-50.0, 12.0))   # the retry succeeds
    check_cpu(x, 30_000)
    assert len(calls) == 2


@pytest.mark.parametrize("upper", [None, 0.0, 0.35, 0.6, float("nan")])
def test_drop_smallest_with_any_upper_bound(upper):
    rng = np.random.default_rng(0)
    vals = rng.integers(0, 8, 5000).astype(np.float32) / 10      # ties everywhere
    idx = np.sort(rng.choice(10 ** 6, 5000, replace=False))
    k = 3000
    out = T._drop_smallest(idx.copy(), vals, k, upper)
    order = np.lexsort((np.arange(vals.size), -vals))[:k]
    assert sorted(out.tolist()) == sorted(idx[order].tolist())


def test_mostly_ascending_order():
    x = data("laplace", 300_001)
    got = topk_indices(x, 30_000)
    assert float((got[1:] > got[:-1]).float().mean()) > 0.7


@pytest.mark.parametrize("n,a,b", [(300_001, 10, 100), (300_001, 10, 10), (70_000, 3, 7), (20_000, 2, 50)])
@pytest.mark.parametrize("kind", ["laplace", "ties", "sparse"])
def test_multilevel_equals_direct(n, a, b, kind):
    x = data(kind, n)
    comp = TopKCompressor(cf=a)
    payload, ctx = comp.compress(x)
    two_level = comp.compress_further(payload, ctx, b)
    direct, _ = TopKCompressor(cf=a * b).compress(x)
    assert two_level.indices.numel() == direct.indices.numel() == kept_count(n, a * b)
    assert torch.equal(two_level.values.abs().sort().values, direct.values.abs().sort().values)
    if kind == "laplace":   # no ties: the same entries
        assert set(two_level.indices.tolist()) == set(direct.indices.tolist())


def test_compressor_leaves_the_global_rng_alone_and_is_deterministic():
    x = data("laplace", 300_001)
    state = torch.random.get_rng_state()
    p1, _ = TopKCompressor(cf=100).compress(x)
    p2, _ = TopKCompressor(cf=100).compress(x)
    assert torch.equal(state, torch.random.get_rng_state())
    assert torch.equal(p1.indices, p2.indices) and torch.equal(p1.values, p2.values)


# -- the accelerator path, run on CPU tensors ------------------------------------------------
@pytest.fixture(params=["sort", "kthvalue"])
def order_statistic(request, monkeypatch):
    """Both ways of reading the sample's thresholds: the sort that accelerators run, and kthvalue."""
    monkeypatch.setattr(sampling, "_sorts", lambda sample: request.param == "sort")
    return request.param


@pytest.mark.parametrize("kind", ["laplace", "ties", "sparse", "zeros"])
@pytest.mark.parametrize("cf", [5, 100, 1000])
def test_device_path_is_exact(kind, cf, order_statistic):
    x = data(kind, 300_001)
    k = kept_count(x.numel(), cf)
    got = T._topk_torch(x, k, torch.Generator().manual_seed(0))
    assert got.numel() == k and torch.unique(got).numel() == k
    m = x.abs()
    assert torch.equal(m[got].sort().values, torch.topk(m, k).values.sort().values)


def test_device_path_syncs_once(monkeypatch, order_statistic):
    """On an accelerator the only host sync is the output size of one ``nonzero``, whatever happens."""
    x = data("laplace", 300_001)
    want = torch.topk(x.abs(), 3000).values.sort().values
    calls = []
    real = torch.nonzero
    monkeypatch.setattr(torch, "nonzero", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for sigmas in ((4.0, 12.0), (-50.0, 12.0), (-50.0, -40.0)):   # normal, first misses, both miss
        monkeypatch.setattr(T, "_SIGMAS", sigmas)
        calls.clear()
        got = T._topk_torch(x, 3000, torch.Generator().manual_seed(0))
        assert len(calls) == 1, sigmas
        assert torch.equal(x.abs()[got].sort().values, want), sigmas


class SyncCounter(TorchDispatchMode):
    """Counts the aten operations that make an accelerator wait for the host (as tests/unit/test_host_syncs.py)."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in SYNC_OPS:
            self.ops[func._schema.name] += 1
        return func(*args, **(kwargs or {}))


def test_compressor_on_the_accelerator_path_syncs_at_most_once_per_call(monkeypatch, order_statistic):
    monkeypatch.setattr(T, "_numpy_path", lambda values: False)
    for n in (1000, 100_000, 300_001, 1_200_000):
        x = data("laplace", n)
        for cf in (2, 10, 100, 1000):
            comp = TopKCompressor(cf=cf)
            with SyncCounter() as c:
                payload, ctx = comp.compress(x)
            want = 1 if n > T._SMALL_DEVICE and cf >= 4 else 0
            assert sum(c.ops.values()) == want, (n, cf, dict(c.ops))
            with SyncCounter() as f:
                further = comp.compress_further(payload, ctx, 10)
            assert sum(f.ops.values()) <= 1, (n, cf, dict(f.ops))
            direct, _ = TopKCompressor(cf=cf * 10).compress(x)
            assert torch.equal(further.values.abs().sort().values, direct.values.abs().sort().values)


@pytest.mark.parametrize("kind", ["laplace", "ties", "sparse", "blocky"])
@pytest.mark.parametrize("cf", [1.5, 10, 1000])
def test_every_cpu_path_gives_the_same_payload_in_the_same_order(kind, cf):
    """Ranks may run different paths (a CPU without AVX-512, a build without a compiler):
    the payload, order included, must not depend on which."""
    x = data(kind, 300_001)
    payloads = []
    previous = native.use("off")
    try:
        for path in native.distinct_choices():
            native.use(path)
            comp = TopKCompressor(cf=cf)
            payload, ctx = comp.compress(x)
            payloads.append((payload, comp.compress_further(payload, ctx, 10)))
    finally:
        native.use(previous)
    for (p, f) in payloads[1:]:
        for a, b in ((p, payloads[0][0]), (f, payloads[0][1])):
            assert torch.equal(a.indices, b.indices)
            assert torch.equal(a.values, b.values)



# -- exact zeros ------------------------------------------------------------------------------
def _embedding_like(n: int) -> torch.Tensor:
    """An embedding's gradient: 2 % of its rows of 100 nonzero, fewer nonzeros than k at CF 10-20
    (``benchmarks/sparse_buckets.py``'s bucket)."""
    from benchmarks.sparse_buckets import embedding_like
    return embedding_like(n, width=100, touched=0.02, seed=3)


@pytest.mark.parametrize("n", [12_000, 60_000, 300_000, 2_000_000])  # torch.topk, exact k-th, sampled
@pytest.mark.parametrize("cf", [10, 20])
def test_send_zeros_false_sends_the_nonzeros_alone(cpu_path, n, cf):
    """With fewer nonzeros than k, ``send_zeros=False`` sends every nonzero and no zero (a zero
    says nothing and costs 8 bytes on the wire); the decompressed tensor is the gradient itself,
    so error feedback keeps nothing, and a further level keeps what is there.  The default
    tops the payload up to k with the first zeros, as torch.topk does (the paper's Top-k)."""
    t = _embedding_like(n)
    k, nonzero = kept_count(n, cf), int(torch.count_nonzero(t))
    assert nonzero < k
    comp = TopKCompressor(cf=cf, send_zeros=False)
    payload, ctx = comp.compress(t)
    assert payload.values.numel() == payload.indices.numel() == nonzero
    assert bool((payload.values != 0).all())
    assert torch.equal(comp.decompress(payload, ctx), t)
    assert comp.select(t, k).numel() == nonzero
    further = comp.compress_further(payload, ctx, 2)   # CF 2x: k/2 of the nonzeros, or all of them
    assert further.values.numel() == min(kept_count(n, 2 * cf), nonzero)
    assert bool((further.values != 0).all())
    default = TopKCompressor(cf=cf)
    padded, _ = default.compress(t)
    assert padded.values.numel() == k and torch.equal(default.decompress(padded, ctx), t)
    got = topk_indices(t, k)
    assert got.numel() == k and torch.unique(got).numel() == k


def test_send_zeros_false_with_enough_nonzeros_is_exact_top_k(cpu_path):
    """Zeros are left out only where they would top the payload up: half zeros, CF 10, k entries,
    the same as the default's."""
    t = data("laplace", 300_001)
    t[::2] = 0
    k = kept_count(t.numel(), 10)
    payload, _ = TopKCompressor(cf=10, send_zeros=False).compress(t)
    default, _ = TopKCompressor(cf=10).compress(t)
    assert payload.values.numel() == k
    assert torch.equal(payload.indices, default.indices) and torch.equal(payload.values, default.values)


def test_send_zeros_false_keeps_k_entries_on_accelerators(monkeypatch):
    """Off the CPU the payload is k entries, zeros included: counting the nonzeros there would
    be a host synchronisation more every call (the module docstring)."""
    monkeypatch.setattr(T, "_numpy_path", lambda values: False)
    t = _embedding_like(300_000)
    comp = TopKCompressor(cf=10, send_zeros=False)
    payload, ctx = comp.compress(t)
    assert payload.values.numel() == kept_count(t.numel(), 10)
    assert torch.equal(comp.decompress(payload, ctx), t)


def test_send_zeros_is_checked_and_shows_in_the_repr():
    """Ranks compare the compressor's repr at start-up: a rank that leaves zeros out is named."""
    assert repr(TopKCompressor(cf=10)) == "TopKCompressor(cf=10)"
    assert repr(TopKCompressor(cf=10, send_zeros=False)) == "TopKCompressor(cf=10, send_zeros=False)"
    with pytest.raises(ValueError, match="send_zeros"):
        TopKCompressor(cf=10, send_zeros=0)
