"""What the primitives of the threshold selectors cost on a device, and where one call's time goes.

    python -m benchmarks.device_primitives --device cuda
    .venv/bin/python -m benchmarks.device_primitives --sizes 262144 --trace redsync:100:262144   # a smoke test

On a GPU the selectors' time at bucket sizes is set by launches and host synchronisations,
not by arithmetic (a streaming pass over a 1M-entry bucket takes 0.05 ms on an H100), so
which primitive a selector is built from decides its cost.  Two tables:

* primitives, each timed alone between two synchronisations (median of ``--repeats``):
  ``nonzero`` of a mask (its output size is a host sync) against ``nonzero_static`` with the
  size given (none), a ``sum`` read back, copies of 1 and 32768 values to the host, a sort of
  the candidates, and ten small element-wise operations in a row (the launch cost);
* ``--trace NAME:CF:NUMEL`` (repeatable): one ``compress`` call with a synchronisation after
  every operation, so each row is that operation's own wall time (launch, kernel, the wait):
  the sum is more than the call's time (nothing overlaps) but the slow operation stands out.
  ``NAME:CF:NUMEL:FACTOR`` traces ``compress_further`` by ``FACTOR`` of that compress's payload
  instead: the multi-level step GraVAC takes in every bucket (on an H100 a ResNet101 step with
  GraVAC and DGC took 1.36x a static DGC 10x step, ``call18_9de7cdb/step_cost_cuda.txt``).
"""
from __future__ import annotations

import argparse
import collections
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.compressors import COMPRESSORS, make_input
from benchmarks.sample_order_stats import median_ms


def primitives(n: int, device: torch.device, repeats: int) -> list:
    """``(name, ms)`` of each primitive on an ``n``-entry Laplace tensor, ~1.6 % candidates."""
    a = make_input("laplace", n, 0).to(device).abs()
    thr = torch.quantile(a[:min(n, 1 << 16)].float(), 1.0 - 0.016)
    mask = a >= thr
    count = int(mask.sum())
    cap = 2 * count + 1024
    cand = a[mask]
    small = torch.zeros(1024, device=device)
    block = torch.zeros(1 << 15, device=device)
    rows = [
        ("abs (one element-wise pass)", lambda: a.abs()),
        ("ten small element-wise ops", lambda: [small.add_(1.0) for _ in range(10)]),
        (f"nonzero ({count} of {n})", lambda: torch.nonzero(mask)),
        (f"nonzero_static (size {cap})", lambda: torch.nonzero_static(mask, size=cap, fill_value=-1)),
        ("sum, read back", lambda: float(mask.sum())),
        ("copy 1 value to the host", lambda: small[:1].cpu()),
        ("copy 32768 values to the host", lambda: block.cpu()),
        (f"sort {count} candidates, descending", lambda: torch.sort(cand, descending=True)),
        (f"topk {count // 2} of {count} candidates", lambda: torch.topk(cand, count // 2, sorted=False)),
        (f"index_select {count}", lambda: a.index_select(0, torch.nonzero(mask).view(-1))),
    ]
    if not hasattr(torch, "nonzero_static"):   # torch < 2.1
        rows = [row for row in rows if not row[0].startswith("nonzero_static")]
    return [(name, median_ms(fn, device, repeats)) for name, fn in rows]


class _PerOp(TorchDispatchMode):
    """Each operation's wall time, with a synchronisation before and after it."""

    def __init__(self, sync):
        super().__init__()
        self.sync = sync
        self.rows = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.sync()
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.sync()
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        size = first.numel() if first is not None else 0
        self.rows.append((func._schema.name.replace("aten::", ""), size, (time.perf_counter() - t0) * 1e3))
        return out


def trace(name: str, cf: float, n: int, device: torch.device, repeats: int, further: float = 0.0) -> str:
    t = make_input("laplace", n, 0).to(device)
    comp = COMPRESSORS[name](cf)
    call = lambda: comp.compress(t)   # noqa: E731
    what = "compress"
    if further:
        payload, ctx = comp.compress(t)
        call = lambda: comp.compress_further(payload, ctx, further)   # noqa: E731
        what = f"compress_further x{further:g} of its payload"
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    whole = median_ms(call, device, repeats)
    runs = []
    for _ in range(5):
        with _PerOp(sync) as mode:
            call()
        runs.append(mode.rows)
    # The median of each op's time over the runs whose op at that position is the same one: a
    # call's sequence can differ between runs (a search that stops after fewer rounds).
    def median_at(i, op):
        times = sorted(r[i][2] for r in runs if len(r) > i and r[i][0] == op)
        return times[len(times) // 2]
    ops = [(op, size, median_at(i, op)) for i, (op, size, _) in enumerate(runs[-1])]
    counts = sorted({len(r) for r in runs})
    lines = [f"## {name} CF {cf:g}, {n:,} entries on {device}, {what}: one call {whole:.3f} ms; "
             f"{len(ops)} operations, each alone {sum(o[2] for o in ops):.3f} ms"
             + (f" (operation counts over the runs: {counts})" if len(counts) > 1 else "")]
    for op, size, ms in ops:
        lines.append(f"  {op:28s} {size:>10,}  {ms:7.3f}")
    totals = collections.Counter()
    for op, _, ms in ops:
        totals[op] += ms
    lines.append("  by operation: " + ", ".join(f"{op} {ms:.3f}" for op, ms in totals.most_common(6)))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", default="262144,1048576,6553600")
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--trace", action="append", default=[],
                    help="NAME:CF:NUMEL[:FACTOR], e.g. redsync:100:1048576 (FACTOR: trace compress_further)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"# device primitives on {device} ({name}), torch {torch.__version__}; median of {args.repeats}, ms")
    for n in (int(s) for s in args.sizes.split(",") if s):
        print(f"\n## {n:,} entries")
        for label, ms in primitives(n, device, args.repeats):
            print(f"  {label:44s} {ms:8.3f}")
    for spec in args.trace:
        cname, cf, n, *further = spec.split(":")
        print()
        print(trace(cname, float(cf), int(n), device, args.repeats, float(further[0]) if further else 0.0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
