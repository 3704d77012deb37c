"""Bucket transfers: how one bucket's (compressed) gradient crosses the ranks.

Each kind is a small class, built once the bucket's payload is known (``__init__``
prepares the wire tensor and counts its bytes), then

    transfer.start(stats)   # submit the collective; ``stats``: the step's StepStats
                            # vector when this is the carrier bucket (see wire.py)
    transfer.advance()      # move to the last phase (PowerSGD: P done, start Q)
    transfer.finish()       # the bucket's combined flat gradient: float64 for a bucket
                            # of float64 parameters, else float32

A carrier bucket (``with_stats=True``) is built, then started later, once every other
bucket is compressed (the step's statistics are complete only then).  After ``finish``
a carrier's ``stats`` holds the rank-averaged statistics (float64).  ``commit(memory,
key)`` updates the error-feedback residual for what was sent.

The kinds (``kind`` names them in ``optimizer.stats`` and tests):

* ``DenseAllreduce``: the whole bucket (Horovod's wire compression, ``op`` and
  predivide factors); the residual is cleared.
* ``SparseAllgather``: values and indices, every rank's own k (8 bytes per entry;
  12 for float64 values).
* ``PairExchange``: the same payload between exactly two ranks whose payloads have the
  same size by construction (exact Top-k, Random-k): the backend's pair exchange swaps
  them (Horovod's is a reducescatter; ``HorovodBackend.pair_exchange_async`` says why).
* ``SharedIndexAllreduce``: the same indices on every rank (shared-seed Random-k):
  only the values, in an allreduce (4 bytes per entry; 8 for float64), plus the step
  index to check that every rank drew the same indices.
* ``SparseAllreduce``: the same payloads summed in two phases whose traffic does not grow
  with the number of ranks (Ok-Topk's split-and-reduce, then an allgather of the regions'
  selections); what the global selection drops stays in each rank's residual.
* ``SlottedSparse``: ``join_safe``'s sparse wire: every rank's payload in a slot of
  an allreduce, which Horovod's ``join`` allows.
* ``LowRankTransfer`` (``lowrank.py``): PowerSGD's two phases (P, then Q) in one object.

Which of them carries a bucket is ``exchange.py``'s choice (by modelled cost, or as the
``exchange=`` option says).  ``wire_bytes``: the bytes this rank's collectives put on its
link by the ring algorithms Gloo runs (an allreduce of ``B`` bytes sends ``2 (P-1)/P B``,
a ring allgather every block but the next rank's), statistics included.

Collectives are submitted only through the link's backend (``backend.CollectiveBackend``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .backend import CollectiveBackend, ReduceOp
from .cf import kept_count
from .comm import MismatchedShapesError
from .regions import (RegionPartition, combine, pack_block, propose, read_blocks, reduce_and_select,
                      split_by_region)
from .selection.payload import SparsePayload
from .wire import (N_STATS, header_rows, pack, pack_slot, read_header_stats, read_slot_stats, row_words,
                   rows_dtype, slot_rows, split_stats, unpack_sum, with_stats)


@dataclass
class Link:
    """What every transfer of one optimizer shares: the backend its collectives go through,
    the user's reduction (``average``: an average, else a sum), the predivide factor, the
    world size (it changes in elastic training) and the bound on each wait."""

    backend: CollectiveBackend
    average: bool
    predivide: float
    world: int
    timeout: float

    @property
    def op(self) -> ReduceOp:
        return ReduceOp.AVERAGE if self.average else ReduceOp.SUM

    def scale_factors(self) -> Tuple[float, float]:
        """Horovod's pre/postscale for ``gradient_predivide_factor`` (Average only)."""
        return (1.0 / self.predivide, self.predivide) if self.average else (1.0, 1.0)


