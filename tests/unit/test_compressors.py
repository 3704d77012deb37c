"""Single-process tests of Top-k and Random-k (no Horovod collectives involved)."""
import math
from types import SimpleNamespace

import pytest
import torch

from horovod_gravac.compressors import RandomKCompressor, SparseCompressor, TopKCompressor, kept_count
from horovod_gravac.selection.sampling import stratified_indices
from horovod_gravac.selection.topk import topk_indices
from horovod_gravac import error_feedback
from horovod_gravac.error_feedback import ErrorFeedback, IntervalSum


def laplace(n, seed=0):
    return torch.distributions.Laplace(0.0, 1.0).sample((n,)) if seed is None else \
        torch.distributions.Laplace(0.0, 1.0).sample((n,))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("n,cf", [(1000, 10), (300_000, 10), (300_000, 100), (300_000, 1000), (70_000, 3)])
def test_topk_selects_exactly_the_largest(n, cf):
    t = laplace(n)
    k = kept_count(n, cf)
    got = set(topk_indices(t.abs(), k).tolist())
    want = set(torch.topk(t.abs(), k).indices.tolist())
    assert len(got) == k and got == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("shape", [(7,), (3, 5, 4), (1,), (130, 257)])
def test_round_trip_shape_dtype_and_kept_entries(dtype, shape):
    t = torch.randn(shape).to(dtype)
    comp = TopKCompressor(cf=4)
    payload, ctx = comp.compress(t)
    out = comp.decompress(payload, ctx)
    assert out.shape == t.shape and out.dtype == t.dtype
    k = kept_count(t.numel(), 4)
    assert payload.values.numel() == k and payload.indices.dtype == torch.int32
    kept = out.reshape(-1) != 0
    assert int(kept.sum()) == k
    assert torch.equal(out.reshape(-1)[kept], t.reshape(-1)[kept])   # exact values kept
    dropped_max = t.reshape(-1)[~kept].float().abs().max() if k < t.numel() else torch.tensor(0.0)
    assert t.reshape(-1)[kept].float().abs().min() >= dropped_max


def test_at_least_one_entry_and_empty_tensor():
    comp = TopKCompressor(cf=1000)
    payload, ctx = comp.compress(torch.tensor([0.5, -3.0, 1.0]))
    assert payload.indices.tolist() == [1] and payload.values.tolist() == [-3.0]
    payload, ctx = comp.compress(torch.empty(0))
    assert payload.values.numel() == 0 and comp.decompress(payload, ctx).shape == (0,)


@pytest.mark.parametrize("bad", [0.5, 0, -3, float("nan"), float("inf"), "10", None, True])
def test_bad_cf_is_a_value_error_naming_cf(bad):
    for cls in (TopKCompressor, RandomKCompressor):
        with pytest.raises(ValueError, match="cf"):
            cls(cf=bad)


def test_non_float_tensor_is_rejected():
    with pytest.raises(ValueError, match="floating-point"):
        TopKCompressor(cf=10).compress(torch.arange(10))


def test_compressors_are_horovod_compressors():
    from horovod.torch.compression import Compressor
    assert issubclass(TopKCompressor, Compressor) and issubclass(RandomKCompressor, Compressor)


@pytest.mark.parametrize("n,a,b", [(200_000, 10, 100), (200_000, 10, 10), (5000, 3, 7)])
def test_topk_multilevel_equals_direct(n, a, b):
    t = laplace(n)
    comp = TopKCompressor(cf=a)
    payload, ctx = comp.compress(t)
    two_level = comp.compress_further(payload, ctx, b)
    direct, _ = TopKCompressor(cf=a * b).compress(t)
    assert set(two_level.indices.tolist()) == set(direct.indices.tolist())
    assert torch.equal(comp.decompress(two_level, ctx), TopKCompressor(cf=a * b).decompress(direct, ctx))


def test_stratified_indices_unique_sorted_and_reach_the_end():
    g = torch.Generator().manual_seed(0)
    hits_last = 0
    for _ in range(400):
        idx = stratified_indices(1003, 10, g)
        assert idx.numel() == 10 and torch.unique(idx).numel() == 10
        assert bool((idx[1:] > idx[:-1]).all()) and idx.min() >= 0 and idx.max() <= 1002
        hits_last += int(idx[-1] == 1002)
    assert hits_last > 0, "the last element can never be chosen"


