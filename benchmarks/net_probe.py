#!/usr/bin/env python3
"""What bandwidth does Horovod get on the emulated link?  An allreduce/allgather bandwidth
probe, run through the emulated network (its fit feeds benchmarks/cost_model.py).

Two halves:

* the worker (``python -m benchmarks.net_probe --worker --sizes 1MiB,16MiB``), one per
  rank, started through benchmarks/netem.py: times synchronous ``hvd.allreduce`` (sum) and
  ``hvd.allgather`` of float32 tensors of each size per rank, checks the results,
  and rank 0 prints one ``PROBE {json}`` line per measurement;
* the driver (``run_probe``, or ``python -m benchmarks.net_probe --np 2,3 --rate 100mbit``;
  ``python -m benchmarks.netem probe ...`` runs this same command), which launches the
  workers under netem and turns their lines into a table.

This module uses benchmarks.netem (to launch the ranks); netem does not import it.

Bandwidth definitions (M = bytes per rank, t = slowest rank's median time, N ranks):

* ``algbw = M / t``
* ``busbw``: bytes each rank puts on its link per second, so it compares directly
  with the configured per-link rate: ring allreduce moves ``2 (N-1)/N M`` per rank,
  ring allgather ``(N-1) M`` per rank.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import sys
import time
from typing import Dict, Iterable, List, Optional, Sequence

from benchmarks import netem

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_SIZES = "4KiB,64KiB,1MiB,4MiB,16MiB"
TAG = "PROBE "

_SIZE_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1024, "m": 1e6, "mb": 1e6,
               "mib": 1024 ** 2, "g": 1e9, "gb": 1e9, "gib": 1024 ** 3}


def parse_size(s: str) -> int:
    """'64KiB' -> 65536 bytes, '1MB' -> 1000000 bytes; rounded down to whole floats."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", s)
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"cannot parse size {s!r} (examples: 4KiB, 1MiB, 16MiB)")
    n = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    n -= n % 4
    if n <= 0:
        raise ValueError(f"size must hold at least one float32: {s!r}")
    return n


def parse_sizes(spec) -> List[int]:
    if isinstance(spec, str):
        spec = [x for x in spec.split(",") if x.strip()]
    return [parse_size(x) if isinstance(x, str) else int(x) for x in spec]


def wire_bytes(op: str, nbytes: int, np: int) -> float:
    """Bytes each rank sends over its link for one ring collective of nbytes per rank."""
    if op == "allreduce":
        return 2.0 * (np - 1) / np * nbytes
    if op == "allgather":
        return float((np - 1) * nbytes)
    raise ValueError(op)


# ---------------------------------------------------------------------------
# Worker (runs inside each rank)
# ---------------------------------------------------------------------------

def worker(sizes: Sequence[int], repeats: int, warmup: int = 1) -> int:
    import torch
    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    expect_sum = size * (size + 1) / 2.0
    for nbytes in sizes:
        n = nbytes // 4
        # small messages are cheap and noisier: time more of them
        reps = repeats * 4 if nbytes < (1 << 20) else repeats
        for op in ("allreduce", "allgather"):
            x = torch.full((n,), float(rank + 1), dtype=torch.float32)
            times = []
            for i in range(warmup + reps):
                hvd.barrier()
                t0 = time.perf_counter()
                if op == "allreduce":
                    y = hvd.allreduce(x, op=hvd.Sum, name=f"probe.ar.{nbytes}")
                else:
                    y = hvd.allgather(x, name=f"probe.ag.{nbytes}")
                dt = time.perf_counter() - t0
                if i >= warmup:
                    times.append(dt)
            # results must be right, or the timing means nothing
            if op == "allreduce":
                ok = y.numel() == n and bool(torch.all(y == expect_sum))
            else:
                ref = torch.arange(1, size + 1, dtype=torch.float32).repeat_interleave(n)
                ok = y.numel() == n * size and bool(torch.equal(y, ref))
            if not ok:
                print(f"rank {rank}: wrong {op} result for {nbytes} bytes", file=sys.stderr)
                return 3
            # the slowest rank defines the collective's time
            t = torch.tensor(times, dtype=torch.float64)
            tmax = hvd.allreduce(t, op=hvd.Max, name=f"probe.t.{op}.{nbytes}")
            if rank == 0:
                med = statistics.median(tmax.tolist())
                rec = {"op": op, "np": size, "bytes": nbytes, "repeats": reps,
                       "median_s": med, "min_s": min(tmax.tolist()), "times_s": tmax.tolist()}
                print(TAG + json.dumps(rec), flush=True)
    hvd.barrier()
    hvd.shutdown()
    return 0


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------

def parse_output(stdout: str) -> List[Dict]:
    return [json.loads(line[len(TAG):]) for line in stdout.splitlines() if line.startswith(TAG)]


