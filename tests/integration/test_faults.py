"""Dead, stalled and frozen ranks, on real ranks: rank 1 of a 2-rank job sleeps, freezes
(SIGSTOP) or exits at step 3 (tests/parallel/fault_scenario.py), and rank 0 must fail with a
``CollectiveTimeoutError`` naming the collective within the timeout; then the whole job must
end within a bound, under horovodrun's Gloo and MPI launchers (docs/reliability.md)."""
import re
import time

import pytest

from horovod_gravac import comm

from conftest import run_ranks
from launcher import PARALLEL

# Wall-clock bounds: after the parallel pass, two scenarios at a time at most (each mostly
# waits for its timeout), never beside a loaded machine.
pytestmark = [pytest.mark.parallel, pytest.mark.serial]
FAULT_SCENARIO = PARALLEL / "fault_scenario.py"


FAULT_TIMEOUT = 4.0
SLACK = 6.0            # a loaded 2-core machine: scheduling noise on top of the bound
FAULTS = {
    # kind: (what rank 1 does, the collective rank 0 must name, or None when Horovod itself reports)
    "bucket": "gravac.bucket.",
    # The step's statistics ride in the last bucket's collective: that is what rank 0 names.
    "stats": "gravac.bucket.",
    "decision": "gravac.decision",
    "startup": "gravac.consistency",
    "exit": None,
    # Frozen between steps: rank 0 waits either in the state broadcast of a window check
    # (window 2) or in the next bucket, depending on where rank 1 stopped.
    "freeze": ("gravac.bucket.", "gravac.decision"),
}


def _failed_after(proc):
    lines = [line for line in proc.stdout.splitlines() if "[0]<stdout>:FAILED_AFTER" in line]
    assert lines, f"rank 0 did not report an error:\n{proc.stdout[-4000:]}"
    _, seconds, error = lines[0].split("FAILED_AFTER", 1)[1].split(" ", 2)
    return float(seconds), error


@pytest.mark.parametrize("kind", list(FAULTS))
def test_dead_or_stalled_rank_fails_with_a_clear_error(kind):
    """Rank 1 stalls (sleeps), freezes (SIGSTOP) or exits at step 3; rank 0 must fail
    with an error naming the collective within the timeout, and the job must end."""
    t0 = time.monotonic()
    # freeze: after the error the exit guard (comm.arm_exit_guard) ends rank 0 within
    # $HOROVOD_GRAVAC_EXIT_GRACE (10 s); horovodrun then takes up to 10 s to kill rank 1.
    proc = run_ranks(2, FAULT_SCENARIO, kind, FAULT_TIMEOUT, timeout=150 if kind == "freeze" else 90)
    wall = time.monotonic() - t0
    assert proc.returncode != 0, proc.stdout[-4000:]
    seconds, error = _failed_after(proc)
    collective = FAULTS[kind]
    if collective is None:   # the peer's socket closed: Horovod reports at once
        assert seconds <= FAULT_TIMEOUT + SLACK and \
            ("CollectiveTimeoutError" in error or "HorovodInternalError" in error), error
    else:
        names = collective if isinstance(collective, tuple) else (collective,)
        assert error.startswith("CollectiveTimeoutError") and any(f"'{c}" in error for c in names), error
        assert FAULT_TIMEOUT <= seconds <= FAULT_TIMEOUT + SLACK, (seconds, error)
    print(f"{kind}: rank 0 failed after {seconds:.2f} s ({error[:60]}...), job ended after {wall:.1f} s")


@pytest.mark.parametrize("kind", ["exchange", "exchange_exit"])
def test_a_rank_that_dies_mid_exchange_gives_the_bounded_error(kind):
    """3 ranks, the sparse allreduce: rank 1 stalls (or exits) after its alltoall went out and
    before its allgather; rank 0 must fail as with the other transfers: a
    ``CollectiveTimeoutError`` naming the exchange's second collective within the timeout
    (or, when the peer's socket closes, Horovod's error at once)."""
    proc = run_ranks(3, FAULT_SCENARIO, kind, FAULT_TIMEOUT, timeout=120)
    assert proc.returncode != 0, proc.stdout[-4000:]
    seconds, error = _failed_after(proc)
    if kind == "exchange":
        assert error.startswith("CollectiveTimeoutError") and ".gather'" in error, error
        assert FAULT_TIMEOUT <= seconds <= FAULT_TIMEOUT + SLACK, (seconds, error)
    else:
        assert seconds <= FAULT_TIMEOUT + SLACK and \
            ("CollectiveTimeoutError" in error or "HorovodInternalError" in error), error
    print(f"{kind}: rank 0 failed after {seconds:.2f} s ({error[:80]}...)")


def test_timeout_from_environment_variable():
    proc = run_ranks(2, FAULT_SCENARIO, "bucket", "unused", timeout=90,
                     env={comm.TIMEOUT_ENV: "3"})
    seconds, error = _failed_after(proc)
    assert error.startswith("CollectiveTimeoutError") and "timeout 3 s" in error, error
    assert 3.0 <= seconds <= 3.0 + SLACK


