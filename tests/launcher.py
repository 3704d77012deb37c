"""The one way the tests start real Horovod ranks: ``horovodrun`` in its own process
group under a timeout; on timeout the whole group (horovodrun and every rank it started)
is killed, so a hung rank fails its test instead of hanging the suite."""
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]


def horovodrun_path() -> Optional[str]:
    """``horovodrun`` next to this Python (the virtual environment) or on PATH."""
    cand = Path(sys.executable).parent / "horovodrun"
    return str(cand) if cand.exists() else shutil.which("horovodrun")


def horovodrun_cmd(np_: int, argv: Sequence, *, gloo: bool = True) -> List[str]:
    """``horovodrun -np N -H localhost:N [--gloo] argv...``; skips the test when Horovod's
    launcher is not installed."""
    hvdrun = horovodrun_path()
    if hvdrun is None:
        pytest.skip("horovodrun is not installed (run scripts/setup.sh)")
    return ([hvdrun, "-np", str(np_), "-H", f"localhost:{np_}"] + (["--gloo"] if gloo else [])
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
