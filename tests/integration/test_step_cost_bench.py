"""benchmarks/step_cost.py, each of its four modes end to end at a small size on the CPU:
``launches`` (what the optimizer adds to a step, counted and timed, with the accelerators'
paths forced on the CPU and put back afterwards), ``compressors`` (the per-step table read from
the harness runs it launched), ``ddp`` (every configuration through DDP on one Gloo rank; its
CUDA figures are benchmarks/results/gpu/ddp_step_cost_cuda.txt) and ``network`` (2 ranks on
localhost: the table and CSV it writes; its figures at emulated rates need root and are
benchmarks/results/step_cost/network.md)."""
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("horovod.torch")
import horovod_gravac.encoder as encoder  # noqa: E402
import horovod_gravac.native as native  # noqa: E402
from benchmarks import step_cost  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def run(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "benchmarks.step_cost", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


# ----------------------------------------------------------------------------- launches
def test_launches_counts_per_bucket_work_and_restores_the_paths(capsys, tmp_path):
    mode, reads_back = native.mode(), encoder._reads_back_freely
    out = tmp_path / "launches.txt"
    assert step_cost.main(["launches", "--models", "vgg16", "--width", "0.0625", "--steps", "1", "--rounds", "1",
                           "--runs", "dense,dgc-10", "--top", "3", "--out", str(out)]) == 0
    assert native.mode() == mode and encoder._reads_back_freely is reads_back
    text = capsys.readouterr().out
    assert out.read_text() == text   # --out: what it printed
    rows = {line.split()[0]: line.split() for line in text.splitlines()
            if line.split() and line.split()[0] in ("plain", "dense", "dgc-10")}
    assert set(rows) == {"plain", "dense", "dgc-10"}, text
    assert "accelerator code paths" in text and "41 parameter tensors" in text, text
    launches, views, syncs = (int(v) for v in rows["dense"][1:4])
    assert launches > 0 and syncs == 1, text   # the NaN check's sync
    if hasattr(torch, "_foreach_copy_"):      # (torch 2.0 copies the gradients back one by one)
        assert launches < 41, text            # per bucket, not per parameter
    assert int(rows["dgc-10"][3]) == 2, text          # and DGC's nonzero
    assert float(rows["dense"][4]) > 0, text


# ----------------------------------------------------------------------------- compressors
@pytest.mark.slow
def test_compressors_table_rows_come_from_the_runs(tmp_path):
    out = tmp_path / "table.txt"
    assert step_cost.main(["compressors", "--device", "cpu", "--preset", "cnn1d-digits", "--steps", "6",
                           "--skip", "2", "--runs", "dense,randomk-10", "--out", str(out)]) == 0
    text = out.read_text()
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line and not line.startswith(("#", "run"))}
    assert set(rows) == {"dense", "randomk-10"}, text   # no plain-torch row: a text-free, non-CIFAR preset
    assert rows["dense"][-1] == "1" and rows["randomk-10"][-1] == "10", text   # the CFs each run sent
    assert rows["dense"][2] == "-"                          # no plain-torch row to divide by
    assert float(rows["dense"][3]) == pytest.approx(1.0)   # "x dense" of the dense row itself
    run_dir = re.search(r"logs: (\S+)", text).group(1)
    with open(os.path.join(run_dir, "randomk-10", "steps.jsonl")) as f:
        steps = [json.loads(line) for line in f]
    assert len(steps) == 6
    summary = step_cost.summarize(os.path.join(run_dir, "randomk-10"), 2)
    assert float(rows["randomk-10"][1]) == pytest.approx(summary["step"], abs=0.05)


# ----------------------------------------------------------------------------- ddp
def test_ddp_every_configuration_lands_in_the_table(tmp_path):
    out = tmp_path / "table.md"
    r = run("ddp", "--device", "cpu", "--model", "resnet-tiny", "--steps", "2", "--warmup", "1",
            "--batch-size", "4", "--window", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line for line in out.read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| config")}
    assert set(rows) == set(step_cost.DDP_CONFIGS)
    assert rows["allreduce"].split("|")[4].strip() == "1.00"
    assert rows["topk100"].split("|")[5].strip() == "100"


# ----------------------------------------------------------------------------- network
def test_network_wire_bytes_count_each_collective_once_per_rank():
    entry = {"collectives": [("dense", 1000), ("pair", 50), ("allgather", 10)]}
    # an allreduce of n floats sends 2 (size-1)/size * 4n bytes; payload rows 8 bytes to each peer
    assert step_cost.wire_bytes(entry, 2) == pytest.approx(4000 + 8 * 50 + 8 * 10)
    assert step_cost.wire_bytes(entry, 3) == pytest.approx(2 * 2 / 3 * 4000 + 2 * 8 * 60)


@pytest.mark.parallel
@pytest.mark.slow
def test_network_writes_its_table_and_csv(tmp_path):
    out = tmp_path / "network"
    r = run("network", "--localhost", "--models", "cnn1d", "--rates", "100mbit", "--paths", "dense,static10",
            "--blocks", "1", "--bare", "2", "--timeout", "240", "--out", str(out), timeout=420)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    text = (out.parent / "network.md").read_text()
    assert "Written by `python -m benchmarks.step_cost network --localhost" in text, text
    assert "## cnn1d at 100mbit (localhost: NOT rate-limited)" in text, text
    with open(out.parent / "network.csv") as f:
        rows = {row["path"]: row for row in csv.DictReader(f)}
    assert set(rows) == {"dense", "static10"}
    assert rows["dense"]["transfers"] and float(rows["dense"]["cf"]) == 1.0
    assert float(rows["static10"]["cf"]) == 10.0
    # Top-k 10x sends a tenth of the entries as (value, index) pairs: 0.2 of dense's bytes
    assert float(rows["static10"]["bytes_per_rank"]) == pytest.approx(0.2 * float(rows["dense"]["bytes_per_rank"]),
                                                                      rel=0.05)
    assert float(rows["dense"]["step_ms"]) > 0 and float(rows["dense"]["bare_ms"]) > 0


# ----------------------------------------------------------------------------- the command line
@pytest.mark.parametrize("args,message", [
    (["ddp", "--configs", "allreduce,nope"], "unknown configuration 'nope'"),
    (["ddp", "--model", "vgg"], "invalid choice"),
    (["compressors", "--runs", "dense,nonsense"], "unknown run(s) 'nonsense'"),
    (["compressors", "--steps", "5", "--skip", "5"], "--steps must exceed --skip"),
    (["launches", "--runs", "topk-100"], "unknown run(s) 'topk-100'"),
    (["network", "--paths", "dense,fast"], "unknown path(s) 'fast'"),
    ([], "MODE"),
    (["step_time"], "invalid choice"),
])
def test_bad_arguments_name_the_problem(args, message):
    r = run(*args, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]
