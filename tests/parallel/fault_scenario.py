"""A fault scenario, not a test: it must fail, in a specific way.  Run on 2 ranks by
tests/integration/test_faults.py, which checks how rank 0 failed and how soon the job ended:

    horovodrun -np 2 -H localhost:2 --gloo python tests/parallel/fault_scenario.py KIND TIMEOUT

At step 3 rank 1 misbehaves (KIND: bucket, stats, decision or startup: it stalls; exit: it
exits; freeze: it stops with SIGSTOP; exchange, exchange_exit: on 3 ranks or more, with the
sparse allreduce, it stalls or exits between the exchange's two phases, its alltoall sent and
the allgather not).  Rank 0 must raise an error naming the collective
within TIMEOUT seconds (``timeout_s``; unused when $HOROVOD_GRAVAC_TIMEOUT is set): it
prints ``FAILED_AFTER <seconds> <error>`` and re-raises, so the job fails.
"""
import os
import signal
import sys
import time

import horovod_gravac as hg
from horovod_gravac import comm
from horovod_gravac.accounting import StepRecord

from ranks import RANK, hg_opt, make_model, train_steps


def _stall(seconds=300):
    print(f"rank {RANK} stalls", flush=True)
    time.sleep(seconds)


def fault_run(kind, timeout):
    """Rank 1 misbehaves at step 3; rank 0 must fail with a clear error within ``timeout``."""
    timeout_s = None if os.environ.get(comm.TIMEOUT_ENV) else float(timeout)
    model = make_model()
    t0 = time.monotonic()
    try:
        if kind == "startup" and RANK == 1:
            _stall()
        # The ladder checks at every window's end (step indexes 1, 3, 5): the decision broadcast that
        # rank 1 stalls in comes at a fixed step.  The default rule set's checks depend on
        # measured step times, so step 3 may pass without one.
        mid_exchange = kind in ("exchange", "exchange_exit")
        opt = hg_opt(model, timeout_s=timeout_s,
                     controller=hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=2, variant="ladder"),
                     **({"exchange": "sparse_allreduce"} if mid_exchange else {}))
    except Exception as exc:
        print(f"FAILED_AFTER {time.monotonic() - t0:.2f} {type(exc).__name__}: {exc}", flush=True)
        raise
    if RANK == 1 and kind in ("stats", "decision"):
        # stats: stall just before the statistics-carrying bucket starts its collective;
        # decision: in the state broadcast of the window check at step index 3 (window 2).
        owner, target = {"stats": (StepRecord, "local_stats"), "decision": (opt.backend, "broadcast_async_")}[kind]
        original = getattr(owner, target)

        def late(*a, **k):
            if opt.step_index == 3:
                _stall()
            return original(*a, **k)
        setattr(owner, target, late)
    if RANK == 1 and mid_exchange:
        from horovod_gravac.transfers import SparseAllreduce
        advance = SparseAllreduce.advance

        def between_phases(self):
            if opt.step_index == 3 and self.handle2 is None:
                if kind == "exchange_exit":
                    print("rank 1 exits mid-exchange", flush=True)
                    os._exit(0)
                _stall()
            return advance(self)
        SparseAllreduce.advance = between_phases
    try:
        for step in range(6):
            if step == 3 and RANK == 1:
                if kind == "bucket":
                    _stall()
                elif kind == "exit":
                    print("rank 1 exits", flush=True)
                    os._exit(0)
                elif kind == "freeze":     # the whole process stops, Horovod's thread too
                    print("rank 1 freezes", flush=True)
                    os.kill(os.getpid(), signal.SIGSTOP)
            t0 = time.monotonic()
            train_steps(model, opt, 1, start=step)
    except Exception as exc:
        print(f"FAILED_AFTER {time.monotonic() - t0:.2f} {type(exc).__name__}: {exc}", flush=True)
        raise
    print(f"rank {RANK} finished without error", flush=True)


if __name__ == "__main__":
    fault_run(*sys.argv[1:3])
