"""What the GraVAC DDP hook costs per step, next to DDP's own hooks, on one process.

DDP runs its comm hook at world size 1 too, so one GPU measures the hook's own cost: the
encoder (Top-k selection, error feedback, the gain's multi-level compression), the
bookkeeping and the (one-rank) collectives, on top of forward and backward.  Each
configuration trains the same model on the same random batch for ``--warmup`` steps, then
times ``--steps`` steps (``torch.cuda.synchronize`` around each on a GPU) and reports the
median, and its ratio to DDP's default hook::

    python -m benchmarks.ddp_step_cost --device cuda              # ResNet-50, batch 64, NCCL
    python -m benchmarks.ddp_step_cost --device cpu --model resnet-tiny --steps 3 --warmup 1

Under ``torchrun`` it runs on every rank (``env://``) and rank 0 prints; alone it starts a
one-rank group itself (NCCL on ``cuda``, Gloo on ``cpu``).

``resnet50``: ``torchvision.models.resnet50`` when torchvision is installed; otherwise the
harness's Bottleneck ResNet with ResNet-50's blocks ``[3, 4, 6, 3]``, 1000 classes, fed 56x56
images.  Its stem is CIFAR's (3x3, stride 1, no max-pool), so at 56x56 every stage sees the
feature maps ResNet-50 sees at 224x224 (its stem divides by 4): the same 25.5 M parameters
within 0.04 %, and about the same work per stage.  The report names the model it ran.

Configurations (``--configs``, comma-separated):
    allreduce    no hook: DDP's default allreduce
    fp16         torch's default_hooks.fp16_compress_hook
    powersgd4    torch's powerSGD_hook, rank 4, compressing from the first step
    hg-dense     gravac_hook with Dense(): the hook's fixed cost over DDP's allreduce
    hg-fp16      gravac_hook with Dense() and compression="fp16"
    topk10/100/1000  gravac_hook, static Top-k with error feedback
    accordion    gravac_hook, Accordion(10, 1000)
    gravac       gravac_hook, the default GraVAC() (its step includes the gain's extra levels)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

CONFIGS = ("allreduce", "fp16", "powersgd4", "hg-dense", "hg-fp16", "topk10", "topk100", "topk1000",
           "accordion", "gravac")


def build_model(name: str, num_classes: int = 1000):
    """``(model, image_size, label)``."""
    from horovod_gravac.harness.models import ResNet
    if name == "resnet50":
        try:
            import torchvision
            return torchvision.models.resnet50(num_classes=num_classes), 224, "torchvision resnet50, 224x224"
        except ImportError:
            model = ResNet((3, 4, 6, 3), num_classes=num_classes, width=64)
            return model, 56, "harness ResNet [3,4,6,3] (ResNet-50's stages), 56x56, torchvision absent"
    if name == "resnet-tiny":
        return ResNet((1, 1, 1, 1), num_classes=10, width=8), 16, "harness ResNet [1,1,1,1] width 8, 16x16"
    raise ValueError(f"--model must be resnet50 or resnet-tiny, got {name!r}")


def make_hook(name: str, window: int):
    """``(state, hook)``; hook None: DDP's default allreduce."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    import horovod_gravac as hg
    if name not in CONFIGS:
        raise ValueError(f"unknown configuration {name!r}; choose from {', '.join(CONFIGS)}")
    if name == "allreduce":
        return None, None
    if name == "fp16":
        return None, default_hooks.fp16_compress_hook
    if name == "powersgd4":
        return (powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                            start_powerSGD_iter=2, min_compression_rate=2, random_seed=0),
                powerSGD_hook.powerSGD_hook)
    if name in ("hg-dense", "hg-fp16"):
        return (hg.ddp.GravacState(None, controller=hg.Dense(), compression="fp16" if name == "hg-fp16" else "none"),
                hg.ddp.gravac_hook)
    from benchmarks.ddp_hooks import package_hook
    return package_hook(name, window)


def one_rank_group(backend: str) -> None:
    """A process group of this process alone (DDP runs its comm hook at world size 1 too).
    It meets through a file, as tests/integration/test_ddp.py's does: no port to find free."""
    import tempfile

    import torch.distributed as dist
    init = "file://" + os.path.join(tempfile.mkdtemp(), "rendezvous")
    dist.init_process_group(backend, init_method=init, rank=0, world_size=1)


def time_config(name: str, args, device, dist) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model, size, label = build_model(args.model)
    model = model.to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    state, hook = make_hook(name, args.window)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch_size, 3, size, size, device=device)
    y = torch.randint(0, 1000 if args.model == "resnet50" else 10, (args.batch_size,), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for step in range(args.warmup + args.steps):
        sync()
        t0 = time.perf_counter()
        loss = F.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    stats = getattr(state, "stats", None) or {}
    params = sum(p.numel() for p in model.parameters())
    del ddp, model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"config": name, "median_ms": 1e3 * statistics.median(times), "min_ms": 1e3 * min(times),
            "cf": float(stats.get("cf", 1.0) or 1.0), "model": label, "params": params}


def report(rows, args, device_name: str, world: int) -> str:
    base = next((r["median_ms"] for r in rows if r["config"] == "allreduce"), None)
    lines = [f"# DDP step cost: {rows[0]['model']} ({rows[0]['params'] / 1e6:.1f} M parameters), "
             f"batch {args.batch_size}, {world} rank(s), {device_name}",
             f"`python -m benchmarks.ddp_step_cost --device {args.device}`; median of {args.steps} steps "
             f"after {args.warmup} warm-up steps; 'vs allreduce': the step time over DDP's default hook's.",
             "", "| config | ms/step (median) | ms/step (min) | vs allreduce | CF at the end |",
             "|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['median_ms'] / base:.2f}" if base else "-"
        lines.append(f"| {r['config']} | {r['median_ms']:.1f} | {r['min_ms']:.1f} | {ratio} | {r['cf']:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--model", default="resnet50", choices=("resnet50", "resnet-tiny"))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--window", type=int, default=20, help="GraVAC's window and Accordion's interval "
                   "(short, so that the timed steps include their checks)")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--out", default=None, help="also write the table to this file")
    args = p.parse_args(argv)
    configs = [c for c in args.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            p.error(f"unknown configuration {c!r}; choose from {', '.join(CONFIGS)}")

    import torch
    import torch.distributed as dist
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu", file=sys.stderr)
        return 2
    backend = "nccl" if args.device == "cuda" else "gloo"
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
    else:
        one_rank_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device, device_name = torch.device("cuda", local), torch.cuda.get_device_name(local)
    else:
        device, device_name = torch.device("cpu"), f"CPU ({torch.get_num_threads()} threads)"
    rows = []
    for c in configs:
        try:
            rows.append(time_config(c, args, device, dist))
        except Exception as e:   # one failed hook must not lose the others' figures
            print(f"{c}: failed: {type(e).__name__}: {e}", file=sys.stderr)
        if rank == 0 and rows and rows[-1]["config"] == c:
            print(f"{c}: {rows[-1]['median_ms']:.1f} ms/step", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and rows:
        text = report(rows, args, device_name, world)
        print(text)
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                f.write(text)
    return 0 if len(rows) == len(configs) else 1


if __name__ == "__main__":
    sys.exit(main())