class Transfer:
    """One bucket's collective(s) for one step (see the module docstring)."""

    kind = ""

    def __init__(self, link: Link, name: str, numel: int, device, with_stats: bool):
        self.link, self.name, self.numel, self.device = link, name, numel, device
        self.with_stats = with_stats
        self.bytes_sent = 0      # payload bytes this rank puts on the wire
        self.floats_sent = 0     # numbers (values and indices) this rank sends
        self.control_bytes = 0   # the statistics carried for the controller
        self.handle = None
        self.started = False
        self.local_stats: Optional[torch.Tensor] = None   # this rank's, as started with
        self.stats: Optional[torch.Tensor] = None   # rank-averaged, once a carrier finished
        self.wire_elements = 0   # this rank's collective tensor: entries (dense) or (k, 2) rows (sparse)
        self.wire_bytes = 0      # bytes this rank's collectives send, by the ring algorithms (module docstring)

    def start(self, stats: Optional[torch.Tensor] = None) -> None:
        self.started = True
        self.local_stats = stats
        self.handle = self._submit(stats)

    def advance(self) -> None:
        """Move to the last phase (nothing to do for one-phase transfers)."""

    def finish(self) -> torch.Tensor:
        raise NotImplementedError

    def commit(self, memory, key: int) -> None:
        """Error feedback: take what was sent out of the residual ``key``."""

    def _submit(self, stats):
        raise NotImplementedError

    def _wait(self, name: Optional[str] = None) -> torch.Tensor:
        return self.link.backend.wait(self.handle, name or self.name, self.link.timeout)

    def _allreduce(self, tensor, name, stats, mean: bool = False):
        """An in-place allreduce, or of a copy with ``stats`` appended (in the copy's dtype,
        see ``wire.with_stats``): with the user's ``op`` and predivide factors, or (``mean``)
        the plain average PowerSGD needs."""
        link = self.link
        op, (pre, post) = (ReduceOp.AVERAGE, (1.0, 1.0)) if mean else (link.op, link.scale_factors())
        if stats is not None:
            tensor = with_stats(tensor, stats)
            self.control_bytes += tensor.element_size() * N_STATS
        return link.backend.allreduce_async(tensor, name, op, pre, post)

    def _ring_allreduce_bytes(self, tensor: torch.Tensor, stats) -> int:
        """Bytes a rank sends in a ring allreduce of ``tensor`` (with ``stats`` appended)."""
        p = self.link.world
        n, size = tensor.numel(), tensor.element_size()
        if stats is not None:   # (wire.with_stats: a float32 copy, float64 for a float64 tensor)
            n, size = n + N_STATS, 8 if tensor.dtype == torch.float64 else 4
        return int(2 * (p - 1) * n * size // p) if p > 1 else 0

    def _mean(self, total: torch.Tensor) -> torch.Tensor:
        """A sum of the ranks' (prescaled) contributions, as ``op`` asks (postscale of the
        predivide factor)."""
        link = self.link
        if not link.average:
            return total
        f = link.predivide
        return total.div_(link.world) if f == 1.0 else total.mul_(f / link.world)

    def _regather(self, payload: SparsePayload) -> torch.Tensor:
        """The ranks' collectives for this bucket differ in size (their decisions diverged
        between two consensus checks; Horovod refused the collective on every rank,
        ``MismatchedShapesError``; collectives of different kinds it does not refuse, see
        ``consensus.py``): every rank sends ``payload`` (its whole contribution, prescaled)
        again with one allgather, which takes any sizes, as the allgather path would have, and
        the bucket reports ``"sparse"``.  Every rank adds the same gathered rows: ranks stay
        identical."""
        return self._regather_finish(self._regather_start(payload))

    def _regather_start(self, payload: SparsePayload):
        """:meth:`_regather`'s allgather, submitted (its handle)."""
        if self.local_stats is not None:
            self.control_bytes = 4 * row_words(payload.values.dtype) * header_rows(N_STATS)
        block = pack(payload, self.local_stats, self.numel)
        self.wire_elements = block.shape[0]
        return self.link.backend.allgather_async(block, self.name + ".ag"), payload.values.dtype

    def _regather_finish(self, started) -> torch.Tensor:
        handle, values_dtype = started
        name = self.name + ".ag"
        gathered = self.link.backend.wait(handle, name, self.link.timeout)
        dtype = torch.float64 if values_dtype == torch.float64 else torch.float32
        rows_dtype(gathered, dtype, name)
        if self.with_stats:
            self.stats = read_header_stats(gathered, self.link.world, N_STATS)
        self.kind = "sparse"
        self.wire_bytes += 4 * row_words(dtype) * (self.link.world - 1) * self.wire_elements
        return self._mean(unpack_sum(gathered, self.numel, dtype, name))

    def _split_stats(self, out: torch.Tensor, mean: bool = False) -> torch.Tensor:
        """Strip the statistics an allreduce carried (a sum is averaged here)."""
        if not self.with_stats:
            return out
        out, stats = split_stats(out, N_STATS)
        self.stats = stats if mean or self.link.average else stats / self.link.world
        return out


class DenseAllreduce(Transfer):
    kind = "dense"

    def __init__(self, link, name, flat: torch.Tensor, with_stats: bool, compression):
        super().__init__(link, name, flat.numel(), flat.device, with_stats)
        self.compression = compression
        self.flat = flat
        if with_stats:   # the statistics travel as float32 with the bucket: no wire compression
            self.wire, self.ctx = flat, None
        else:
            self.wire, self.ctx = compression.compress(flat)
        self.bytes_sent = self.wire.numel() * self.wire.element_size()
        self.floats_sent = flat.numel()
        self.wire_elements = self.wire.numel()

    def _submit(self, stats):
        self.wire_bytes = self._ring_allreduce_bytes(self.wire, stats)
        return self._allreduce(self.wire, self.name, stats)

    def finish(self) -> torch.Tensor:
        try:
            out = self._split_stats(self._wait())
        except MismatchedShapesError:   # another rank sent this bucket sparse: everything, regathered
            pre, _ = self.link.scale_factors()
            values = self.flat if pre == 1.0 else self.flat * pre
            return self._regather(SparsePayload(values, torch.arange(self.numel, dtype=torch.int32,
                                                                     device=self.flat.device)))
        if not self.with_stats:
            out = self.compression.decompress(out, self.ctx)
        return out if out.dtype == torch.float64 else out.float()   # a float64 bucket stays float64

    def commit(self, memory, key):
        memory.sent_dense(key)


class _Sparse(Transfer):
    """Payloads whose entries were sent exactly: the residual is cleared there.  Values
    travel in their own dtype: float64 (a bucket of float64 parameters) or float32."""

    def __init__(self, link, name, payload: SparsePayload, numel, device, with_stats):
        super().__init__(link, name, numel, device, with_stats)
        self.sent_indices = payload.indices
        self.dtype = torch.float64 if payload.values.dtype == torch.float64 else torch.float32
        self.row_bytes = 4 * row_words(self.dtype)   # a value and its index

    def commit(self, memory, key):
        memory.sent_sparse(key, self.sent_indices)

    def _prescaled(self, payload: SparsePayload) -> SparsePayload:
        pre, _ = self.link.scale_factors()
        return payload if pre == 1.0 else SparsePayload(payload.values * pre, payload.indices)


class SparseAllgather(_Sparse):
    kind = "sparse"

    def __init__(self, link, name, payload, numel, device, with_stats):
        super().__init__(link, name, payload, numel, device, with_stats)
        self.payload = self._prescaled(payload)
        k = payload.values.numel()
        self.bytes_sent, self.floats_sent = self.row_bytes * k, 2 * k

    def _submit(self, stats):
        if stats is not None:
            self.control_bytes += self.row_bytes * header_rows(N_STATS)
        block = pack(self.payload, stats, self.numel)
        self.wire_elements = block.shape[0]
        return self.link.backend.allgather_async(block, self.name)

    def finish(self) -> torch.Tensor:
        try:
            return self._combine(self._wait())
        except MismatchedShapesError:   # another rank picked another exchange for this bucket
            return self._regather(self.payload)

    def _combine(self, gathered: torch.Tensor) -> torch.Tensor:
        """Every rank's rows (rank order) -> the statistics, and the bucket's aggregate."""
        rows_dtype(gathered, self.dtype, self.name)   # before any header is read
        if self.link.world > 1:   # a ring sends every block but the next rank's: about (P-1) blocks
            self.wire_bytes = self.row_bytes * (self.link.world - 1) * self.wire_elements
        if self.with_stats:
            self.stats = read_header_stats(gathered, self.link.world, N_STATS)
        return self._mean(unpack_sum(gathered, self.numel, self.dtype, self.name))


class PairExchange(SparseAllgather):
    """Two ranks, payloads of one size on both (``GradientCompressor.fixed_count``): each
    receives the other's block and lays the two out in rank order, exactly as the allgather
    would have returned them, so every rank adds them up in the same order.

    Should the two blocks' sizes ever differ (the ranks' decisions diverged between two
    consensus checks; the next check puts every rank back on rank 0's state), Horovod
    refuses the reducescatter on both ranks, and both send the same blocks again with
    the allgather, which takes any sizes."""

    kind = "pair"

    def _submit(self, stats):
        if stats is not None:
            self.control_bytes += self.row_bytes * header_rows(N_STATS)
        self.block = pack(self.payload, stats, self.numel)
        self.wire_elements = self.block.shape[0]
        return self.link.backend.pair_exchange_async(self.block, self.name)

    def finish(self) -> torch.Tensor:
        backend = self.link.backend
        try:
            other = self._wait()
        except MismatchedShapesError:   # (the same rows as _regather's allgather)
            self.kind = "sparse"
            gathered = backend.wait(backend.allgather_async(self.block, self.name + ".ag"),
                                    self.name + ".ag", self.link.timeout)
            return self._combine(gathered)
        first = backend.rank() == 0
        out = self._combine(torch.cat([self.block, other] if first else [other, self.block]))
        self.wire_bytes = self.row_bytes * self.wire_elements   # its own block, once
        return out


class SparseAllreduce(_Sparse):
    """Every rank's sparse payload summed with traffic that does not grow with the number of
    ranks: Ok-Topk's split-and-reduce over a balanced partition of the index space, then an
    allgather of each region's selection (Li and Hoefler, PPoPP 2022; ``regions.py``).

    1. ``start``: each rank splits its rows by region (``regions.split_by_region``) and one
       alltoall sends region ``j``'s rows to rank ``j``, which owns it.
    2. ``advance``: each owner adds the rows it received in source-rank order and keeps the
       ``quota = ceil(k / P)`` sums of largest magnitude (``k`` = ``kept_count(numel, cf)``,
       the same on every rank); one allgather of the owners' blocks (with the statistics when
       this is the carrier, and each rank's proposal for the next step's boundaries).
    3. ``finish``: the blocks' rows added into the bucket (regions do not overlap), divided
       as ``op`` asks.

    Semantics: the global top-``k`` of the sum of the ranks' payloads, region by region
    (each region keeps its own largest ``k / P`` sums; the balanced partition makes that the
    global top-``k`` when the payloads' large sums spread as their entries do).  It is not
    the allgather's per-rank top-``k`` summed: a sum the selection drops is not sent, and
    every rank keeps its own share of it in its residual (``commit``: only the entries of
    this rank's payload whose index was selected count as sent), to be sent at a later step.
    A kept sum is bit for bit the allgather path's (the same additions in the same order),
    and when no region receives more than ``quota`` distinct indices the aggregate is the
    allgather path's exactly.  Every rank builds the aggregate from the same gathered blocks:
    ranks stay bitwise identical.

    Bytes a rank sends, ``r`` bytes a row (8; 12 for float64 values): about
    ``(P-1)/P * r k`` in the alltoall (its rows for the other regions) plus ``(P-1) * r q``
    in the ring allgather, with ``q = ceil(k/P)``: about ``2 (P-1)/P * r k`` in all
    (Ok-Topk's bound is ``6 k (P-1)/P`` words; an allgather of the payloads sends
    ``(P-1) * r k``), plus ``1 + P`` header rows a block (and the statistics' ``2 n``).
    ``wire_bytes`` counts them as sent."""

    kind = "sparse_allreduce"
    #: The global selection keeps ``KEEP * k`` sums (tests raise it until nothing is dropped).
    KEEP = 1.0

    def __init__(self, link, name, payload, numel, device, with_stats, cf: float, partition: RegionPartition,
                 generator: Optional[torch.Generator] = None):
        super().__init__(link, name, payload, numel, device, with_stats)
        self.raw = payload
        self.payload = self._prescaled(payload)
        world = max(1, link.world)
        self.quota = max(1, math.ceil(self.KEEP * kept_count(numel, cf) / world))
        self.partition, self.generator = partition, generator
        k = payload.values.numel()
        self.bytes_sent, self.floats_sent = self.row_bytes * k, 2 * k
        self.handle2 = None
        self.regathered = None   # the allgather of Transfer._regather, when ranks disagreed
        self.selected: Optional[torch.Tensor] = None   # every selected index (the gathered rows' last column)
        self._kept: Optional[torch.Tensor] = None
        self.distinct = 0       # distinct indices this rank received as an owner
        self.kept = 0           # sums this rank kept as an owner

    def _submit(self, stats):
        world = self.link.world
        rows = pack(self.payload)
        bounds = self.partition.boundaries(self.name, self.numel, world)
        rows, splits = split_by_region(rows, bounds, world)
        self.splits = splits
        self.proposal = propose(self.payload.indices, self.numel, world)
        me = self.link.backend.rank()
        self.wire_elements = rows.shape[0]
        self.first_rows = sum(splits) - splits[me]   # rows that leave this rank in the alltoall
        return self.link.backend.alltoall_async(rows, splits, self.name)

    def advance(self) -> None:
        if self.handle2 is not None or self.regathered is not None or not self.started:
            return
        try:
            received = self._wait()
        except MismatchedShapesError:   # another rank picked another exchange for this bucket
            self.regathered = self._regather_start(self.payload)
            self.selected = self.sent_indices
            return
        world = self.link.world
        idx, vals, self.distinct = reduce_and_select(received, self.dtype, self.quota, self.generator)
        self.kept = idx.numel()
        if self.local_stats is not None:
            self.control_bytes += self.row_bytes * 2 * self.local_stats.numel()
        block = pack_block(idx, vals, self.payload.values.numel(), self.proposal, self.local_stats,
                           self.numel, world)
        self.block_rows = block.shape[0]
        self.handle2 = self.link.backend.allgather_async(block, self.name + ".gather")

    def finish(self) -> torch.Tensor:
        self.advance()
        if self.regathered is not None:
            return self._regather_finish(self.regathered)
        name = self.name + ".gather"
        gathered = self.link.backend.wait(self.handle2, name, self.link.timeout)
        rows_dtype(gathered, self.dtype, name)
        world = self.link.world
        counts, proposals, stats, block_rows = read_blocks(gathered, world, N_STATS if self.with_stats else 0)
        if self.with_stats:
            self.stats = stats
        self.partition.update(self.name, self.numel, world, combine(proposals, counts, self.numel, world))
        me = self.link.backend.rank()
        # the ring allgather sends every block but the next rank's
        self.wire_bytes = self.row_bytes * (self.first_rows + gathered.shape[0] - block_rows[(me + 1) % world])
        self.selected = gathered[:, -1]
        return self._mean(unpack_sum(gathered, self.numel, self.dtype, name))

    def commit(self, memory, key):
        """Only the entries of this rank's payload that the global selection kept were sent;
        the rest stay in the residual."""
        memory.sent_sparse(key, self.delivered_indices())

    def _kept_mask(self) -> torch.Tensor:
        """For each entry of this rank's payload: did the global selection keep its index?"""
        if self._kept is None:
            mask = torch.zeros(self.numel + 1, dtype=torch.bool, device=self.selected.device)
            mask[self.selected.long()] = True
            self._kept = mask[self.sent_indices.long()]
        return self._kept

    def delivered_indices(self) -> torch.Tensor:
        """The indices of this rank's payload that the global selection kept."""
        return self.sent_indices[self._kept_mask()]

    def dropped(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(values, indices) of this rank's payload that the global selection dropped (what
        stays in the residual)."""
        drop = ~self._kept_mask()
        return self.raw.values[drop], self.sent_indices[drop]


class SlottedSparse(_Sparse):
    """``join_safe``: every rank's payload in its own slot of an allreduce (sum).  The slot
    size comes from the decision alone, the same on every rank; a threshold compressor's
    surplus beyond it is not sent and stays in the residual."""

    kind = "slotted"

    def __init__(self, link, name, payload, numel, device, with_stats, cf: float):
        self.cap = 2 * kept_count(numel, cf) + 1
        if payload.values.numel() > self.cap:
            payload = SparsePayload(payload.values[:self.cap], payload.indices[:self.cap])
        super().__init__(link, name, payload, numel, device, with_stats)
        self.payload = self._prescaled(payload)
        self.bytes_sent = self.row_bytes * link.world * slot_rows(self.cap, N_STATS)
        self.floats_sent = 2 * payload.values.numel()

    def _submit(self, stats):
        if stats is not None:
            self.control_bytes += self.row_bytes * header_rows(N_STATS)
        backend = self.link.backend
        buf = pack_slot(self.payload, stats, self.numel, self.link.world, backend.rank(), self.cap, N_STATS)
        self.wire_elements = buf.shape[0]
        self.wire_bytes = self._ring_allreduce_bytes(buf, None)
        return backend.allreduce_async(buf, self.name, ReduceOp.SUM)

    def finish(self) -> torch.Tensor:
        out = self._wait()
        rows_dtype(out, self.dtype, self.name)   # before any header is read
        if self.with_stats:
            self.stats = read_slot_stats(out, self.link.world, self.cap, N_STATS)
        return self._mean(unpack_sum(out, self.numel, self.dtype, self.name))


class SharedIndexAllreduce(_Sparse):
    """Every rank drew the same indices (shared seed): allreduce the values alone.
    ``step_index`` (None in ``join_safe`` mode, whose exchange aligns it) rides along so
    that ranks that drew from different steps fail instead of adding misplaced values."""

    kind = "shared"

    def __init__(self, link, name, payload, numel, device, with_stats, step_index: Optional[int]):
        super().__init__(link, name, payload, numel, device, with_stats)
        self.step_index = step_index
        values = payload.values.clone()
        if step_index is not None:
            values = torch.cat([values, values.new_tensor([float(step_index)])])
        self.values = values
        k = payload.values.numel()
        self.bytes_sent, self.floats_sent = values.element_size() * k, k
        self.wire_elements = values.numel()

    def _submit(self, stats):
        self.wire_bytes = self._ring_allreduce_bytes(self.values, stats)
        return self._allreduce(self.values, self.name, stats)

    def finish(self) -> torch.Tensor:
        try:
            out = self._split_stats(self._wait())
        except MismatchedShapesError:   # another rank picked another exchange for this bucket
            pre, _ = self.link.scale_factors()
            k = self.sent_indices.numel()
            values = self.values[:k] if pre == 1.0 else self.values[:k] * pre
            return self._regather(SparsePayload(values, self.sent_indices))
        if self.step_index is not None:
            out = self._check_step(out)
        aggregated = torch.zeros(self.numel, dtype=out.dtype, device=self.device)
        aggregated.index_copy_(0, self.sent_indices.long(), out)
        return aggregated

    def _check_step(self, out: torch.Tensor) -> torch.Tensor:
        """Strip the step index; if the ranks' differ (a rank sat out steps in
        ``hvd.join()``), their draws differ too: fail."""
        got = float(out[-1])
        want = self.step_index * (1 if self.link.average else self.link.world)
        if abs(got - want) > 0.5:
            raise RuntimeError(
                f"horovod_gravac: ranks disagree on the step index of a shared-seed compressor "
                f"(rank {self.link.backend.rank()} is at step {self.step_index}; the ranks' combined value is "
                f"{got:g}), so they drew different indices. This happens when a rank sat out steps "
                f"in hvd.join(); pass DistributedOptimizer(..., join_safe=True) for uneven data.")
        return out[:-1]
