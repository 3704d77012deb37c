"""benchmarks/compressors.py's size sweep, benchmarks/sparse_buckets.py and
benchmarks/quality_ladder.py on the CPU: they run and print every row, within their targets."""
import csv
import math
import sys


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


def test_benchmark_sweep_reports_every_size_cf_and_compressor(tmp_path):
    from benchmarks import compressors as bench

    out = tmp_path / "sweep"
    stdout = sys.stdout
    rc = bench.main(["--sweep-only", "--sizes", "20000,70000", "--cfs", "10,100", "--sweep-repeats", "1",
                     "--compressors", "topk,dgc,redsync,sidco-exp", "--out", str(out)])
    assert sys.stdout is stdout and rc == 0
    rows = list(csv.DictReader(open(str(out) + ".csv")))
    sweep = [r for r in rows if r["table"] == "sweep"]
    assert {(int(r["numel"]), float(r["cf"]), r["compressor"]) for r in sweep} == {
        (n, cf, c) for n in (20000, 70000) for cf in (10.0, 100.0)
        for c in ("topk", "topk-again", "dgc", "redsync", "sidco-exp")}
    for r in sweep:
        if r["compressor"] == "topk":
            assert float(r["compress_per_topk"]) == 1.0 and float(r["cd_per_topk"]) == 1.0
        if r["compressor"] == "topk-again":   # the noise control: timed, never judged
            assert r["compress_ok"] == "" and float(r["compress_per_topk"]) > 0
        assert math.isclose(float(r["compress_per_pass"]), float(r["compress_ms"]) / float(r["stream_ms"]))
    multi = [r for r in rows if r["table"] == "sweep_multilevel"]
    assert len(multi) == 2 * 4
    text = open(str(out) + ".txt").read()
    assert "Table 0: size sweep" in text and "target(s) failed" in text and "# noise control: " in text
    # The two tables come from the same rows: largest size first, one cell per CF.
    table = text[text.index("Compress alone:"):]
    lines = [line for line in table.splitlines() if line.startswith("| 70,000") or line.startswith("| 20,000")]
    assert len(lines) == 4 and lines[0].startswith("| 70,000")
    dgc_alone = next(r for r in sweep if r["compressor"] == "dgc" and r["numel"] == "70000" and r["cf"] == "10.0")
    assert f"{float(dgc_alone['compress_per_topk']):.2f} ({float(dgc_alone['compress_per_pass']):.2f})" in lines[0]
