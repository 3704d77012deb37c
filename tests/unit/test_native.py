"""The native CPU kernels (``horovod_gravac/_native/kernels.c`` via ``horovod_gravac.native``).

Each entry point is checked against a NumPy statement of its contract, on the AVX-512
path, the AVX2 path and the portable path, with the awkward floats (NaN, infinities, -0.0,
subnormals), lengths around the 16-lane vector width, a too-small output buffer, heavy
ties and a wrong search bound.
"""
import shutil

import numpy as np
import pytest

from horovod_gravac import native

pytestmark = pytest.mark.skipif(native._LIB is None, reason="native kernels not built")

# every native path that runs different code on this CPU (the AVX2 one too, on an AVX-512 CPU)
SIMD_PATHS = [p for p in native.distinct_choices() if p != "off"]


@pytest.fixture(params=SIMD_PATHS)
def path(request):
    previous = native.use(request.param)
    yield request.param
    native.use(previous)


def awkward(n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.laplace(size=n).astype(np.float32)
    if n >= 8:
        x[rng.integers(0, n, 3)] = np.nan
        x[rng.integers(0, n, 2)] = np.inf
        x[rng.integers(0, n, 2)] = -np.inf
        x[rng.integers(0, n, 3)] = -0.0
        x[rng.integers(0, n, 3)] = 1e-40            # subnormal
        x[rng.integers(0, n, 3)] = -1e-40
    return x


def want_select(x, t, strict):
    a = np.abs(x)
    keep = ~(a <= t) if strict else ~(a < t)         # NaN passes
    return np.flatnonzero(keep)


def test_the_install_built_the_library():
    """setup.py builds it as an optional extension; with a compiler present it must be there."""
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler on this machine")
    assert native._LIB is not None


def test_a_library_built_from_older_sources_falls_back_to_numpy_with_a_warning():
    """A checkout updated without rebuilding keeps an old library that lacks newer entry points:
    the package still imports, warns how to rebuild, and runs the NumPy code."""
    class Stale:   # the entry points of an older build: everything but the gamma quantile
        pass
    stale = Stale()
    for name in native._SIGNATURES:
        if name != "hg_gamma_upper_quantile":
            setattr(stale, name, getattr(native._LIB, name))
    with pytest.warns(RuntimeWarning, match="hg_gamma_upper_quantile.*build_ext --inplace"):
        assert native._configure(stale, "/old/_kernels.so") is None
    assert native._configure(native._LIB, "x") is native._LIB


def test_use_validates_and_reports_the_path():
    previous = native.use("off")
    try:
        assert native.mode() == "numpy" and not native.available()
        native.use("portable")
        assert native.mode() == "portable" and native.available()
        native.use("avx2")
        assert native.mode() in ("avx2", "portable")   # (portable: a CPU without AVX2)
        native.use("auto")
        assert native.mode() in ("avx512", "avx2", "portable")
        with pytest.raises(ValueError, match="native mode"):
            native.use("fast")
    finally:
        native.use(previous)


def test_usable_only_for_contiguous_float32():
    x = np.zeros(100, dtype=np.float32)
    assert native.usable(x)
    assert not native.usable(x.astype(np.float64))
    assert not native.usable(x[::2])
    assert not native.usable(x.reshape(10, 10))


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 31, 33, 1000, 100_003])
@pytest.mark.parametrize("t,strict", [(0.0, True), (0.0, False), (1e-41, False), (0.7, False),
                                      (2.5, False), (np.inf, False), (np.nan, False)])
@pytest.mark.parametrize("likely", [None, 0.0], ids=["dense-loop", "sparse-loop"])
def test_select_matches_its_contract(path, n, t, strict, likely):
    # likely=None: the density hint is the buffer (all of x: the loop that stores every
    # step); likely=0: the loop that skips blocks without survivors.  Same output.
    x = awkward(n, seed=n)
    count, idx, val = native.select_into(x, t, strict, cap=n, likely=likely)
    want = want_select(x, np.float32(t), strict) if not np.isnan(t) else np.flatnonzero(np.isnan(x))
    assert count == want.size
    assert idx.dtype == np.int32 and val.dtype == np.float32
    assert np.array_equal(idx, want)
    assert np.array_equal(val.view(np.uint32), x[want].view(np.uint32))   # signs and NaN bits kept


@pytest.mark.parametrize("cap", [0, 1, 16, 40, 999])
@pytest.mark.parametrize("likely", [None, 0.0], ids=["dense-loop", "sparse-loop"])
def test_select_with_a_small_buffer_counts_all_and_keeps_the_first(path, cap, likely):
    x = awkward(5000, seed=3)
    want = want_select(x, np.float32(0.5), False)
    count, idx, val = native.select_into(x, 0.5, False, cap, likely=likely)
    assert count == want.size > cap
    assert np.array_equal(idx, want[:cap]) and np.array_equal(val.view(np.uint32), x[want[:cap]].view(np.uint32))
    # select() makes room for all of them when its estimate was short
    idx, val = native.select(x, 0.5, False, cap)
    assert np.array_equal(idx, want) and np.array_equal(val.view(np.uint32), x[want].view(np.uint32))