def test_randomk_is_uniform():
    comp = RandomKCompressor(cf=10, seed=None)
    counts = torch.zeros(100)
    for step in range(3000):
        payload, _ = comp.compress(torch.randn(100))
        counts[payload.indices.long()] += 1
    expected = 3000 * 10 / 100
    assert float((counts - expected).abs().max()) < 6 * math.sqrt(expected)


def test_randomk_shared_seed_agrees_per_step_and_leaves_global_rng_alone():
    a, b = RandomKCompressor(cf=50, seed=3), RandomKCompressor(cf=50, seed=3)
    t = torch.randn(10_000)
    state = torch.random.get_rng_state()
    a.set_step(5, 1); b.set_step(5, 1)
    pa, _ = a.compress(t); pb, _ = b.compress(t)
    assert torch.equal(pa.indices, pb.indices) and a.shared_indices
    a.set_step(6, 1)
    pc, _ = a.compress(t)
    assert not torch.equal(pa.indices, pc.indices)
    assert torch.equal(state, torch.random.get_rng_state())


def test_wire_bytes():
    payload, _ = TopKCompressor(cf=100).compress(torch.randn(10_000))
    assert SparseCompressor.wire_bytes(payload) == 8 * 100
    assert SparseCompressor.wire_bytes(payload, shared_indices=True) == 4 * 100


def _float64_compressors():
    from horovod_gravac.compressors import DGCCompressor, RedSyncCompressor, SIDCoCompressor
    return {"topk": TopKCompressor, "dgc": DGCCompressor, "redsync": RedSyncCompressor,
            "sidco": SIDCoCompressor, "randomk": RandomKCompressor,
            "randomk_unseeded": lambda cf: RandomKCompressor(cf=cf, seed=None)}


