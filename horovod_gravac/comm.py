"""The one seam where Horovod is called, and the sparse wire format.

Wire format of a sparse payload: one contiguous int32 tensor of shape (k, 2);
column 0 holds the fp32 values' bits, column 1 the int32 flat indices.  One
``hvd.allgather`` per bucket concatenates every rank's rows along dim 0, whatever
k each rank chose, so no sizes need to be exchanged first: 8 bytes per kept
entry and nothing else.  Aggregation *adds* colliding indices (``index_add_``),
then divides by the number of ranks.

Payloads whose indices are the same on every rank (Random-k with a shared seed)
skip the indices: a dense allreduce of the k values, 4 bytes per entry.
"""
from __future__ import annotations

import torch

import horovod.torch as hvd

from .compressors.base import SparsePayload


def rank() -> int:
    return hvd.rank()


def size() -> int:
    return hvd.size()


# -- sparse wire format ------------------------------------------------------------
def pack(payload: SparsePayload) -> torch.Tensor:
    values = payload.values.to(torch.float32).contiguous().view(torch.int32)
    return torch.stack([values, payload.indices.to(torch.int32)], dim=1).contiguous()


def unpack_sum(gathered: torch.Tensor, numel: int) -> torch.Tensor:
    """Dense fp32 sum of every rank's rows of a gathered (sum_k, 2) buffer."""
    out = torch.zeros(numel, dtype=torch.float32, device=gathered.device)
    if gathered.numel():
        values = gathered[:, 0].contiguous().view(torch.float32)
        out.index_add_(0, gathered[:, 1].long(), values)
    return out


# -- collectives -------------------------------------------------------------------
def allreduce_mean_async(tensor: torch.Tensor, name: str):
    """In-place average across ranks (dense gradients, shared-index values)."""
    return hvd.allreduce_async_(tensor, op=hvd.Average, name=name)


def allgather_async(tensor: torch.Tensor, name: str):
    return hvd.allgather_async(tensor, name=name)


def wait(handle) -> torch.Tensor:
    return hvd.synchronize(handle)


def allreduce_mean(values, name: str) -> torch.Tensor:
    """Average a small float64 vector across ranks (one collective, blocking)."""
    t = torch.as_tensor(values, dtype=torch.float64)
    return hvd.allreduce(t, op=hvd.Average, name=name)


def allreduce_max(values, name: str) -> torch.Tensor:
    t = torch.as_tensor(values, dtype=torch.float64)
    return hvd.allreduce(t, op=hvd.Max, name=name)


def broadcast_object(obj, name: str):
    """Rank 0's object on every rank (pickled; every rank must call this)."""
    return hvd.broadcast_object(obj, root_rank=0, name=name)


def allgather_object(obj, name: str):
    return hvd.allgather_object(obj, name=name)
