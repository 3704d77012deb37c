#!/usr/bin/env python3
"""How do the controllers compare over several seeds?  Time to accuracy across seeds: one
table from several ``benchmarks.adaptivity`` outputs.

Each directory holds the ``results.csv`` of one seed (``python -m benchmarks.adaptivity
--seed S --out DIR ...``; a directory may hold one rate or both).  For every workload and
rate the table gives each configuration's TTA per seed, how often it reached the target,
and its median ratio to static Top-k 10x; the last column compares two configurations
head to head (``--a`` against ``--b``: the share of seeds where ``a`` was at least as fast,
a miss counting as slowest)::

    python -m benchmarks.adaptivity --seed 42 --out /tmp/seed42      # and 1, 2: one folder each
    python -m benchmarks.adaptivity_seeds --dirs /tmp/seed42,/tmp/seed1,/tmp/seed2 --labels 42,1,2 \\
        --configs topk-cf10,gravac-ladder-exp-topk-eps0.7 --out benchmarks/results/adaptivity_seeds.md
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
from collections import defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

from benchmarks.adaptivity import LATE_EVALS

Key = Tuple[str, str]   # (workload, rate)


def load(dirs: Sequence[str], labels: Sequence[str], column: str = "tta_s"
         ) -> Dict[Key, Dict[str, Dict[str, Optional[float]]]]:
    """(workload, rate) -> config -> seed label -> ``column`` of results.csv (TTA seconds by
    default; None: never reached, or the column is absent from that seed's results)."""
    out: Dict[Key, Dict[str, Dict[str, Optional[float]]]] = defaultdict(lambda: defaultdict(dict))
    for d, label in zip(dirs, labels):
        with open(os.path.join(d, "results.csv")) as f:
            for row in csv.DictReader(f):
                v = row.get(column) or ""
                out[(row["workload"], row["rate"])][row["config"]][label] = float(v) if v else None
    return out


def late_table(data, configs: Sequence[str]) -> str:
    """Mean over seeds of each configuration's last-evaluations quality against dense's
    (``late_vs_dense`` of benchmarks.adaptivity), with its per-seed values."""
    seeds = sorted({s for runs in data.values() for c in runs.values() for s in c})
    lines = [f"Last evaluations against dense's (mean of the last {LATE_EVALS} evaluations, by seed "
             f"{', '.join(seeds)}, "
             "then their mean): accuracy in pp, language model in % of perplexity (positive = lower); "
             "negative is worse than dense.", ""]
    header = ["workload", "rate", *configs]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (w, rate) in sorted(data):
        cells = [w, rate]
        for c in configs:
            vals = {s: v for s, v in data[(w, rate)].get(c, {}).items() if v is not None}
            cells.append(" / ".join(f"{vals[s]:+.1f}" for s in seeds if s in vals)
                         + f" (mean {statistics.mean(vals.values()):+.2f})" if vals else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def head_to_head(a: Dict[str, Optional[float]], b: Dict[str, Optional[float]]) -> Optional[Tuple[int, int]]:
    """(seeds where a was at least as fast as b, seeds with both run); a miss is slowest."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    inf = float("inf")
    wins = sum((a[s] if a[s] is not None else inf) <= (b[s] if b[s] is not None else inf) for s in seeds)
    return wins, len(seeds)


def speedup(ref_tta: Optional[float], tta: Optional[float]) -> Optional[float]:
    """ref's TTA / this TTA; a miss of this config is 0, a miss of ref alone is inf, both: None."""
    if tta is None:
        return None if ref_tta is None else 0.0
    return float("inf") if ref_tta is None else ref_tta / tta


def table(data, configs: Sequence[str], a: str, b: str, ref: str = "topk-cf10") -> str:
    seeds = sorted({s for runs in data.values() for c in runs.values() for s in c})
    lines = [f"TTA in seconds by seed ({', '.join(seeds)}); '-' never reached the target; "
             f"'x' is the median over seeds of Top-k 10x's TTA / this TTA (a miss counts as 0, "
             f"a miss of Top-k 10x alone as inf).", ""]
    header = ["workload", "rate", *configs, f"{a} at least as fast as {b}"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (w, rate) in sorted(data):
        runs = data[(w, rate)]
        cells = [w, rate]
        for c in configs:
            by_seed = runs.get(c, {})
            if not by_seed:
                cells.append("")
                continue
            ttas = " / ".join("-" if by_seed.get(s) is None else f"{by_seed[s]:.1f}" for s in seeds if s in by_seed)
            ratios = [r for r in (speedup(runs.get(ref, {}).get(s), by_seed[s]) for s in by_seed) if r is not None]
            cells.append(f"{ttas} ({statistics.median(ratios):.2f}x)" if ratios else ttas)
        h = head_to_head(runs.get(a, {}), runs.get(b, {}))
        cells.append("" if h is None else f"{h[0]} of {h[1]}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dirs", required=True, help="comma-separated output directories of benchmarks.adaptivity")
    p.add_argument("--labels", required=True, help="comma-separated seed label of each directory")
    p.add_argument("--configs", default="topk-cf10,gravac-paper-exp-topk-eps0.7,gravac-delivered-exp-topk-eps0.7")
    p.add_argument("--a", default="gravac-delivered-exp-topk-eps0.7")
    p.add_argument("--b", default="gravac-paper-exp-topk-eps0.7")
    p.add_argument("--out", help="also write the table here")
    args = p.parse_args(argv)
    dirs, labels = args.dirs.split(","), args.labels.split(",")
    if len(dirs) != len(labels):
        p.error("--dirs and --labels need the same number of entries")
    configs = args.configs.split(",")
    text = table(load(dirs, labels), configs, args.a, args.b)
    late = load(dirs, labels, "late_vs_dense")
    if any(v is not None for runs in late.values() for c in runs.values() for v in c.values()):
        text += "\n" + late_table(late, configs)
    print(text, end="")
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"<!-- python -m benchmarks.adaptivity_seeds --dirs {args.dirs} --labels {args.labels} "
                    f"--configs {args.configs} --a {args.a} --b {args.b} -->\n\n"
                    + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
