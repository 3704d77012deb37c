"""The pieces of the sparse allreduce (``transfers.SparseAllreduce``) that need no
collective: how a bucket's index space is cut into one region per rank, how a rank's payload
is split by region, how a region's owner sums and selects what it received, and the layout
of the blocks the owners then allgather (pure torch; no Horovod).

The regions (Ok-Topk's balanced partition, Li and Hoefler, PPoPP 2022).  Region ``j`` is
``[b_j, b_{j+1})`` with ``b_0 = 0`` and ``b_P = numel``; rank ``j`` owns it.  The inner
boundaries are the same on every rank: at a bucket's first exchange they cut the index
space evenly; after each exchange every rank has every rank's proposal (the ``P - 1``
quantiles of the indices of its own payload) in the gathered blocks and takes their mean
weighted by payload size, so each region holds about ``k / P`` of every rank's entries at
the next step.  Only the balance depends on the boundaries: an owner sums whatever reaches
it, so ranks that disagreed (an elastic joiner's first step) would still add every entry
exactly once.

The sums: an owner adds what it received in source-rank order (``index_add_`` into a
buffer spanning the indices it got), the order in which the allgather path
(``wire.unpack_sum``) adds colliding indices, so a sum the owner keeps is bit for bit the
allgather path's.  It keeps the ``quota`` entries of largest magnitude (NaN first, so a
non-finite bucket stays non-finite everywhere).

A gathered block, all int32 rows of the payload's width ``w`` (2 for float32 values, 3 for
float64), every row but the payload's pointing at the slack slot ``numel``::

    row 0           [m, 0.., numel]          m: payload rows in this block
    rows 1..P       [c, 0.., numel], [b_1..b_{P-1}, 0.., numel]
                                             c: this rank's own payload size; its proposal
    2 n rows        the step's statistics as float64 words, when the block is the carrier's
    m rows          [value bits, index]      the owner's selection
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from .wire import _adds_with_atomics, _deterministic_if, row_words, words_as_float64

#: Bins of the histogram from which a rank's proposal is read (fewer for smaller buckets).
PROPOSAL_BINS = 1 << 14


def even_boundaries(numel: int, world: int) -> torch.Tensor:
    """The ``world - 1`` inner boundaries that cut ``[0, numel)`` evenly (int64)."""
    return torch.tensor([numel * j // world for j in range(1, world)], dtype=torch.int64)


class RegionPartition:
    """The inner boundaries of each bucket's regions, by bucket name (the same on every
    rank: they are computed from gathered data only)."""

    def __init__(self):
        self._bounds: Dict[str, Tuple[int, int, torch.Tensor]] = {}

    def boundaries(self, name: str, numel: int, world: int) -> torch.Tensor:
        got = self._bounds.get(name)
        if got is None or got[0] != numel or got[1] != world:
            return even_boundaries(numel, world)
        return got[2]

    def update(self, name: str, numel: int, world: int, boundaries: torch.Tensor) -> None:
        self._bounds[name] = (numel, world, boundaries)

    def reset(self) -> None:
        self._bounds.clear()


def propose(indices: torch.Tensor, numel: int, world: int) -> torch.Tensor:
    """This rank's proposal: the ``world - 1`` boundaries that would split its own payload's
    ``indices`` into ``world`` equal parts, read off a histogram of ``PROPOSAL_BINS`` bins
    (int64, non-decreasing; even boundaries for an empty payload)."""
    count = indices.numel()
    if count == 0 or world <= 1:
        return even_boundaries(numel, world)
    bins = max(1, min(PROPOSAL_BINS, numel))
    width = -(-numel // bins)
    hist = torch.bincount((indices.long() // width).cpu(), minlength=bins)
    cum = torch.cumsum(hist, 0)
    targets = torch.tensor([count * j // world for j in range(1, world)], dtype=cum.dtype)
    # the first bin whose cumulative count passes the target ends there
    ends = torch.searchsorted(cum, targets, right=True) + 1
    return torch.clamp(ends * width, max=numel).to(torch.int64)


def combine(proposals: torch.Tensor, counts: torch.Tensor, numel: int, world: int) -> torch.Tensor:
    """The next boundaries: the ranks' proposals (``(world, world - 1)``) weighted by their
    payload sizes, in float64 and rank order, so every rank computes the same numbers."""
    weights = counts.to(torch.float64)
    total = float(weights.sum())
    if total <= 0 or world <= 1:
        return even_boundaries(numel, world)
    mean = (proposals.to(torch.float64) * weights[:, None]).sum(0) / total
    return torch.clamp(mean.floor().to(torch.int64), 0, numel)


def split_by_region(rows: torch.Tensor, boundaries: torch.Tensor, world: int) -> Tuple[torch.Tensor, List[int]]:
    """``rows`` (a packed ``(k, w)`` payload) grouped by the region of their index, region 0
    first, and the row count of each group (the alltoall's splits).  Within a group the rows
    keep their order."""
    k, w = rows.shape[0], rows.shape[1]
    if k == 0 or world <= 1:
        return rows, [k] + [0] * (world - 1)
    if rows.device.type == "cpu":
        idx = rows[:, w - 1].numpy()
        dest = np.searchsorted(boundaries.numpy().astype(np.int64), idx, side="right").astype(np.int16)
        order = np.argsort(dest, kind="stable")   # a radix sort for 16-bit keys
        counts = np.bincount(dest, minlength=world).tolist()
        return rows[torch.from_numpy(order)], counts
    dest = torch.searchsorted(boundaries.to(rows.device), rows[:, w - 1].long(), right=True)
    order = torch.sort(dest, stable=True).indices
    counts = torch.bincount(dest, minlength=world).tolist()   # (one host read)
    return rows.index_select(0, order), counts


def values_of(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The values of packed rows (their first ``w - 1`` words), as ``dtype``."""
    w = rows.shape[1]
    if w == 2:
        return rows[:, 0].contiguous().view(dtype)
    return rows[:, :2].contiguous().view(dtype).view(-1)


def reduce_and_select(received: torch.Tensor, dtype: torch.dtype, quota: int,
                      generator: Optional[torch.Generator] = None) -> Tuple[torch.Tensor, torch.Tensor, int]:
    """What an owner keeps of the rows it received (in source-rank order): the sums of
    colliding indices, added in that order, and of those the ``quota`` of largest magnitude
    (NaN first).  Returns (int32 indices ascending, values in ``dtype``, the distinct indices
    received)."""
    device = received.device
    if received.shape[0] == 0:
        return torch.empty(0, dtype=torch.int32, device=device), torch.empty(0, dtype=dtype, device=device), 0
    w = received.shape[1]
    idx = received[:, w - 1].long()
    lo = int(idx.min())
    span = int(idx.max()) - lo + 1
    local = idx - lo
    sums = torch.zeros(span, dtype=dtype, device=device)
    with _deterministic_if(_adds_with_atomics(sums)):
        sums.index_add_(0, local, values_of(received, dtype))
    touched = torch.zeros(span, dtype=torch.bool, device=device)
    touched[local] = True
    where = touched.nonzero().view(-1)
    vals = sums.index_select(0, where)
    distinct = where.numel()
    if distinct > quota:
        from .selection.topk import topk_indices   # exact, NaN largest
        keep = topk_indices(vals, quota, generator).sort().values
        where, vals = where.index_select(0, keep), vals.index_select(0, keep)
    return (where + lo).to(torch.int32), vals, distinct


def info_rows(world: int) -> int:
    """Rows before a block's statistics: the count row and the ``world`` proposal rows."""
    return 1 + world


def pack_block(indices: torch.Tensor, values: torch.Tensor, own_count: int, proposal: torch.Tensor,
               stats: Optional[torch.Tensor], numel: int, world: int) -> torch.Tensor:
    """One owner's block for the allgather (the module docstring's layout)."""
    w = row_words(values.dtype)
    m = indices.numel()
    head = info_rows(world) + (0 if stats is None else 2 * stats.numel())
    out = torch.zeros((head + m, w), dtype=torch.int32, device=values.device)
    out[:head, w - 1] = numel
    out[0, 0] = m
    out[1, 0] = own_count
    out[2:1 + world, 0] = proposal.to(device=out.device, dtype=torch.int32)
    if stats is not None:
        out[1 + world:head, 0] = stats.to(device=out.device, dtype=torch.float64).view(torch.int32)
    if m:
        out[head:, :w - 1] = values.view(torch.int32).view(m, w - 1)
        out[head:, w - 1] = indices
    return out


def read_blocks(gathered: torch.Tensor, world: int, n_stats: int) -> Tuple[torch.Tensor, torch.Tensor,
                                                                              Optional[torch.Tensor], List[int]]:
    """Every block's header of a gathered buffer, in rank order: (payload sizes ``(world,)``,
    proposals ``(world, world - 1)``, the rank-averaged statistics (float64; None without
    them), each block's row count)."""
    head = info_rows(world) + 2 * n_stats
    firsts = gathered[:, 0].cpu()
    pos, counts, proposals, stats, rows = 0, [], [], [], []
    for r in range(world):
        if pos + head > firsts.numel():
            raise RuntimeError(f"horovod_gravac: malformed sparse allreduce block of rank {r} "
                               f"(gathered {gathered.shape[0]} rows)")
        m = int(firsts[pos])
        counts.append(int(firsts[pos + 1]))
        proposals.append(firsts[pos + 2:pos + 1 + world].to(torch.int64))
        if n_stats:
            stats.append(words_as_float64(firsts[pos + 1 + world:pos + head]))
        rows.append(head + m)
        pos += head + m
    if pos != gathered.shape[0]:
        raise RuntimeError(f"horovod_gravac: sparse allreduce blocks cover {pos} of {gathered.shape[0]} "
                           f"gathered rows; ranks disagree on the wire format")
    averaged = torch.stack(stats).sum(0).div_(world) if n_stats else None
    return (torch.tensor(counts, dtype=torch.int64), torch.stack(proposals) if world > 1
            else torch.zeros((1, 0), dtype=torch.int64), averaged, rows)
