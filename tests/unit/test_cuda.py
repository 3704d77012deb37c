"""Every CUDA branch, on a real GPU.  Marked ``cuda``: skipped where
``torch.cuda.is_available()`` is False (tests/conftest.py), so CI without a GPU passes.

The latest run's output: benchmarks/results/gpu/pytest_cuda.txt.  Run them with
``bash scripts/gpu_check.sh`` (or ``pytest -m cuda tests/unit/test_cuda.py``) on a GPU machine; all
but the optimizer's run without Horovod.

What is covered:
- every sparsifier on CUDA tensors against the same call on the CPU (exact compressors:
  the same indices; threshold compressors, whose samples come from per-device generators:
  counts within a tolerance, the kept values equal to the input at the kept indices),
  compress_further and decompress on the device;
- fp16/bf16 gradients: the wire carries fp32 values, decompress gives the input dtype;
  float64 gradients: float64 values (their own digits, 1e39 included), float64 wire rows;
- ``wire.unpack_sum`` on CUDA: deterministic ``index_add_`` (the same bits in repeated
  runs, close to the CPU's rank-order sum), deterministic mode restored afterwards; the
  statistics header and the allreduce tail on CUDA;
- host synchronisations per compressor call on CUDA (counted with the same dispatch
  counter as tests/unit/test_host_syncs.py, and with CUDA's own sync debug mode);
- the optimizer on CUDA with one rank (when Horovod was built with CUDA support), against
  the same run on the CPU.
The 2-rank NCCL run is tests/parallel/test_cuda_nccl.py, launched by scripts/gpu_check.sh.
"""
import warnings

import pytest
import torch

import horovod_gravac as hg
from horovod_gravac import wire   # pack/unpack: pure tensor code, no Horovod needed
from horovod_gravac.compressors import (DGCCompressor, PowerSGDCompressor, RandomKCompressor,
                                        RedSyncCompressor, SIDCoCompressor, TopKCompressor,
                                        kept_count)

pytestmark = pytest.mark.cuda

EXACT = {
    "topk": lambda cf: TopKCompressor(cf=cf),
    "randomk": lambda cf: RandomKCompressor(cf=cf, seed=11),   # drawn on the device: the CPU's integers
}
THRESHOLD = {
    "dgc": lambda cf: DGCCompressor(cf=cf),
    "redsync": lambda cf: RedSyncCompressor(cf=cf),
    "sidco-exponential": lambda cf: SIDCoCompressor(cf, distribution="exponential"),
    "sidco-gpareto": lambda cf: SIDCoCompressor(cf, distribution="gpareto"),
    "sidco-gamma": lambda cf: SIDCoCompressor(cf, distribution="gamma"),
}
ALL = {**EXACT, **THRESHOLD}
NUMEL = 300_000


