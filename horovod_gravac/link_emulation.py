"""A slower link, emulated in user space, for trying the controllers on one machine.

Ranks on one machine exchange at memory speed: a step at CF 10 and one at CF 1000 take the
same time, so a controller that reads step times (``GraVAC()``) has nothing to choose by,
and its choice follows noise.  ``$HOROVOD_GRAVAC_EMULATE_LINK`` (a rate: ``"100mbit"``)
makes every collective of this package's optimizer and DDP hook also cost the time its bytes
would take on such a link: when a collective completes on the real transport, the waiting
rank sleeps until the bytes it sends by the ring algorithms (the table in ``exchange.py``)
have crossed a wire of that rate, queued behind the bytes of the collectives before it.  The
real transport's own time (Horovod's negotiation, Gloo) stays in, as on a cluster.

It changes timings only: results, the ranks' agreement and what is sent are untouched.  The
demo sets it (``python -m horovod_gravac.harness.train --emulate-link``); ``benchmarks/netem.py``
shapes real sockets instead, where the machine allows (root, network namespaces).  Never set
it on a cluster: the real link is already there.
"""
from __future__ import annotations

import os
import time
from typing import List, Optional

import torch

from .backend import CollectiveBackend, ReduceOp
from .exchange import parse_rate

#: The variable that turns the emulation on (a rate such as ``"100mbit"``).
EMULATE_ENV = "HOROVOD_GRAVAC_EMULATE_LINK"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class EmulatedLinkBackend(CollectiveBackend):
    """``inner``'s collectives, each also paying its bytes at ``rate`` (module doc).
    ``wire_seconds``: the emulated wire time added so far on this rank."""

    def __init__(self, inner: CollectiveBackend, rate):
        self.inner = inner
        self.rate = rate
        self.bytes_per_second = parse_rate(rate) / 8.0
        self.wire_seconds = 0.0
        self._wire_free = 0.0   # when the emulated wire has sent everything queued on it

    def rank(self) -> int:
        return self.inner.rank()

    def size(self) -> int:
        return self.inner.size()

    def allreduce_async(self, tensor, name, op=ReduceOp.AVERAGE, prescale_factor=1.0, postscale_factor=1.0):
        p = self.size()
        return _Emulated(self.inner.allreduce_async(tensor, name, op, prescale_factor, postscale_factor),
                         2.0 * (p - 1) / p * _nbytes(tensor))

    def allgather_async(self, tensor, name):
        return _Emulated(self.inner.allgather_async(tensor, name), (self.size() - 1) * _nbytes(tensor))

    def alltoall_async(self, tensor, splits: List[int], name):
        row = _nbytes(tensor) / max(1, tensor.shape[0]) if tensor.dim() else 0.0
        others = sum(s for j, s in enumerate(splits) if j != self.rank())
        return _Emulated(self.inner.alltoall_async(tensor, splits, name), others * row)

    def pair_exchange_async(self, block, name):
        return _Emulated(self.inner.pair_exchange_async(block, name), _nbytes(block))

    def broadcast_async_(self, tensor, name, root=0):
        return _Emulated(self.inner.broadcast_async_(tensor, name, root),
                         _nbytes(tensor) if self.size() > 1 else 0)

    def wait(self, handle, name: str, timeout: Optional[float] = None) -> torch.Tensor:
        out = self.inner.wait(handle.inner, name, timeout)
        if handle.nbytes > 0:
            now = time.perf_counter()
            seconds = handle.nbytes / self.bytes_per_second
            self._wire_free = max(now, self._wire_free) + seconds
            self.wire_seconds += seconds
            while True:   # sleep() may return early
                left = self._wire_free - time.perf_counter()
                if left <= 0:
                    break
                time.sleep(left)
        return out


class _Emulated:
    __slots__ = ("inner", "nbytes")

    def __init__(self, inner, nbytes: float):
        self.inner, self.nbytes = inner, float(nbytes)


def emulated_rate() -> Optional[str]:
    """``$HOROVOD_GRAVAC_EMULATE_LINK`` (None when unset).  A rate that cannot be read is a
    ``ValueError`` naming the variable."""
    rate = os.environ.get(EMULATE_ENV, "").strip()
    if not rate:
        return None
    try:
        parse_rate(rate)
    except ValueError as exc:
        raise ValueError(f"${EMULATE_ENV}: {exc}") from None
    return rate


def emulated(backend: CollectiveBackend) -> CollectiveBackend:
    """``backend`` behind the link ``$HOROVOD_GRAVAC_EMULATE_LINK`` gives, or as it is when
    unset (:func:`emulated_rate`)."""
    rate = emulated_rate()
    return backend if rate is None else EmulatedLinkBackend(backend, rate)
