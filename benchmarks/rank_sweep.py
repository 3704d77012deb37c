#!/usr/bin/env python3
"""Step time against the number of ranks: dense allreduce, the paper's allgather and the
sparse allreduce, at 10x and 100x, on an emulated link (issue 59).

For each world size (2, 4, 8, 16 by default) one launch of that many ranks, each in its own
network namespace behind a ``--rate`` link (``benchmarks/netem.py``), trains a 1D CNN whose
1.41M parameters form one bucket, with every path in turn, in interleaved blocks of ``BLOCK``
steps (so that a noisy machine slows them alike):

* ``dense``: ``hvd.DistributedOptimizer`` (ring allreduce of the whole gradient);
* ``allgather10``, ``allgather100``: Top-k at 10x and 100x, ``exchange="allgather"`` (the
  paper's path: the pair exchange on 2 ranks, one allgather beyond);
* ``sparse10``, ``sparse100``: ``exchange="sparse_allreduce"``;
* ``auto10``, ``auto100``: ``exchange="auto"`` with ``link=`` the emulated rate: what the
  optimizer picks by itself (its pick is in the table).

Per path and world size: the median step (rank 0's clock), the median wait for the transfers
(``comm_time``), and the bytes a rank sends per step, measured twice: ``optimizer.stats``
(``wire_bytes``, what the collectives send by Gloo's ring algorithms) and the link's own
counter (``tx_bytes`` of the rank's interface, read inside its namespace before and after each
block: TCP/IP headers and Horovod's negotiation included; the median and the largest over the
ranks).  The floor of a path is its compute (the step less its wait, the median over the
compressed paths at that size) plus its ``wire_bytes`` at the link rate.  Ok-Topk's bound,
``6 k (P-1)/P`` words (k = numel / CF), is printed beside the sparse allreduce's bytes.

    python -m benchmarks.rank_sweep                       # 2,4,8,16 ranks at 100mbit, 100 steps a path (~35 min)
    python -m benchmarks.rank_sweep --ranks 2,4 --blocks 3 --out /tmp/sweep   # a quick look
    python -m benchmarks.rank_sweep --plot-only                # redraw the plot from results.csv

Writes ``benchmarks/results/rank_sweep/results.md``, ``results.csv`` and ``step_vs_ranks.png``
(``--out`` changes the folder).  ``python -m benchmarks.cost_model ranks`` checks its cost
model against ``results.csv`` and projects to 32, 64 and 256 ranks.  Needs root for the
emulated network; without it ranks run on plain localhost and the rate is not applied (the
output says so).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from typing import List, Optional

from benchmarks.interleave import cell, launch_json, train_interleaved

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "results", "rank_sweep")
PATHS = ("dense", "allgather10", "allgather100", "sparse10", "sparse100", "auto10", "auto100")
RANKS = (2, 4, 8, 16)
BLOCK = 10
BATCH = 16


# ----------------------------------------------------------------------------- worker
def build_model():
    """A 1D CNN, 1.41M parameters, most in the first linear layer: one bucket of gradients."""
    import torch
    from torch import nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv1d(32, 64, 3, padding=1), nn.ReLU(),
                         nn.MaxPool1d(2), nn.Conv1d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool1d(2),
                         nn.Flatten(), nn.Linear(128 * 16, 672), nn.ReLU(), nn.Linear(672, 10))


def _optimizer(path: str, model, rate: Optional[str]):
    import torch
    import horovod.torch as hvd
    import horovod_gravac as hg
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if path == "dense":
        return hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    mode = {"allgather": "allgather", "sparse": "sparse_allreduce", "auto": "auto"}[path.rstrip("0123456789")]
    cf = float(path[len(path.rstrip("0123456789")):])
    return hg.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), controller=hg.StaticCF(cf),
                                   compressor=hg.TopKCompressor, exchange=mode, link=rate or "1gbit")


def _tx_bytes() -> Optional[int]:
    """This rank's interface's transmitted bytes (inside its namespace: ``ip netns exec``
    mounts the namespace's own /sys), or None without one."""
    iface = os.environ.get("HOROVOD_GLOO_IFACE")
    try:
        with open(f"/sys/class/net/{iface}/statistics/tx_bytes") as f:
            return int(f.read())
    except (OSError, ValueError, TypeError):
        return None


def worker(args) -> int:
    import torch
    import horovod.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    paths = args.paths.split(",")
    runs = {}
    for path in paths:
        model = build_model()
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        runs[path] = dict(model=model, opt=_optimizer(path, model, args.rate), times=[], stats=[], tx=0, tx_steps=0)
    numel = sum(p.numel() for p in runs[paths[0]]["model"].parameters())
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn(BATCH, 1, 64, generator=g)
    y = torch.randint(0, 10, (BATCH,), generator=g)

    def count_link_bytes(run, counted):
        # called before and after each block: the link's bytes over the block
        now = _tx_bytes()
        if "tx_mark" not in run:
            run["tx_mark"] = now
            return
        before = run.pop("tx_mark")
        if counted and before is not None and now is not None:
            run["tx"] += now - before
            run["tx_steps"] += BLOCK

    train_interleaved(runs, x, y, args.blocks, BLOCK, plain=("dense",), around_block=count_link_bytes)
    out = {"rank": hvd.rank(), "size": hvd.size(), "numel": numel, "paths": {}}
    for path in paths:
        run = runs[path]
        stats = run["stats"]

        def median(key):
            values = [s[key] for s in stats if s.get(key) is not None]
            return statistics.median(values) if values else None
        size = hvd.size()
        out["paths"][path] = {
            "step_s": statistics.median(run["times"]),
            "comm_s": median("comm_time"),
            "compress_s": median("compress_time"),
            "transfers": stats[-1]["transfers"] if stats else "allreduce",
            "bytes_sent": median("bytes_sent"),
            # hvd's ring allreduce of the float32 gradient: 2 (P-1)/P * 4 n
            "wire_bytes": median("wire_bytes") if stats else 2 * (size - 1) / size * 4 * numel,
            "kept_share": median("kept_share"),
            "comm_model_s": median("comm_model_s"),
            "dense_model_s": median("dense_model_s"),
            "tx_per_step": run["tx"] / run["tx_steps"] if run["tx_steps"] else None,
        }
    print("RANK_SWEEP " + json.dumps(out), flush=True)
    return 0


# ----------------------------------------------------------------------------- driver
def _launch(np_: int, paths: List[str], rate: Optional[str], blocks: int, timeout: float) -> List[dict]:
    ranks = launch_json(["benchmarks.rank_sweep", "--worker", "--paths", ",".join(paths), "--blocks", str(blocks)]
                        + (["--rate", rate] if rate else []), "RANK_SWEEP", np_, rate, timeout, expect=np_)
    return sorted(ranks, key=lambda d: d["rank"])


def measure(ranks: List[int], paths: List[str], rate: Optional[str], blocks: int, timeout: float) -> List[dict]:
    from benchmarks.netem import parse_rate
    rows = []
    for np_ in ranks:
        t0 = time.time()
        data = _launch(np_, paths, rate, blocks, timeout)
        print(f"[rank_sweep] {np_} ranks ({data[0]['mode']}) in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        zero = data[0]
        numel = zero["numel"]
        bps = parse_rate(rate) / 8 if rate else None
        compute = statistics.median(zero["paths"][p]["step_s"] - zero["paths"][p]["comm_s"]
                                    for p in paths if p != "dense" and zero["paths"][p]["comm_s"] is not None)
        dense_step = zero["paths"]["dense"]["step_s"] if "dense" in paths else None
        for path in paths:
            e = zero["paths"][path]
            tx = [d["paths"][path]["tx_per_step"] for d in data if d["paths"][path]["tx_per_step"] is not None]
            cf = float(path[len(path.rstrip("0123456789")):]) if path != "dense" else 1.0
            k = numel // cf if cf > 1 else numel
            floor = compute + e["wire_bytes"] / bps if bps else None
            rows.append(dict(
                ranks=np_, path=path, rate=rate or "none", mode=zero["mode"], transfers=e["transfers"], cf=cf,
                step_ms=1e3 * e["step_s"], comm_ms=None if e["comm_s"] is None else 1e3 * e["comm_s"],
                compute_ms=1e3 * compute, floor_ms=None if floor is None else 1e3 * floor,
                vs_dense=None if dense_step is None else e["step_s"] / dense_step,
                wire_kb=e["wire_bytes"] / 1e3, stats_bytes_kb=None if e["bytes_sent"] is None else e["bytes_sent"] / 1e3,
                link_kb_median=statistics.median(tx) / 1e3 if tx else None,
                link_kb_max=max(tx) / 1e3 if tx else None,
                oktopk_bound_kb=4 * 6 * k * (np_ - 1) / np_ / 1e3 if cf > 1 else None,
                kept_share=e["kept_share"],
                model_comm_ms=None if e["comm_model_s"] is None else 1e3 * e["comm_model_s"],
                model_dense_ms=None if e["dense_model_s"] is None else 1e3 * e["dense_model_s"],
                numel=numel))
    return rows


FIELDS = ("ranks", "path", "transfers", "cf", "step_ms", "vs_dense", "comm_ms", "compute_ms", "floor_ms", "wire_kb",
          "stats_bytes_kb", "link_kb_median", "link_kb_max", "oktopk_bound_kb", "kept_share", "model_comm_ms",
          "model_dense_ms", "rate", "mode", "numel")


def read_rows(path: str) -> List[dict]:
    """``results.csv`` back as rows (numbers as numbers, empty cells as None)."""
    text = ("path", "transfers", "rate", "mode")
    with open(path, newline="") as f:
        return [{k: (v if k in text else None if v == "" else int(v) if k in ("ranks", "numel") else float(v))
                 for k, v in r.items()} for r in csv.DictReader(f)]


def write(rows: List[dict], out: str, command: str, blocks: int) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
    rate = rows[0]["rate"]
    lines = ["# Step time against the number of ranks", "",
             f"Written by `{command}`: {rows[0]['numel'] / 1e6:.2f}M parameters in one bucket, batch {BATCH}, "
             f"link {rate} per rank ({rows[0]['mode']}); medians over {blocks} interleaved blocks of {BLOCK} steps "
             f"a path, all on one 2-core machine.",
             "vs dense: the step over `hvd.DistributedOptimizer`'s at the same size. floor: compute (the step less "
             "its wait, the median over the compressed paths) + the path's bytes at the link rate. Bytes are per "
             "rank and step: `stats` = `optimizer.stats['wire_bytes']`, `link` = the interface's own tx counter "
             "(median and largest over the ranks; TCP/IP headers and Horovod's negotiation included); "
             "Ok-Topk's bound = 6 k (P-1)/P words.", ""]
    lines += ["| ranks | path | sent as | step ms | vs dense | wait ms | floor ms | stats kB | link kB (med / max) "
              "| bound kB | kept share |", "|" + "---|" * 11]
    for r in rows:
        lines.append("| " + " | ".join([
            str(r["ranks"]), r["path"], r["transfers"], cell(r["step_ms"]), cell(r["vs_dense"], 2), cell(r["comm_ms"]),
            cell(r["floor_ms"]), cell(r["wire_kb"], 0),
            f"{cell(r['link_kb_median'], 0)} / {cell(r['link_kb_max'], 0)}", cell(r["oktopk_bound_kb"], 0),
            cell(r["kept_share"], 2)]) + " |")
    lines.append("")
    sizes = sorted({r["ranks"] for r in rows})
    by = {(r["ranks"], r["path"]): r for r in rows}
    worst = [(s, p, by[(s, p)]["vs_dense"]) for s in sizes for p in ("auto10", "auto100")
             if (s, p) in by and by[(s, p)]["vs_dense"] is not None]
    if worst:
        s, p, v = max(worst, key=lambda t: t[2])
        lines += [f"Slowest `auto` configuration against dense: {p} at {s} ranks, {v:.2f}x dense's step.", ""]
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write("\n".join(lines))
    plot(rows, os.path.join(out, "step_vs_ranks.png"))


def plot(rows: List[dict], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[rank_sweep] matplotlib is not installed: no plot", file=sys.stderr)
        return
    style = {"dense": ("k", "o", "dense allreduce (hvd.DistributedOptimizer)"),
             "allgather10": ("tab:red", "s", "allgather, Top-k 10x"), "allgather100": ("tab:orange", "s", "allgather, Top-k 100x"),
             "sparse10": ("tab:blue", "^", "sparse allreduce, Top-k 10x"),
             "sparse100": ("tab:green", "^", "sparse allreduce, Top-k 100x")}
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for name, (color, marker, label) in style.items():
        part = sorted((r for r in rows if r["path"] == name), key=lambda r: r["ranks"])
        if not part:
            continue
        xs = [r["ranks"] for r in part]
        ax.plot(xs, [r["step_ms"] for r in part], color=color, marker=marker, label=label)
        if part[0]["floor_ms"] is not None and name in ("dense", "sparse10", "sparse100", "allgather10"):
            ax.plot(xs, [r["floor_ms"] for r in part], color=color, linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted({r["ranks"] for r in rows}))
    ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("ranks")
    ax.set_ylabel("ms per step (median)")
    ax.set_title(f"Step time against ranks at {rows[0]['rate']} per rank; dotted: compute + bytes at the link rate",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default=",".join(map(str, RANKS)))
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--rate", default="100mbit")
    p.add_argument("--blocks", type=int, default=10, help=f"blocks of {BLOCK} steps per path (after one warm-up block)")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plot-only", action="store_true", help="redraw step_vs_ranks.png from --out's results.csv")
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.plot_only:
        plot(read_rows(os.path.join(args.out, "results.csv")), os.path.join(args.out, "step_vs_ranks.png"))
        return 0
    rows = measure([int(n) for n in args.ranks.split(",")], args.paths.split(","), args.rate, args.blocks,
                   args.timeout)
    command = "python -m benchmarks.rank_sweep" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    write(rows, args.out, command, args.blocks)
    print(open(os.path.join(args.out, "results.md")).read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
