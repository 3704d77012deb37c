"""The ``torch.distributed`` backend: :class:`backend.CollectiveBackend` on a process group
(Gloo, NCCL, ...).  The only module of the core that calls ``torch.distributed``'s
collectives; ``ddp.py`` builds the DDP comm hook on it.  No Horovod is imported.

Averages follow DDP's own arithmetic, so ``Dense()`` reproduces DDP bit for bit:

* a full-width tensor (float32, float64) is multiplied by ``1 / size`` before the sum, as
  DDP's reducer does when no comm hook is registered (``mul_out`` by ``1 / div_factor``
  while it copies the gradient into the bucket);
* a half-width wire (fp16, bf16) is divided by ``size`` before the sum, as
  ``default_hooks.fp16_compress_hook`` / ``bf16_compress_hook`` do.

(``default_hooks.allreduce_hook`` divides float32 too: at 3 ranks its result differs from
DDP's default in the last bit; DDP's default is the one reproduced here.)

Uneven allgathers (threshold sparsifiers' payloads): one tiny allgather of every rank's row
count, then one allgather of the payloads padded to the longest; the padding is cut off
again.  Host tensors (the consensus's small buffers and pickled objects) travel through
the current CUDA device when the group cannot move CPU tensors (NCCL), and are copied
back.  Two ranks' payloads of one size by construction (exact Top-k, Random-k) swap with
one allgather (:meth:`DDPBackend.pair_exchange_async`).  An alltoall with uneven splits
(the sparse allreduce's first phase) sends its row counts first.  Every call is asynchronous
(``async_op=True``) and every wait is bounded (``comm.bounded_wait``)."""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist

from .backend import CollectiveBackend, ReduceOp
from .comm import arm_exit_guard, bounded_wait

_HALF = (torch.float16, torch.bfloat16)
# One allgather into one tensor: all_gather_single since torch 2.13 (which deprecates the old name).
_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class _Handle:
    """An asynchronous collective: torch's ``Work`` and what turns its buffer into the result."""

    def __init__(self, work, result: Callable[[], torch.Tensor]):
        self.work, self.result = work, result


class DDPBackend(CollectiveBackend):
    """``torch.distributed``'s collectives within ``process_group`` (``None``: the default
    group).  Ranks are the group's; a broadcast's root is translated to its global rank.
    ``timeout``: the bound of the waits this backend makes by itself (the uneven
    allgather's row counts)."""

    def __init__(self, process_group=None, timeout: Optional[float] = None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("horovod_gravac.ddp: torch.distributed is not initialized; the hook's "
                               "state joins its process group at the first hook call (or its first "
                               "state_dict() / load_state_dict()): call "
                               "torch.distributed.init_process_group(...) before that")
        self.group = process_group
        self.timeout = timeout
        # NCCL moves only CUDA tensors: host buffers are staged on this rank's current device.
        self._host_staging = None
        if dist.get_backend(process_group) == "nccl":
            self._host_staging = torch.device("cuda", torch.cuda.current_device())

    def _on_wire(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``, or its copy on the device the group can send from."""
        if self._host_staging is not None and tensor.device.type == "cpu":
            return tensor.to(self._host_staging)
        return tensor

    def rank(self) -> int:
        return dist.get_rank(self.group)

    def size(self) -> int:
        return dist.get_world_size(self.group)

    def allreduce_async(self, tensor, name, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0):
        if prescale_factor != 1.0:
            tensor.mul_(prescale_factor)
        if op is ReduceOp.AVERAGE:
            n = self.size()
            if tensor.dtype in _HALF:
                tensor.div_(n)            # as fp16_compress_hook
            else:
                tensor.mul_(1.0 / n)      # as DDP's reducer without a hook
        wire = self._on_wire(tensor)
        work = dist.all_reduce(wire, op=dist.ReduceOp.SUM, group=self.group, async_op=True)

        def result():
            if wire is not tensor:
                tensor.copy_(wire)
            return tensor.mul_(postscale_factor) if postscale_factor != 1.0 else tensor
        return _Handle(work, result)

    def allgather_async(self, tensor, name):
        host = tensor.device
        tensor = self._on_wire(tensor)
        n = self.size()
        rows = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=tensor.device)
        counts = torch.empty(n, dtype=torch.int64, device=tensor.device)
        self.wait(_Handle(_gather_into(counts, rows, group=self.group, async_op=True),
                          lambda: counts), name + ".rows", self.timeout)
        counts = counts.tolist()
        longest = max(counts)
        tail = tuple(tensor.shape[1:])
        padded = tensor
        if tensor.shape[0] < longest:
            padded = torch.zeros((longest,) + tail, dtype=tensor.dtype, device=tensor.device)
            padded[:tensor.shape[0]] = tensor
        out = torch.empty((n * longest,) + tail, dtype=tensor.dtype, device=tensor.device)
        work = _gather_into(out, padded.contiguous(), group=self.group, async_op=True)

        def result():
            got = out if all(c == longest for c in counts) else \
                torch.cat([out[r * longest:r * longest + c] for r, c in enumerate(counts)])
            return got.to(host)
        return _Handle(work, result)

    def alltoall_async(self, tensor, splits, name):
        """``all_to_all_single`` with split sizes (Gloo, NCCL and MPI take uneven ones): first
        one tiny ``all_to_all_single`` of the row counts, so each rank knows what it receives
        (bounded by this backend's timeout), then the rows."""
        host = tensor.device
        tensor = self._on_wire(tensor.contiguous())
        n = self.size()
        send = torch.tensor(splits, dtype=torch.int64, device=tensor.device)
        recv = torch.empty(n, dtype=torch.int64, device=tensor.device)
        self.wait(_Handle(dist.all_to_all_single(recv, send, group=self.group, async_op=True), lambda: recv),
                  name + ".rows", self.timeout)
        recv_splits = recv.tolist()
        out = torch.empty((sum(recv_splits),) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        work = dist.all_to_all_single(out, tensor, recv_splits, list(splits), group=self.group, async_op=True)
        return _Handle(work, lambda: out.to(host))

    def pair_exchange_async(self, block, name):
        """One allgather of the two ranks' equal-sized blocks; the result is the other's.
        (The shapes are equal by construction: ``transfers.PairExchange`` is chosen only when
        the start-up check compared the ranks' compressors.)"""
        host = block.device
        block = self._on_wire(block)
        rows = block.shape[0]
        out = torch.empty((2 * rows,) + tuple(block.shape[1:]), dtype=block.dtype, device=block.device)
        work = _gather_into(out, block.contiguous(), group=self.group, async_op=True)
        other = 1 - self.rank()
        return _Handle(work, lambda: out[other * rows:(other + 1) * rows].to(host))

    def broadcast_async_(self, tensor, name, root=0):
        src = root if self.group is None else dist.get_global_rank(self.group, root)
        wire = self._on_wire(tensor)
        work = dist.broadcast(wire, src=src, group=self.group, async_op=True)
        return _Handle(work, lambda: tensor if wire is tensor else tensor.copy_(wire))

    def wait(self, handle, name: str, timeout: Optional[float] = None) -> torch.Tensor:
        bounded_wait(handle.work.is_completed, name, timeout, where=self._where,
                     on_timeout=lambda: arm_exit_guard(_shutdown))
        handle.work.wait()
        return handle.result()

    def _where(self) -> str:
        try:
            return f"rank {self.rank()} of {self.size()}"
        except Exception:   # the group is gone
            return "this rank"


def _shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
