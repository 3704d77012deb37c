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
* ``SlottedSparse``: ``join_safe``'s sparse wire: every rank's payload in a slot of
  an allreduce, which Horovod's ``join`` allows.
* ``LowRankTransfer`` (``lowrank.py``): PowerSGD's two phases (P, then Q) in one object.

Collectives are submitted only through the link's backend (``backend.CollectiveBackend``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .backend import CollectiveBackend, ReduceOp
from .cf import kept_count
from .comm import MismatchedShapesError
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
        self.stats: Optional[torch.Tensor] = None   # rank-averaged, once a carrier finished
        self.wire_elements = 0   # this rank's collective tensor: entries (dense) or (k, 2) rows (sparse)

    def start(self, stats: Optional[torch.Tensor] = None) -> None:
        self.started = True
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
        if with_stats:   # the statistics travel as float32 with the bucket: no wire compression
            self.wire, self.ctx = flat, None
        else:
            self.wire, self.ctx = compression.compress(flat)
        self.bytes_sent = self.wire.numel() * self.wire.element_size()
        self.floats_sent = flat.numel()
        self.wire_elements = self.wire.numel()

    def _submit(self, stats):
        return self._allreduce(self.wire, self.name, stats)

    def finish(self) -> torch.Tensor:
        out = self._split_stats(self._wait())
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

    def _mean(self, total: torch.Tensor) -> torch.Tensor:
        """The gathered rows' sum, as ``op`` asks (postscale of the predivide factor)."""
        link = self.link
        if not link.average:
            return total
        f = link.predivide
        return total.div_(link.world) if f == 1.0 else total.mul_(f / link.world)


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
        return self._combine(self._wait())

    def _combine(self, gathered: torch.Tensor) -> torch.Tensor:
        """Every rank's rows (rank order) -> the statistics, and the bucket's aggregate."""
        rows_dtype(gathered, self.dtype, self.name)   # before any header is read
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
        except MismatchedShapesError:
            self.kind = "sparse"
            gathered = backend.wait(backend.allgather_async(self.block, self.name + ".ag"),
                                    self.name + ".ag", self.link.timeout)
            return self._combine(gathered)
        first = backend.rank() == 0
        return self._combine(torch.cat([self.block, other] if first else [other, self.block]))


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
        return self._allreduce(self.values, self.name, stats)

    def finish(self) -> torch.Tensor:
        out = self._split_stats(self._wait())
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