@pytest.mark.parametrize("name", list(_float64_compressors()))
@pytest.mark.parametrize("n", [40, 20_000])   # (a small tensor's exact path, the sampled one)
def test_float64_payloads_keep_the_gradients_own_digits(name, n):
    """A float64 gradient's payload is float64: digits float32 would round (1.0000000001)
    and a finite entry beyond float32's range (1e39) travel as they are; 12 bytes an entry."""
    g = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * (1 + 1e-10)
    g[7], g[n // 2] = 1e39, -1.0000000001e3
    comp = _float64_compressors()[name](10)
    comp.set_step(2, 0)
    payload, ctx = comp.compress(g)
    assert payload.values.dtype == torch.float64 and payload.indices.dtype == torch.int32
    assert torch.equal(payload.values, g[payload.indices.long()])   # bit for bit
    assert not torch.equal(payload.values.float().double(), payload.values)   # float32 would round them
    if name != "randomk" and name != "randomk_unseeded":   # magnitude selectors keep the spike
        assert 7 in payload.indices.tolist()
    assert torch.equal(comp.decompress(payload, ctx), torch.zeros_like(g).index_put_(
        (payload.indices.long(),), payload.values))
    k = payload.values.numel()
    assert SparseCompressor.wire_bytes(payload) == 12 * k
    assert SparseCompressor.wire_bytes(payload, shared_indices=True) == 8 * k
    further = comp.compress_further(payload, ctx, 2.0)   # multi-level stays float64
    assert further.values.dtype == torch.float64 and torch.equal(further.values, g[further.indices.long()])
    empty, _ = comp.compress(torch.empty(0, dtype=torch.float64))
    assert empty.values.dtype == torch.float64


@pytest.mark.parametrize("momentum", [None, 0.5])
def test_float64_error_feedback_remembers_in_float64(momentum):
    """A float64 residual (and DGC velocity) keeps what float32 would round, and 1e39."""
    memory = ErrorFeedback(momentum=momentum)
    comp = TopKCompressor(cf=4)
    grads = [torch.tensor([1.0000000001, 1e39, -3.0, 2e-10, 0.5, 0.25, 1.0 + 2 ** -40, 7.0], dtype=torch.float64),
             torch.full((8,), 1e-12, dtype=torch.float64)]
    for step, grad in enumerate(grads):
        old = memory.buffer(0, 8, "cpu", torch.float64).clone()
        g_ef = memory.add(0, [grad], [(0, 8)], 8, "cpu", dtype=torch.float64)
        assert g_ef.dtype == torch.float64 and torch.isfinite(g_ef).all()
        if momentum is None:
            assert torch.equal(g_ef, old + grad)
        else:
            assert memory.velocities[0].dtype == torch.float64
        kept = g_ef.clone()
        payload, ctx = comp.compress(g_ef)
        memory.sent_sparse(0, payload.indices)
        assert torch.equal(comp.decompress(payload, ctx) + memory.residuals[0], kept)   # exactly
        if step == 0:   # 1e39 and 7.0 were sent; what stays keeps its float64 digits
            assert sorted(payload.indices.tolist()) == [1, 7]
            assert memory.residuals[0][[0, 6]].tolist() == [1.0000000001, 1.0 + 2 ** -40]
    assert memory.residuals[0].dtype == torch.float64
    # a float32 bucket's buffer is float32 as before; asking for the other dtype makes a new one
    assert memory.buffer(1, 8, "cpu").dtype == torch.float32
    assert memory.buffer(1, 8, "cpu", torch.float64).dtype == torch.float64


def test_a_float32_residual_saved_for_a_float64_bucket_loads_widened():
    """load_by_name: a checkpoint's float32 slice (written before float64 buckets kept float64
    residuals) goes into the bucket's float64 buffer exactly; float64 slices round-trip bitwise."""
    from types import SimpleNamespace
    from horovod_gravac.error_feedback import load_by_name, save_by_name
    bucket = SimpleNamespace(index=0, names=["w", "b"], offsets=[(0, 3), (3, 5)], numel=5, device="cpu",
                             value_dtype=torch.float64)
    saved = {"w": torch.tensor([0.1, -2.0, 1e-3], dtype=torch.float32),
             "b": torch.tensor([1.0000000001, 1e39], dtype=torch.float64)}
    buffers = {0: torch.full((5,), 9.0)}   # a stale float32 buffer is replaced
    load_by_name(buffers, saved, [bucket])
    assert buffers[0].dtype == torch.float64
    assert buffers[0][:3].tolist() == saved["w"].double().tolist()
    assert buffers[0][3:].tolist() == [1.0000000001, 1e39]
    again = save_by_name(buffers, [bucket])
    assert again["b"].dtype == torch.float64 and torch.equal(again["b"], saved["b"])


@pytest.mark.parametrize("comp", [TopKCompressor(cf=20), RandomKCompressor(cf=20, seed=None)])
def test_error_feedback_invariant(comp):
    """sent + new residual == gradient + old residual, every step."""
    memory = ErrorFeedback()
    n = 5000
    for step in range(10):
        grad = torch.randn(n)
        old = memory.buffer(0, n, "cpu").clone()
        g_ef = memory.add(0, [grad], [(0, n)], n, "cpu")
        payload, ctx = comp.compress(g_ef)
        sent = comp.decompress(payload, ctx)
        memory.sent_sparse(0, payload.indices)
        torch.testing.assert_close(sent + memory.residuals[0], grad + old, rtol=0, atol=1e-6)


def test_dgc_momentum_correction_and_masking():
    memory = ErrorFeedback(momentum=0.5)
    g1, g2 = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 1.0, 1.0, 1.0])
    v = memory.add(0, [g1], [(0, 4)], 4, "cpu")
    assert v.tolist() == [1, 2, 3, 4]
    memory.sent_sparse(0, torch.tensor([3], dtype=torch.int32))     # sent the largest
    assert memory.residuals[0].tolist() == [1, 2, 3, 0] and memory.velocities[0].tolist() == [1, 2, 3, 0]
    v = memory.add(0, [g2], [(0, 4)], 4, "cpu")
    # u = 0.5 * u + g2 = [1.5, 2, 2.5, 1];  v = v + u
    assert memory.velocities[0].tolist() == [1.5, 2.0, 2.5, 1.0]
    assert v.tolist() == [2.5, 4.0, 5.5, 1.0]
    with pytest.raises(ValueError, match="momentum_correction"):
        ErrorFeedback(momentum=1.5)


