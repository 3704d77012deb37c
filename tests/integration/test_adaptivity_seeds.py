"""The cross-seed table of benchmarks/adaptivity_seeds.py, from hand-made results.csv files."""
import csv

from benchmarks import adaptivity_seeds as S


def _results(path, rows):
    path.mkdir()
    with open(path / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["workload", "rate", "config", "tta_s"])
        w.writeheader()
        for config, tta in rows:
            w.writerow({"workload": "cnn", "rate": "100mbit", "config": config, "tta_s": "" if tta is None else tta})
    return str(path)


def test_table_gives_every_seed_the_median_speedup_and_the_head_to_head(tmp_path):
    d1 = _results(tmp_path / "s1", [("topk-cf10", 20.0), ("a", 10.0), ("b", 20.0)])
    d2 = _results(tmp_path / "s2", [("topk-cf10", 30.0), ("a", None), ("b", 15.0)])
    d3 = _results(tmp_path / "s3", [("topk-cf10", None), ("a", 12.0), ("b", None)])
    data = S.load([d1, d2, d3], ["1", "2", "3"])
    assert data[("cnn", "100mbit")]["a"] == {"1": 10.0, "2": None, "3": 12.0}
    text = S.table(data, ["topk-cf10", "a", "b"], "a", "b")
    row = next(line for line in text.splitlines() if line.startswith("| cnn"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # a: 2.0x (seed 1), a miss (0, seed 2), Top-k 10x missed alone (inf, seed 3): median 2.0x
    assert cells[3] == "10.0 / - / 12.0 (2.00x)"
    # b: 1.0x, 2.0x, both missed (not counted): median 1.5x
    assert cells[4] == "20.0 / 15.0 / - (1.50x)"
    # a at least as fast as b: seed 1 yes, seed 2 no (a missed), seed 3 yes (b missed)
    assert cells[5] == "2 of 3"


def test_speedup_counts_misses():
    assert S.speedup(20.0, 10.0) == 2.0
    assert S.speedup(20.0, None) == 0.0
    assert S.speedup(None, 10.0) == float("inf")
    assert S.speedup(None, None) is None


def test_late_table_gives_the_mean_over_seeds_of_the_last_evaluations_against_dense(tmp_path):
    def results(path, rows):
        path.mkdir()
        with open(path / "results.csv", "w", newline="") as f:
            w = csv.DictWriter(f, ["workload", "rate", "config", "tta_s", "late_vs_dense"])
            w.writeheader()
            for config, late in rows:
                w.writerow({"workload": "cnn", "rate": "100mbit", "config": config, "tta_s": 1.0,
                            "late_vs_dense": "" if late is None else late})
        return str(path)
    d1 = results(tmp_path / "s1", [("a", -1.0), ("b", 0.5)])
    d2 = results(tmp_path / "s2", [("a", -0.5), ("b", None)])
    text = S.late_table(S.load([d1, d2], ["1", "2"], "late_vs_dense"), ["a", "b"])
    row = next(line for line in text.splitlines() if line.startswith("| cnn"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "-1.0 / -0.5 (mean -0.75)" and cells[3] == "+0.5 (mean +0.50)"
    # older results without the column: no late table
    assert S.load([_results(tmp_path / "old", [("a", 3.0)])], ["1"], "late_vs_dense")[("cnn", "100mbit")]["a"] == {"1": None}
