"""Two versions of the compressors side by side, from size sweeps run in one session.

    python -m benchmarks.sweep_compare --new DIR/sweep_new_1.csv,DIR/sweep_new_2.csv \\
        --old DIR/sweep_old_1.csv,DIR/sweep_old_2.csv

Each CSV is the ``--out`` of ``python -m benchmarks.compressors --sweep-only``; every round
measures every compressor against exact Top-k on the same tensor in the same process, so the
ratio ``c/T`` (compress alone over exact Top-k's compress) is what compares across rounds and
versions (the absolute times of a shared GPU host move by 20-30 % between rounds).  Prints one
row per size, CF and compressor with the ratio of each round, new then old, then the range of
each compressor's ratios from 1M entries up (the issue's target: at most 1).
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict


def load(path: str) -> dict:
    """``{(numel, compressor, cf): (c/T, cd/T, quality min, quality max)}`` of one sweep CSV."""
    rows = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["table"] != "sweep" or not r["compress_per_topk"]:
                continue
            rows[(int(r["numel"]), r["compressor"], float(r["cf"]))] = (
                float(r["compress_per_topk"]), float(r["cd_per_topk"]),
                float(r["quality_min"]), float(r["quality_max"]))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--new", required=True, help="comma-separated sweep CSVs of the new version")
    ap.add_argument("--old", default="", help="comma-separated sweep CSVs of the old version")
    ap.add_argument("--compressors", default="dgc,redsync,sidco-exp,sidco-gpareto,sidco-gamma,topk-again")
    args = ap.parse_args(argv)
    new = [load(p) for p in args.new.split(",") if p]
    old = [load(p) for p in args.old.split(",") if p]
    names = args.compressors.split(",")
    print(f"# c/T (compress over exact Top-k, same tensor, same round) per round: new {len(new)}, "
          f"old {len(old)}; quality = kept / k of the new version's first round")
    print(f"{'entries':>11} {'CF':>5} {'compressor':14} {'new':>14} {'old':>14}  quality")
    ranges = defaultdict(list)
    for key in sorted(k for k in new[0] if k[1] in names):
        n, name, cf = key
        got = [r[key][0] for r in new if key in r]
        was = [r[key][0] for r in old if key in r]
        q = new[0][key]
        print(f"{n:>11,} {cf:>5g} {name:14} {' '.join(f'{v:.2f}' for v in got):>14} "
              f"{' '.join(f'{v:.2f}' for v in was):>14}  {q[2]:.2f}-{q[3]:.2f}")
        if n >= 1 << 20:
            ranges[(name, "new")] += got
            ranges[(name, "old")] += was
            size = "25M" if n > 8_000_000 else "1M-6.5M"
            ranges[(name, size, cf, "new")] += got
            ranges[(name, size, cf, "old")] += was
    print("\n# from 1M entries up, every CF: range of c/T")
    for name in names:
        parts = [f"{tag} {min(v):.2f}-{max(v):.2f}" for tag in ("new", "old") if (v := ranges[(name, tag)])]
        print(f"  {name:14} " + ", ".join(parts))
    print("\n# by CF, bucket sizes (1M-6.5M entries) and 25M: range of c/T, new | old")
    cfs = sorted({k[2] for k in new[0]})
    for name in names:
        cells = []
        for size in ("1M-6.5M", "25M"):
            for cf in cfs:
                v, w = ranges[(name, size, cf, "new")], ranges[(name, size, cf, "old")]
                if v:
                    cells.append(f"{size} CF {cf:g}: {min(v):.2f}-{max(v):.2f}"
                                 + (f" | {min(w):.2f}-{max(w):.2f}" if w else ""))
        print(f"  {name:14} " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
