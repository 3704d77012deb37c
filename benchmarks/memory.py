"""How much memory does each mode take?  Peak memory per rank of GraVAC, static and dense steps
against ``hvd.DistributedOptimizer``'s.

    python -m benchmarks.memory                    # launches itself: horovodrun -np 2 --gloo
    python -m benchmarks.memory --np 3 --model mlp --width 2048
    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.memory   # as is

How memory is measured.  Python's ``tracemalloc`` does not see torch's allocations and
torch has no CPU allocator statistics, so this uses the kernel's accounting:
the process is started with ``MALLOC_MMAP_THRESHOLD_=131072`` (glibc then serves every
block over 128 KiB, i.e. every tensor that matters, with its own mmap and returns it
on free, so resident memory follows live tensors), and before each measured step the
peak-RSS counter is reset (``echo 5 > /proc/self/clear_refs``) and read back afterwards
(``VmHWM``).  Per mode, on every rank:

- persistent = RSS after warm-up steps - RSS with only the model built: gradients,
  optimizer state (momentum), error-feedback residuals, communication buffers;
- transient  = peak RSS during a step - RSS before it: what the step allocates and frees
  (activations, compression temporaries, payloads, gathered buffers, decoded gradients);
- peak       = persistent + transient, the number to compare.

Alongside, the exact numbers: ``optimizer.residual_bytes()`` and the bytes this rank
sent.  The check: residuals cost at most one copy of the parameters per compressor
level actually used (by design they are one fp32 buffer per bucket, whatever the
number of levels: the error-fed gradient is formed in place in that buffer, and the
multi-level candidate is cut from the theta_min payload, never from a second dense copy).

Modes (same model, same data, one after another in the same processes):
  horovod        hvd.DistributedOptimizer (the dense baseline users have today)
  dense          horovod_gravac Dense() (flattens each bucket into one buffer)
  topk-10        StaticCF(10), Top-k (GraVAC's first level below)
  topk-100       StaticCF(100), Top-k
  gravac-settled GraVAC settled at 100 (theta_min == candidate == 100): one level
  gravac-topk    GraVAC exploring: theta_min 10, candidate 100, sending the candidate
                 (both levels computed every step, plus gains and consensus)
  gravac-randomk the same with Random-k (shared seed: values-only allreduce)
  gravac-default GraVAC() as users get it (the predictive rule set), with a window of 8 steps so
                 that its checks fall among the measured steps: besides the residuals it keeps
                 the sum of what its interval sent (one fp32 buffer per bucket)
  dgc-100        StaticCF(100), DGC (when the compressor exists)
"""
import argparse
import gc
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MMAP_THRESHOLD = "131072"


def _status(field):
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+)", text).group(1)) * 1024


def rss():
    return _status("VmRSS")


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak():
    return _status("VmHWM")


def launch(args):
    """Re-run this script under horovodrun with the allocator setting, bounded by a timeout."""
    hvdrun = Path(sys.executable).parent / "horovodrun"
    cmd = [str(hvdrun) if hvdrun.exists() else "horovodrun", "-np", str(args.np), "-H",
           f"localhost:{args.np}", "--gloo", sys.executable, "-m", "benchmarks.memory", *sys.argv[1:]]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=MMAP_THRESHOLD, OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               GRAVAC_MEMORY_CHILD="1")
    try:
        return subprocess.run(cmd, env=env, timeout=args.timeout, cwd=str(ROOT)).returncode
    except subprocess.TimeoutExpired:
        print(f"memory benchmark timed out after {args.timeout}s", file=sys.stderr)
        return 124


def build(args):
    from horovod_gravac.harness.models import build_model
    torch.manual_seed(0)
    if args.model == "mlp":
        w = args.width
        model = torch.nn.Sequential(torch.nn.Linear(256, w), torch.nn.ReLU(), torch.nn.Linear(w, w),
                                    torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                                    torch.nn.Linear(w, 10))
        g = torch.Generator().manual_seed(1)
        data = torch.randn(args.batch, 256, generator=g), torch.randint(0, 10, (args.batch,), generator=g)
    else:
        classes = 100 if args.model == "vgg16" else 10
        model = build_model(args.model, num_classes=classes)
        g = torch.Generator().manual_seed(1)
        data = (torch.randn(args.batch, 3, 32, 32, generator=g),
                torch.randint(0, classes, (args.batch,), generator=g))
    return model, data


def modes():
    import horovod_gravac as hg
    from horovod_gravac.controllers import Decision, PaperGraVAC

    class PinnedGraVAC(PaperGraVAC):
        """GraVAC doing all its per-step work but held at one decision (both levels used)."""

        def __init__(self, theta_min, candidate):
            super().__init__(theta_min=theta_min, theta_max=candidate, epsilon=0.01, window=10 ** 9,
                             variant="paper")
            self.pinned = Decision(candidate, theta_min, candidate)
            self.adopt(self.pinned)

        def observe(self, obs):
            super().observe(obs)
            self.decision = self.pinned
            return self.decision

    out = {
        "horovod": None,
        "dense": dict(controller=hg.Dense(), levels=0),
        "topk-10": dict(controller=hg.StaticCF(10), compressor=hg.TopKCompressor, levels=1),
        "topk-100": dict(controller=hg.StaticCF(100), compressor=hg.TopKCompressor, levels=1),
        "gravac-settled": dict(controller=PinnedGraVAC(100, 100), compressor=hg.TopKCompressor, levels=1),
        "gravac-topk": dict(controller=PinnedGraVAC(10, 100), compressor=hg.TopKCompressor, levels=2),
        "gravac-randomk": dict(controller=PinnedGraVAC(10, 100), compressor=hg.RandomKCompressor, levels=2),
        # the default rule set, checking every couple of steps: its interval's sums ride along
        "gravac-default": dict(controller=hg.GraVAC(window=8), compressor=hg.TopKCompressor, levels=1),
    }
    from horovod_gravac import compressors
    if hasattr(compressors, "DGCCompressor"):
        out["dgc-100"] = dict(controller=hg.StaticCF(100), compressor=compressors.DGCCompressor, levels=1)
    return out


