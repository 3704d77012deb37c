"""Multi-rank tests: plain pytest files that every rank runs, under horovodrun (or, for the
DDP hook's ``test_ddp_*.py``, under torchrun).

    horovodrun -np 2 -H localhost:2 --gloo python -m pytest tests/parallel/test_optimizer.py
    torchrun --nproc_per_node 2 --tee 3 -m pytest tests/parallel/test_ddp_hook.py

The normal test run does not collect this folder (``collect_ignore`` in tests/conftest.py);
tests/integration/test_parallel.py and test_horovod_compat.py launch these files with
``launcher.run_parallel_tests``, under a timeout, and fail unless every rank's pytest passed.
Run outside horovodrun, every test here is skipped.

Every rank collects the same tests in the same order and runs all of them (no ``-x``):
their collectives must match.  This file adds, for each test:

- the ``sizes(n, ...)`` marker: the test runs only when the job has one of these numbers
  of ranks (it is deselected otherwise); without it, a test runs at any size;
- an agreement on the outcome: after each test the ranks allgather pass/fail, and a test
  that failed on any rank fails on every rank, naming the ranks, so each rank's summary
  tells the whole story;
- a failure is printed at once (before the agreement, which waits for the other ranks),
  so it is in the output even when a peer then hangs and the launch is killed;
- a final barrier after the summary, so no rank's exit ends the job (horovodrun stops
  every rank when one fails) before the others have printed theirs.
"""
import importlib.util
import os

import pytest
import torch

import horovod.torch as hvd

# What horovodrun sets for each rank: Gloo (and elastic), Open MPI, other MPIs.
RANK_ENV = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
UNDER_HOROVODRUN = any(v in os.environ for v in RANK_ENV)
# torchrun (the DDP tests): torch.distributed is initialised by the test module, and the
# ranks agree on outcomes through it instead of Horovod.
UNDER_TORCHRUN = "TORCHELASTIC_RUN_ID" in os.environ and not UNDER_HOROVODRUN
UNDER_LAUNCHER = UNDER_HOROVODRUN or UNDER_TORCHRUN
ELASTIC = os.environ.get("HOROVOD_ELASTIC") == "1"
_config = None   # set by pytest_configure, for the hooks that are not given it
# tests/integration/test_horovod_compat.py runs some files again on torch 2.0's hook path (gradient
# accumulator nodes instead of register_post_accumulate_grad_hook), forced on this torch.
if os.environ.get("HOROVOD_GRAVAC_TEST_NODE_HOOKS") == "1":
    import horovod_gravac.optimizer
    horovod_gravac.optimizer.ACCUMULATOR_NODE_HOOKS = True


# How a rank waits for Horovod's collectives.  ``hvd.synchronize`` (under every blocking
# collective: hvd.allreduce, broadcast_optimizer_state, hvd.DistributedOptimizer's step...)
# spins on ``std::this_thread::yield()`` until the background thread is done; with 2-3 ranks
# (and the other pytest worker's) on 2 cores, those spinning threads take the CPU that the
# background threads need, and most of a launch's CPU time goes to the kernel.  Here the ranks
# poll first, sleeping between polls as horovod_gravac's own bounded waits do, then call
# Horovod's synchronize, which returns at once (releasing the handle, raising its error).
# Nothing else changes: the same collectives, in the same order, with the same results.
# test_horovod_cases.py on 2 ranks: 80 s -> 22-36 s, 94 -> 34-39 CPU-s (68 s of it in the kernel
# before).  GRAVAC_TEST_HOROVOD_SPIN=1 keeps Horovod's own wait.
def _sleeping_waits():
    import time

    import horovod.torch.functions
    import horovod.torch.mpi_ops as mpi_ops
    import horovod.torch.optimizer
    import horovod.torch.sync_batch_norm

    spin = mpi_ops.synchronize

    def synchronize(handle):
        if handle in mpi_ops._handle_map:
            start = time.monotonic()
            while not mpi_ops.poll(handle):
                time.sleep(min(1e-3, max(2e-5, 0.05 * (time.monotonic() - start))))
        return spin(handle)
    synchronize.__doc__ = spin.__doc__
    for module in (mpi_ops, hvd, horovod.torch.functions, horovod.torch.optimizer, horovod.torch.sync_batch_norm):
        if getattr(module, "synchronize", None) is spin:
            module.synchronize = synchronize


