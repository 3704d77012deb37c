"""scripts/gpu_check.sh on a machine without a GPU: it must say so, write
its results folder, and (dry run) get through every step without dying."""
import os
import re
import subprocess
import tarfile
import sys

import pytest
import torch

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def test_gpu_check_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


SESSION = ROOT / "scripts" / "gpu_session.sh"


def test_gpu_session_script_parses_and_names_what_is_missing(tmp_path):
    subprocess.run(["bash", "-n", str(SESSION)], check=True)
    usage = subprocess.run(["bash", str(SESSION)], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "prepare|run" in usage.stderr
    # run without the carried archive: a clear message naming the command that fetches it,
    # before anything is built
    env = dict(os.environ, GPU_CARRY=str(tmp_path / "carry"), OUT=str(tmp_path / "out"), PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(SESSION), "run"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "horovod-0.28.1.tar.gz" in proc.stderr and "gpu_session.sh prepare" in proc.stderr
    # what ran is packed into one archive (the device tool sends back only a few files)
    with tarfile.open(tmp_path / "out" / "gpu_check.tgz") as packed:
        names = packed.getnames()
    assert "gpu_check/git.txt" in names and "gpu_check/build_ext.log" not in names, names


@pytest.mark.parallel
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: run scripts/gpu_check.sh itself")
def test_gpu_check_without_a_gpu_says_so_and_dry_runs_every_step(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, RESULTS=str(tmp_path / "r"), GPU_CHECK_DRY_RUN="1",
               GPU_CHECK_TIMEOUT="600")
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    summary = (tmp_path / "r" / "summary.txt").read_text()
    assert "torch.cuda.is_available() is False" in summary, summary
    assert "PASS  pytest -m cuda" in summary, summary            # every CUDA test skipped, none failed
    # Step 3 follows the Horovod found (the summary's "Horovod NCCL=" note): without NCCL it is
    # skipped, with the reason; with NCCL (as in the Docker image) it runs, and fails without a GPU.
    if "Horovod NCCL=1" in summary:
        assert re.search(r"^(PASS|FAIL)  horovodrun -np \d+ NCCL optimizer, every compressor", summary, re.M), summary
    else:
        assert "SKIP  NCCL optimizer run" in summary, summary
    assert "compressor benchmark" in summary or "compressors.py --device cuda" in summary, summary
    assert summary.count("training harness on the GPU") == 4, summary   # ran, and failed without CUDA
    assert "step launches" in summary and "step cost" in summary, summary
    assert "CUDA is not available" in (tmp_path / "r" / "harness_r101-gravac-dgc.txt").read_text()
    assert (tmp_path / "r" / "env.txt").exists() and f"results: {tmp_path / 'r'}" in out
    assert "skipped" in (tmp_path / "r" / "pytest_cuda.txt").read_text()
