"""Shared helpers: launching real Horovod ranks under a timeout."""
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from horovod_gravac import native

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def horovodrun_path():
    cand = BIN / "horovodrun"
    return str(cand) if cand.exists() else shutil.which("horovodrun")


def run_ranks(np_, script, *args, timeout=240, env=None):
    """Run ``script`` on ``np_`` local ranks with Gloo; a hung or failed rank fails the test."""
    hvdrun = horovodrun_path()
    if hvdrun is None:
        pytest.skip("horovodrun is not installed (run scripts/setup.sh)")
    cmd = [hvdrun, "-np", str(np_), "-H", f"localhost:{np_}", "--gloo",
           sys.executable, str(script), *map(str, args)]
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                    PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)   # horovodrun and every rank it started
        out, _ = proc.communicate()
        pytest.fail(f"{np_}-rank run of {Path(script).name} {' '.join(map(str, args))} timed out "
                    f"after {timeout}s (a rank hung).\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


# The CPU paths of the sparsifiers: the native kernels with AVX-512 ("auto", where the CPU
# has it), without SIMD ("portable"), and NumPy/torch alone ("off").  All must agree.
CPU_PATHS = ["auto", "portable", "off"] if native._LIB is not None else ["off"]


@pytest.fixture(params=CPU_PATHS)
def cpu_path(request):
    """Run a test once per CPU code path (see ``horovod_gravac.native``)."""
    previous = native.use(request.param)
    yield request.param
    native.use(previous)


# -- the ``cuda`` marker ----------------------------------------------------
CUDA = torch.cuda.is_available()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cuda: needs a CUDA GPU (torch.cuda.is_available()); skipped elsewhere. "
                   "Run them alone with `pytest -m cuda`, or everything with scripts/gpu_check.sh.")


def pytest_collection_modifyitems(config, items):
    if CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False here")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
