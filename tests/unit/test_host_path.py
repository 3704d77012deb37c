"""The threshold compressors' CPU host path: NumPy arrays, host scalars and the
native kernels instead of torch ops on 0-dim tensors.  Each piece must compute what its
torch twin (the path accelerators take) computes; the compressors' contracts (quality,
threshold sets, multi-level, determinism) are tested on every CPU path in
test_threshold_compressors.py."""
import math

import numpy as np
import pytest
import torch

from horovod_gravac import native
from horovod_gravac.compressors import DGCCompressor, RedSyncCompressor, SIDCoCompressor, kept_count
from horovod_gravac.selection import kernels
from horovod_gravac.selection.sidco import SIDCoSelector
from horovod_gravac.selection.fits import (fitted_excess, fitted_excess_host, gamma_upper_quantile,
                                           gamma_upper_quantile_host)
from horovod_gravac.selection.kernels import exceedance_moments
from horovod_gravac.selection.redsync import redsync_search
from horovod_gravac.selection.sampling import host_abs_sample

needs_native = pytest.mark.skipif(native._LIB is None, reason="native kernels not built")


def laplace(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2.0 * u.abs())).float()


@pytest.fixture
def native_on():
    previous = native.use("auto")
    yield
    native.use(previous)


@pytest.fixture(params=[p for p in native.distinct_choices() if p != "off"])
def native_mode(request):
    """The native kernels with their SIMD loops (where the CPU has them; AVX2 alone as well on
    an AVX-512 CPU) and without."""
    previous = native.use(request.param)
    yield request.param
    native.use(previous)


# -- RedSync's search -----------------------------------------------------------------------------
def _torch_redsync(cand_signed, k, floor, ceil, steps, tolerance):
    """What redsync.py's torch path does with the candidates: bounds, search, keep."""
    cand = cand_signed.abs()
    many = k * (1.0 + tolerance)
    vmax = cand.max()
    hi = torch.minimum(vmax, torch.tensor(ceil))
    hi = torch.where(torch.count_nonzero(cand > hi) > many, vmax, hi)
    lo = torch.minimum(torch.tensor(floor), hi)
    thr, _ = redsync_search(cand, k, lo, hi, steps, tolerance)
    return thr.item(), torch.nonzero(cand > thr).view(-1)


@needs_native
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("k_frac,ceil_q", [(0.5, 0.45), (0.1, 0.08), (0.01, 0.012), (0.3, 0.9)])
def test_native_redsync_search_equals_the_torch_search(native_mode, seed, k_frac, ceil_q):
    x = laplace(50_000, seed)
    floor = 0.05
    val = x[x.abs() >= floor].contiguous()
    c = val.numel()
    k = max(1, int(k_frac * c))
    ceil = float(val.abs().quantile(1.0 - ceil_q))   # ceil_q 0.9: a ceiling far too low (search up to max)
    steps, tol = 12, 0.02
    thr_t, keep_t = _torch_redsync(val, k, floor, ceil, steps, tol)
    idx = np.arange(c, dtype=np.int32)
    v = val.numpy().copy()
    idx2, v2, thr_n = native.redsync_search(idx, v, floor, ceil, k * (1 - tol), k * (1 + tol), steps)
    assert thr_n == pytest.approx(thr_t, rel=0, abs=0)
    assert sorted(idx2.tolist()) == keep_t.tolist()
    assert np.array_equal(v2, val.numpy()[idx2])
    assert len(set(idx2.tolist())) == idx2.size


@needs_native
def test_native_redsync_search_refills_in_order_and_drops_nan(native_mode):
    val = np.array([5.0, -1.0, 3.0, np.nan, -4.0, 2.0, 0.5, 6.0], dtype=np.float32)
    idx = np.arange(8, dtype=np.int32) * 10
    # Threshold search with no steps: keep |v| > lo = 2.5.
    idx2, v2, thr = native.redsync_search(idx, val, 2.5, 10.0, 0, 100, 0)
    assert thr == 2.5
    assert sorted(idx2.tolist()) == [0, 20, 40, 70]
    assert sorted(v2.tolist()) == [-4.0, 3.0, 5.0, 6.0]