def measure(args, name, spec):
    import horovod.torch as hvd
    import horovod_gravac as hg
    gc.collect()
    model, (x, y) = build(args)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gc.collect()
    base = rss()
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if spec is None:
        opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
        levels = 0
    else:
        spec = dict(spec)
        levels = spec.pop("levels")
        opt = hg.DistributedOptimizer(sgd, named_parameters=model.named_parameters(), **spec)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    gc.collect()
    steady = rss()
    transient, times = 0, []
    for _ in range(args.steps):
        before = rss()
        reset_peak()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
        transient = max(transient, peak() - before)
    params = [p for p in model.parameters() if p.requires_grad]
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    row = {"mode": name, "levels": levels, "param_bytes": param_bytes,
           "persistent": steady - base, "transient": transient, "peak": steady - base + transient,
           "residual_bytes": opt.residual_bytes() if hasattr(opt, "residual_bytes") else 0,
           "fp32_param_copy": 4 * sum(p.numel() for p in params),
           "bytes_sent": getattr(opt, "stats", {}).get("bytes_sent", 4 * sum(p.numel() for p in params)),
           "step_s": sorted(times)[len(times) // 2]}
    if hasattr(opt, "close"):
        opt.close()
    del opt, sgd, model
    gc.collect()
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--np", type=int, default=2, help="ranks when launching itself")
    ap.add_argument("--model", default="vgg16", choices=["vgg16", "resnet101", "mlp"])
    ap.add_argument("--width", type=int, default=1536, help="MLP hidden width")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=None)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "memory"))
    ap.add_argument("--timeout", type=int, default=1800)
    args = ap.parse_args()
    if "HOROVOD_RANK" not in os.environ and not os.environ.get("GRAVAC_MEMORY_CHILD"):
        sys.exit(launch(args))
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != MMAP_THRESHOLD:
        print(f"note: MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD} is not set; freed tensors may stay "
              f"resident and transient figures are then lower bounds", file=sys.stderr)

    import horovod.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    table = modes()
    names = args.modes or list(table)
    for warm in ("horovod", "dense"):   # first-use allocations (Horovod's buffers, lazy imports)
        measure(args, "warm-up", table[warm])
    rows = [measure(args, n, table[n]) for n in names]
    everyone = hvd.allgather_object(rows, name="memory.rows")
    if hvd.rank() != 0:
        return
    # Per mode, the worst rank.
    worst = []
    for i, row in enumerate(rows):
        r = dict(row)
        for k in ("persistent", "transient", "peak", "residual_bytes", "bytes_sent"):
            r[k] = max(ranks[i][k] for ranks in everyone)
        worst.append(r)
    ref = next((r for r in worst if r["mode"] == "horovod"), worst[0])
    mb = 2 ** 20
    lines = [f"# Peak memory per rank: {args.model}, {worst[0]['param_bytes'] / mb:.1f} MiB of parameters, "
             f"batch {args.batch}, {hvd.size()} ranks (Gloo, CPU), worst rank",
             "",
             "| mode | levels | persistent MiB | transient MiB | peak MiB | peak vs horovod | residuals MiB "
             "| residuals / fp32 param copy | check | sent MiB/step | step s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ok_all = True
    for r in worst:
        copies = r["residual_bytes"] / r["fp32_param_copy"]
        ok = r["residual_bytes"] <= max(1, r["levels"]) * r["fp32_param_copy"]
        ok_all &= ok
        lines.append(f"| {r['mode']} | {r['levels']} | {r['persistent'] / mb:.1f} | {r['transient'] / mb:.1f} "
                     f"| {r['peak'] / mb:.1f} | {r['peak'] / ref['peak']:.2f}x | {r['residual_bytes'] / mb:.1f} "
                     f"| {copies:.2f} | {'PASS' if ok else 'FAIL'} | {r['bytes_sent'] / mb:.2f} "
                     f"| {r['step_s']:.2f} |")
    lines += ["", "persistent: RSS after warm-up minus RSS with the model only (gradients, momentum, "
              "residuals, buffers); transient: peak RSS during a step minus RSS before it; "
              "check: residuals <= one fp32 copy of the parameters per compressor level used "
              "(dense modes: the flat communication buffer, allowed one copy).",
              f"target met: {'yes' if ok_all else 'NO'}"]
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = f"{args.model}_np{hvd.size()}"
        (out / f"{stem}.md").write_text(text + "\n")
        (out / f"{stem}.json").write_text(json.dumps({"args": vars(args), "per_rank": everyone,
                                                      "worst_rank": worst}, indent=1))


if __name__ == "__main__":
    main()
