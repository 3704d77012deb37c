"""benchmarks/ddp_step_cost.py on the CPU with a tiny ResNet: every configuration runs through
DDP (one Gloo rank) and lands in the table.  Its CUDA run (ResNet-50, NCCL) is
scripts/gpu_session.sh's ``ddp``; the figures are benchmarks/results/gpu/ddp_step_cost_cuda.txt."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "benchmarks.ddp_step_cost", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_every_configuration_lands_in_the_table(tmp_path):
    from benchmarks.ddp_step_cost import CONFIGS
    out = tmp_path / "table.md"
    r = run("--device", "cpu", "--model", "resnet-tiny", "--steps", "2", "--warmup", "1",
            "--batch-size", "4", "--window", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in out.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| config")}
    assert set(rows) == set(CONFIGS)
    assert rows["allreduce"].split("|")[4].strip() == "1.00"
    assert rows["topk100"].split("|")[5].strip() == "100"


@pytest.mark.parametrize("args,message", [(["--configs", "allreduce,nope"], "unknown configuration 'nope'"),
                                          (["--model", "vgg"], "invalid choice")])
def test_bad_arguments_name_the_problem(args, message):
    r = run("--device", "cpu", *args, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]
