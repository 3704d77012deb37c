"""The one way the tests start real Horovod ranks: ``horovodrun`` in its own process
group under a timeout; on timeout the whole group (horovodrun and every rank it started)
is killed, so a hung rank fails its test instead of hanging the suite.

``run_parallel_tests`` runs pytest files of tests/parallel on every rank that way and
fails the calling test unless every rank's pytest passed."""
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARALLEL = ROOT / "tests" / "parallel"
HVDRUN = ROOT / "tests" / "hvdrun.py"
HVDRUN_BUILT_ENV = "HOROVOD_GRAVAC_TEST_BUILT"   # read by hvdrun.py


def horovodrun_path() -> Optional[str]:
    """``horovodrun`` next to this Python (the virtual environment) or on PATH."""
    cand = Path(sys.executable).parent / "horovodrun"
    return str(cand) if cand.exists() else shutil.which("horovodrun")


_BUILT: Optional[str] = None


def horovodrun_launcher() -> List[str]:
    """The command that runs horovodrun: ``python tests/hvdrun.py``, horovodrun's own command
    line with its Gloo/MPI build probe answered once per pytest process instead of by a
    forked torch import at every launch (see hvdrun.py).  Skips the test when Horovod's
    launcher is not installed."""
    global _BUILT
    if horovodrun_path() is None:
        pytest.skip("horovodrun is not installed (run scripts/setup.sh)")
    if _BUILT is None:
        from horovod.common.util import gloo_built, mpi_built   # what horovodrun itself asks
        _BUILT = f"gloo={int(bool(gloo_built()))},mpi={int(bool(mpi_built()))}"
        os.environ[HVDRUN_BUILT_ENV] = _BUILT   # every launch from this process inherits it
    return [sys.executable, str(HVDRUN)]


def bracketed_runs(out: str, count: int) -> List[Optional[str]]:
    """Rank 0's output of each of ``count`` runs made in one launch, each bracketed by
    ``RUN_BEGIN k`` and ``RUN_END k`` lines (tests/integration/examples/_runs.py and
    test_train_e2e.py print them); None for a run that did not start or did not end."""
    segments = []
    for k in range(count):
        begin, end = re.search(rf"RUN_BEGIN {k}\n", out), re.search(rf"RUN_END {k}\n", out)
        segments.append(out[begin.end():end.start()] if begin and end else None)
    return segments


def horovodrun_cmd(np_: int, argv: Sequence, *, gloo: bool = True) -> List[str]:
    """``horovodrun -np N -H localhost:N [--gloo] argv...`` (through ``horovodrun_launcher``);
    skips the test when Horovod's launcher is not installed."""
    return (horovodrun_launcher() + ["-np", str(np_), "-H", f"localhost:{np_}"] + (["--gloo"] if gloo else [])
            + [str(a) for a in argv])


def run_with_timeout(cmd: Sequence[str], timeout: float, env: Optional[dict] = None,
                     cwd=None, pythonpath=ROOT) -> Tuple[Optional[int], str]:
    """Run ``cmd`` (a horovodrun command line) in its own process group, stdout and stderr
    together, with ``pythonpath`` first on PYTHONPATH, unbuffered output and one OpenMP
    thread per rank (``env`` overrides any of these). Returns (exit status, output), or
    (None, output so far) after killing the group when ``timeout`` seconds pass."""
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                    PYTHONPATH=str(pythonpath) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, start_new_session=True,
                            cwd=None if cwd is None else str(cwd))
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # horovodrun and every rank it started
        out, _ = proc.communicate()
        return None, out
    return proc.returncode, out


# pytest on every rank: a line per test, short tracebacks, failure messages not cut short
# (-vv), no colours (mpirun gives ranks a terminal), no cache written by N ranks at once,
# never a plugin that reorders tests (each rank must run the same collectives), and no
# hypothesis plugin (seconds of import per rank, for no test there).
PYTEST_ARGS = ["-m", "pytest", "-vv", "--tb=short", "-ra", "--color=no", "-p", "no:cacheprovider",
               "-p", "no:randomly", "-p", "no:hypothesispytest"]
# horovodrun's prefix of each line: "[0]<stdout>:" (Gloo), "[1,0]<stdout>:" (Open MPI, where
# the next rank's prefix may follow on the same line)
# (torchrun --tee 3: "[default0]:")
_PREFIX = re.compile(r"\[(?:\d+,)?(\d+)\]<std(?:out|err)>:|\[default(\d+)\]:")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)\b")
_SUMMARY = re.compile(r"^=* ?(?:\d+ \w+(?:, )?)+.* in [\d.]+s")   # "=== 2 passed, 1 deselected in 3.1s ==="
_NODE = re.compile(r"^\S+\.py::\S+")   # "test_x.py::test_y PASSED" (-v, relative to tests/parallel)


