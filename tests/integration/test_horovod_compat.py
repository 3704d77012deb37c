"""``horovod_gravac.DistributedOptimizer`` as a drop-in for ``hvd.DistributedOptimizer``.

The tests are in parallel/test_compat_*.py, and Horovod's own DistributedOptimizer cases
(its test/parallel/test_torch.py, written again) in parallel/test_horovod_cases.py.  They
run on real Horovod ranks: one horovodrun
launch per group below, each rank running pytest on the group's files; a launch passes
only if every rank's pytest passed.  Every launch has a timeout that kills all its ranks,
Horovod's stall check shuts a stalled collective down before that, and the optimizer's
own ``timeout_s`` bounds each of its collectives.

The package under test is the one on ``$HOROVOD_GRAVAC_TEST_ROOT`` if set (a checkout
directory), else this checkout; e.g. to test another checkout's package with these tests:
``HOROVOD_GRAVAC_TEST_ROOT=/path/to/checkout python -m pytest tests/integration/test_horovod_compat.py``.
"""
import os
import re
import sys
import time
from pathlib import Path

import pytest
import torch

from launcher import (ROOT, check_parallel_tests, horovodrun_cmd, launch_parallel_tests, rank_summaries,
                      run_with_timeout)

pytestmark = [pytest.mark.parallel, pytest.mark.slow]

IMPL_ROOT = Path(os.environ.get("HOROVOD_GRAVAC_TEST_ROOT", str(ROOT))).resolve()


def _horovod_env(timeout, mpi, env):
    # Horovod itself aborts a stalled collective instead of waiting forever
    full_env = dict(HOROVOD_STALL_CHECK_TIME_SECONDS="30",
                    HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=str(max(60, timeout - 30)))
    if mpi:
        full_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        OMPI_MCA_btl_vader_single_copy_mechanism="none")
    full_env.update(env or {})
    return full_env


def launch(np_, script, args, timeout, mpi=False, env=None):
    """horovodrun ``script args`` on ``np_`` local ranks (test_horovod_examples.py's scripts);
    returns (returncode or None on timeout, output)."""
    cmd = horovodrun_cmd(np_, [sys.executable, script, *args], gloo=not mpi)
    start = time.monotonic()
    rc, out = run_with_timeout(cmd, timeout, env=_horovod_env(timeout, mpi, env), pythonpath=IMPL_ROOT)
    if rc is None:
        out += f"\n*** TIMEOUT after {timeout}s: a rank hung; every rank was killed ***\n"
    out += f"\n[launch took {time.monotonic() - start:.1f}s]\n"
    return rc, out


def launch_tests(np_, tests, timeout, mpi=False, env=None):
    """pytest on ``np_`` local ranks, ``tests`` from tests/parallel; returns (returncode or
    None on timeout, output)."""
    return launch_parallel_tests(np_, *tests, timeout=timeout, env=_horovod_env(timeout, mpi, env),
                                 gloo=not mpi, pythonpath=IMPL_ROOT)


def run(np_, tests, timeout, **kw):
    """``launch_tests``; fails unless every rank's pytest passed."""
    rc, out = launch_tests(np_, tests, timeout, **kw)
    check_parallel_tests(f"{np_}-rank pytest of {' '.join(tests)}", rc, out, timeout, range(np_))


# group -> (ranks, test files, timeout seconds).  The np2 groups are separate launches so
# that a rank that dies takes only its group down; the tests marked ``sizes(2, 3)`` in
# their files also run in the 3-rank launch.
GROUPS = {
    "np2-api-dense-sparse-compressed": (2, ["test_compat_api.py"], 240),
    "np2-amp": (2, ["test_compat_amp.py"], 150),
    # its join tests last: if Horovod shuts down on a join failure, the tests after it cannot run
    "np2-hang-prone": (2, ["test_compat_collectives.py"], 240),
    # alone: it may leave state behind
    "np2-stock": (2, ["test_compat_stock.py"], 120),
    "np3": (3, ["test_compat_api.py", "test_compat_collectives.py"], 300),
    # Horovod's own DistributedOptimizer cases; add_process_set needs dynamic process sets
    "np2-horovod-cases": (2, ["test_horovod_cases.py"], 240, {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}),
    "np3-horovod-cases": (3, ["test_horovod_cases.py"], 240, {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"}),
}


@pytest.mark.parametrize("group", list(GROUPS))
def test_compat(group):
    if group == "np2-amp" and not hasattr(torch.amp, "GradScaler"):
        pytest.skip("torch < 2.3: no torch.amp.GradScaler (none on the CPU)")
    ranks, files, timeout, *env = GROUPS[group]
    run(ranks, files, timeout, env=env[0] if env else None)


def test_compat_on_torch20s_hook_path():
    """torch 2.0, the last torch Horovod 0.28.1 was built for, has no
    ``register_post_accumulate_grad_hook``: the optimizer then hooks each parameter's
    gradient accumulator node, as Horovod does.  The same side-by-side tests against
    ``hvd.DistributedOptimizer`` on that path, forced on this torch."""
    run(2, ["test_compat_api.py"], 240, env={"HOROVOD_GRAVAC_TEST_NODE_HOOKS": "1"})


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_process_set_dense_matches_hvd_and_excludes_rank2(mode):
    env = {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"} if mode == "dynamic" else {}
    run(3, ["test_compat_process_set.py"], 180, env=env)


def test_no_hang_user_collectives_under_mpi():
    tests = ["test_compat_collectives.py::test_no_hang_user_collectives"]
    rc, out = launch_tests(2, tests, 180, mpi=True)
    if rc != 0 and re.search(r"MPI (is )?not (built|available|supported)|mpirun.*not found|"
                             r"requires.*MPI|Horovod was not compiled with MPI", out, re.I) \
            and not rank_summaries(out):
        pytest.skip(f"MPI not usable here: {out[-400:]}")
    check_parallel_tests(f"2-rank pytest under MPI of {tests[0]}", rc, out, 180, range(2))