@pytest.mark.parametrize("n", [3, 40, 1000])
@pytest.mark.parametrize("cap_of", ["all", "two"])
def test_select_from_any_alignment(path, n, cap_of):
    """The vector loop starts at the first 64-byte boundary (the entries before it go
    through portable C): every start offset, with the buffer filling inside the head."""
    base = awkward(n + 32, seed=n)
    for offset in range(17):
        x = base[offset:offset + n]
        cap = n if cap_of == "all" else 2
        for t, strict in ((0.0, True), (0.3, False), (2.0, False)):
            want = want_select(x, np.float32(t), strict)
            count, idx, val = native.select_into(x, t, strict, cap)
            assert count == want.size, (offset, t)
            assert np.array_equal(idx, want[:cap]), (offset, t)
            assert np.array_equal(val.view(np.uint32), x[want[:cap]].view(np.uint32)), (offset, t)


def test_select_output_is_cache_line_aligned():
    """The kept values feed the next level of multi-level compression: they start on a
    64-byte boundary, so that pass reads whole cache lines."""
    x = awkward(10_000, seed=1)
    for cap in (1, 17, 5000):
        _, idx, val = native.select_into(x, 0.1, False, cap)
        assert idx.ctypes.data % 64 == 0 and val.ctypes.data % 64 == 0


def test_every_path_gives_identical_output():
    x = awkward(300_001, seed=5)
    outs = []
    for p in SIMD_PATHS:
        previous = native.use(p)
        try:
            outs.append(native.select_into(x, 1.3, False, 100_000))
        finally:
            native.use(previous)
    c1, i1, v1 = outs[0]
    for c2, i2, v2 in outs[1:]:
        assert c1 == c2 and np.array_equal(i1, i2) and np.array_equal(v1, v2, equal_nan=True)


def reference_keep(vals, k):
    """Positions of the k largest |vals| (NaN largest), ties to the lowest position."""
    a = np.abs(vals.astype(np.float64))
    nan = np.isnan(a)
    order = np.lexsort((np.arange(a.size), -np.where(nan, 0.0, a), -nan.astype(np.int8)))
    return np.sort(order[:k])


@pytest.mark.parametrize("kind", ["distinct", "ties", "nan", "constant"])
@pytest.mark.parametrize("k", [0, 1, 500, 2999, 3000])
@pytest.mark.parametrize("bound", ["none", "right", "too low", "nan"])
def test_drop_smallest_keeps_the_k_largest(path, kind, k, bound):
    rng = np.random.default_rng(k)
    c = 3000
    if kind == "distinct":
        vals = rng.normal(size=c).astype(np.float32)
    elif kind == "ties":
        vals = (rng.integers(-4, 5, c) / 4).astype(np.float32)
    elif kind == "nan":
        vals = rng.normal(size=c).astype(np.float32)
        vals[rng.integers(0, c, 700)] = np.nan
    else:
        vals = np.full(c, -2.0, dtype=np.float32)
    idx = np.sort(rng.choice(10 ** 6, c, replace=False)).astype(np.int32)
    keep = reference_keep(vals, k)
    mags = np.sort(np.abs(vals))
    lower = {"none": None, "too low": float(mags[0]), "nan": float("nan"),
             "right": float(np.nextafter(mags[min(c - k, c - 1)], np.float32(np.inf)))}[bound]
    i2, v2 = native.drop_smallest(idx.copy(), vals.copy(), k, lower)
    assert i2.size == k
    assert sorted(i2.tolist()) == sorted(idx[keep].tolist())
    # each kept value still sits next to its index
    where = {int(i): j for j, i in enumerate(idx)}
    assert np.array_equal(v2.view(np.uint32), vals[[where[int(i)] for i in i2]].view(np.uint32))


def test_drop_smallest_refills_in_order():
    """Slots below k that are dropped take the tail's survivors in order: mostly ascending output."""
    vals = np.arange(1, 11, dtype=np.float32)[::-1].copy()   # 10, 9, ..., 1
    vals[2] = 0.5                                            # the smallest sits at slot 2
    idx = np.arange(10, dtype=np.int32) * 10
    i2, v2 = native.drop_smallest(idx, vals, 9)
    assert i2.tolist() == [0, 10, 90, 30, 40, 50, 60, 70, 80]
    assert v2.tolist() == [10, 9, 1, 7, 6, 5, 4, 3, 2]


def test_an_unknown_switch_value_is_an_error_naming_the_variable():
    import os
    import subprocess
    import sys
    env = dict(os.environ, HOROVOD_GRAVAC_NATIVE="yes")
    proc = subprocess.run([sys.executable, "-c", "import horovod_gravac.native"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "HOROVOD_GRAVAC_NATIVE must be one of" in proc.stderr and "'yes'" in proc.stderr


# -- scatter (decompress) ---------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 1, 17, 5000])
def test_scatter_zeroes_then_writes(k):
    rng = np.random.default_rng(k)
    out = rng.standard_normal(20_000).astype(np.float32)     # stale content must go
    idx = rng.choice(20_000, size=k, replace=False).astype(np.int32)
    val = rng.standard_normal(k).astype(np.float32)
    native.scatter(out, idx, val)
    want = np.zeros(20_000, dtype=np.float32)
    want[idx] = val
    assert np.array_equal(out, want)


@pytest.mark.parametrize("bad", [-1, 20_000, np.iinfo(np.int32).max])
def test_scatter_rejects_an_index_outside_the_tensor(bad):
    out = np.ones(20_000, dtype=np.float32)
    idx = np.array([3, bad, 7], dtype=np.int32)
    with pytest.raises(IndexError, match="out of range"):
        native.scatter(out, idx, np.ones(3, dtype=np.float32))
    assert out[0] == 1.0     # nothing written: the check comes first
