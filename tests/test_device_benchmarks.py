"""benchmarks/device_primitives.py and benchmarks/sweep_compare.py on the CPU: they run, print
every row, and the comparison reads the committed H100 sweeps back into the figures quoted."""
import os

import torch

from benchmarks import device_primitives, sweep_compare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CALL20 = os.path.join(ROOT, "benchmarks", "results", "gpu_h100", "call20_1ded337")


def test_device_primitives_prints_each_primitive_and_a_per_operation_trace(capsys):
    assert device_primitives.main(["--sizes", "65536", "--repeats", "2", "--trace", "sidco-exp:100:65536"]) == 0
    out = capsys.readouterr().out
    for label in ("nonzero (", "nonzero_static (size", "sort", "copy 32768 values to the host"):
        assert label in out or (label == "nonzero_static (size" and not hasattr(torch, "nonzero_static")), label
    trace = out[out.index("## sidco-exp CF 100"):]
    ops = [ln.split() for ln in trace.splitlines()[1:] if ln.startswith("  ") and not ln.strip().startswith("by")]
    assert ops and all(float(row[-1]) >= 0 for row in ops)
    assert "by operation:" in trace


def test_device_primitives_traces_compress_further_when_given_a_factor(capsys):
    assert device_primitives.main(["--sizes", "", "--repeats", "2", "--trace", "dgc:10:65536:4"]) == 0
    out = capsys.readouterr().out
    assert "## dgc CF 10, 65,536 entries on cpu, compress_further x4 of its payload: one call" in out


def test_sweep_compare_reads_the_committed_h100_sweeps(capsys):
    new = ",".join(os.path.join(CALL20, f"sweep_new_{i}.csv") for i in (1, 2))
    old = ",".join(os.path.join(CALL20, f"sweep_old_{i}.csv") for i in (1, 2))
    assert sweep_compare.main(["--new", new, "--old", old]) == 0
    out = capsys.readouterr().out
    assert out == open(os.path.join(CALL20, "compare.txt")).read()
    by_cf = out[out.index("# by CF"):]
    redsync = next(ln for ln in by_cf.splitlines() if ln.strip().startswith("redsync"))
    assert "1M-6.5M CF 100: 0.88-1.10 | 1.27-1.63" in redsync


def test_sparse_buckets_benchmark_prints_every_compressor_without_fallbacks(capsys):
    from benchmarks import sparse_buckets
    assert sparse_buckets.main(["--numel", "65000", "--width", "65", "--touched", "0.05", "--cfs", "10",
                                "--repeats", "1"]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.startswith("    0.05")]
    assert [r[2] for r in rows] == ["topk", "topk-nz", "dgc", "redsync", "sidco"]
    # Top-k fills k with zeros; the others (Top-k with send_zeros=False too) send the nonzeros alone
    assert all(r[-1] in ("0", "-") for r in rows) and float(rows[0][5]) == 1.0
    assert all(float(r[5]) == 0.5 for r in rows[1:])


def test_quality_ladder_benchmark_prints_every_threshold_compressor_within_target(capsys):
    from benchmarks import quality_ladder
    assert quality_ladder.main(["--inputs", "laplace", "--sizes", "65536", "--cfs", "10,50,1000",
                                "--steps", "2", "--bases", "10", "--factors", "4,100"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [ln.split() for ln in out if ln.startswith("laplace")]
    names = ["dgc", "redsync", "sidco-exp", "sidco-gpareto", "sidco-gamma"]
    assert [r[2] for r in rows] == names + [f"{name}@10x" for name in names]
    assert all(len(r) == (6 if "@" not in r[2] else 5) for r in rows), rows
    assert not any(c.endswith("!") for r in rows for c in r[3:]), rows
    assert out[-1] == "# 0 cell(s) outside [0.8, 1.25]"