# ---------------------------------------------------------------- the job ends
EXIT_GRACE = 3.0        # $HOROVOD_GRAVAC_EXIT_GRACE for these runs
# How long the launcher takes to kill the frozen peer once rank 0 has exited: horovodrun's
# Gloo launcher sends SIGTERM, waits 5 s, kills, then waits up to 5 s more for the rank's
# shell (GRACEFUL_TERMINATION_TIME_S in horovod/runner/common/util/safe_shell_exec.py);
# mpirun aborts the job at once.
LAUNCHER_KILL_S = {"gloo": 10.0, "mpi": 0.0}
EXIT_SLACK = 6.0        # scheduling noise on 2 busy cores
_RANK0 = re.compile(r"\[(\d+,)?0\]<std")   # Gloo: [0]<stdout>, Open MPI: [1,0]<stdout>


def _launcher_cmd(launcher, script, *args):
    import os
    import sys
    from launcher import horovodrun_launcher
    cmd = horovodrun_launcher() + ["-np", "2", "-H", "localhost:2"]   # skips without horovodrun
    if launcher == "gloo":
        cmd.append("--gloo")
    else:
        import shutil
        import horovod.torch as hvd
        if not hvd.mpi_built() or shutil.which("mpirun") is None:
            pytest.skip("Horovod was built without MPI, or mpirun is missing")
        cmd.append("--mpi")
        if os.geteuid() == 0:
            cmd.append("--mpi-args=--allow-run-as-root --oversubscribe")
    return cmd + [sys.executable, str(script), *map(str, args)]


def _run_timed(cmd, env, timeout, after_error):
    """Run ``cmd`` in its own process group; return (rc, output, seconds from the first
    line in which rank 0 reports its error to the end of the job, or None if the error did
    not come within ``timeout`` s or the job did not end ``after_error`` s after it)."""
    import os
    import signal
    import subprocess
    import threading
    from conftest import ROOT
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                    PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, start_new_session=True)
    lines, error_at = [], []

    def read():
        for line in proc.stdout:
            lines.append(line)
            if not error_at and "FAILED_AFTER" in line and _RANK0.search(line):
                error_at.append(time.monotonic())
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    start, ended = time.monotonic(), None
    while True:   # wait up to `timeout` for the error, then up to `after_error` for the end
        try:
            proc.wait(timeout=0.2)
            ended = time.monotonic()
            break
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if (error_at and now - error_at[0] > after_error) or (not error_at and now - start > timeout):
                os.killpg(proc.pid, signal.SIGKILL)   # horovodrun, mpirun and every rank
                os.killpg(proc.pid, signal.SIGCONT)
                proc.wait()
                break
    reader.join(10)
    after = None if ended is None or not error_at else ended - error_at[0]
    return proc.returncode, "".join(lines), after, error_at


@pytest.mark.parametrize("launcher", ["gloo", "mpi"])
def test_frozen_peer_job_ends_within_a_bound(launcher):
    """Rank 1 freezes (SIGSTOP) at step 3.  Rank 0 raises CollectiveTimeoutError after the
    timeout; then the whole job must end within $HOROVOD_GRAVAC_EXIT_GRACE plus the
    launcher's reaction.  Before the exit guard, Horovod's shutdown at interpreter exit
    blocked for ever under mpirun (the job was still running 175 s later) and for Gloo's
    30 s receive timeout under Gloo."""
    cmd = _launcher_cmd(launcher, FAULT_SCENARIO, "freeze", FAULT_TIMEOUT)
    rc, out, after, error_at = _run_timed(cmd, {comm.EXIT_GRACE_ENV: str(EXIT_GRACE)}, timeout=180,
                                          after_error=60)
    assert error_at, f"rank 0 reported no error:\n{out[-4000:]}"
    seconds, error = next(_failed_after_lines(out))
    assert error.startswith("CollectiveTimeoutError") and f"timeout {FAULT_TIMEOUT:g} s" in error, error
    # No lower bound here: rank 0 may already have been waiting, in the overlapped decision
    # broadcast of the step before, when its step timer started (3.99 s has been seen).
    assert seconds <= FAULT_TIMEOUT + SLACK, (seconds, error)
    assert after is not None, f"{launcher}: the job was still running 60 s after rank 0's error\n{out[-4000:]}"
    assert rc != 0, out[-4000:]
    bound = EXIT_GRACE + LAUNCHER_KILL_S[launcher] + EXIT_SLACK
    assert after <= bound, \
        f"{launcher}: the job ended {after:.1f} s after rank 0's error (bound {bound} s)\n{out[-4000:]}"
    print(f"{launcher}: rank 0 failed after {seconds:.2f} s; the job ended {after:.1f} s after that")


def _failed_after_lines(out):
    for line in out.splitlines():
        if _RANK0.search(line) and "FAILED_AFTER" in line:
            _, seconds, error = line.split("FAILED_AFTER", 1)[1].split(" ", 2)
            yield float(seconds), error