def pytest_argv(*tests) -> List[str]:
    """``python -m pytest ... tests``: the command each rank runs (paths relative to
    tests/parallel, or node ids such as ``test_x.py::test_y``)."""
    return [sys.executable, *PYTEST_ARGS, *[str(PARALLEL / t) for t in tests]]


def rank_lines(out: str) -> Iterator[Tuple[int, str]]:
    """(rank, text) for every line a rank printed under horovodrun."""
    for line in out.splitlines():
        parts = _PREFIX.split(_ANSI.sub("", line))   # [before, rank, torchrun's rank, text, ...]
        for hvd_rank, torch_rank, text in zip(parts[1::3], parts[2::3], parts[3::3]):
            yield int(hvd_rank if hvd_rank is not None else torch_rank), text.rsplit("\r", 1)[-1]


def rank_summaries(out: str) -> Dict[int, Dict[str, int]]:
    """Per rank, the counts of its pytest summary line: {"passed": n, "failed": m, ...}."""
    found = {}
    for rank, text in rank_lines(out):
        if _SUMMARY.match(text.strip()):
            found[rank] = {k.rstrip("s") if k.startswith("error") else k: int(n)
                           for n, k in _COUNTS.findall(text)}
    return found


def _failure_lines(out: str) -> List[str]:
    return [f"[{rank}] {text}" for rank, text in rank_lines(out) if text.startswith(("FAILED ", "ERROR "))]


def _running(out: str) -> Dict[int, str]:
    """Per rank, the last test pytest started and did not finish (``-v`` prints the node
    id first, the outcome when the test ends)."""
    last = {}
    for rank, text in rank_lines(out):
        if _NODE.match(text):
            last[rank] = None if re.search(r" (PASSED|FAILED|ERROR|SKIPPED)\b", text) else text.strip()
    return {r: t for r, t in last.items() if t}


def torchrun_cmd(np_: int) -> List[str]:
    """``torchrun --nproc_per_node N --tee 3`` on one machine (a free port each launch; every
    line prefixed by its rank), for the DDP tests; skips when torchrun is not installed."""
    cand = Path(sys.executable).parent / "torchrun"
    run = str(cand) if cand.exists() else shutil.which("torchrun")
    if run is None:
        pytest.skip("torchrun is not installed")
    return [run, "--standalone", "--nproc_per_node", str(np_), "--tee", "3", "--no-python"]


def launch_parallel_tests(np_: int, *tests, timeout: float, env: Optional[dict] = None,
                          gloo: bool = True, launcher: Optional[Sequence[str]] = None,
                          pythonpath=ROOT) -> Tuple[Optional[int], str]:
    """Run the pytest files (or node ids) ``tests`` of tests/parallel on ``np_`` local ranks:
    ``horovodrun -np N -H localhost:N [--gloo] python -m pytest ...``, or ``launcher`` (a
    horovodrun command line) instead.  Returns ``run_with_timeout``'s (exit status, output)."""
    cmd = (list(launcher) if launcher is not None else horovodrun_cmd(np_, [], gloo=gloo)) + pytest_argv(*tests)
    # The ranks get only these options: a -x or a random order from outside would make
    # their collectives diverge.
    return run_with_timeout(cmd, timeout, env=dict(PYTEST_ADDOPTS="", **(env or {})),
                            cwd=PARALLEL, pythonpath=pythonpath)


def check_parallel_tests(what: str, rc: Optional[int], out: str, timeout: float,
                         ranks: Sequence[int]) -> str:
    """Fail the calling test, with the failed tests of each rank and the output's tail,
    unless horovodrun exited 0 in time and every rank in ``ranks`` printed a pytest summary
    with a passed test and no failure.  Returns the output."""
    failures = "\n".join(_failure_lines(out))
    if rc is None:
        running = "\n".join(f"[{r}] {t}" for r, t in sorted(_running(out).items()))
        pytest.fail(f"{what} timed out after {timeout}s (a rank hung); still running:\n{running}\n"
                    f"{failures}\n--- output tail ---\n{out[-8000:]}", pytrace=False)
    summaries = rank_summaries(out)
    bad = [r for r in ranks if r not in summaries or not summaries[r].get("passed")
           or summaries[r].get("failed") or summaries[r].get("error")]
    if rc != 0 or bad:
        pytest.fail(f"{what}: exit status {rc}; ranks without a clean pytest summary: {bad}\n"
                    f"{failures}\n--- output tail ---\n{out[-8000:]}", pytrace=False)
    print(f"{what}: " + "; ".join(f"rank {r}: {summaries[r]}" for r in ranks))
    return out


def run_parallel_tests(np_: int, *tests, timeout: float, **kw) -> str:
    """``launch_parallel_tests``, then ``check_parallel_tests`` for every rank: the one call
    a test needs to run multi-rank tests.  Returns the output."""
    rc, out = launch_parallel_tests(np_, *tests, timeout=timeout, **kw)
    return check_parallel_tests(f"{np_}-rank pytest of {' '.join(map(str, tests))}", rc, out, timeout,
                                range(np_))
