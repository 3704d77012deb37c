"""Threshold kernels shared by the threshold selectors (DGC, RedSync, SIDCo).

* :func:`exceedance_moments`: one streaming pass giving the count, sum and sum of
  squares of the excesses ``|x| - t`` over ``|x| > t``;
* :func:`select_abs_at_least`: indices and magnitudes of the entries with
  ``|x| >= t`` (with a column-maximum prefilter on the CPU when few entries pass);
* :func:`host_path`: whether a tensor takes the CPU host path (see ``threshold.py``).

On the CPU the passes run over cache-sized chunks of the tensor with one reused
scratch buffer: materialising ``flat.abs()`` (a fresh 100 MB tensor for 25M
entries) costs most of a streaming pass in page faults alone.  The chunk loop
contains no host synchronisation (thresholds are 0-dim tensors; partial results
stay tensors until the end).  On other devices (CUDA) each kernel is a single
vectorised expression over the whole tensor, since the caching allocator makes
temporaries cheap there.  (Tests of the accelerator path patch :func:`_chunked` and
:func:`host_path` in this module.)
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

from .. import native

# Chunk of the CPU kernels: 512 KiB of float32, comfortably inside a 1 MiB L2.
CHUNK = 1 << 17
# Thresholds are never below this, so exact zeros are never "kept" (sending them is useless).
TINY = torch.finfo(torch.float32).tiny


def _work_dtype(flat: torch.Tensor) -> torch.Tensor:
    """float32/float64 stay as they are; half precision is widened (sums would overflow)."""
    return flat if flat.dtype in (torch.float32, torch.float64) else flat.float()


def _chunked(flat: torch.Tensor) -> bool:
    return flat.device.type == "cpu" and flat.numel() > CHUNK


def _count_positive_(b: torch.Tensor) -> torch.Tensor:
    """Number of entries > 0 of a non-negative buffer, overwriting it (``sign_`` then ``sum``).

    About twice as fast as ``count_nonzero`` on CPU floats; exact (counts < 2^24 per chunk).
    """
    return b.sign_().sum()


def exceedance_moments(flat: torch.Tensor, threshold: torch.Tensor, squares: bool = True) -> torch.Tensor:
    """One pass: float64 ``[m, sum w, sum w^2]`` of the excesses ``w = |x| - t`` over ``|x| > t``.

    ``threshold`` is a 0-dim tensor on ``flat``'s device; ``squares=False`` skips the sum of
    squares (left 0).  No host synchronisation.
    """
    flat = _work_dtype(flat)
    t = threshold.to(flat.dtype)
    if not _chunked(flat):
        w = (flat.abs() - t).clamp_(min=0)
        sq = torch.dot(w, w).double() if squares else w.new_zeros((), dtype=torch.float64)
        return torch.stack([torch.count_nonzero(w).double(), w.sum().double(), sq])
    buf = torch.empty(CHUNK, dtype=flat.dtype)
    cnt, s1, s2 = [], [], []
    for start in range(0, flat.numel(), CHUNK):
        c = flat[start:start + CHUNK]
        b = buf[:c.numel()]
        torch.abs(c, out=b)
        b.sub_(t).clamp_(min=0)
        s1.append(b.sum())
        if squares:
            s2.append(torch.dot(b, b))
        cnt.append(_count_positive_(b))
    sq = torch.stack(s2).double().sum() if squares else torch.zeros((), dtype=torch.float64)
    return torch.stack([torch.stack(cnt).double().sum(), torch.stack(s1).double().sum(), sq])


def _prefilter_width(density: float) -> int:
    """Rows of the column-max prefilter for an expected density (0: select directly).

    Measured on one core: the prefilter halves the cost of a selection at densities up
    to about 1 %, and loses above about 2 %.
    """
    if density <= 0.003:
        return 16
    if density <= 0.02:
        return 8
    return 0


def abs_for_reuse(flat: torch.Tensor) -> Optional[torch.Tensor]:
    """``|flat|`` (in its work dtype) for a caller that samples and selects from it more than
    once, or None where :func:`select_abs_at_least` works chunk by chunk (the CPU's torch path,
    where materialising ``|x|`` costs most of a pass in page faults).  On a GPU a call's time
    follows its operation count, so taking ``|x|`` once saves launches."""
    return None if _chunked(flat) else _work_dtype(flat).abs()


def largest_positions(mags: torch.Tensor, k: int) -> torch.Tensor:
    """Ascending positions in ``mags`` of its ``k`` largest values, the earliest of a tie first
    (NaN largest, as in ``torch.topk``): the exact k largest of a kept set whose threshold could
    not split a tie (RedSync's tie fill, the threshold selectors' band check)."""
    return torch.sort(torch.sort(mags, descending=True, stable=True).indices[:k]).values


_ROUNDING = {torch.float32: np.float32, torch.float64: np.float64}


def _compared(threshold, dtype: torch.dtype):
    """The threshold as ``|x| >= threshold`` compares it: a 0-dim tensor in ``dtype``, or a number
    rounded to ``dtype`` (a Python number costs no tensor operation)."""
    if isinstance(threshold, torch.Tensor):
        return threshold.to(dtype)
    return float(_ROUNDING[dtype](threshold))


def select_abs_at_least(flat: torch.Tensor, threshold, density: float = 1.0, magnitudes: bool = True,
                        abs_flat: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Flat int64 indices and magnitudes of the entries with ``|x| >= threshold``.

    ``threshold``: a 0-dim tensor or a number, compared in ``flat``'s work dtype either way.
    ``magnitudes=False`` returns ``(indices, None)``, saving a gather and a copy.
    ``abs_flat``: ``|flat|`` from :func:`abs_for_reuse`, when the caller has it already (the
    chunked CPU path does not use it).

    ``density`` (expected fraction kept; a hint, any value gives the same result) lets the
    CPU path skip most of each chunk: the chunk is viewed as ``rows x cols``, the column
    maxima are compared first and only the columns holding a kept entry are examined.
    Indices are then grouped by chunk but not sorted within it.
    One host synchronisation on accelerators (the output size of ``nonzero``).

    On the CPU, float32 goes through the native kernel when it is built (one fused pass,
    int32 indices in ascending order, the same set).
    """
    flat = _work_dtype(flat)
    if flat.device.type == "cpu" and native.usable(flat.numpy()):
        return _select_native(flat.numpy(), float(threshold), density, magnitudes)
    t = _compared(threshold, flat.dtype)
    if not _chunked(flat):
        a = flat.abs() if abs_flat is None else abs_flat
        idx = torch.nonzero(a >= t).view(-1)
        return idx, (a.index_select(0, idx) if magnitudes else None)
    t = torch.as_tensor(t, dtype=flat.dtype)
    rows = _prefilter_width(density)
    cols = CHUNK // rows if rows else 0
    buf = torch.empty(CHUNK, dtype=flat.dtype)
    mask = torch.empty(CHUNK, dtype=torch.bool)
    idxs, vals = [], []
    for start in range(0, flat.numel(), CHUNK):
        c = flat[start:start + CHUNK]
        b = buf[:c.numel()]
        torch.abs(c, out=b)
        if rows and c.numel() == CHUNK:
            grid = b.view(rows, cols)
            hit_cols = torch.nonzero(grid.amax(0) >= t).view(-1)
            sub = grid.index_select(1, hit_cols)
            rc = torch.nonzero(sub >= t)
            r, col = rc[:, 0], rc[:, 1]
            if magnitudes:
                vals.append(sub[r, col])
            idxs.append(r.mul_(cols).add_(hit_cols.index_select(0, col)).add_(start))
            continue
        m = mask[:c.numel()]
        torch.ge(b, t, out=m)
        local = torch.nonzero(m).view(-1)
        if magnitudes:
            vals.append(b.index_select(0, local))
        idxs.append(local.add_(start))
    return torch.cat(idxs), (torch.cat(vals) if magnitudes else None)


def _select_native(x, threshold: float, density: float, magnitudes: bool):
    """``select_abs_at_least`` by the native kernel."""
    # Room for the expected count plus a margin; a miss costs a second, exactly sized pass.
    idx, val = native.select(x, threshold, False, int(density * x.size * 1.25 + 4096), density * x.size)
    return torch.from_numpy(idx), (torch.from_numpy(np.abs(val, out=val)) if magnitudes else None)



def host_path(flat: torch.Tensor) -> bool:
    """Whether a (work-dtype) tensor takes the host path: CPU, float32, native kernels on.
    (Tests of the accelerator path switch it off by patching this function.)"""
    return flat.device.type == "cpu" and flat.dtype == torch.float32 and native.usable(flat.numpy())


