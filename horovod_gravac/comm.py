"""What every collective backend shares: timeouts, bounded waits, the exit guard and the
errors a collective raises.  No collective library is imported here; the backends
(``backend.CollectiveBackend``, ``horovod_backend.HorovodBackend``) build on it.

Bounded waits: every wait takes a ``timeout`` in seconds (``math.inf``: no limit; ``None``:
``$HOROVOD_GRAVAC_TIMEOUT``, else 600 s).  :func:`bounded_wait` polls the collective until
a deadline and then raises :class:`CollectiveTimeoutError` naming the collective and the
time waited, so a rank whose peer died or stalls fails with a clear error instead of
hanging.

Bounded exit: once a rank has raised :class:`CollectiveTimeoutError`, its peer is dead or
frozen, and the collective library's own shutdown (Horovod's is an ``atexit`` handler) can
block for ever on it (Open MPI) or for Gloo's receive timeout (30 s).  The first such error
therefore registers an ``atexit`` handler of its own (:func:`arm_exit_guard`), which runs
before the library's: it flushes stdout and stderr and runs the library's shutdown on a
helper thread; if that has not returned within ``$HOROVOD_GRAVAC_EXIT_GRACE`` seconds
(default 10), it flushes the ``logging`` handlers and ends the process with
``os._exit(1)``, so the launcher sees it fail and ends the job (later ``atexit`` handlers
and open files' unflushed buffers are skipped then: the alternative is a process that
never exits).  Nothing else changes: a process that catches the error can still save a
checkpoint or log before it exits.
"""
from __future__ import annotations

import atexit
import math
import os
import sys
import threading
import time
from typing import Callable, Optional

#: Environment variable read when ``DistributedOptimizer(timeout_s=None)``.
TIMEOUT_ENV = "HOROVOD_GRAVAC_TIMEOUT"
#: Seconds a collective may take before the rank gives up (when nothing else is set).
DEFAULT_TIMEOUT_S = 600.0
#: Shortest pause between polls of a bounded wait (seconds; each poll takes the GIL).
POLL_MIN_SLEEP_S = 2e-5
#: Environment variable: seconds the collective library's shutdown may take at exit after a
#: collective timed out, before the process ends itself with ``os._exit(1)``.
EXIT_GRACE_ENV = "HOROVOD_GRAVAC_EXIT_GRACE"
DEFAULT_EXIT_GRACE_S = 10.0


class CollectiveTimeoutError(TimeoutError):
    """A collective did not complete within the timeout: a peer rank died or stalls."""

    def __init__(self, name: str, elapsed: float, timeout: float, where: str = "this rank"):
        self.collective, self.elapsed, self.timeout = name, elapsed, timeout
        super().__init__(
            f"horovod_gravac: collective '{name}' did not complete on {where} "
            f"after {elapsed:.1f} s (timeout {timeout:g} s). Another rank has "
            f"probably died or stalled. The job cannot continue from here; restart it (from a "
            f"checkpoint). The limit is DistributedOptimizer(timeout_s=...) or ${TIMEOUT_ENV}.")


class MismatchedShapesError(RuntimeError):
    """The library refused a collective on every rank because the ranks' tensors differ in
    shape, or because the ranks called different collectives under one name (their decisions
    diverged, and with them the exchange ``exchange.py`` picks for a CF).  Every transfer
    then sends its payload again with one allgather (``transfers.Transfer._regather``)."""


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


def bounded_wait(done: Callable[[], bool], name: str, timeout: Optional[float],
                 where: Callable[[], str] = lambda: "this rank",
                 on_timeout: Optional[Callable[[], None]] = None) -> None:
    """Return once ``done()`` is true; raise :class:`CollectiveTimeoutError` (``where()``
    names this rank in it; ``on_timeout()`` runs first) rather than wait longer than
    ``timeout`` seconds (``None``: :func:`resolve_timeout`'s default; ``math.inf``: return at
    once, the caller's blocking wait does the rest)."""
    if timeout is None:
        timeout = resolve_timeout(None)
    if math.isinf(timeout) or done():
        return
    start = time.monotonic()
    deadline = start + timeout
    while not done():
        now = time.monotonic()
        if now >= deadline:
            error = CollectiveTimeoutError(name, now - start, timeout, where())
            if on_timeout is not None:
                on_timeout()
            raise error
        # Sleep a small fraction of the time waited so far: the completion is noticed
        # at most ~5 % (and 1 ms) late, and a long wait costs few wake-ups.
        time.sleep(min(max(1e-3, POLL_MIN_SLEEP_S), max(POLL_MIN_SLEEP_S, 0.05 * (now - start)),
                       deadline - now))


def exit_grace() -> float:
    """Seconds the exit guard gives the library's shutdown (``$HOROVOD_GRAVAC_EXIT_GRACE``,
    else 10; an unparsable or non-positive value falls back to 10)."""
    try:
        grace = float(os.environ.get(EXIT_GRACE_ENV, "").strip() or DEFAULT_EXIT_GRACE_S)
    except ValueError:
        return DEFAULT_EXIT_GRACE_S
    return grace if grace > 0 and not math.isnan(grace) else DEFAULT_EXIT_GRACE_S


_exit_guard_lock = threading.Lock()
_exit_guard_armed = False


def arm_exit_guard(shutdown: Callable[[], None]) -> bool:
    """Make sure this process ends within :func:`exit_grace` seconds of interpreter exit,
    even if ``shutdown`` (the collective library's, e.g. ``hvd.shutdown``) blocks on a dead
    peer (called when a collective times out; idempotent).  Registered with ``atexit`` after
    the library registered its own shutdown, so it runs first.  Returns whether it is armed."""
    global _exit_guard_armed
    with _exit_guard_lock:
        if not _exit_guard_armed:
            atexit.register(_bounded_shutdown, shutdown)
            _exit_guard_armed = True
    return True


def _bounded_shutdown(shutdown: Callable[[], None], grace: Optional[float] = None) -> None:
    grace = exit_grace() if grace is None else grace
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:   # a closed or broken stream must not stop the exit
            pass
    done = threading.Event()

    def run_shutdown():
        try:
            shutdown()
        except Exception:
            pass
        done.set()

    threading.Thread(target=run_shutdown, name="gravac-bounded-shutdown", daemon=True).start()
    if not done.wait(grace):
        try:   # os._exit skips the atexit handlers still to come, logging's among them
            import logging
            logging.shutdown()
        except Exception:
            pass
        try:
            sys.stderr.write(f"horovod_gravac: a collective timed out and the collective library's "
                             f"shutdown did not return within {grace:g} s (${EXIT_GRACE_ENV}); exiting "
                             f"now with status 1\n")
            sys.stderr.flush()
        except Exception:
            pass
        os._exit(1)
