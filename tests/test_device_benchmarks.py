"""benchmarks/sparse_buckets.py and benchmarks/quality_ladder.py on the CPU: they run and print
every row, within their targets."""


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