def enrich(rec: Dict, rate: Optional[str], delay: Optional[str], mode: str) -> Dict:
    t = rec["median_s"]
    rate_mbit = netem.parse_rate(rate) / 1e6 if (rate and mode == "netns") else None
    busbw = wire_bytes(rec["op"], rec["bytes"], rec["np"]) * 8 / t / 1e6
    row = {
        "mode": mode, "np": rec["np"], "rate": rate if mode == "netns" else "none",
        "delay": delay or "0ms", "op": rec["op"], "bytes": rec["bytes"],
        "median_ms": t * 1e3, "min_ms": rec["min_s"] * 1e3, "repeats": rec["repeats"],
        "algbw_mbit": rec["bytes"] * 8 / t / 1e6, "busbw_mbit": busbw,
        "rate_mbit": rate_mbit,
        "busbw_over_rate": (busbw / rate_mbit) if rate_mbit else None,
    }
    return row


def run_probe(np: int = 2, rate: Optional[str] = "100mbit", delay: Optional[str] = None,
              sizes=DEFAULT_SIZES, repeats: int = 3, timeout: float = 600.0,
              force_localhost: bool = False, python: str = sys.executable) -> List[Dict]:
    sizes = parse_sizes(sizes)
    cmd = [python, "-m", "benchmarks.net_probe", "--worker",
           "--sizes", ",".join(str(s) for s in sizes), "--repeats", str(repeats)]
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    results = netem.run_ranks(cmd, np, rate, delay, timeout, env=env,
                              force_localhost=force_localhost)
    mode = results[0].mode
    load1 = os.getloadavg()[0]
    recs = parse_output(results[0].stdout)
    if len(recs) != 2 * len(sizes):
        raise RuntimeError(f"probe produced {len(recs)} records, expected {2 * len(sizes)}:\n"
                           f"{results[0].stdout[-2000:]}\n{results[0].stderr[-2000:]}")
    rows = [enrich(r, rate, delay, mode) for r in recs]
    for r in rows:   # the machine's 1-minute load at the end: CPU contention skews timings
        r["loadavg"] = round(load1, 2)
    return rows


def _fmt_bytes(n: int) -> str:
    for unit, k in (("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return f"{n}B"


def format_table(rows: Iterable[Dict]) -> str:
    rows = list(rows)
    head = (f"{'mode':9} {'np':>2} {'rate':>8} {'op':9} {'size':>7} {'median ms':>10} "
            f"{'algbw Mb/s':>10} {'busbw Mb/s':>10} {'busbw/rate':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        ratio = f"{r['busbw_over_rate']:.3f}" if r["busbw_over_rate"] is not None else "n/a"
        lines.append(f"{r['mode']:9} {r['np']:>2} {r['rate']:>8} {r['op']:9} "
                     f"{_fmt_bytes(r['bytes']):>7} {r['median_ms']:>10.2f} "
                     f"{r['algbw_mbit']:>10.1f} {r['busbw_mbit']:>10.1f} {ratio:>10}")
    if rows and rows[0]["mode"] != "netns":
        lines.append("NOTE: localhost fallback, no rate limit: these are NOT constrained-network numbers.")
    return "\n".join(lines)


FIELDS = ["mode", "np", "rate", "delay", "op", "bytes", "median_ms", "min_ms", "repeats",
          "algbw_mbit", "busbw_mbit", "rate_mbit", "busbw_over_rate", "loadavg", "cpus"]


def write_csv(rows: Iterable[Dict], path: str, append: bool = False) -> None:
    exists = os.path.exists(path) and os.path.getsize(path) > 0
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a" if append else "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if not (append and exists):
            w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, os.cpu_count() if k == "cpus" else None) for k in FIELDS})


def read_csv(path: str) -> List[Dict]:
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            for k in ("np", "bytes", "repeats"):
                r[k] = int(r[k])
            for k in ("median_ms", "min_ms", "algbw_mbit", "busbw_mbit"):
                r[k] = float(r[k])
            for k in ("rate_mbit", "busbw_over_rate", "loadavg"):
                r[k] = float(r[k]) if r.get(k) not in ("", "None", None) else None
            out.append(r)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", action="store_true", help="run as one Horovod rank")
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help="comma-separated message sizes per rank")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--np", default="2", help="ranks; a comma list sweeps, e.g. 2,3")
    ap.add_argument("--rate", default="100mbit", help="link rate; a comma list sweeps")
    ap.add_argument("--delay", default=None)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds, per run")
    ap.add_argument("--localhost", action="store_true",
                    help="skip namespaces (plain localhost, no shaping)")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--append", action="store_true")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(parse_sizes(args.sizes), args.repeats)
    nps = [int(x) for x in str(args.np).split(",")]
    rates = [None if x in ("none", "") else x for x in str(args.rate).split(",")]
    rows = []
    for rate in rates:          # sweep: --np 2,3 --rate 100mbit,1gbit
        for np_ in nps:
            part = run_probe(np=np_, rate=rate, delay=args.delay, sizes=args.sizes,
                             repeats=args.repeats, timeout=args.timeout,
                             force_localhost=args.localhost)
            print(format_table(part), flush=True)
            rows += part
            if args.csv:
                write_csv(part, args.csv, append=args.append or len(rows) > len(part))
    if args.csv:
        netem.log(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