if UNDER_HOROVODRUN and os.environ.get("GRAVAC_TEST_HOROVOD_SPIN") != "1":
    _sleeping_waits()


def pytest_configure(config):
    global _config
    _config = config
    config.addinivalue_line("markers", "sizes(n, ...): run only on a job of n ranks "
                                       "(tests/parallel/conftest.py); default: any size")


def pytest_report_header(config):
    rank = next((os.environ[v] for v in RANK_ENV + ("RANK",) if v in os.environ), None)
    origin = importlib.util.find_spec("horovod_gravac").origin
    where = f"rank {rank}" if rank is not None else "not under horovodrun or torchrun: every test is skipped"
    hooks = "; torch 2.0's hook path" if os.environ.get("HOROVOD_GRAVAC_TEST_NODE_HOOKS") == "1" else ""
    return f"horovod_gravac from {os.path.dirname(origin)}; {where}{hooks}"


def _size():
    if UNDER_TORCHRUN:
        return int(os.environ["WORLD_SIZE"])
    return hvd.size() if hvd.is_initialized() else None


def _dist():
    """torch.distributed when it carries the agreement (under torchrun, once initialised)."""
    import torch.distributed as dist
    return dist if UNDER_TORCHRUN and dist.is_available() and dist.is_initialized() else None


def _rank():
    return _dist().get_rank() if UNDER_TORCHRUN else hvd.rank()


def _gather_outcome(ok: int, name: str) -> list:
    dist = _dist()
    if dist is None:
        return hvd.allgather(torch.tensor([ok], dtype=torch.int32), name=name).tolist()
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, ok)
    return out


def pytest_collection_modifyitems(config, items):
    if not UNDER_LAUNCHER:
        skip = pytest.mark.skip(reason="a multi-rank test: run it under horovodrun or torchrun "
                                       "(see tests/parallel/conftest.py)")
        for item in items:
            item.add_marker(skip)
        return
    size = _size()
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("sizes")
        (drop if marker is not None and size not in marker.args else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.hookimpl(trylast=True)
def pytest_runtest_logstart(nodeid, location):
    # End the line "-v" starts with the test's name: horovodrun prints only whole lines,
    # so the test a rank is running still shows when the launch is killed.
    tr = _terminal()
    if tr is not None and tr.verbosity > 0:
        tr.ensure_newline()


def _terminal():
    return _config.pluginmanager.get_plugin("terminalreporter") if _config else None


def _agreeing():
    if UNDER_TORCHRUN:
        return _dist() is not None and _dist().get_world_size() > 1
    return UNDER_HOROVODRUN and hvd.is_initialized() and hvd.size() > 1


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    # One agreement per test: after the call, or after a setup that did not pass (then
    # there is no call).  Ranks may reach it in different phases; the name matches.
    if not (call.when == "call" or (call.when == "setup" and not report.passed)) or not _agreeing():
        return report
    if report.failed:
        tr = _terminal()
        if tr is not None:
            tr.write_line(f"\nFAILED on rank {_rank()}: {item.nodeid}\n{report.longreprtext}\n")
    try:
        outcomes = _gather_outcome(0 if report.failed else 1, f"pytest.outcome.{item.nodeid}")
    except Exception as exc:   # Horovod itself is broken: nothing after this can run
        item.session.shouldstop = f"the ranks could not agree on {item.nodeid}: {exc}"
        if not report.failed:
            report.outcome = "failed"
            report.longrepr = f"the ranks could not agree on the outcome: {type(exc).__name__}: {exc}"
        return report
    failed = [r for r, ok in enumerate(outcomes) if not ok]
    if failed and not report.failed:
        report.outcome = "failed"
        report.longrepr = f"failed on rank(s) {failed} (passed on rank {_rank()}): see their output"
    return report


def pytest_unconfigure(config):
    if _agreeing() and not ELASTIC:   # (elastic workers come and go; they end on their own)
        try:
            _dist().barrier() if UNDER_TORCHRUN else hvd.barrier()
        except Exception as exc:   # already reported by the test that broke Horovod
            print(f"final barrier: {type(exc).__name__}: {exc}", flush=True)
