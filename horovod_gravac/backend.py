"""The collectives the core asks of a communication library: one interface, one small module
per library that implements it (``horovod_backend.HorovodBackend``).

The encoder, the transfers, the consensus and the sparse path call nothing else: they are
handed a backend (``transfers.Link.backend``) and never import a collective library.  A
backend works within one group of ranks (a Horovod process set, a ``torch.distributed``
process group); ranks are numbered within it, 0 first.

Every collective is named.  The name is the same on every rank and unique among the
collectives in flight; a library that matches collectives by order may ignore it, but must
then see them in the same order on every rank (this package submits every collective from
the training thread, in program order).  The asynchronous calls return a handle that only
:meth:`CollectiveBackend.wait` reads, so its type is the backend's own.

What stays shared by all backends is in ``comm.py``: the timeout's resolution, the bounded
wait's polling policy, the exit guard and the two errors :meth:`~CollectiveBackend.wait`
raises.  The object collectives are built here, once, from the tensor collectives.
"""
from __future__ import annotations

import abc
import enum
import io
from typing import Any, List, Optional

import torch

try:   # (what Horovod's own object collectives use; it pickles classes defined in __main__ by value)
    import cloudpickle as _pickle
except ImportError:   # pragma: no cover - without Horovod, which brings it
    import pickle as _pickle


class ReduceOp(enum.Enum):
    """How an allreduce combines the ranks' tensors."""

    AVERAGE = "average"
    SUM = "sum"


#: Objects up to this many pickled bytes travel inline in ``broadcast_object``'s first collective.
INLINE_OBJECT_BYTES = 1016


class CollectiveBackend(abc.ABC):
    """The collectives of one group of ranks (see the module docstring)."""

    @abc.abstractmethod
    def rank(self) -> int:
        """This process's rank within the group."""

    @abc.abstractmethod
    def size(self) -> int:
        """The number of ranks in the group."""

    @abc.abstractmethod
    def allreduce_async(self, tensor: torch.Tensor, name: str, op: ReduceOp = ReduceOp.AVERAGE,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0):
        """In-place allreduce of ``tensor``: each rank's tensor is multiplied by
        ``prescale_factor``, combined by ``op`` and the result multiplied by
        ``postscale_factor`` (Horovod's ``gradient_predivide_factor`` uses the two)."""

    @abc.abstractmethod
    def allgather_async(self, tensor: torch.Tensor, name: str):
        """Every rank's ``tensor`` concatenated along dim 0 in rank order; the first
        dimension may differ by rank."""

    @abc.abstractmethod
    def alltoall_async(self, tensor: torch.Tensor, splits: List[int], name: str):
        """Rows of ``tensor`` (dim 0) in ``len(splits) == size()`` consecutive parts, part ``j``
        (``splits[j]`` rows, possibly none) to rank ``j``; the result on each rank is the parts
        it was sent, concatenated in source-rank order (its own part included).  Row counts
        may differ between ranks; the other dimensions and the dtype may not."""

    @abc.abstractmethod
    def pair_exchange_async(self, block: torch.Tensor, name: str):
        """Two ranks swap ``block`` (int32, the same shape on both): the result on each rank
        is the other rank's block.  When the shapes differ, :meth:`wait` raises
        ``comm.MismatchedShapesError`` on both ranks (the caller falls back to an allgather)."""

    @abc.abstractmethod
    def broadcast_async_(self, tensor: torch.Tensor, name: str, root: int = 0):
        """In-place broadcast of ``root``'s ``tensor`` (``root``: a rank within the group)."""

    @abc.abstractmethod
    def wait(self, handle, name: str, timeout: Optional[float] = None) -> torch.Tensor:
        """The result of an asynchronous collective.  Raises ``comm.CollectiveTimeoutError``
        rather than wait longer than ``timeout`` seconds (``None``: ``comm.resolve_timeout``'s
        default; ``math.inf``: no limit), and ``comm.MismatchedShapesError`` when the library
        refused the collective because the ranks' shapes differ."""

    def broadcast_object(self, obj: Any, name: str, timeout: Optional[float] = None, root: int = 0) -> Any:
        """``root``'s object on every rank (pickled; every rank must call this).

        One broadcast of a fixed-size header that carries the pickle's length and, when it
        fits (up to ``INLINE_OBJECT_BYTES``; a GraVAC decision is ~200), the pickle itself; a
        second broadcast only for larger objects.  Each is bounded by ``timeout``."""
        is_root = self.rank() == root
        data = _to_bytes(obj) if is_root else None
        head = torch.zeros(8 + INLINE_OBJECT_BYTES, dtype=torch.uint8)
        if is_root:
            head[:8].view(torch.int64)[0] = data.numel()
            if data.numel() <= INLINE_OBJECT_BYTES:
                head[8:8 + data.numel()] = data
        self.wait(self.broadcast_async_(head, name + ".head", root), name + ".head", timeout)
        size = int(head[:8].view(torch.int64)[0])
        if is_root:
            if size > INLINE_OBJECT_BYTES:
                self.wait(self.broadcast_async_(data, name + ".t", root), name + ".t", timeout)
            return obj
        if size <= INLINE_OBJECT_BYTES:
            return _from_bytes(head[8:8 + size])
        data = torch.zeros(size, dtype=torch.uint8)
        self.wait(self.broadcast_async_(data, name + ".t", root), name + ".t", timeout)
        return _from_bytes(data)

    def allgather_object(self, obj: Any, name: str, timeout: Optional[float] = None) -> List[Any]:
        """Every rank's object, in rank order (two allgathers, each bounded by ``timeout``)."""
        data = _to_bytes(obj)
        sizes = self.wait(self.allgather_async(torch.tensor([data.numel()], dtype=torch.int64), name + ".sz"),
                          name + ".sz", timeout).tolist()
        gathered = self.wait(self.allgather_async(data, name + ".t"), name + ".t", timeout)
        out, start = [], 0
        for n in sizes:
            out.append(_from_bytes(gathered[start:start + n]))
            start += n
        return out


def _to_bytes(obj) -> torch.Tensor:
    buf = io.BytesIO()
    _pickle.dump(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _from_bytes(t: torch.Tensor):
    return _pickle.load(io.BytesIO(t.numpy().tobytes()))
