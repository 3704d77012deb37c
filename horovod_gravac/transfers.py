"""Bucket transfers: how one bucket's (compressed) gradient crosses the ranks.

Each kind is a small class, built once the bucket's payload is known (``__init__``
prepares the wire tensor and counts its bytes), then

    transfer.start(stats)   # submit the collective; ``stats``: the step's StepStats
                            # vector when this is the carrier bucket (see comm.py)
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
  same size by construction (exact Top-k, Random-k): one reducescatter that swaps them
  (``comm.pair_exchange_async`` says why not the allgather).
* ``SharedIndexAllreduce``: the same indices on every rank (shared-seed Random-k):
  only the values, in an allreduce (4 bytes per entry; 8 for float64), plus the step
  index to check that every rank drew the same indices.
* ``SlottedSparse``: ``join_safe``'s sparse wire: every rank's payload in a slot of
  an allreduce, which Horovod's ``join`` allows.
* ``LowRankTransfer``: PowerSGD's two phases (P, then Q) in one object; the warm-start
  Q matrices it updates live in a :class:`WarmStarts` store that saves itself.

Collectives are submitted only through ``comm`` (the one seam with Horovod).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from . import comm
from .cf import kept_count
from .compressors.powersgd import orthonormalize
from .selection.payload import SparsePayload
from .wire import N_STATS


@dataclass
class Link:
    """What every transfer of one optimizer shares: its process set, the user's ``op``
    (``average``: it is Horovod's Average), the predivide factor, the world size (it
    changes in elastic training) and the bound on each wait."""

    process_set: object
    op: object
    average: bool
    predivide: float
    world: int
    timeout: float

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
        return comm.wait(self.handle, name or self.name, self.link.timeout)

    def _allreduce(self, tensor, name, stats, mean: bool = False):
        """An in-place allreduce, or of a copy with ``stats`` appended (in the copy's dtype,
        see ``wire.with_stats``): with the user's ``op`` and predivide factors, or (``mean``)
        the plain average PowerSGD needs."""
        link = self.link
        op, (pre, post) = (None, (1.0, 1.0)) if mean else (link.op, link.scale_factors())
        if stats is not None:
            tensor = comm.with_stats(tensor, stats)
            self.control_bytes += tensor.element_size() * N_STATS
        return comm.allreduce_async(tensor, name, op, pre, post, link.process_set)

    def _split_stats(self, out: torch.Tensor, mean: bool = False) -> torch.Tensor:
        """Strip the statistics an allreduce carried (a sum is averaged here)."""
        if not self.with_stats:
            return out
        out, stats = comm.split_stats(out, N_STATS)
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
        self.row_bytes = 4 * comm.row_words(self.dtype)   # a value and its index

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
            self.control_bytes += self.row_bytes * comm.header_rows(N_STATS)
        block = comm.pack(self.payload, stats, self.numel)
        self.wire_elements = block.shape[0]
        return comm.allgather_async(block, self.name, self.link.process_set)

    def finish(self) -> torch.Tensor:
        return self._combine(self._wait())

    def _combine(self, gathered: torch.Tensor) -> torch.Tensor:
        """Every rank's rows (rank order) -> the statistics, and the bucket's aggregate."""
        comm.rows_dtype(gathered, self.dtype, self.name)   # before any header is read
        if self.with_stats:
            self.stats = comm.read_header_stats(gathered, self.link.world, N_STATS)
        return self._mean(comm.unpack_sum(gathered, self.numel, self.dtype, self.name))


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
            self.control_bytes += self.row_bytes * comm.header_rows(N_STATS)
        self.block = comm.pack(self.payload, stats, self.numel)
        self.wire_elements = self.block.shape[0]
        return comm.pair_exchange_async(self.block, self.name, self.link.process_set)

    def finish(self) -> torch.Tensor:
        try:
            other = self._wait()
        except comm.MismatchedShapesError:
            self.kind = "sparse"
            gathered = comm.wait(comm.allgather_async(self.block, self.name + ".ag", self.link.process_set),
                                 self.name + ".ag", self.link.timeout)
            return self._combine(gathered)
        first = comm.group_rank(self.link.process_set) == 0
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
        self.bytes_sent = self.row_bytes * link.world * comm.slot_rows(self.cap, N_STATS)
        self.floats_sent = 2 * payload.values.numel()

    def _submit(self, stats):
        if stats is not None:
            self.control_bytes += self.row_bytes * comm.header_rows(N_STATS)
        me = comm.group_rank(self.link.process_set)
        buf = comm.pack_slot(self.payload, stats, self.numel, self.link.world, me, self.cap, N_STATS)
        self.wire_elements = buf.shape[0]
        return comm.allreduce_sum_async(buf, self.name, self.link.process_set)

    def finish(self) -> torch.Tensor:
        out = self._wait()
        comm.rows_dtype(out, self.dtype, self.name)   # before any header is read
        if self.with_stats:
            self.stats = comm.read_slot_stats(out, self.link.world, self.cap, N_STATS)
        return self._mean(comm.unpack_sum(out, self.numel, self.dtype, self.name))


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
                f"(rank {comm.rank()} is at step {self.step_index}; the ranks' combined value is "
                f"{got:g}), so they drew different indices. This happens when a rank sat out steps "
                f"in hvd.join(); pass DistributedOptimizer(..., join_safe=True) for uneven data.")
        return out[:-1]


class WarmStarts:
    """PowerSGD's Q per (parameter name, rank), warm-starting the next step's power
    iteration; identical on every rank, saved with the optimizer's state."""

    def __init__(self):
        self.q: Dict[Tuple[str, int], torch.Tensor] = {}

    def state_dict(self) -> dict:
        return {f"{n}|{r}": q.clone() for (n, r), q in self.q.items()}

    def load_state_dict(self, state: dict) -> None:
        self.q = {(k.rsplit("|", 1)[0], int(k.rsplit("|", 1)[1])): q.clone() for k, q in state.items()}

    def clear(self) -> None:
        """Back to the seeded initial Q (elastic reset)."""
        self.q.clear()


