"""Shared by tests/unit and tests/integration: launching real Horovod ranks under a timeout
(see launcher.py), the CPU paths of the sparsifiers, and the markers of pyproject.toml."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from horovod_gravac import native
from launcher import ROOT, horovodrun_cmd, horovodrun_path, run_with_timeout  # noqa: F401

# tests/parallel holds the multi-rank tests: the ranks run them under horovodrun, launched
# by the tests here (launcher.run_parallel_tests); a plain pytest run does not collect them.
collect_ignore = ["parallel"]


def run_ranks(np_, script, *args, timeout=240, env=None):
    """Run ``script`` on ``np_`` local ranks with Gloo; a hung or failed rank fails the test."""
    cmd = horovodrun_cmd(np_, [sys.executable, script, *args])
    rc, out = run_with_timeout(cmd, timeout, env=env)
    if rc is None:
        pytest.fail(f"{np_}-rank run of {Path(script).name} {' '.join(map(str, args))} timed out "
                    f"after {timeout}s (a rank hung).\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, rc, out, "")


# The CPU paths of the sparsifiers: the native kernels with AVX-512 ("auto", where the CPU
# has it), with AVX2 at most ("avx2": what a CPU without AVX-512 runs), without SIMD
# ("portable"), and NumPy/torch alone ("off"), each that runs different code here.  All must agree.
CPU_PATHS = native.distinct_choices()


@pytest.fixture(params=CPU_PATHS)
def cpu_path(request):
    """Run a test once per CPU code path (see ``horovod_gravac.native``)."""
    previous = native.use(request.param)
    yield request.param
    native.use(previous)


# -- markers (declared in pyproject.toml) -----------------------------------
CUDA = torch.cuda.is_available()
INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(config, items):
    skip = None if CUDA else pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False here")
    for item in items:
        if INTEGRATION in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)
        if skip is not None and "cuda" in item.keywords:
            item.add_marker(skip)