@pytest.mark.parametrize("make", [lambda: TopKCompressor(cf=7), lambda: RandomKCompressor(cf=7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decompress_into_a_reused_buffer_matches_a_fresh_one(make, dtype):
    comp = make()
    t = laplace(3000).to(dtype).view(30, 100)
    payload, ctx = comp.compress(t)
    buf = torch.full((3000,), 7.0, dtype=dtype)        # stale contents must be overwritten
    got = comp.decompress(payload, ctx, out=buf)
    assert torch.equal(got, comp.decompress(payload, ctx)) and got.shape == t.shape
    assert got.data_ptr() == buf.data_ptr()            # written in place, no new allocation


def test_decompress_rejects_a_wrong_buffer():
    comp = TopKCompressor(cf=10)
    payload, ctx = comp.compress(laplace(100))
    for bad in (torch.zeros(99), torch.zeros(100, dtype=torch.float64), torch.zeros(200)[::2], "buf"):
        with pytest.raises(ValueError, match="out must be"):
            comp.decompress(payload, ctx, out=bad)


def test_stratified_strata_interleave_long_and_short():
    """Each half of the tensor is sampled at the same rate (long strata are not bunched)."""
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(1003)
    for _ in range(4000):
        counts[stratified_indices(1003, 400, g)] += 1
    first, second = counts[:501].mean(), counts[501:].mean()
    assert abs(first - second) / (4000 * 400 / 1003) < 0.01


@pytest.mark.parametrize("numel,k", [(1003, 10), (1003, 400), (1000, 10), (7, 7), (7, 9)])
def test_stratified_draw_one_exact_uniform_draw_per_stratum(numel, k):
    """Random-k's drawer: unique, sorted, int32, one index in each stratum of
    stratified_indices (floor(i * numel / k) ...), every position reachable."""
    from horovod_gravac.selection.randomk import stratified_draw
    kk = min(k, numel)
    starts = [i * numel // kk for i in range(kk + 1)]
    seen = torch.zeros(numel)
    for key in range(300):
        idx = stratified_draw(numel, k, key * 0x9E3779B97F4A7C15 % 2 ** 64)
        assert idx.dtype == torch.int32 and idx.numel() == kk
        assert bool((idx[1:] > idx[:-1]).all()) and idx.min() >= 0 and idx.max() < numel
        for i in (0, kk // 2, kk - 1):   # the i-th draw lies in the i-th stratum
            assert starts[i] <= int(idx[i]) < starts[i + 1]
        seen[idx.long()] += 1
    if numel / kk <= 5:
        assert bool((seen > 0).all()), "a position was never drawn"


@pytest.mark.parametrize("numel,k", [(1003, 10), (1003, 400), (1000, 10), (5, 2), (6_553_601, 65_536),
                                     (6_553_600, 655_360), (2 ** 31 + 5, 3), (2 ** 31 - 1, 7)])
def test_stratified_draw_same_integers_on_every_path(numel, k):
    """Ranks sharing a seed sum values by position, so every path must draw the same
    integers: the C kernel, NumPy (no native kernels) and the torch formula that
    accelerators run (here on CPU tensors), bit for bit; int64 beyond int32's range."""
    from horovod_gravac import native
    from horovod_gravac.selection.randomk import _draw_key, _strata_positions, stratified_draw
    assert torch.equal(stratified_draw(numel, k, -1), stratified_draw(numel, k, 2 ** 64 - 1))   # modulo 2**64
    for key in (0, 1, 2 ** 64 - 1, _draw_key(1234, 7, 3, 1)):
        via_torch = _strata_positions(torch.arange(k, dtype=torch.int64), numel, k, key)
        previous = native.use("off")
        try:
            via_numpy = stratified_draw(numel, k, key)
        finally:
            native.use(previous)
        got = stratified_draw(numel, k, key)
        assert got.dtype == (torch.int32 if numel < 2 ** 31 else torch.int64)
        assert torch.equal(got.long(), via_torch) and torch.equal(via_numpy, got), (numel, k, key)


def test_stratified_draw_refuses_strata_past_its_limit_naming_cf():
    from horovod_gravac.selection.randomk import stratified_draw
    with pytest.raises(ValueError, match="compression factor cf"):
        stratified_draw(2 ** 40, 1, 5)


def test_stratified_draw_is_uniform_and_independent():
    """Within a stratum every offset is equally likely (chi-square), and neither neighbouring
    strata nor consecutive steps' draws are correlated (the hash, not a generator, makes
    them: a weak mix would show here)."""
    from horovod_gravac.selection.randomk import _draw_key, stratified_draw
    numel, k, draws = 1000, 10, 4000     # strata of 100
    offsets = torch.stack([stratified_draw(numel, k, _draw_key(5, step, 0, 0)).long() for step in range(draws)])
    offsets -= torch.arange(k) * 100
    counts = torch.bincount(offsets.reshape(-1), minlength=100).double()
    expected = draws * k / 100
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 160, chi2     # 99 degrees of freedom: P(chi2 > 160) < 1e-4
    u = offsets.double() / 100 - 0.495
    neighbours = float((u[:, 1:] * u[:, :-1]).mean() / u.var())
    steps = float((u[1:] * u[:-1]).mean() / u.var())
    assert abs(neighbours) < 0.03 and abs(steps) < 0.03, (neighbours, steps)


def test_randomk_shared_seed_draws_per_step_stream_and_level():
    """Two ranks with one seed draw the same indices for the same (step, bucket); another
    step, another bucket or the next draw of the step (multi-level) draws anew."""
    t = torch.randn(10_007)
    a, b = RandomKCompressor(cf=10, seed=7), RandomKCompressor(cf=10, seed=7)
    a.set_step(3, 1)
    b.set_step(3, 1)
    pa, ca = a.compress(t)
    pb, cb = b.compress(t)
    assert torch.equal(pa.indices, pb.indices)
    assert torch.equal(a.compress_further(pa, ca, 10).indices, b.compress_further(pb, cb, 10).indices)
    first = pa.indices
    for step, stream in ((4, 1), (3, 2)):
        a.set_step(step, stream)
        assert not torch.equal(a.compress(t)[0].indices, first)
    a.set_step(3, 1)
    assert torch.equal(a.compress(t)[0].indices, first)
    assert not torch.equal(a.compress(t)[0].indices, first)   # a second draw in the step
    assert not torch.equal(RandomKCompressor(cf=10, seed=8).compress(t)[0].indices, first)


def test_randomk_without_seed_draws_differently_per_instance():
    """seed=None: each rank's generator comes from OS entropy (the old generator was
    seeded with 0 on every rank, so 'independent' ranks drew identical indices)."""
    t = torch.randn(10_000)
    a, b = RandomKCompressor(cf=50, seed=None), RandomKCompressor(cf=50, seed=None)
    assert not a.shared_indices
    assert not torch.equal(a.compress(t)[0].indices, b.compress(t)[0].indices)


def test_decompress_native_and_torch_paths_agree_and_reject_bad_indices():
    # float32 on the CPU writes with the native scatter; other dtypes with index_put_.
    from horovod_gravac import native
    from horovod_gravac.compressors import TopKCompressor
    from horovod_gravac.compressors import SparsePayload
    comp = TopKCompressor(10)
    t = torch.randn(50_000)
    payload, ctx = comp.compress(t)
    out = torch.full_like(t, 7.0)
    got = comp.decompress(payload, ctx, out=out)
    previous = native.use("off")
    try:
        want = comp.decompress(payload, ctx)
    finally:
        native.use(previous)
    assert got.data_ptr() == out.data_ptr() and torch.equal(got, want)
    assert torch.equal(comp.decompress(payload, ctx), want)                      # fresh output
    bad = SparsePayload(payload.values[:2].clone(), torch.tensor([0, 50_000], dtype=torch.int32))
    with pytest.raises(IndexError):
        comp.decompress(bad, ctx)


def test_interval_sum_takes_the_window_then_starts_again():
    """Accordion's sums: G summed step by step."""
    buckets = [SimpleNamespace(index=0, numel=5, offsets=[(0, 5)], device=torch.device("cpu"),
                               value_dtype=torch.float32)]
    sums = IntervalSum(gradients=True)
    grad = torch.arange(1.0, 6.0)
    sums.record(buckets[0], [grad], None, scale=1.0)
    sums.record(buckets[0], [grad], None, scale=2.0)
    owed = grad * 1.5   # one step at scale 1, one at scale 2
    assert sums.take_window(buckets) == pytest.approx((float(owed @ owed), 0.0, 0.0))
    assert sums.take_window(buckets) == (0.0, 0.0, 0.0)


def test_taking_a_float64_buckets_window_sums_leaves_its_g_ef_as_it_was():
    """A float64 bucket's g_ef is already float64: the sums work on a copy of it."""
    bucket = SimpleNamespace(index=0, numel=4, offsets=[(0, 4)], device=torch.device("cpu"),
                             value_dtype=torch.float64)
    sums = IntervalSum(gradients=True, delivered=True)
    g_ef = torch.tensor([1.0, -3.0, 0.5, 2.0], dtype=torch.float64)
    before = g_ef.clone()
    sent = SimpleNamespace(values=g_ef[[1]].clone(), indices=torch.tensor([1], dtype=torch.int32))
    sums.record(bucket, [g_ef], sent, 2.0, g_ef=g_ef)
    assert torch.equal(g_ef, before)
    owed = before / 2
    d = torch.tensor([0.0, -1.5, 0.0, 0.0], dtype=torch.float64)
    assert sums.take_window([bucket]) == pytest.approx((float(owed @ owed), float(d @ owed), float(d @ d)))


@pytest.mark.parametrize("chunk", [None, 4, 1])
def test_delivered_sums_owe_what_was_sent_and_what_error_feedback_still_holds(chunk, monkeypatch):
    """GraVAC "delivered" and "predictive": G = D + r_end, the residual's invariant summed
    over the window, so G starts at the residual the window inherited and nothing owed is
    summed step by step.  Checked against G summed explicitly, over sparse and dense sends
    and a loss scale; summed in one chunk or in chunks of 4 and 1 entries."""
    if chunk is not None:
        monkeypatch.setattr(error_feedback, "WINDOW_CHUNK", chunk)
    bucket = SimpleNamespace(index=0, numel=6, offsets=[(0, 6)], device=torch.device("cpu"),
                             value_dtype=torch.float32)
    memory, sums = ErrorFeedback(), IntervalSum(gradients=True, delivered=True)
    assert not sums.gradients   # nothing owed is summed
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(6, generator=gen) for _ in range(7)]
    scales = [1.0, 1.0, 4.0, 1.0, 2.0, 1.0, 1.0]
    owed, sent_sum = torch.zeros(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
    for step, (g, scale) in enumerate(zip(grads, scales)):
        if step == 2:   # a new window: it owes the residual it inherits
            owed = memory.residuals[0].double().clone()
            sent_sum.zero_()
        g_ef = memory.add(0, [g * scale], bucket.offsets, 6, "cpu", scale)
        owed += g.double()
        if step == 4:   # a dense send
            sent = g_ef
            sent_sum += g_ef.double() / scale
        else:   # the two largest entries
            idx = g_ef.abs().topk(2).indices.to(torch.int32)
            sent = SimpleNamespace(values=g_ef[idx].clone(), indices=idx)
            sent_sum.index_add_(0, idx.long(), g_ef[idx].double() / scale)
        closing = step in (1, 6)
        sums.record(bucket, [g * scale], sent, scale, g_ef=g_ef if closing else None)
        if closing:
            want = (float(owed @ owed), float(sent_sum @ owed), float(sent_sum @ sent_sum))
            got = sums.take_window([bucket])
            assert got == pytest.approx(want, rel=1e-6), step
        if isinstance(sent, torch.Tensor):
            memory.sent_dense(0)
        else:
            memory.sent_sparse(0, sent.indices)
        memory.unscale(0, scale)
    assert float(memory.residuals[0].abs().max()) > 0   # the last window owed a residual
    # a window whose every entry was sent owes nothing more: exactly lossless
    g_ef = memory.add(0, [grads[0]], bucket.offsets, 6, "cpu", 1.0)
    sums.record(bucket, [grads[0]], g_ef, 1.0, g_ef=g_ef)
    g_sq, dot, d_sq = sums.take_window([bucket])
    assert g_sq == dot == d_sq > 0
    # a bucket not taken this step (non-finite here) owes what its residual holds
    sums.record(bucket, [grads[1]], torch.full((6,), 2.0), 1.0)   # D = 2 everywhere
    memory.residuals[0].fill_(1.0)
    assert sums.take_window([bucket], memory.residuals) == pytest.approx((6 * 9.0, 6 * 6.0, 6 * 4.0))