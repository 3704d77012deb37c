"""scripts/gpu_check.sh on a machine without a GPU: it must say so, write
its results folder, and (dry run) get through every step without dying."""
import os
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
    assert "NCCL optimizer run" in summary, summary               # skipped, with the reason
    assert "compressor benchmark" in summary or "compressors.py --device cuda" in summary, summary
    assert summary.count("training harness on the GPU") == 4, summary   # ran, and failed without CUDA
    assert "Random-k's draw" in summary and "step cost" in summary, summary
    assert "CUDA is not available" in (tmp_path / "r" / "harness_r101-gravac-dgc.txt").read_text()
    assert (tmp_path / "r" / "env.txt").exists() and f"results: {tmp_path / 'r'}" in out
    assert "skipped" in (tmp_path / "r" / "pytest_cuda.txt").read_text()


def test_compressor_profile_prints_a_table_per_compressor_and_cf(capsys):
    from benchmarks import compressor_profile
    assert compressor_profile.main(["--numel", "50000", "--cfs", "10,100", "--compressors", "topk,dgc",
                                    "--repeats", "1", "--rows", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("## ") == 4 and out.count("Self CPU time total") == 4


def test_sample_order_stats_prints_a_row_per_sample_size(capsys):
    from benchmarks import sample_order_stats
    assert sample_order_stats.main(["--sizes", "4096,20000", "--repeats", "1"]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["4,096", "20,000"]
    assert all(float(v) > 0 for r in rows for v in r[1:4])


def test_launch_cuts_prints_its_three_tables(capsys):
    from benchmarks import launch_cuts
    import horovod_gravac.native as native
    import horovod_gravac.selection.redsync as R
    before = (native._MODE, R._resolves)
    device, timed = torch.device("cpu"), launch_cuts._timer(torch.device("cpu"))
    launch_cuts.redsync_search_paths(device, timed, 1, [70_000])
    launch_cuts.further_vs_direct(device, timed, 1, 70_000)
    out = capsys.readouterr().out
    rows = [ln.split() for ln in out.splitlines() if ln.strip().startswith("70,000")]
    assert [r[1] for r in rows] == ["10", "100", "1000"] and all(float(r[2]) > 0 for r in rows)
    assert sum(ln.startswith(("topk:", "dgc:", "sidco-exp:")) for ln in out.splitlines()) == 3
    assert (native._MODE, R._resolves) == before   # the native switch and the search's branch restored
