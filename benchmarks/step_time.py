#!/usr/bin/env python3
"""How close is each path's training step to what its bytes allow?

For every path (Dense, ``hvd.DistributedOptimizer`` as the reference, StaticCF 10/100/1000,
GraVAC pinned at 10x, Accordion at 10x), two models and two emulated link rates, 2 ranks:

* ``step``: the median step time (zero_grad, forward, backward, step), measured with the
  paths interleaved in blocks of steps within one launch, so that a noisy machine slows
  them alike;
* ``compute``: the same path's step on an unshaped link (a veth pair between network
  namespaces): everything but the wire;
* ``wire``: the bytes each rank sends per step, at the link rate, full duplex (an
  allreduce of n bytes between 2 ranks sends n; an exchange of k-entry payloads 8 k);
* ``bare``: the same collectives (same sizes and kinds, one after the other, as the
  buckets) run by bare Horovod calls at that rate, with no training around them.

Two floors follow: ``compute + wire`` and ``compute + bare``.  The table gives each
path's ratio to both.  With many buckets, communication can hide behind the backward
pass; ``hidden`` = 1 - (step - compute) / bare, the share of the bare collectives' time
that the step did not pay (0 when none is hidden; Horovod's own optimizer is the
reference).

Models: ``cnn1d`` (a 1D CNN, 1.17M parameters: one bucket, its whole gradient ready at the
end of backward; batches of 32 sequences of 64) and ``resnet`` (a bottleneck ResNet with one
block per stage, 0.51M parameters in 53 tensors, cut into buckets of at most 0.1 MB;
batches of 32 images of 16x16).

    python -m benchmarks.step_time                        # both models, 100mbit and 1gbit (~15 min)
    python -m benchmarks.step_time --models cnn1d --rates 100mbit --blocks 4   # a quick look

Writes ``benchmarks/results/step_time.md`` and ``.csv`` (``--out`` changes the prefix).
Needs root for the emulated network (``benchmarks/netem.py``); without it, ranks run on
plain localhost and the rates are not applied (the output says so).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(HERE, "results", "step_time")
PATHS = ("dense", "hvd", "static10", "static100", "static1000", "gravac-pinned10", "accordion10")
MODELS = ("cnn1d", "resnet")
RATES = ("100mbit", "1gbit")
BLOCK = 10          # steps per block; paths take turns block by block
BUCKET_CAP_MB = {"cnn1d": 25.0, "resnet": 0.1}


# ----------------------------------------------------------------------------- worker
def _model(name: str):
    """(model, input shape without the batch)."""
    import torch
    from torch import nn
    from horovod_gravac.harness.models import resnet101
    torch.manual_seed(0)
    if name == "cnn1d":   # 1.17M parameters, most in the first linear layer
        return nn.Sequential(nn.Conv1d(1, 64, 3, padding=1), nn.ReLU(), nn.Conv1d(64, 128, 3, padding=1),
                             nn.ReLU(), nn.MaxPool1d(2), nn.Conv1d(128, 256, 3, padding=1), nn.ReLU(),
                             nn.MaxPool1d(2), nn.Flatten(), nn.Linear(256 * 16, 256), nn.ReLU(),
                             nn.Linear(256, 10)), (1, 64)
    # bottleneck ResNet, one block per stage: 0.51M parameters in 53 tensors
    return resnet101(num_classes=10, width=16, blocks=(1, 1, 1, 1)), (3, 16, 16)


def _optimizer(path: str, model, bucket_cap_mb: float):
    import torch
    import horovod.torch as hvd
    import horovod_gravac as hg
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if path == "hvd":
        return hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
    controller = {
        "dense": lambda: hg.Dense(),
        "static10": lambda: hg.StaticCF(10), "static100": lambda: hg.StaticCF(100),
        "static1000": lambda: hg.StaticCF(1000),
        # theta 10..10 and an epsilon no gain misses: every step sends 10x, as the static path
        "gravac-pinned10": lambda: hg.GraVAC(theta_min=10, theta_max=10, epsilon=1e-9),
        "accordion10": lambda: hg.Accordion(low_cf=10, high_cf=10),
    }[path]()
    return hg.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), controller=controller,
                                   bucket_cap_mb=bucket_cap_mb)


def _collectives(opt, path: str, n_params: List[int]) -> List[tuple]:
    """What one step of ``path`` sent, as (kind, elements) per collective, from the
    optimizer's last step (``hvd``: one allreduce per parameter tensor, which Horovod
    fuses as it goes)."""
    if path == "hvd":
        return [("allreduce", n) for n in n_params]
    out = []
    for kind, numel, rows in opt.last_collectives:
        out.append((kind, numel if kind == "dense" else rows))
    return out


def _bare(collectives: List[tuple], repeats: int) -> float:
    """Median seconds of the same collectives run back to back by bare Horovod calls
    (submitted together, then waited for, as the buckets are)."""
    import torch
    import horovod.torch as hvd
    times = []
    for r in range(repeats):
        hvd.allreduce(torch.zeros(1), name=f"bare.sync.{r}")
        t = time.perf_counter()
        handles = []
        for i, (kind, n) in enumerate(collectives):
            name = f"bare.{r}.{i}"
            if kind in ("dense", "allreduce"):
                handles.append(hvd.allreduce_async(torch.zeros(n), name=name))
            elif kind == "pair":
                handles.append(hvd.reducescatter_async(torch.zeros((2 * n, 2), dtype=torch.int32),
                                                       name=name, op=hvd.Sum))
            else:
                handles.append(hvd.allgather_async(torch.zeros((n, 2), dtype=torch.int32), name=name))
        for h in handles:
            hvd.synchronize(h)
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def worker(args) -> int:
    import torch
    import horovod.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    model_name, paths = args.model, args.paths.split(",")
    runs = {}
    for path in paths:
        model, shape = _model(model_name)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = _optimizer(path, model, BUCKET_CAP_MB[model_name])
        runs[path] = dict(model=model, opt=opt, times=[], stats=[])
    n_params = [p.numel() for p in runs[paths[0]]["model"].parameters()]
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn((32,) + shape, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    loss_fn = torch.nn.functional.cross_entropy
    for block in range(args.blocks + 1):          # block 0 warms up and is not counted
        for path in paths:
            run = runs[path]
            model, opt = run["model"], run["opt"]
            for _ in range(BLOCK):
                t = time.perf_counter()
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                opt.step()
                if block:
                    run["times"].append(time.perf_counter() - t)
                    if path != "hvd":
                        run["stats"].append(dict(opt.stats))
    out = {"model": model_name, "rank": hvd.rank(), "size": hvd.size(), "paths": {}}
    for path in paths:
        run = runs[path]
        colls = _collectives(run["opt"], path, n_params)
        stats = run["stats"]
        out["paths"][path] = {
            "step_s": statistics.median(run["times"]),
            "collectives": colls,
            "buckets": len(colls) if path != "hvd" else None,
            "transfers": stats[-1]["transfers"] if stats else "allreduce",
            "cf": statistics.median(s["cf"] for s in stats) if stats else 1.0,
            "bytes_sent": statistics.median(s["bytes_sent"] + s["control_bytes"] for s in stats) if stats
            else 4 * sum(n_params),
        }
    if args.bare:
        for path in paths:
            out["paths"][path]["bare_s"] = _bare(out["paths"][path]["collectives"], args.bare)
    if hvd.rank() == 0:
        print("STEP_TIME " + json.dumps(out), flush=True)
    return 0


# ----------------------------------------------------------------------------- driver
def wire_bytes(entry: dict, size: int) -> float:
    """Bytes each rank puts on the wire in one step: an allreduce of n float32 entries
    sends 2 (size - 1) / size * 4n; an exchange of payload rows sends (size - 1) * 8 rows."""
    total = 0.0
    for kind, n in entry["collectives"]:
        if kind in ("dense", "allreduce", "shared"):
            total += 2 * (size - 1) / size * 4 * n
        else:
            total += (size - 1) * 8 * n
    return total


def _launch(model: str, paths: List[str], rate: Optional[str], blocks: int, bare: int, np_: int,
            timeout: float) -> dict:
    from benchmarks.netem import run_ranks
    cmd = [sys.executable, "-m", "benchmarks.step_time", "--worker", "--model", model,
           "--paths", ",".join(paths), "--blocks", str(blocks), "--bare", str(bare)]
    env = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    results = run_ranks(cmd, np=np_, rate=rate, timeout=timeout, env=env)
    for res in results:
        for line in res.stdout.splitlines():
            if line.startswith("STEP_TIME "):
                data = json.loads(line[len("STEP_TIME "):])
                data["mode"] = res.mode
                return data
    raise RuntimeError("no STEP_TIME line from rank 0:\n" + results[0].stdout[-2000:] + results[0].stderr[-2000:])


def _rate_bps(rate: str) -> float:
    from benchmarks.netem import parse_rate
    return parse_rate(rate)


def measure(models, rates, paths, blocks: int, bare: int, np_: int, timeout: float) -> List[dict]:
    rows = []
    for model in models:
        compute = _launch(model, paths, None, blocks, 0, np_, timeout)
        print(f"[step_time] {model}: compute measured ({compute['mode']})", file=sys.stderr, flush=True)
        for rate in rates:
            data = _launch(model, paths, rate, blocks, bare, np_, timeout)
            print(f"[step_time] {model} at {rate} ({data['mode']})", file=sys.stderr, flush=True)
            for path in paths:
                e, c = data["paths"][path], compute["paths"][path]
                wire_s = wire_bytes(e, data["size"]) * 8 / _rate_bps(rate)
                bare_s = e.get("bare_s")
                step, comp = e["step_s"], c["step_s"]
                rows.append(dict(
                    model=model, rate=rate, path=path, mode=data["mode"], transfers=e["transfers"],
                    buckets=e["buckets"], cf=e["cf"], bytes_per_rank=round(wire_bytes(e, data["size"])),
                    step_ms=1e3 * step, compute_ms=1e3 * comp, wire_ms=1e3 * wire_s,
                    bare_ms=None if bare_s is None else 1e3 * bare_s,
                    vs_wire_floor=step / (comp + wire_s),
                    vs_bare_floor=None if bare_s is None else step / (comp + bare_s),
                    hidden=None if not bare_s else max(0.0, min(1.0, 1 - (step - comp) / bare_s))))
    return rows


FIELDS = ("model", "rate", "path", "transfers", "buckets", "cf", "bytes_per_rank", "step_ms", "compute_ms",
          "wire_ms", "bare_ms", "vs_wire_floor", "vs_bare_floor", "hidden", "mode")


def _fmt(v, digits=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def write(rows: List[dict], out: str, command: str) -> None:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
    lines = ["# Step time against the link floor", "",
             f"Written by `{command}`; 2 ranks, medians over interleaved blocks of {BLOCK} steps.",
             "floor (wire) = compute + bytes per rank / rate; floor (bare) = compute + the same collectives "
             "run by bare Horovod calls; hidden = share of the bare collectives' time the step did not pay.", ""]
    for (model, rate) in dict.fromkeys((r["model"], r["rate"]) for r in rows):
        part = [r for r in rows if r["model"] == model and r["rate"] == rate]
        lines += [f"## {model} at {rate}" + ("" if part[0]["mode"] == "netns" else " (localhost: NOT rate-limited)"),
                  "", "| path | collectives | buckets | CF | MB/rank | step ms | compute ms | wire ms | bare ms "
                  "| step / wire floor | step / bare floor | hidden |", "|" + "---|" * 12]
        for r in part:
            lines.append("| " + " | ".join([
                r["path"], r["transfers"], _fmt(r["buckets"]), _fmt(r["cf"], 0), _fmt(r["bytes_per_rank"] / 1e6, 3),
                _fmt(r["step_ms"]), _fmt(r["compute_ms"]), _fmt(r["wire_ms"]), _fmt(r["bare_ms"]),
                _fmt(r["vs_wire_floor"], 2), _fmt(r["vs_bare_floor"], 2), _fmt(r["hidden"], 2)]) + " |")
        lines.append("")
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines))


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--rates", default=",".join(RATES))
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--blocks", type=int, default=6, help="blocks of %d steps per path (after one warm-up block)" % BLOCK)
    p.add_argument("--bare", type=int, default=8, help="repeats of the bare collectives")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    rows = measure(args.models.split(","), args.rates.split(","), args.paths.split(","), args.blocks,
                   args.bare, args.np, args.timeout)
    command = "python -m benchmarks.step_time" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
    write(rows, args.out, command)
    print(open(args.out + ".md").read())
    return 0


if __name__ == "__main__":
    sys.exit(main())
