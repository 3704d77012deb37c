"""The one seam where Horovod is called.

The wire format (how payloads and statistics are laid out in a collective's
tensor) is ``wire.py``'s, re-exported here.

Bounded waits: every wait here takes a ``timeout`` in seconds (``math.inf``: no
limit; ``None``: ``$HOROVOD_GRAVAC_TIMEOUT``, else 600 s).  A bounded wait polls
``hvd.poll(handle)`` until a deadline and then raises :class:`CollectiveTimeoutError`
naming the collective and the time waited, so a rank whose peer died or stalls
fails with a clear error instead of hanging.  The
blocking helpers (``broadcast_object``, ``allgather_object``)
are built from asynchronous collectives plus such a wait.

Bounded exit: once a rank has raised :class:`CollectiveTimeoutError`, its peer is dead or
frozen, and Horovod's own ``shutdown()`` (an ``atexit`` handler) can block for ever on it
(Open MPI) or for Gloo's receive timeout (30 s).  The first such error therefore registers
an ``atexit`` handler of its own, which runs before Horovod's: it flushes stdout and
stderr and runs Horovod's shutdown on a helper thread; if that has not returned within
``$HOROVOD_GRAVAC_EXIT_GRACE`` seconds (default 10), it flushes the ``logging`` handlers
and ends the process with ``os._exit(1)``, so the launcher sees it fail and ends the job
(later ``atexit`` handlers and open files' unflushed buffers are skipped then: the
alternative is a process that never exits).  Nothing else changes: a
process that catches the error can still save a checkpoint or log before it exits.
"""
from __future__ import annotations

import atexit
import io
import math
import os
import sys
import threading
import time
from typing import Optional

import cloudpickle
import torch

import horovod.torch as hvd
import horovod.torch as _horovod

from .wire import (N_STATS, StepStats, header_rows, pack, pack_slot, read_header_stats,  # noqa: F401
                   read_slot_stats, row_words, rows_dtype, slot_rows, split_stats, unpack_sum,
                   with_stats)

#: Environment variable read when ``DistributedOptimizer(timeout_s=None)``.
TIMEOUT_ENV = "HOROVOD_GRAVAC_TIMEOUT"
#: Seconds a collective may take before the rank gives up (when nothing else is set).
DEFAULT_TIMEOUT_S = 600.0
#: Shortest pause between polls of a bounded wait (seconds).
POLL_MIN_SLEEP_S = 2e-5
#: Environment variable: seconds Horovod's shutdown may take at exit after a collective
#: timed out, before the process ends itself with ``os._exit(1)``.
EXIT_GRACE_ENV = "HOROVOD_GRAVAC_EXIT_GRACE"
DEFAULT_EXIT_GRACE_S = 10.0


class CollectiveTimeoutError(TimeoutError):
    """A collective did not complete within the timeout: a peer rank died or stalls."""

    def __init__(self, name: str, elapsed: float, timeout: float):
        self.collective, self.elapsed, self.timeout = name, elapsed, timeout
        try:
            where = f"rank {hvd.rank()} of {hvd.size()}"
        except ValueError:   # Horovod not initialized (unit tests)
            where = "this rank"
        super().__init__(
            f"horovod_gravac: collective '{name}' did not complete on {where} "
            f"after {elapsed:.1f} s (timeout {timeout:g} s). Another rank has "
            f"probably died or stalled. The job cannot continue from here; restart it (from a "
            f"checkpoint). The limit is DistributedOptimizer(timeout_s=...) or ${TIMEOUT_ENV}.")


class MismatchedShapesError(RuntimeError):
    """Horovod refused a collective on every rank because the ranks' tensors differ in shape."""


def exit_grace() -> float:
    """Seconds the exit guard gives Horovod's shutdown (``$HOROVOD_GRAVAC_EXIT_GRACE``,
    else 10; an unparsable or non-positive value falls back to 10)."""
    try:
        grace = float(os.environ.get(EXIT_GRACE_ENV, "").strip() or DEFAULT_EXIT_GRACE_S)
    except ValueError:
        return DEFAULT_EXIT_GRACE_S
    return grace if grace > 0 and not math.isnan(grace) else DEFAULT_EXIT_GRACE_S


_exit_guard_lock = threading.Lock()
_exit_guard_armed = False


def arm_exit_guard() -> bool:
    """Make sure this process ends within :func:`exit_grace` seconds of interpreter exit,
    even if Horovod's shutdown blocks on a dead peer (called when a collective times out;
    idempotent).  Registered with ``atexit`` after ``hvd.init()`` registered Horovod's
    shutdown, so it runs first.  Returns whether it is armed."""
    global _exit_guard_armed
    with _exit_guard_lock:
        if not _exit_guard_armed:
            atexit.register(_bounded_shutdown)
            _exit_guard_armed = True
    return True