class LowRankTransfer(Transfer):
    """PowerSGD: phase 1 allreduces P = M Q of every matrix (vectors travel as they are)
    in one collective; ``advance`` orthonormalizes the mean P and starts phase 2, Q = M^T P;
    ``finish`` rebuilds P Q^T.  With ``update`` (the residual is formed this step) the
    residual ``g_ef`` keeps what the rank-r sum missed and the warm starts move on.  All
    of it in ``g_ef``'s dtype (float64 for float64 parameters)."""

    kind = "lowrank"

    def __init__(self, link, name, bucket, g_ef: torch.Tensor, comp, warm: WarmStarts,
                 update: bool, with_stats: bool):
        super().__init__(link, name, bucket.numel, bucket.device, with_stats)
        self.g_ef, self.warm, self.update = g_ef, warm, update
        parts, self.plan = [], []
        for pname, p, (s, e) in zip(bucket.names, bucket.params, bucket.offsets):
            if comp.compressible(p):
                n, m = p.shape[0], p.numel() // p.shape[0]
                r = comp.rank_for(n, m)
                key = (pname, r)
                q = warm.q.get(key)
                if q is None:
                    q = comp.initial_q(m, r, zlib.crc32(pname.encode()), g_ef.device)
                q = q.to(g_ef.dtype)   # (a float32 Q saved for float64 parameters widens exactly)
                parts.append((g_ef[s:e].view(n, m) @ q).reshape(-1))
                self.plan.append((s, e, n, m, r, key))
            else:
                parts.append(g_ef[s:e])
                self.plan.append((s, e, None, None, None, None))
        self.p_buf = torch.cat(parts)
        self.bytes_sent = self.p_buf.element_size() * self.p_buf.numel()
        self.wire_elements = self.p_buf.numel()   # (phase 2 adds Q's)
        self.floats_sent = self.p_buf.numel()
        self.aggregated: Optional[torch.Tensor] = None
        self.p: List[Optional[torch.Tensor]] = []

    def _submit(self, stats):
        return self._allreduce(self.p_buf, self.name + ".P", stats, mean=True)

    def advance(self) -> None:
        out = self._split_stats(self._wait(self.name + ".P"), mean=True)
        aggregated = torch.zeros(self.numel, dtype=self.g_ef.dtype, device=self.device)
        q_parts, ofs = [], 0
        for s, e, n, m, r, key in self.plan:
            if n is None:
                aggregated[s:e] = out[ofs:ofs + e - s]
                ofs += e - s
                self.p.append(None)
                continue
            p = orthonormalize(out[ofs:ofs + n * r].view(n, r))
            ofs += n * r
            q_parts.append((self.g_ef[s:e].view(n, m).t() @ p).reshape(-1))
            self.p.append(p)
        self.aggregated = aggregated
        self.handle = None
        if q_parts:
            qbuf = torch.cat(q_parts)
            self.bytes_sent += qbuf.element_size() * qbuf.numel()
            self.wire_elements += qbuf.numel()
            self.floats_sent += qbuf.numel()
            self.handle = comm.allreduce_async(qbuf, self.name + ".Q", None,
                                               process_set=self.link.process_set)

    def finish(self) -> torch.Tensor:
        q_all = self._wait(self.name + ".Q") if self.handle is not None else None
        aggregated, g_ef, ofs = self.aggregated, self.g_ef, 0
        for (s, e, n, m, r, key), p in zip(self.plan, self.p):
            if n is None:
                if self.update:
                    g_ef[s:e].zero_()           # sent exactly
                continue
            q = q_all[ofs:ofs + m * r].view(m, r)
            ofs += m * r
            approx = (p @ q.t()).reshape(-1)
            aggregated[s:e] = approx
            if self.update:
                g_ef[s:e].sub_(approx)          # error feedback: what the rank-r sum missed
                self.warm.q[key] = q.clone()    # warm start (identical on every rank)
        if not self.link.average:
            aggregated.mul_(self.link.world)
        return aggregated