def _laplace(numel=NUMEL, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(numel, generator=g, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).to(dtype)   # Laplace(0, 1), no ties


def _check_payload(payload, ctx, t_dev, dtype=torch.float32):
    assert payload.values.device.type == "cuda" and payload.indices.device.type == "cuda"
    assert payload.values.dtype == torch.float32, "the wire carries fp32 values"
    idx = payload.indices.long()
    assert torch.unique(idx).numel() == idx.numel(), "indices must be unique"
    assert torch.equal(payload.values, t_dev.reshape(-1)[idx].float()), "kept values != input at the indices"


def compare_with_cpu(name, cf, device="cuda"):
    """Compress the same tensor on the CPU and on ``device``; check what must agree."""
    make = ALL[name]
    t = _laplace()
    cpu_p, cpu_ctx = make(cf).compress(t)
    dev_t = t.to(device)
    comp = make(cf)
    dev_p, dev_ctx = comp.compress(dev_t)
    _check_payload(dev_p, dev_ctx, dev_t)
    k = kept_count(NUMEL, cf)
    if name in EXACT:
        assert torch.equal(torch.sort(dev_p.indices.long().cpu()).values, torch.sort(cpu_p.indices.long()).values), \
            f"{name}: other indices on the device than on the CPU"
    else:
        n_dev, n_cpu = dev_p.values.numel(), cpu_p.values.numel()
        assert abs(n_dev - n_cpu) <= max(0.15 * n_cpu, 20), (name, cf, n_dev, n_cpu)
        assert 0.5 * k <= n_dev <= 2.0 * k, (name, cf, n_dev, k)
    dense = comp.decompress(dev_p, dev_ctx)
    assert dense.device.type == "cuda" and dense.shape == t.shape and dense.dtype == t.dtype
    assert torch.equal(dense.reshape(-1)[dev_p.indices.long()], dev_p.values)
    assert int((dense != 0).sum()) == int((dev_p.values != 0).sum())
    # multi-level: the 10x-further candidate, cut from the device payload
    dev_f = comp.compress_further(dev_p, dev_ctx, 10)
    cpu_f = make(cf).compress_further(cpu_p, cpu_ctx, 10)
    _check_payload(dev_f, dev_ctx, dev_t)
    assert set(dev_f.indices.long().cpu().tolist()) <= set(dev_p.indices.long().cpu().tolist())
    if name != "randomk":   # the magnitude selectors cut a device payload by one topk: its exact largest
        k_f = min(kept_count(NUMEL, cf * 10), dev_p.values.numel())
        want = torch.topk(dev_p.values.abs(), k_f).values
        assert dev_f.values.numel() == k_f and torch.equal(torch.sort(dev_f.values.abs()).values,
                                                           torch.sort(want).values), name
    if name == "topk":
        assert torch.equal(torch.sort(dev_f.indices.long().cpu()).values, torch.sort(cpu_f.indices.long()).values)
    else:
        assert abs(dev_f.values.numel() - cpu_f.values.numel()) <= max(0.2 * cpu_f.values.numel(), 20), \
            (name, dev_f.values.numel(), cpu_f.values.numel())


@pytest.mark.parametrize("cf", [10, 100, 1000])
@pytest.mark.parametrize("name", sorted(ALL))
def test_sparsifier_on_cuda_matches_cpu(name, cf):
    compare_with_cpu(name, cf)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", sorted(ALL))
def test_half_precision_on_cuda_sends_fp32_and_returns_its_dtype(name, dtype):
    t = _laplace(dtype=dtype).cuda()
    comp = ALL[name](100)
    payload, ctx = comp.compress(t)
    _check_payload(payload, ctx, t, dtype)
    dense = comp.decompress(payload, ctx)
    assert dense.dtype == dtype and dense.device.type == "cuda"
    if name == "topk":   # the same magnitudes as on the CPU (fp16 may tie: compare values)
        cpu_p, _ = ALL[name](100).compress(t.cpu())
        assert torch.equal(torch.sort(payload.values.abs().cpu()).values, torch.sort(cpu_p.values.abs()).values)


def test_powersgd_on_cuda_matches_cpu():
    m = torch.randn(64, 48, generator=torch.Generator().manual_seed(3))
    comp = PowerSGDCompressor(cf=4, rank=4)
    cpu = comp.decompress(*comp.compress(m))
    dev = comp.decompress(*comp.compress(m.cuda()))
    assert dev.device.type == "cuda"
    assert torch.allclose(dev.cpu(), cpu, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------ the wire format
def _gathered(world=3, numel=5000, k=4000, seed=0, stats=None, device="cuda"):
    """What an allgather hands every rank: each rank's packed rows, in rank order, with
    many colliding indices (k close to numel)."""
    blocks = []
    for r in range(world):
        g = torch.Generator().manual_seed(seed + r)
        idx = torch.randint(0, numel, (k,), generator=g, dtype=torch.int32)
        vals = torch.randn(k, generator=g) * 10 ** torch.randint(-3, 4, (k,), generator=g).float()
        payload = hg.SparsePayload(vals.to(device), idx.to(device))
        blocks.append(wire.pack(payload, None if stats is None else stats[r].to(device), numel))
    return torch.cat(blocks)


def unpack_sum_check(device="cuda"):
    numel = 5000
    gathered = _gathered(device=device)
    before = torch.are_deterministic_algorithms_enabled()
    runs = [wire.unpack_sum(gathered, numel) for _ in range(5)]
    assert torch.are_deterministic_algorithms_enabled() == before, "deterministic mode not restored"
    assert all(torch.equal(r, runs[0]) for r in runs), "index_add_ gave different bits in repeated runs"
    assert runs[0].device.type == torch.device(device).type
    cpu = wire.unpack_sum(gathered.cpu(), numel)
    assert torch.allclose(runs[0].cpu(), cpu, rtol=1e-5, atol=1e-4), (runs[0].cpu() - cpu).abs().max()
    return runs[0].cpu(), cpu


def test_unpack_sum_on_cuda_is_deterministic_and_matches_cpu():
    dev, cpu = unpack_sum_check("cuda")
    print(f"unpack_sum CUDA vs CPU rank-order sum: max |diff| {(dev - cpu).abs().max().item():.3e}, "
          f"bitwise equal: {torch.equal(dev, cpu)}")


def test_unpack_sum_on_cuda_runs_in_deterministic_mode(monkeypatch):
    seen = []
    real = torch.Tensor.index_add_

    def spy(self, *a, **k):
        seen.append(torch.are_deterministic_algorithms_enabled())
        return real(self, *a, **k)
    monkeypatch.setattr(torch.Tensor, "index_add_", spy)
    wire.unpack_sum(_gathered(), 5000)
    assert seen == [True]
    assert not torch.are_deterministic_algorithms_enabled()


def test_statistics_header_and_allreduce_tail_on_cuda():
    world, n = 3, 6
    stats = torch.randn(world, n, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    dev = _gathered(world=world, stats=stats)
    assert torch.equal(wire.read_header_stats(dev, world, n), stats.sum(0) / world)
    assert torch.allclose(wire.unpack_sum(dev, 5000).cpu(), wire.unpack_sum(dev.cpu(), 5000), rtol=1e-5, atol=1e-4)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        flat = torch.randn(100).to(dtype).cuda()
        joined = wire.with_stats(flat, stats[0])
        assert joined.dtype == torch.float32 and joined.device.type == "cuda"
        tensor, back = wire.split_stats(joined, n)
        assert back.device.type == "cpu" and back.dtype == torch.float64
        assert torch.equal(tensor, flat.float())
        assert torch.allclose(back, stats[0].float().double())


# ------------------------------------------------------------------ float64 on the device
@pytest.mark.parametrize("name", sorted(ALL))
def test_float64_on_cuda_keeps_the_gradients_own_digits(name):
    """A float64 gradient's payload on the device is float64: the kept values are the input's
    bit for bit (digits float32 would round, and 1e39, beyond its range), multi-level too."""
    t = (_laplace(dtype=torch.float64) * (1 + 1e-10)).cuda()
    t[7] = 1e39
    comp = ALL[name](100)
    comp.set_step(3, 0)
    payload, ctx = comp.compress(t)
    idx = payload.indices.long()
    assert payload.values.dtype == torch.float64 and payload.values.device.type == "cuda"
    assert torch.equal(payload.values, t[idx]) and torch.isfinite(payload.values).all()
    if name != "randomk":   # the magnitude selectors keep the spike
        assert 7 in idx.tolist()
    further = comp.compress_further(payload, ctx, 10)
    assert further.values.dtype == torch.float64 and torch.equal(further.values, t[further.indices.long()])
    dense = comp.decompress(payload, ctx)
    assert dense.dtype == torch.float64 and torch.equal(dense[idx], t[idx])


def test_float64_wire_on_cuda_is_deterministic_and_exact():
    """Float64 rows (three words) on the device: headers read back exactly, the sum of colliding
    rows is the same bits in repeated runs (deterministic mode) and the CPU's to float64 precision."""
    world, numel, n, k = 3, 5000, 6, 4000
    stats = torch.randn(world, n, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    blocks = []
    for r in range(world):
        g = torch.Generator().manual_seed(r)
        idx = torch.randint(0, numel, (k,), generator=g, dtype=torch.int32)
        vals = torch.randn(k, generator=g, dtype=torch.float64) * (1 + 1e-10)
        vals[r] = 1e39 * (r + 1)
        blocks.append(wire.pack(hg.SparsePayload(vals.cuda(), idx.cuda()), stats[r].cuda(), numel))
    dev = torch.cat(blocks)
    assert dev.shape[1] == 3 and dev.device.type == "cuda"
    assert torch.equal(wire.read_header_stats(dev, world, n), stats.sum(0) / world)
    runs = [wire.unpack_sum(dev, numel, torch.float64) for _ in range(3)]
    assert all(torch.equal(r, runs[0]) for r in runs) and runs[0].dtype == torch.float64
    cpu = wire.unpack_sum(dev.cpu(), numel, torch.float64)
    assert torch.isfinite(runs[0]).all() and torch.allclose(runs[0].cpu(), cpu, rtol=1e-12, atol=1e-9)
    joined = wire.with_stats(torch.randn(10, dtype=torch.float64).cuda(), stats[0])
    assert joined.dtype == torch.float64 and torch.equal(wire.split_stats(joined, n)[1], stats[0])


@pytest.mark.parametrize("numel,k", [(1003, 10), (6_553_601, 655_353), (6_553_600, 65_536), (2 ** 31 + 5, 3)])
def test_randomk_draw_on_cuda_is_the_cpus(numel, k):
    """Random-k's shared-seed draw on the device: the CPU's integers bit for bit (ranks may
    mix devices or paths), int32 below 2**31 entries, made without a host copy."""
    from horovod_gravac.selection.randomk import _draw_key, stratified_draw
    key = _draw_key(11, 4, 2, 0)
    dev = stratified_draw(numel, k, key, "cuda")
    assert dev.device.type == "cuda" and dev.dtype == stratified_draw(numel, k, key).dtype
    assert torch.equal(dev.cpu(), stratified_draw(numel, k, key))


@pytest.mark.parametrize("cf", [1.5, 10, 100, 1000])
def test_redsync_on_cuda_keeps_what_a_full_sort_decides(cf):
    """RedSync on a GPU: above CF ~13 the set its search decides from a full sort of |x|
    (computed here on the CPU), whatever its sample, so the same entries on every device;
    below, one threshold's set within a few % of k (tests/unit/test_host_syncs.py)."""
    from test_host_syncs import check_redsync_kept
    from horovod_gravac.selection.redsync import RedSyncSelector
    for numel in (300_000, 1_200_000):
        t = _laplace(numel, seed=int(cf))
        k = max(1, int(numel / cf))
        got = RedSyncSelector(cf=cf).select(t.cuda(), k)
        assert got.device.type == "cuda"
        check_redsync_kept(t, k, got, (numel, cf))


@pytest.mark.parametrize("name", ["redsync", "dgc", "sidco-exponential", "sidco-gamma"])
def test_tied_buckets_keep_k_on_cuda(name):
    """Many magnitudes tied at the k-th (constant, value-clipped, ...): RedSync keeps the k
    largest, the earliest of the tie first (the CPU's set); DGC and SIDCo keep a count in
    [k/2, 2k] whose entries are the largest (tests/unit/test_host_syncs.py, the tie tests)."""
    from test_host_syncs import _band_reachable, _first_k_stable, _tied_cases
    from horovod_gravac.selection.dgc import DGCSelector
    from horovod_gravac.selection.redsync import RedSyncSelector
    from horovod_gravac.selection.sidco import SIDCoSelector
    make = {"redsync": RedSyncSelector, "dgc": DGCSelector,
            "sidco-exponential": SIDCoSelector,
            "sidco-gamma": lambda cf: SIDCoSelector(cf, distribution="gamma")}[name]
    g = torch.Generator().manual_seed(5)
    for numel in (20_000, 300_000):
        for cf in (10, 100, 1000):
            k = max(1, int(numel / cf))
            for case, t in _tied_cases(numel, k, g):
                got = torch.sort(make(cf).select(t.cuda(), k).long().cpu()).values
                what = (name, numel, cf, case, got.numel(), k)
                if name == "redsync" and not _band_reachable(t, k):
                    assert torch.equal(got, _first_k_stable(t, k)), what
                    continue
                a = t.abs()
                kept = torch.zeros(numel, dtype=torch.bool)
                kept[got] = True
                assert 0.5 <= got.numel() / k <= 2.0 and a[kept].min() >= a[~kept].max(), what


def test_sidco_keeps_k_on_heavy_tails_and_sparse_buckets_on_cuda():
    """SIDCo's host fits on a CUDA tensor: within [0.85, 1.15] of k at the CFs between the swept
    ones on Student's t, and on an embedding-like bucket (2 % of rows nonzero) at CF 100/1000
    with no stage fitted on a pass over the bucket (tests/unit/test_host_syncs.py, the same cases
    on the CPU's paths)."""
    import horovod_gravac.selection.sidco as sidco
    import horovod_gravac.selection.sidco_device as sidco_device
    from horovod_gravac.selection.fits import DISTRIBUTIONS
    torch.manual_seed(6)
    heavy = torch.distributions.StudentT(3.0).sample((1 << 20,)).cuda()
    rows = torch.zeros(2000, 150)
    rows[torch.randperm(2000)[:40]] = torch.randn(40, 150)
    sparse = rows.view(-1).cuda()
    passes = []
    real_pass = sidco_device.exceedance_moments
    sidco_device.exceedance_moments = lambda x, *a, **kw: passes.append(x.numel()) or real_pass(x, *a, **kw)
    try:
        for dist in DISTRIBUTIONS:
            for t, cfs in ((heavy, (30, 50, 300)), (sparse, (100, 1000))):
                for cf in cfs:
                    sel = sidco.SIDCoSelector(cf, dist)
                    k = t.numel() // cf
                    for step in range(4):
                        sel.set_step(step, 0)
                        got = sel.select(t, k)
                        assert got.device.type == "cuda"
                        assert 0.85 <= got.numel() / k <= 1.15, (dist, t.numel(), cf, step, got.numel() / k)
    finally:
        sidco_device.exceedance_moments = real_pass
    assert passes == [], passes[:4]


def test_adaptive_statistics_make_no_sync_on_cuda():
    """The encoder's squared norms and their per-bucket sum stay on the device (CUDA's sync
    debug mode sees every synchronising call); the step's total is read once."""
    import horovod_gravac.encoder as encoder
    from horovod_gravac.accounting import StepRecord
    t = _laplace(1_000_000).cuda()
    record = StepRecord()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for part in t.split(300_000):
                sq = encoder._sq(part)
                record.add_norms(torch.stack([sq, sq, sq]))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert not [w for w in caught if "called a synchronizing" in str(w.message)]
    assert float(record.norms[0]) == pytest.approx(float((t.double() ** 2).sum()), rel=1e-9)


# ------------------------------------------------------------------ host syncs
@pytest.mark.parametrize("name", ["randomk", "dgc", "redsync", "sidco-exponential", "sidco-gpareto", "sidco-gamma"])
def test_host_syncs_on_cuda_match_the_documented_counts(name):
    from test_host_syncs import DOCUMENTED, SyncCounter
    make, per_compress, per_further = DOCUMENTED[name]
    t = _laplace(1_200_000).cuda()
    for cf in (10, 100, 1000):
        comp = make(cf)
        comp.compress(t)   # warm-up (lazy generator creation, kernel caches)
        torch.cuda.synchronize()
        with SyncCounter() as c:
            payload, ctx = comp.compress(t)
        assert c.total <= per_compress, (name, cf, dict(c.ops))
        with SyncCounter() as f:
            comp.compress_further(payload, ctx, 10)
        assert f.total <= per_further, (name, cf, dict(f.ops))
        # CUDA's own account: every synchronising call warns in sync debug mode.
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                comp.compress(t)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        # (The first warning of a process announces the prototype mode; it is no sync.)
        syncs = [w for w in caught if "called a synchronizing" in str(w.message)]
        # Random-k draws its indices on the device (until 2026-11-27 on the CPU, uploaded with
        # a synchronising pageable copy): none.
        # SIDCo (device_fits="host", the default) copies its sample and its candidates to the
        # host, where it fits: two device-to-host copies that the dispatch counter does not see.
        # RedSync copies its candidates' largest magnitudes to the host: one more.
        allowed = per_compress + {"redsync": 1}.get(name, 0) + (2 if name.startswith("sidco") else 0)
        print(f"{name} cf={cf}: {c.total} dispatch-counted syncs, {len(syncs)} CUDA sync warnings")
        assert len(syncs) <= allowed, (name, cf, [str(w.message)[:120] for w in syncs])


# ------------------------------------------------------------------ the optimizer, one rank
@pytest.fixture(scope="module")
def hvd_cuda():
    hvd = pytest.importorskip("horovod.torch", reason="Horovod is not installed here: the optimizer needs it, "
                              "the compressor and wire-format tests above do not")
    hvd.init()
    if not (hvd.cuda_built() or hvd.nccl_built() or getattr(hvd, "rocm_built", lambda: False)()):
        pytest.skip("Horovod was built without GPU support (hvd.cuda_built() and hvd.nccl_built() are "
                    "False): CUDA tensors cannot go through its collectives")
    return hvd


def _train(device, compressor, controller, dtype=torch.float32, steps=6):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5)).to(device, dtype)
    opt = hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=model.named_parameters(), compressor=compressor,
                                  controller=controller, bucket_cap_mb=0.005)
    cfs = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(24, 32, generator=g), torch.randint(0, 5, (24,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x.to(device, dtype)).float(), y.to(device)).backward()
        opt.step()
        cfs.append(opt.stats["cf"])
    opt.close()
    params = torch.cat([p.detach().float().cpu().reshape(-1) for p in model.parameters()])
    for p in model.parameters():
        assert p.grad.dtype == p.dtype and p.grad.device == p.device
    return params, cfs


OPT_CASES = {
    "dense": (TopKCompressor, lambda: hg.Dense(), True),
    "topk-static": (TopKCompressor, lambda: hg.StaticCF(10), True),
    "randomk-static": (RandomKCompressor(cf=10, seed=3), lambda: hg.StaticCF(10), True),
    "topk-gravac": (TopKCompressor, lambda: hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=2), False),
    "dgc-static": (DGCCompressor, lambda: hg.StaticCF(10), False),
    "redsync-static": (RedSyncCompressor, lambda: hg.StaticCF(10), False),
    "sidco-static": (SIDCoCompressor, lambda: hg.StaticCF(10), False),
    "powersgd-static": (PowerSGDCompressor, lambda: hg.StaticCF(4), False),
    "topk-accordion": (TopKCompressor, lambda: hg.Accordion(low_cf=2, high_cf=16, interval=2), False),
}


@pytest.mark.parametrize("case", sorted(OPT_CASES))
def test_optimizer_on_cuda_against_cpu(hvd_cuda, case):
    compressor, controller, exact = OPT_CASES[case]
    dev, dev_cfs = _train("cuda", compressor, controller())
    cpu, cpu_cfs = _train("cpu", compressor, controller())
    assert torch.isfinite(dev).all()
    if exact:   # the same selections; only float rounding differs between the devices
        assert dev_cfs == cpu_cfs and torch.allclose(dev, cpu, atol=1e-4, rtol=1e-4), (dev - cpu).abs().max()
    else:
        assert (dev - cpu).abs().max() < 1.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_optimizer_on_cuda_half_precision(hvd_cuda, dtype):
    params, cfs = _train("cuda", TopKCompressor, hg.StaticCF(10), dtype=dtype)
    assert torch.isfinite(params).all() and cfs == [10.0] * 6