@needs_native
@pytest.mark.parametrize("c", [7, 8, 9, 23, 64])
def test_native_redsync_search_with_nan_and_a_low_ceiling(native_mode, c):
    """NaN never becomes max |v|; candidates above a ceiling that keeps too many are searched
    up to max |v| (the vector loop and its scalar tail both record them)."""
    rng = np.random.default_rng(c)
    val = (rng.standard_normal(c) * 3).astype(np.float32)
    val[c // 2] = np.nan
    idx = np.arange(c, dtype=np.int32)
    k = max(1, c // 4)
    want_thr, want_keep = _torch_redsync(torch.from_numpy(np.nan_to_num(val, nan=0.0)), k, 0.0, 0.1, 20, 0.02)
    idx2, v2, thr = native.redsync_search(idx, val.copy(), 0.0, 0.1, k * 0.98, k * 1.02, 20)
    assert thr == pytest.approx(want_thr, rel=0, abs=0)
    assert sorted(idx2.tolist()) == want_keep.tolist()
    assert not np.isnan(v2).any()


# -- SIDCo's pieces -------------------------------------------------------------------------------
@needs_native
@pytest.mark.parametrize("t", [0.0, 0.3, 2.0, 9.0])
def test_native_exceedance_moments_equal_the_torch_pass(native_on, t):
    x = laplace(300_001, 5)
    x[7] = float("nan")
    want = exceedance_moments(x[~x.isnan()], torch.tensor(t)).tolist()
    got = native.exceedance_moments(x.numpy(), t)
    assert got[0] == want[0]
    assert got[1] == pytest.approx(want[1], rel=1e-5)
    assert got[2] == pytest.approx(want[2], rel=1e-5)
    assert native.exceedance_moments(x.numpy(), t, squares=False)[2] == 0.0


@needs_native
@pytest.mark.parametrize("t", [0.0, 0.5, 1.5, 2.0, -1.0])
def test_native_moments_of_one_array_count_ties_and_not_nan(native_on, t):
    val = np.array([2.0, -2.0, 1.5, -0.5, 0.0, np.nan, 3.0, -1.4999999, 0.5], dtype=np.float32)
    want = np.count_nonzero(np.abs(val[~np.isnan(val)]) >= np.float32(t))
    moments = native.MomentsOf(val)
    assert moments.count_at_least(t) == want
    assert moments(t) == native.exceedance_moments(val, t)


@pytest.mark.parametrize("alpha", [0.01, 0.2, 1.0, 3.5, 80.0, 5000.0])
@pytest.mark.parametrize("density", [0.7, 0.25, 1e-3, 1e-7])
def test_gamma_quantile_host_equals_torch(alpha, density):
    want = gamma_upper_quantile(torch.tensor(alpha, dtype=torch.float64), torch.tensor(density, dtype=torch.float64))
    assert gamma_upper_quantile_host(alpha, density) == pytest.approx(float(want), rel=1e-9)


@needs_native
def test_native_gamma_quantile_is_the_python_one_bit_for_bit(native_on):
    """The C port of the host quantile returns the same double as the Python loops it replaces,
    from alpha 0.01 to 1e4 and density 1e-300 to 1, and switching the kernels off changes nothing."""
    from horovod_gravac.selection import fits
    rng = np.random.default_rng(0)
    alphas = [0.01, 0.1, 0.5, 0.8, 1.0, 1.2, 3.0, 100.0, 1e4] + list(np.exp(rng.uniform(np.log(0.01), np.log(1e4), 60)))
    densities = [1e-300, 1e-9, 1e-4, 0.01, 0.25, 0.9, 1.0 - 1e-9, 1.0] + list(np.exp(rng.uniform(-25.0, 0.0, 20)))
    for alpha in map(float, alphas):
        for density in map(float, densities):
            clamped = min(max(density, 1e-300), 1.0 - 1e-12)
            want = fits._gamma_upper_quantile_python(alpha, clamped, math.lgamma(alpha))
            assert gamma_upper_quantile_host(alpha, density) == want, (alpha, density)
    previous = native.use("off")
    try:
        assert gamma_upper_quantile_host(1.2, 0.1) == fits._gamma_upper_quantile_python(1.2, 0.1, math.lgamma(1.2))
    finally:
        native.use(previous)


@pytest.mark.parametrize("distribution", ["exponential", "gpareto", "gamma"])
@pytest.mark.parametrize("moments", [(1000.0, 800.0, 2000.0), (50.0, 10.0, 2.5), (1.0, 3.0, 9.0)])
@pytest.mark.parametrize("density", [0.25, 0.01, 1e-4])
def test_fitted_excess_host_equals_torch(distribution, moments, density):
    want = fitted_excess(distribution, torch.tensor(moments, dtype=torch.float64),
                         torch.tensor(density, dtype=torch.float64))
    assert fitted_excess_host(distribution, moments, density) == pytest.approx(float(want), rel=1e-9)


def _sidco_inputs():
    """Tensors that take each branch of SIDCo's host path: the gather of a heavy tail's input from
    512K entries up and the streaming pass below, embedding-like and half-zero buckets, ties, NaN
    and inf, a payload of multi-level compression (magnitudes all above a threshold) and a tensor
    smaller than the sample."""
    g = torch.Generator().manual_seed(11)
    rows = torch.zeros(2000, 150)
    rows[torch.randperm(2000, generator=g)[:40]] = torch.randn(40, 150, generator=g)
    top = torch.randn(1_000_000, generator=g)
    payload = top[top.abs() >= top.abs().kthvalue(900_000).values][:90_000]
    nan = laplace(200_000, 12)
    nan[17], nan[5_000] = float("nan"), float("inf")
    torch.manual_seed(13)
    return {
        "laplace": laplace(262_144, 14), "normal": torch.randn(600_000, generator=g),
        "student2-600k": torch.distributions.StudentT(2.0).sample((600_000,)),
        "student2-262k": torch.distributions.StudentT(2.0).sample((262_144,)),
        "cauchy": torch.distributions.StudentT(1.0).sample((300_000,)),
        "embedding": rows.view(-1), "half-zeros": torch.randn(500_000, generator=g) * (torch.rand(500_000, generator=g) > 0.5),
        "ties": torch.randint(0, 4, (300_000,), generator=g).float(), "nan-inf": nan,
        "payload": payload, "small": torch.randn(3_000, generator=g),
    }


@needs_native
def test_sidco_stages_in_c_select_what_the_python_stages_select(native_on, monkeypatch):
    """``native.sidco_select`` (kernels.c) is ``sidco_host.HostStages.select`` in C: on every input,
    distribution, CF and stage setting both keep the same entries (bit for bit, in the same order),
    fit the same number of stages and make the same streaming passes; and the inputs reach each of
    its branches (a streaming pass, a candidate phase, a selection without one)."""
    import horovod_gravac.selection.sidco as sidco
    seen = set()
    real = native.sidco_select

    def noting(*args, **kwargs):
        idx, val, done = real(*args, **kwargs)
        seen.update({"pass"} if done["passes"] else set())
        seen.add("candidates" if done["candidates"] else "direct")
        return idx, val, done

    monkeypatch.setattr(native, "sidco_select", noting)
    for name, t in _sidco_inputs().items():
        x = t.numpy()
        for distribution in ("exponential", "gpareto", "gamma"):
            for cf, stages in [(2, None), (10, None), (12, None), (15, None), (20, None), (50, None),
                               (300, None), (1000, None), (100, 3), (1000, 1)]:
                k = max(1, x.size // cf)
                got = []
                for in_c in (True, False):
                    monkeypatch.setattr(sidco, "_NATIVE_STAGES", in_c)
                    sel = SIDCoSelector(cf, distribution, stages=stages, seed=5)
                    for step in (3, 4):
                        sel.set_step(step)
                        idx, val = sel._select_host(x, k)
                        got.append((idx.tolist(), val.tobytes(), sel.last_stages, sel.last_passes))
                assert got[:2] == got[2:], (name, distribution, cf, stages, [(len(g[0]),) + g[2:] for g in got])
    assert seen == {"pass", "candidates", "direct"}, seen


@needs_native
def test_sidco_stages_in_c_match_python_under_any_settings(native_on, monkeypatch):
    """The same comparison over random settings (first, stage and compact densities, refinement
    rounds, tolerance, fixed stage counts, CFs from 1.5 to 10000): the C loop reads every setting
    the Python one does."""
    import random
    import horovod_gravac.selection.sidco as sidco
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(50_000, generator=g), torch.distributions.StudentT(1.5).sample((300_000,)),
              torch.randn(200_000, generator=g) * (torch.rand(200_000, generator=g) > 0.7),
              torch.rand(9_000, generator=g), laplace(700_000, 21)]
    for trial in range(150):
        x = rng.choice(inputs).numpy()
        cf = rng.choice([1.5, 2, 3, 7, 10, 13, 25, 40, 77, 150, 500, 2000, 10000])
        settings = dict(distribution=rng.choice(["exponential", "gpareto", "gamma"]),
                        stages=rng.choice([None, None, 1, 2, 5]), first_density=rng.choice([0.25, 0.5, 0.1, 0.9]),
                        stage_density=rng.choice([0.25, 0.5, 0.1, 0.9]),
                        compact_density=rng.choice([0.02, 0.1, 0.001]), refine=rng.choice([6, 0, 1, 3]),
                        tolerance=rng.choice([0.05, 0.01, 0.2, 0.5]))
        k = max(1, int(x.size / cf))
        got = []
        for in_c in (True, False):
            monkeypatch.setattr(sidco, "_NATIVE_STAGES", in_c)
            sel = SIDCoSelector(cf, seed=7, **settings)
            sel.set_step(trial)
            idx, val = sel._select_host(x, k)
            got.append((idx.tobytes(), val.tobytes(), sel.last_stages, sel.last_passes))
        assert got[0] == got[1], (trial, x.size, cf, settings, got[0][2:], got[1][2:])
    from horovod_gravac.selection import fits
    for steps in (1, 2):   # the gamma quantile's Newton steps come from fits._NEWTON_STEPS in both
        monkeypatch.setattr(fits, "_NEWTON_STEPS", steps)
        for cf in (10, 300):
            got = []
            for in_c in (True, False):
                monkeypatch.setattr(sidco, "_NATIVE_STAGES", in_c)
                sel = SIDCoSelector(cf, "gamma", seed=7)
                idx, val = sel._select_host(inputs[1].numpy(), inputs[1].numel() // cf)
                got.append((idx.tobytes(), val.tobytes(), sel.last_stages))
            assert got[0] == got[1], (steps, cf, got[0][2:], got[1][2:])


# -- sampling -------------------------------------------------------------------------------------
@needs_native
@pytest.mark.parametrize("n,s", [(262_144, 16_384), (100_003, 1000), (6_553_601, 3517), (70_001, 70_000),
                                 (1_048_577, 8191), (2_097_152, 8192), (3_000_017, 8190)])
def test_native_sample_equals_the_numpy_sample(n, s):
    """hg_abs_sample computes the positions in the same double arithmetic as NumPy: in its AVX-512
    loop (eight positions a step, up to 2M entries, the remainder in scalar code) and its scalar
    one."""
    x = laplace(n, 4).numpy()
    x[5] = np.nan
    got = host_abs_sample(x, s, torch.Generator().manual_seed(9))
    previous = native.use("off")
    try:
        want = host_abs_sample(x, s, torch.Generator().manual_seed(9))
    finally:
        native.use(previous)
    assert np.array_equal(got, want, equal_nan=True)


def test_host_sample_is_stratified_and_reproducible():
    n, s = 100_003, 1000
    x = np.arange(n, dtype=np.float32)          # |x| = position
    pos = host_abs_sample(x, s, torch.Generator().manual_seed(1))
    again = host_abs_sample(x, s, torch.Generator().manual_seed(1))
    other = host_abs_sample(x, s, torch.Generator().manual_seed(2))
    d = n // s
    assert np.array_equal(pos, again) and not np.array_equal(pos, other)
    assert np.array_equal(pos // d, np.arange(s))   # one position in each stratum [i d, (i + 1) d)
    assert np.array_equal(host_abs_sample(-x[:500], s, torch.Generator()), x[:500])   # all when s >= n


# -- the compressors take it ----------------------------------------------------------------------
@needs_native
@pytest.mark.parametrize("make", [DGCCompressor, RedSyncCompressor, SIDCoCompressor])
@pytest.mark.parametrize("cf", [10, 100, 1000])
def test_compressors_take_the_host_path_for_cpu_float32(native_on, monkeypatch, make, cf):
    def torch_path(*args, **kwargs):
        raise AssertionError("the torch path ran")

    comp = make(cf)
    monkeypatch.setattr(type(comp.selector), "_select", torch_path)
    x = laplace(300_000, 2)
    payload, _ = comp.compress(x)
    assert 0.8 <= comp.last_quality <= 1.25
    assert comp.last_quality == payload.values.numel() / kept_count(x.numel(), cf)
    idx = payload.indices.long()
    assert torch.equal(payload.values, x[idx]) and idx.unique().numel() == idx.numel()
    kept = torch.zeros(x.numel(), dtype=torch.bool)
    kept[idx] = True
    assert x.abs()[kept].min() >= x.abs()[~kept].max()


@needs_native
def test_host_path_off_for_other_dtypes_and_when_switched_off(monkeypatch):
    x = laplace(200_000, 3)
    assert kernels.host_path(x)
    assert not kernels.host_path(x.double())
    previous = native.use("off")
    try:
        assert not kernels.host_path(x)
    finally:
        native.use(previous)


@pytest.mark.parametrize("distribution", ["exponential", "gpareto", "gamma"])
@pytest.mark.parametrize("moments", [(15.0, 870.0, 54130.0), (1000.0, 800.0, 2000.0)])
def test_fitted_excess_at_density_one_is_zero(distribution, moments):
    # Density 1 asks for every excess; the gamma quantile's Newton steps alone stopped at
    # 3.56 for the first moments, which dropped the smallest entries of a sparse tensor.
    assert fitted_excess_host(distribution, moments, 1.0) == 0.0
    assert float(fitted_excess(distribution, torch.tensor(moments, dtype=torch.float64),
                               torch.tensor(1.0, dtype=torch.float64))) == 0.0


def test_host_sample_is_stratified_for_every_seed_and_covers_each_stratum_uniformly():
    # One random draw per call: each stratum's position is still uniform over the stratum.
    n, s = 64_000, 1000
    x = np.arange(n, dtype=np.float32)
    d = n // s
    offsets = np.stack([host_abs_sample(x, s, torch.Generator().manual_seed(seed)) for seed in range(400)])
    assert np.array_equal(offsets.astype(np.int64) // d, np.broadcast_to(np.arange(s), offsets.shape))
    counts = np.bincount((offsets[:, 7] - 7 * d).astype(np.int64), minlength=d)   # stratum 7 over seeds
    assert counts.min() >= 1 and counts.max() <= 20          # 400 draws over 64 slots: ~6 each