def _bounded_shutdown(grace: Optional[float] = None) -> None:
    grace = exit_grace() if grace is None else grace
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:   # a closed or broken stream must not stop the exit
            pass
    done = threading.Event()

    def shutdown():
        try:
            hvd.shutdown()
        except Exception:
            pass
        done.set()

    threading.Thread(target=shutdown, name="gravac-bounded-shutdown", daemon=True).start()
    if not done.wait(grace):
        try:   # os._exit skips the atexit handlers still to come, logging's among them
            import logging
            logging.shutdown()
        except Exception:
            pass
        try:
            sys.stderr.write(f"horovod_gravac: a collective timed out and Horovod's shutdown did not "
                             f"return within {grace:g} s (${EXIT_GRACE_ENV}); exiting now with "
                             f"status 1\n")
            sys.stderr.flush()
        except Exception:
            pass
        os._exit(1)


def resolve_timeout(timeout_s=None) -> float:
    """Seconds to wait for a collective (``math.inf``: no limit).

    ``timeout_s`` if given, else ``$HOROVOD_GRAVAC_TIMEOUT``, else 600 s.  A finite
    number > 0 bounds every wait; ``math.inf`` (or "inf"/"none" in the environment
    variable) waits forever, as plain Horovod does.
    """
    source = "timeout_s"
    if timeout_s is None:
        env = os.environ.get(TIMEOUT_ENV, "").strip()
        if not env:
            return DEFAULT_TIMEOUT_S
        source = TIMEOUT_ENV
        if env.lower() in ("inf", "none", "never"):
            return math.inf
        try:
            timeout_s = float(env)
        except ValueError:
            raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds > 0 or 'inf', "
                             f"got {env!r}") from None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or math.isnan(timeout_s) or timeout_s <= 0:
        raise ValueError(f"{source} must be a number of seconds > 0 (math.inf: no limit), "
                         f"got {timeout_s!r}")
    return float(timeout_s)


def rank() -> int:
    return hvd.rank()


def size() -> int:
    return hvd.size()


# -- collectives -------------------------------------------------------------------
# ``process_set``: the Horovod process set the collective runs in (None: every rank).
# Horovod names a broadcast's root by its *global* rank, also inside a process set.

def _ps(process_set):
    return hvd.global_process_set if process_set is None else process_set


def group_size(process_set=None) -> int:
    return _ps(process_set).size()


def group_rank(process_set=None) -> int:
    """This process's rank inside ``process_set`` (0 is the set's root)."""
    return _ps(process_set).rank()


def group_root(process_set=None) -> int:
    """Global rank of the process set's first member: the root of our broadcasts."""
    return _global_rank(0, process_set)


def _global_rank(group_rank_: int, process_set=None) -> int:
    ranks = _ps(process_set).ranks
    return ranks[group_rank_] if ranks else group_rank_


def allreduce_async(tensor: torch.Tensor, name: str, op=None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0, process_set=None):
    """In-place allreduce (``op``: ``hvd.Average`` by default, or ``hvd.Sum``); the
    scale factors are Horovod's (``gradient_predivide_factor`` uses them)."""
    return hvd.allreduce_async_(tensor, op=hvd.Average if op is None else op, name=name,
                                prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                process_set=_ps(process_set))


def allreduce_sum_async(tensor: torch.Tensor, name: str, process_set=None):
    """In-place sum across ranks (a joined rank adds zeros)."""
    return allreduce_async(tensor, name, hvd.Sum, process_set=process_set)


def allreduce_mean_async(tensor: torch.Tensor, name: str, process_set=None):
    """In-place average across ranks (dense gradients, shared-index values)."""
    return allreduce_async(tensor, name, process_set=process_set)


def allgather_async(tensor: torch.Tensor, name: str, process_set=None):
    return hvd.allgather_async(tensor, name=name, process_set=_ps(process_set))


def pair_exchange_async(block: torch.Tensor, name: str, process_set=None):
    """Two ranks swap ``block`` (int32, the same shape on both): the result on each rank is
    the other rank's block.

    Each rank puts its block in the half of a reducescatter's buffer that the other rank
    receives, zeros in its own half; an integer sum with zeros copies the bits exactly, and
    the reduce-scatter of two ranks sends each rank just the other's half: ``block``'s bytes
    each way, as an allgather would.  Why not the allgather: Gloo's allgather (like its
    alltoall) writes a rank's data before its notice that it is ready to receive, into the
    one TCP stream between the two ranks, so whichever rank enters second has its notice
    queued behind its whole block, and the two directions run one after the other (2.1x the
    link's time for 1 MB at 100 Mbit/s against 1.4x here; ``docs/benchmarks.md``).  Its
    reduce-scatter and allreduce post their receives first."""
    me = group_rank(process_set)
    rows = block.shape[0]
    buf = torch.zeros((2 * rows,) + tuple(block.shape[1:]), dtype=block.dtype, device=block.device)
    buf[(1 - me) * rows:(2 - me) * rows] = block
    return hvd.reducescatter_async(buf, name=name, op=hvd.Sum, process_set=_ps(process_set))


def broadcast_async_(tensor: torch.Tensor, name: str, process_set=None, root: Optional[int] = None):
    """In-place broadcast from ``root`` (a rank of the process set; default its first)."""
    return hvd.broadcast_async_(tensor, _global_rank(root or 0, process_set), name=name,
                                process_set=_ps(process_set))


