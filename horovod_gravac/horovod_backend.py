"""The Horovod backend: :class:`backend.CollectiveBackend` on Horovod's collectives, within
one Horovod process set.  The only module of the core that calls Horovod."""
from __future__ import annotations

from typing import Optional

import torch

import horovod.torch as hvd
import horovod.torch as _horovod

from .backend import CollectiveBackend, ReduceOp
from .comm import MismatchedShapesError, arm_exit_guard, bounded_wait

_OPS = {ReduceOp.AVERAGE: hvd.Average, ReduceOp.SUM: hvd.Sum}


class HorovodBackend(CollectiveBackend):
    """Horovod's collectives within ``process_set`` (``None``: every rank).  Horovod names a
    broadcast's root by its *global* rank, also inside a process set: translated here."""

    def __init__(self, process_set=None):
        self.process_set = hvd.global_process_set if process_set is None else process_set

    def rank(self) -> int:
        return self.process_set.rank()

    def size(self) -> int:
        return self.process_set.size()

    def allreduce_async(self, tensor, name, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0):
        return hvd.allreduce_async_(tensor, op=_OPS[op], name=name, prescale_factor=prescale_factor,
                                    postscale_factor=postscale_factor, process_set=self.process_set)

    def allgather_async(self, tensor, name):
        return hvd.allgather_async(tensor, name=name, process_set=self.process_set)

    def alltoall_async(self, tensor, splits, name):
        """``hvd.alltoall`` with ``splits`` (Gloo's alltoallv: every pair of ranks swaps its
        parts directly, so a rank sends only its rows for the others).  ``wait`` returns the
        received rows (Horovod's result also carries the received splits)."""
        return _Alltoall(hvd.alltoall_async(tensor.contiguous(), splits=torch.tensor(splits, dtype=torch.int32),
                                            name=name, process_set=self.process_set))

    def pair_exchange_async(self, block, name):
        """Each rank puts its block in the half of a reducescatter's buffer that the other rank
        receives, zeros in its own half; an integer sum with zeros copies the bits exactly, and
        the reduce-scatter of two ranks sends each rank just the other's half: ``block``'s bytes
        each way, as an allgather would.  Why not the allgather: Gloo's allgather (like its
        alltoall) writes a rank's data before its notice that it is ready to receive, into the
        one TCP stream between the two ranks, so whichever rank enters second has its notice
        queued behind its whole block, and the two directions run one after the other
        (``docs/benchmarks.md``, "Step cost", has the timings).  Its reduce-scatter and
        allreduce post their receives first."""
        me = self.rank()
        rows = block.shape[0]
        buf = torch.zeros((2 * rows,) + tuple(block.shape[1:]), dtype=block.dtype, device=block.device)
        buf[(1 - me) * rows:(2 - me) * rows] = block
        return hvd.reducescatter_async(buf, name=name, op=hvd.Sum, process_set=self.process_set)

    def broadcast_async_(self, tensor, name, root=0):
        ranks = self.process_set.ranks
        return hvd.broadcast_async_(tensor, ranks[root] if ranks else root, name=name,
                                    process_set=self.process_set)

    def wait(self, handle, name: str, timeout: Optional[float] = None) -> torch.Tensor:
        alltoall = isinstance(handle, _Alltoall)
        handle = handle.handle if alltoall else handle
        bounded_wait(lambda: hvd.poll(handle), name, timeout, where=_where,
                     on_timeout=lambda: arm_exit_guard(hvd.shutdown) if hvd is _horovod else None)
        try:
            out = hvd.synchronize(handle)
            return out[0] if alltoall else out
        except Exception as exc:
            explained = _explained(exc, name)
            if explained is exc:
                raise
            raise explained from exc


class _Alltoall:
    """An alltoall's Horovod handle (its result is a pair: the rows and the received splits)."""

    def __init__(self, handle):
        self.handle = handle


def _where() -> str:
    try:
        return f"rank {hvd.rank()} of {hvd.size()}"
    except ValueError:   # Horovod not initialized (unit tests)
        return "this rank"


def _explained(exc: Exception, name: str) -> Exception:
    """Horovod's error with what it means here (its messages do not say which collective)."""
    if "not supported with Join" in str(exc):   # a peer sits in hvd.join()
        return type(exc)(f"{exc} (collective '{name}'). horovod_gravac sends sparse payloads with "
                         f"allgather (reducescatter between two ranks) and decisions with broadcast; "
                         f"for hvd.join() with uneven data "
                         f"use DistributedOptimizer(..., join_safe=True), which sends everything "
                         f"with allreduce.")
    if "Mismatched operations" in str(exc):   # ranks chose different exchanges for one bucket
        return MismatchedShapesError(f"{exc} (collective '{name}')")
    if "Mismatched data types" in str(exc) or "tensor shapes" in str(exc):
        # Horovod compared the ranks' dtypes and shapes (a payload's width is its dtype,
        # see wire.py) and moved nothing.
        message = (f"{exc} (collective '{name}'). The ranks sent different dtypes or "
                   f"layouts for it: a bucket of float64 parameters travels as float64, "
                   f"so every rank must build the model with the same parameter dtypes "
                   f"(DistributedOptimizer's start-up check, check_consistency=True, "
                   f"compares them).")
        if "tensor shapes" in str(exc):   # (the pair exchange falls back on this one)
            return MismatchedShapesError(message)
        return type(exc)(message)
    return exc
