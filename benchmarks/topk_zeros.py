"""Top-k with and without the exact zeros it tops a sparse gradient up with, on 2 real ranks.

    .venv/bin/python -m benchmarks.topk_zeros          # ~5 minutes

``TopKCompressor`` sends exactly k entries, as the paper's Top-k and GRACE's do: a bucket with
fewer than k nonzeros (an embedding's gradient, most rows untouched) is topped up with zeros.
``send_zeros=False`` (the harness's ``--topk-zeros skip``) sends the nonzeros alone.  A zero says
nothing (the decompressed bucket and the error-feedback residual are the same), so the training
should come out the same while the bytes drop.

Workload: ``--preset ngram-pydoc-chars`` (see ``benchmarks/gravac_eps09.py``; 1000 steps, 2 Gloo
ranks on localhost, no emulated network: the bytes are the figure that carries over to a real
one).  Four runs, identical but for the controller and ``--topk-zeros``: static Top-k 10x and
GraVAC on Top-k at epsilon 0.9 (the paper's settings, window 100), each sending and skipping
the zeros.  Prints final accuracy, bytes sent, bytes skip / send and training seconds.

Committed output: ``benchmarks/results/topk_zeros.txt``.
"""
from __future__ import annotations

import argparse
import os

from benchmarks.gravac_eps09 import ROOT, launch

RUNS = [
    ("static-topk-cf10", ["--controller", "static", "--compressor", "topk", "--cf", "10"]),
    ("gravac-topk-eps0.9", ["--controller", "gravac", "--variant", "paper", "--compressor", "topk",
                            "--epsilon", "0.9", "--theta-min", "10", "--theta-max", "1000",
                            "--policy", "exponential", "--omega", "0.01", "--window", "100"]),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--steps", type=int, default=None, help="training steps (the preset's 1000)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--runs-dir", default=os.path.join(ROOT, "reports", "topk_zeros"))
    args = ap.parse_args(argv)
    results = {}
    for name, flags in RUNS:
        for zeros in ("send", "skip"):
            run_dir = os.path.join(args.runs_dir, f"{name}-{zeros}")
            results[name, zeros] = launch(f"{name} --topk-zeros {zeros}", flags + ["--topk-zeros", zeros],
                                          run_dir, args.seed, args.steps, args.timeout, 2)
    print(f"\n# Top-k sending and skipping exact zeros: ngram-pydoc-chars, 2 Gloo ranks, seed {args.seed}")
    print(f"{'run':<20} {'zeros':<5} {'final acc %':>11} {'bytes sent':>14} {'vs send':>8} "
          f"{'floats vs dense':>15} {'train s':>8}")
    failed = 0
    for name, _ in RUNS:
        send = results[name, "send"]
        for zeros in ("send", "skip"):
            r = results[name, zeros]
            if not r["ok"]:
                print(f"{name:<20} {zeros:<5} {r['status']}")
                failed += 1
                continue
            s = r["summary"]
            ratio = s["bytes_sent"] / send["summary"]["bytes_sent"] if send["ok"] else float("nan")
            print(f"{name:<20} {zeros:<5} {100 * s['final']['accuracy']:>11.2f} {int(s['bytes_sent']):>14,} "
                  f"{ratio:>8.4f} {s['floats_sent_vs_dense']:>15.5f} {s['train_seconds']:>8.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