def wait(handle, name: str = "collective", timeout: Optional[float] = None,
         min_sleep: float = POLL_MIN_SLEEP_S) -> torch.Tensor:
    """The result of an asynchronous collective; raises :class:`CollectiveTimeoutError`
    rather than wait longer than ``timeout`` seconds (``None``: the default, see
    :func:`resolve_timeout`; ``math.inf``: no limit).  ``min_sleep``: the shortest pause
    between polls (each poll takes the GIL)."""
    if timeout is None:
        timeout = resolve_timeout(None)
    if not math.isinf(timeout) and not hvd.poll(handle):
        start = time.monotonic()
        deadline = start + timeout
        while not hvd.poll(handle):
            now = time.monotonic()
            if now >= deadline:
                error = CollectiveTimeoutError(name, now - start, timeout)
                if hvd is _horovod:   # the real Horovod (unit tests substitute a fake)
                    arm_exit_guard()
                raise error
            # Sleep a small fraction of the time waited so far: the completion is noticed
            # at most ~5 % (and 1 ms) late, and a long wait costs few wake-ups.
            time.sleep(min(max(1e-3, min_sleep), max(min_sleep, 0.05 * (now - start)), deadline - now))
    try:
        return hvd.synchronize(handle)
    except Exception as exc:
        if "not supported with Join" in str(exc):   # a peer sits in hvd.join()
            raise type(exc)(f"{exc} (collective '{name}'). horovod_gravac sends sparse payloads with "
                            f"allgather (reducescatter between two ranks) and decisions with broadcast; "
                            f"for hvd.join() with uneven data "
                            f"use DistributedOptimizer(..., join_safe=True), which sends everything "
                            f"with allreduce.") from exc
        if "Mismatched data types" in str(exc) or "tensor shapes" in str(exc):
            # Horovod compared the ranks' dtypes and shapes (a payload's width is its dtype,
            # see wire.py) and moved nothing; its message does not say which collective.
            message = (f"{exc} (collective '{name}'). The ranks sent different dtypes or "
                       f"layouts for it: a bucket of float64 parameters travels as float64, "
                       f"so every rank must build the model with the same parameter dtypes "
                       f"(DistributedOptimizer's start-up check, check_consistency=True, "
                       f"compares them).")
            if "tensor shapes" in str(exc):   # (the pair exchange falls back on this one)
                raise MismatchedShapesError(message) from exc
            raise type(exc)(message) from exc
        raise


def _to_bytes(obj) -> torch.Tensor:
    buf = io.BytesIO()
    cloudpickle.dump(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _from_bytes(t: torch.Tensor):
    return cloudpickle.load(io.BytesIO(t.numpy().tobytes()))


# Objects up to this many pickled bytes travel inline in broadcast_object's first collective.
_INLINE_BYTES = 1016


def broadcast_object(obj, name: str, timeout: Optional[float] = None,
                     min_sleep: float = POLL_MIN_SLEEP_S, process_set=None, root: int = 0):
    """Rank 0's object on every rank (pickled; every rank must call this).

    One broadcast of a fixed-size header that carries the pickle's length and, when it
    fits (up to ``_INLINE_BYTES``; a GraVAC decision is ~200), the pickle itself; a
    second broadcast only for larger objects.  Each is bounded by ``timeout``.
    (``hvd.broadcast_object`` always needs two: the receivers do not know the size.)"""
    src = root
    root = group_rank(process_set) == src
    data = _to_bytes(obj) if root else None
    head = torch.zeros(8 + _INLINE_BYTES, dtype=torch.uint8)
    if root:
        head[:8].view(torch.int64)[0] = data.numel()
        if data.numel() <= _INLINE_BYTES:
            head[8:8 + data.numel()] = data
    wait(broadcast_async_(head, name + ".head", process_set, src), name + ".head", timeout, min_sleep)
    size = int(head[:8].view(torch.int64)[0])
    if root:
        if size > _INLINE_BYTES:
            wait(broadcast_async_(data, name + ".t", process_set, src), name + ".t", timeout, min_sleep)
        return obj
    if size <= _INLINE_BYTES:
        return _from_bytes(head[8:8 + size])
    data = torch.zeros(size, dtype=torch.uint8)
    wait(broadcast_async_(data, name + ".t", process_set, src), name + ".t", timeout, min_sleep)
    return _from_bytes(data)


def allgather_object(obj, name: str, timeout: Optional[float] = None, process_set=None):
    """Every rank's object, in rank order (two allgathers, each bounded by ``timeout``)."""
    data = _to_bytes(obj)
    sizes = wait(allgather_async(torch.tensor([data.numel()], dtype=torch.int64), name + ".sz", process_set),
                 name + ".sz", timeout).tolist()
    gathered = wait(allgather_async(data, name + ".t", process_set), name + ".t", timeout)
    out, start = [], 0
    for n in sizes:
        out.append(_from_bytes(gathered[start:start + n]))
        start += n
    return out
