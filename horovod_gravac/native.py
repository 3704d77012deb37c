"""The native CPU kernels (``_native/kernels.c``), loaded with ctypes, and their switch.

``setup.py`` builds ``horovod_gravac/_kernels*.so`` as an optional extension: where
no C compiler is found the install still succeeds and every caller falls back to its
NumPy code, which gives the same results, only slower (see ``benchmarks/compressors.py``
for the figures).  The library has no Python module inside (ctypes needs none), so
it is found by file name rather than imported.

``HOROVOD_GRAVAC_NATIVE`` chooses, read once at import:

* unset or ``1``: the native kernels, with AVX-512 where the CPU has it (else the select
  pass in AVX2 where the CPU has that);
* ``avx2``: the native kernels with AVX2 at most: what an x86 CPU without AVX-512 (AMD
  Zen 2/3, many GPU hosts) runs, so that a machine with AVX-512 can test and time it;
* ``portable``: the native kernels without their hand-written SIMD code (portable C,
  compiled with an AVX2 variant on x86);
* ``0``: NumPy only.

Any other value is a ``ValueError`` naming the variable, at import.

Tests and benchmarks switch at run time with :func:`use`.  Every path returns the
same indices and values, so ranks that run different paths still agree.
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import os
import warnings
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

__all__ = ["available", "use", "mode", "distinct_choices", "usable", "select", "select_into", "drop_smallest",
           "redsync_search", "exceedance_moments", "MomentsOf", "abs_sample", "scatter", "gamma_upper_quantile",
           "stratified_draw", "sidco_select", "SLACK"]

# Extra slots every output buffer needs after its capacity (whole-vector stores).
SLACK = 16
_INT32_MAX = np.iinfo(np.int32).max

_p = ctypes.c_void_p
_i64 = ctypes.c_int64


# Every entry point, with its (restype, argtypes).
_SIGNATURES = {
    "hg_select": (_i64, [_p, _i64, ctypes.c_float, ctypes.c_int, ctypes.c_double, _p, _p, _i64, ctypes.c_int]),
    "hg_drop_smallest": (ctypes.c_int, [_p, _p, _i64, _i64, ctypes.c_float, ctypes.c_int, ctypes.c_int]),
    "hg_redsync": (_i64, [_p, _p, _i64, ctypes.c_float, ctypes.c_float, ctypes.c_double, ctypes.c_double,
                          ctypes.c_int, _p, ctypes.c_int]),
    "hg_exceedance_moments": (None, [_p, _i64, ctypes.c_float, ctypes.c_int, _p]),
    "hg_abs_sample": (None, [_p, _i64, _i64, ctypes.c_double, ctypes.c_double, _p, ctypes.c_int]),
    "hg_scatter": (ctypes.c_int, [_p, _i64, _p, _p, _i64]),
    "hg_gamma_upper_quantile": (ctypes.c_double, [ctypes.c_double] * 5 + [ctypes.c_int]),
    "hg_stratified_draw": (None, [_i64, _i64, ctypes.c_uint64, _p, _p]),
    "hg_simd_level": (ctypes.c_int, [ctypes.c_int]),
    "hg_sidco_select": (_i64, [_p, _i64, _p, _i64, _i64, _p, _p, _p, _i64, _p]),
}


def _configure(lib, path) -> Optional[ctypes.CDLL]:
    """``lib`` with every entry point's types set, or None (with a warning) when one is missing:
    a library built from older sources (a checkout updated without rebuilding) would otherwise
    fail the import of the whole package at the first missing name."""
    missing = [name for name in _SIGNATURES if not hasattr(lib, name)]
    if missing:
        warnings.warn(f"horovod_gravac: the native kernels at {path} lack {', '.join(missing)} (built from "
                      f"older sources?); running the NumPy code instead. Rebuild them with "
                      f"'python setup.py build_ext --inplace' or reinstall the package.", RuntimeWarning)
        return None
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def _load() -> Optional[ctypes.CDLL]:
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_kernels{suffix}"
        if path.exists():
            try:
                lib = ctypes.CDLL(str(path))
            except OSError:
                return None
            return _configure(lib, path)
    return None


_LIB = _load()
_MODE = "off"
# The kernels' last argument for each choice (kernels.c's hg_simd_level): 1 the best SIMD
# the CPU has, 2 AVX2 at most, 0 none.
_SIMD_ARG = {"auto": 1, "avx2": 2, "portable": 0, "off": 0}


def _simd() -> int:
    return _SIMD_ARG[_MODE]


def use(choice: str) -> str:
    """Switch to ``"auto"`` (native, SIMD where supported), ``"avx2"`` (native, AVX2 at most),
    ``"portable"`` or ``"off"``; returns the previous choice.  The native choices fall back to
    ``"off"`` when the library was not built (and ``"avx2"`` runs portable C on a CPU without
    AVX2: :func:`mode` says what runs)."""
    global _MODE
    if choice not in _SIMD_ARG:
        raise ValueError(f"native mode must be one of {', '.join(map(repr, _SIMD_ARG))}, got {choice!r}")
    previous = _MODE
    _MODE = choice if _LIB is not None else "off"
    return previous


_ENV_CHOICES = {"1": "auto", "avx2": "avx2", "portable": "portable", "0": "off"}
_env = os.environ.get("HOROVOD_GRAVAC_NATIVE", "1")
if _env not in _ENV_CHOICES:
    raise ValueError(f"HOROVOD_GRAVAC_NATIVE must be one of {', '.join(map(repr, _ENV_CHOICES))}, got {_env!r}")
use(_ENV_CHOICES[_env])


def distinct_choices() -> List[str]:
    """The choices of :func:`use` that run different code on this CPU, each once, ``"off"``
    last: ``["auto", "avx2", "portable", "off"]`` on a CPU with AVX-512, ``["auto", "portable",
    "off"]`` on one with AVX2 alone (where ``"avx2"`` is ``"auto"``), ``["off"]`` without the
    library.  Tests run every path on this list and compare them."""
    if _LIB is None:
        return ["off"]
    seen, out = set(), []
    for choice in ("auto", "avx2", "portable"):
        level = _LIB.hg_simd_level(_SIMD_ARG[choice])
        if level not in seen:
            seen.add(level)
            out.append(choice)
    return out + ["off"]


def available() -> bool:
    """True when the library is loaded and switched on."""
    return _MODE != "off"


def mode() -> str:
    """What runs now: ``"avx512"``, ``"avx2"`` (x86 without AVX-512: the select pass in AVX2,
    the rest portable), ``"portable"`` or ``"numpy"``."""
    if _MODE == "off":
        return "numpy"
    return {2: "avx512", 3: "avx2"}.get(_LIB.hg_simd_level(_simd()), "portable")


def usable(x: np.ndarray) -> bool:
    """Whether the kernels take this array: switched on, contiguous 1-D float32, int32-indexable."""
    return (_MODE != "off" and x.dtype == np.float32 and x.ndim == 1 and x.flags.c_contiguous
            and x.size <= _INT32_MAX)


def select(x: np.ndarray, threshold, strict: bool, expected: int,
           likely: Optional[float] = None) -> Tuple[np.ndarray, np.ndarray]:
    """The entries of ``x`` with ``|x| >= threshold`` (``> threshold`` when ``strict``; NaN
    passes), in ascending index order: ``(idx, val)``, int32 indices and the signed
    float32 values.  ``x`` must pass :func:`usable`.

    ``expected``: how many to make room for; when more pass, the pass is repeated once
    with exactly enough room (the first pass counted them).  ``likely``: the count the
    caller actually expects (``expected`` is usually that plus a safety margin); it picks
    the faster loop for the density and changes nothing else.
    """
    count, idx, val = select_into(x, threshold, strict, expected, likely)
    if count > idx.size:
        count, idx, val = select_into(x, threshold, strict, count, count)
    return idx, val


def select_into(x: np.ndarray, threshold, strict: bool, cap: int,
                likely: Optional[float] = None) -> Tuple[int, np.ndarray, np.ndarray]:
    """One pass of :func:`select` with room for ``cap`` entries: ``(count, idx, val)``, where
    ``idx`` and ``val`` hold the first ``min(count, cap)`` of the ``count`` that pass."""
    cap = max(0, min(int(cap), x.size))
    idx = _aligned_empty(cap + SLACK, np.int32)
    val = _aligned_empty(cap + SLACK, np.float32)
    density = (cap if likely is None else float(likely)) / max(1, x.size)
    count = _LIB.hg_select(x.ctypes.data, x.size, float(threshold), int(bool(strict)),
                           density, idx.ctypes.data, val.ctypes.data, cap, _simd())
    kept = min(count, cap)
    return count, idx[:kept], val[:kept]


def _aligned_empty(count: int, dtype) -> np.ndarray:
    """An uninitialised 1-D array starting on a 64-byte boundary: the kept values become
    the input of the next level of multi-level compression, and the AVX-512 pass reads
    whole cache lines (NumPy itself only guarantees 16 bytes)."""
    itemsize = np.dtype(dtype).itemsize
    raw = np.empty(count + 64 // itemsize, dtype=dtype)
    skip = (-raw.ctypes.data % 64) // itemsize
    return raw[skip:skip + count]


def drop_smallest(idx: np.ndarray, val: np.ndarray, k: int, lower_than=None) -> Tuple[np.ndarray, np.ndarray]:
    """Keep the ``k`` candidates of largest ``|val|`` (NaN largest; ties: the earliest) in
    place; returns the first ``k`` slots of ``idx`` and ``val``, ascending except where
    dropped slots were refilled from the tail.

    ``lower_than``: a magnitude expected above the ``len(idx) - k`` smallest candidates;
    only the candidates below it are searched (all of them when it proves too low).
    """
    c = idx.size
    if c > k:
        status = _LIB.hg_drop_smallest(idx.ctypes.data, val.ctypes.data, c, int(k),
                                       0.0 if lower_than is None else float(lower_than),
                                       int(lower_than is not None), _simd())
        if status != 0:
            raise MemoryError("horovod_gravac native drop_smallest: out of memory")
    return idx[:k], val[:k]


def redsync_search(idx: np.ndarray, val: np.ndarray, lo, ceil, few: float, many: float,
                   steps: int) -> Tuple[np.ndarray, np.ndarray, float]:
    """RedSync's binary search over candidates (``idx``/``val`` from :func:`select`), in place.

    The search of ``horovod_gravac.selection.redsync.redsync_search`` on the magnitudes
    ``|val|`` from ``[lo, min(max |val|, ceil)]`` (up to ``max |val|`` when more than
    ``many`` lie above ``ceil``), at most ``steps`` steps, stopping once the count is in
    ``[few, many]``; then the candidates with ``|val| >`` the threshold are compacted to
    the front.  Returns ``(idx, val, threshold)``: views of the first slots, order kept.
    """
    out = np.zeros(3, dtype=np.float64)
    kept = _LIB.hg_redsync(idx.ctypes.data, val.ctypes.data, idx.size, float(lo), float(ceil),
                           float(few), float(many), int(steps), out.ctypes.data, _simd())
    if kept < 0:
        raise MemoryError("horovod_gravac native redsync_search: out of memory")
    return idx[:kept], val[:kept], float(out[0])


def exceedance_moments(x: np.ndarray, threshold, squares: bool = True) -> Tuple[float, float, float]:
    """``(m, sum w, sum w^2)`` of the excesses ``w = |x| - threshold`` over ``|x| > threshold``
    (one pass; NaN left out; the sum of squares 0 unless ``squares``).  ``x`` must pass :func:`usable`."""
    out = np.zeros(3, dtype=np.float64)
    _LIB.hg_exceedance_moments(x.ctypes.data, x.size, float(threshold), int(bool(squares)), out.ctypes.data)
    return float(out[0]), float(out[1]), float(out[2])


class MomentsOf:
    """:func:`exceedance_moments` of one array at many thresholds (SIDCo's stages and counts on
    its sample and on its candidates): the array's address and the output buffer are set up
    once, since ctypes' conversions of them per call cost more than a pass over 16K entries.
    ``count_at_least(t)``: how many have ``|x| >= t`` (NaN not counted)."""

    def __init__(self, x: np.ndarray):
        self._x = x   # (keeps the memory alive)
        self._ptr = x.ctypes.data
        self._out = (ctypes.c_double * 3)()

    def __call__(self, threshold, squares: bool = True) -> Tuple[float, float, float]:
        _LIB.hg_exceedance_moments(self._ptr, self._x.size, float(threshold), int(bool(squares)), self._out)
        out = self._out
        return out[0], out[1], out[2]

    def count_at_least(self, threshold) -> float:
        # |x| >= t is |x| > t' for t' the float32 just below t
        below = np.nextafter(np.float32(threshold), np.float32(-np.inf))
        _LIB.hg_exceedance_moments(self._ptr, self._x.size, float(below), 0, self._out)
        return self._out[0]


def sidco_select(x: np.ndarray, sample: np.ndarray, k: int, settings) -> Tuple[np.ndarray, np.ndarray, dict]:
    """SIDCo's whole host path after its sample (``sidco_host.HostStages.select`` in C, the same
    selection): the entries of ``x`` it keeps as ``(idx, val)``, ascending, and what the call did
    (``threshold``, ``stages``, ``passes``: streaming passes over ``x`` that fitted a stage,
    ``candidates``: how many were gathered, 0 without a candidate phase, ``gathers``: how many
    times, a select pass over ``x`` each).  ``sample``: the float32
    host sample (``sampling.host_abs_sample``); ``settings``: the selector's settings in the order
    of ``kernels.c``'s ``HG_S_*`` up to ``HG_S_SIMD`` (``sidco_native.NativeStages.settings``).  Both arrays must pass
    :func:`usable`."""
    cap = max(0, min(int(k * 1.25) + 64, x.size))
    idx = _aligned_empty(cap + SLACK, np.int32)
    val = _aligned_empty(cap + SLACK, np.float32)
    params = (ctypes.c_double * (len(settings) + 1))(*settings, float(_simd()))
    info = (ctypes.c_double * 5)()
    count = _LIB.hg_sidco_select(x.ctypes.data, x.size, sample.ctypes.data, sample.size, int(k), params,
                                 idx.ctypes.data, val.ctypes.data, cap, info)
    if count < 0:
        raise MemoryError("horovod_gravac native sidco_select: out of memory")
    stats = {"threshold": info[0], "stages": int(info[1]), "passes": int(info[2]), "candidates": int(info[3]),
             "gathers": int(info[4])}
    if count > cap:   # (ties or NaN beyond the room): the same entries, |x| >= the final threshold
        idx, val = select(x, info[0], False, count, count)
        return idx, val, stats
    return idx[:count], val[:count], stats


def abs_sample(x: np.ndarray, size: int, shift: float, phi: float) -> np.ndarray:
    """``|x|`` at the ``size`` stratified positions of ``sampling.host_abs_sample`` for the
    uniform ``shift`` and rotation ``phi`` (the same positions; ``0 < size < x.size``).
    ``x`` must pass :func:`usable`."""
    out = np.empty(size, dtype=np.float32)
    _LIB.hg_abs_sample(x.ctypes.data, x.size, int(size), float(shift), float(phi), out.ctypes.data,
                       _simd())
    return out


def gamma_upper_quantile(alpha: float, density: float, lg: float, lg1: float, z: float,
                         newton_steps: int) -> float:
    """``fits.gamma_upper_quantile_host`` in C, bit for bit (its ``lgamma(alpha)``, ``lgamma(alpha + 1)``
    and normal quantile ``z`` come from Python, which computes them with its own code).
    Call only when :func:`available`."""
    return _LIB.hg_gamma_upper_quantile(alpha, density, lg, lg1, z, newton_steps)


def stratified_draw(numel: int, k: int, key: int) -> np.ndarray:
    """``selection.randomk.stratified_draw``'s ``k`` indices in ``[0, numel)`` for the 64-bit
    ``key``, the same integers, as int32 (int64 beyond 2**31 - 1 entries).  Needs
    ``0 < k < numel`` and ``numel // k < 2**32``.  Call only when :func:`available`."""
    wide = numel > _INT32_MAX
    out = np.empty(k, dtype=np.int64 if wide else np.int32)
    _LIB.hg_stratified_draw(int(numel), int(k), int(key), None if wide else out.ctypes.data,
                            out.ctypes.data if wide else None)
    return out


def scatter(out: np.ndarray, idx: np.ndarray, val: np.ndarray) -> None:
    """``out[:] = 0; out[idx] = val`` for a contiguous 1-D float32 ``out``, int32 ``idx`` and
    float32 ``val`` (both contiguous, same length).  IndexError when an index is outside
    ``out`` (nothing written past it; ``out`` is left zeroed)."""
    if _LIB.hg_scatter(out.ctypes.data, out.size, idx.ctypes.data, val.ctypes.data, idx.size) != 0:
        raise IndexError(f"sparse payload index out of range for a tensor of {out.size} entries")
