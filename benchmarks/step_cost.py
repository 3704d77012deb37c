#!/usr/bin/env python3
"""What does a training step cost, and where does it go?  One benchmark, four modes:

    python -m benchmarks.step_cost launches                     # CPU: the accelerators' paths, emulated
    python -m benchmarks.step_cost launches --device cuda       # what the optimizer adds to plain torch
    python -m benchmarks.step_cost compressors --device cuda    # each compressor in a real training step
    python -m benchmarks.step_cost ddp --device cuda            # the GraVAC DDP hook against DDP's own hooks
    python -m benchmarks.step_cost network                      # 2 ranks on emulated links (as root)

``launches`` -- what ``hg.DistributedOptimizer`` adds to plain torch per step, on one rank:
dispatched operations and host time.  On a GPU every dispatched operation costs host time,
and every one that is not a view also launches a kernel; a backward of many small layers
(ResNet101 at batch 32 on an H100) is bound by those launches, so work the optimizer adds per
*parameter* (one ``copy_`` per gradient, 314 of them for ResNet101) adds to the step even
where the GPU has time to spare.  This counts, per step, what the optimizer's bucket hooks and
``step()`` add to plain torch (the same backward and SGD step with no distributed optimizer):

* ``launches``: operations that run a kernel; ``views``: operations that only make a view
  (dispatched, no kernel); ``syncs``: host synchronisations (``.item()``, ``nonzero``, ...);
* ``ms``: the wall time of a step, median over ``--rounds`` interleaved rounds of ``--steps``
  steps, and what it adds to plain torch.  The loss is ``sum(w * p.sum())`` over the
  parameters, so the backward is a few operations per parameter and the step is bound by
  dispatch, not arithmetic: the time is the host overhead a launch-bound GPU step would see.

On the CPU the accelerators' code paths are forced, as ``tests/unit/test_host_syncs.py`` does.
Rows: the dense controller, DGC and Top-k at 10x, and GraVAC with DGC.  Models: the harness's
ResNet101 (314 tensors) and VGG16 (32), at ``--width`` (default: the paper's size on a GPU;
ResNet101 stem 8 and VGG16 x0.125 on the CPU, where copying the full 42.5M entries would hide
the dispatch cost).

``compressors`` -- what each compressor adds to a real training step on one device: plain
torch, then the harness (``horovod_gravac.harness.train``) with the dense controller and with
each static compressor, one rank, so there is no network: what differs between the rows is
the work each compressor adds (compressing, error feedback, decompressing) and the host
synchronisations inside the bucket hooks, which on a GPU hold back the launches of the
backward kernels queued after them (so a row's step time can grow by more than its
``compress`` column).  Each harness row is its own process, run one after the other; the
table gives medians over the steps after the first ``--skip`` (warm-up).  Data: random data
in the real formats (``scripts/make_synthetic_datasets.py``; nothing is downloaded).  The GPU
check (``scripts/gpu_check.sh``) runs it and ``launches``; their figures are in docs/gpu.md.

``ddp`` -- what the GraVAC DDP hook costs per step, next to DDP's own hooks, on one process.
DDP runs its comm hook at world size 1 too, so one GPU measures the hook's own cost: the
encoder (Top-k selection, error feedback, the gain's multi-level compression), the
bookkeeping and the (one-rank) collectives, on top of forward and backward.  Each
configuration trains the same model on the same random batch for ``--warmup`` steps, then
times ``--steps`` steps (``torch.cuda.synchronize`` around each on a GPU) and reports the
median, and its ratio to DDP's default hook.  Under ``torchrun`` it runs on every rank
(``env://``) and rank 0 prints; alone it starts a one-rank group itself (NCCL on ``cuda``, Gloo
on ``cpu``).  ``resnet50``: ``torchvision.models.resnet50`` when torchvision is installed;
otherwise the harness's Bottleneck ResNet with ResNet-50's blocks ``[3, 4, 6, 3]``, 1000
classes, fed 56x56 images.  Its stem is CIFAR's (3x3, stride 1, no max-pool), so at 56x56
every stage sees the feature maps ResNet-50 sees at 224x224 (its stem divides by 4): the same
25.5 M parameters within 0.04 %, and about the same work per stage.  The report names the
model it ran.  Configurations (``--configs``, comma-separated):

    allreduce    no hook: DDP's default allreduce
    fp16         torch's default_hooks.fp16_compress_hook
    powersgd4    torch's powerSGD_hook, rank 4, compressing from the first step
    hg-dense     gravac_hook with Dense(): the hook's fixed cost over DDP's allreduce
    hg-fp16      gravac_hook with Dense() and compression="fp16"
    topk10/100/1000  gravac_hook, static Top-k with error feedback
    accordion    gravac_hook, Accordion(10, 1000)
    gravac       gravac_hook, the default GraVAC() (its step includes the gain's extra levels)

``network`` -- how close is each path's training step to what its bytes allow?  For every
path (Dense, ``hvd.DistributedOptimizer`` as the reference, StaticCF 10/100/1000, GraVAC
pinned at 10x, Accordion at 10x), two models and two emulated link rates, ``--np`` ranks (2):

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
reference).  Models: ``cnn1d`` (a 1D CNN, 1.17M parameters: one bucket, its whole gradient
ready at the end of backward; batches of 32 sequences of 64) and ``resnet`` (a bottleneck
ResNet with one block per stage, 0.51M parameters in 53 tensors, cut into buckets of at most
0.1 MB; batches of 32 images of 16x16).

    python -m benchmarks.step_cost network                # both models, 100mbit and 1gbit (~15 min)
    python -m benchmarks.step_cost network --models cnn1d --rates 100mbit --blocks 4   # a quick look

It writes ``benchmarks/results/step_cost/network.md`` and ``.csv`` (``--out`` changes the
prefix).  It needs root for the emulated network (``benchmarks/netem.py``); without it, or with
``--localhost``, ranks run on plain localhost and the rates are not applied (the output says
so).

Every mode takes ``--out FILE`` to write what it prints (``network``: a prefix for .md and .csv).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.interleave import cell, launch_json, train_interleaved

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODES = ("launches", "compressors", "ddp", "network")


# ----------------------------------------------------------------------------- shared
def device_sync(device):
    """``torch.cuda.synchronize`` on a GPU (a timed call covers its kernels, not their
    launch), nothing on the CPU."""
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def median_ms(fn, device, repeats, warmup=3):
    """Median wall time of ``fn()`` in ms over ``repeats`` calls after ``warmup`` calls."""
    sync = device_sync(device)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def write_text(text: str, out: Optional[str]) -> None:
    """``--out``: also write what the mode printed to this file."""
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")


# ----------------------------------------------------------------------------- launches
#: The aten operations that make an accelerator wait for the host (a result whose size or
#: value Python needs); tests/unit/test_host_syncs.py counts with the same set.
SYNC_OPS = {"aten::nonzero", "aten::nonzero_static", "aten::masked_select", "aten::_local_scalar_dense",
            "aten::unique", "aten::_unique", "aten::_unique2", "aten::unique_consecutive",
            "aten::unique_dim", "aten::repeat_interleave", "aten::is_nonzero", "aten::equal"}
FREE = {"aten::detach", "aten::lift_fresh", "aten::alias"}   # no kernel, no new tensor data


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.launches = self.views = self.syncs = 0
        self.names = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if func.is_view or name in FREE:
            self.views += 1
        else:
            self.launches += 1
            self.names[name] += 1
        self.syncs += name in SYNC_OPS
        return func(*args, **(kwargs or {}))


def selection_accelerator_patches():
    """``(module, attribute, replacement)``: the selectors' accelerator paths on CPU tensors
    (tests/unit/test_host_syncs.py's ``accelerator_path`` fixture applies the same)."""
    import horovod_gravac.selection.base as selection_base
    import horovod_gravac.selection.kernels as kernels
    import horovod_gravac.selection.redsync as redsync
    import horovod_gravac.selection.sampling as sampling
    return [(kernels, "_chunked", lambda flat: False),
            (kernels, "host_path", lambda flat: False),            # the CPU host path has no device
            (sampling, "_sorts", lambda sample: True),              # thresholds off one sort, as on a GPU
            (redsync, "_resolves", lambda values: True),            # RedSync's steps resolved, as on a GPU
            (selection_base, "_exact_further", lambda values: True)]   # further: one topk


@contextlib.contextmanager
def accelerator_paths():
    """The code paths a GPU runs, on CPU tensors: the selectors', the encoder's (no free
    reads of a norm), and the native kernels off."""
    import horovod_gravac.encoder as encoder
    import horovod_gravac.native as native
    patches = [(encoder, "_reads_back_freely", lambda t: False)] + selection_accelerator_patches()
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    previous = native.use("off")
    try:
        for mod, name, fn in patches:
            setattr(mod, name, fn)
        yield
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)
        native.use(previous)


LAUNCH_ROWS = ("dense", "dgc-10", "topk-10", "gravac-dgc")   # besides plain torch


def launch_rows():
    """name -> keyword arguments of hg.DistributedOptimizer (None: plain torch); the names
    are ``LAUNCH_ROWS``."""
    import horovod_gravac as hg
    from horovod_gravac.compressors import DGCCompressor, TopKCompressor
    return {"plain torch": None, "dense": {}, "dgc-10": dict(compression=DGCCompressor(10)),
            "topk-10": dict(compression=TopKCompressor(10)),
            "gravac-dgc": dict(compressor=DGCCompressor,
                               controller=hg.GraVAC(theta_min=10, theta_max=1000, window=5))}


class Loop:
    """One model copy and its optimizer; ``step()`` is one training step."""

    def __init__(self, model_name: str, width, device, kwargs):
        import horovod_gravac as hg
        from horovod_gravac.harness.models import build_model
        torch.manual_seed(0)
        self.model = build_model(model_name, 10, width=width).to(device)
        params = list(self.model.parameters())
        self.weights = torch.linspace(0.5, 1.5, len(params), device=device)
        opt = torch.optim.SGD(params, lr=1e-6)
        if kwargs is not None:
            opt = hg.DistributedOptimizer(opt, named_parameters=self.model.named_parameters(), **kwargs)
        self.opt, self.params = opt, params

    def step(self):
        self.opt.zero_grad()
        loss = sum(w * p.sum() for w, p in zip(self.weights, self.params))
        loss.backward()
        self.opt.step()


def measure_launches(model_name: str, width, device, steps: int, rounds: int, names):
    loops = {name: Loop(model_name, width, device, kw) for name, kw in launch_rows().items() if name in names}
    sync = device_sync(device)
    for loop in loops.values():   # warm-up: buffers, the controllers' first windows
        for _ in range(12):
            loop.step()
    counts = {}
    for name, loop in loops.items():
        loop.opt.zero_grad()
        loss = sum(w * p.sum() for w, p in zip(loop.weights, loop.params))
        with OpCounter() as c:
            loss.backward()
            loop.opt.step()
        counts[name] = c
    times = collections.defaultdict(list)
    for _ in range(rounds):
        for name, loop in loops.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                loop.step()
            sync()
            times[name].append((time.perf_counter() - t0) / steps * 1e3)
    n_params = len(next(iter(loops.values())).params)
    n_entries = sum(p.numel() for p in next(iter(loops.values())).params)
    return counts, {k: statistics.median(v) for k, v in times.items()}, n_params, n_entries


def launches_main(args) -> int:
    import horovod.torch as hvd
    hvd.init()
    device = torch.device(args.device)
    names = list(launch_rows())
    if args.runs:
        names = ["plain torch"] + [n for n in args.runs.split(",") if n and n != "plain torch"]
    path = "accelerator" if device.type == "cpu" else device.type
    forced = accelerator_paths() if device.type == "cpu" else contextlib.nullcontext()
    lines = []

    def say(line=""):
        lines.append(line)
        print(line, flush=True)
    say(f"# step launches: device {device}"
        + (f" ({torch.cuda.get_device_name(0)})" if device.type == "cuda" else "")
        + f", {path} code paths, torch {torch.__version__}, one rank; ms: median of {args.rounds} "
        f"interleaved rounds of {args.steps} steps")
    with forced:
        for model_name in args.models.split(","):
            default = {"resnet101": 8, "vgg16": 0.125}.get(model_name) if device.type == "cpu" else None
            width = args.width if args.width is not None else default
            counts, ms, n_params, n_entries = measure_launches(model_name, width, device, args.steps, args.rounds,
                                                               names)
            base, base_ms = counts["plain torch"], ms["plain torch"]
            say()
            say(f"## {model_name} (width {width if width is not None else 'full'}): {n_params} parameter "
                f"tensors, {n_entries:,} entries; added to plain torch per step")
            say(f"{'run':12s} {'launches':>9s} {'views':>7s} {'syncs':>6s} {'step ms':>8s} {'added ms':>9s}")
            for name in names:
                c = counts[name]
                if name == "plain torch":
                    say(f"{name:12s} {c.launches:9d} {c.views:7d} {c.syncs:6d} {ms[name]:8.2f} {'-':>9s}"
                        "   (its own totals)")
                    continue
                say(f"{name:12s} {c.launches - base.launches:9d} {c.views - base.views:7d} "
                    f"{c.syncs - base.syncs:6d} {ms[name]:8.2f} {ms[name] - base_ms:9.2f}")
                if args.top:
                    added = c.names.copy()
                    added.subtract(base.names)
                    top = [f"{n.replace('aten::', '')} {v}" for n, v in added.most_common(args.top) if v > 0]
                    say(f"{'':12s} {', '.join(top)}")
    write_text("\n".join(lines), args.out)
    return 0


# ----------------------------------------------------------------------------- compressors
# name -> harness arguments after --preset
RUNS = {
    "dense": ["--controller", "dense"],
    "topk-10": ["--controller", "static", "--compressor", "topk", "--cf", "10"],
    "dgc-10": ["--controller", "static", "--compressor", "dgc", "--cf", "10"],
    "randomk-10": ["--controller", "static", "--compressor", "randomk", "--cf", "10"],
    "topk-100": ["--controller", "static", "--compressor", "topk", "--cf", "100"],
    "dgc-100": ["--controller", "static", "--compressor", "dgc", "--cf", "100"],
    "redsync-100": ["--controller", "static", "--compressor", "redsync", "--cf", "100"],
    "sidco-100": ["--controller", "static", "--compressor", "sidco", "--cf", "100"],
    "gravac-dgc": ["--controller", "gravac", "--compressor", "dgc", "--window", "10"],
}


def plain_step_ms(preset: str, device: str, steps: int, skip: int) -> Optional[float]:
    """Median step of the preset's image model and batch with plain torch SGD, or None
    for a model this loop does not build (text models: the harness rows still run)."""
    from horovod_gravac.harness.models import build_model
    from horovod_gravac.harness.train import PRESETS
    p = PRESETS[preset]
    shapes = {"cifar10": (10, 3, 32), "cifar100": (100, 3, 32)}
    if p.get("dataset") not in shapes:
        return None
    classes, channels, side = shapes[p["dataset"]]
    torch.manual_seed(0)
    model = build_model(p["model"], num_classes=classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=p.get("lr", 0.1), momentum=p.get("momentum", 0.0),
                          weight_decay=p.get("weight_decay", 0.0))
    batch = p.get("batch_size", 32)
    x = torch.randn(batch, channels, side, side, device=device)
    y = torch.randint(0, classes, (batch,), device=device)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return median_ms(step, torch.device(device), steps - skip, warmup=skip)


def summarize(run_dir: str, skip: int) -> dict:
    """Medians (ms) of a harness run's per-step times, and the floats it sent."""
    from horovod_gravac.harness import runlog
    rows = runlog.load_run(run_dir).steps
    rows = rows[skip:] or rows

    def med(key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(vals) * 1e3 if vals else float("nan")
    return {"step": med("step_time"), "compress": med("compress_time"), "comm": med("comm_time"),
            "floats": sum(r["floats_sent"] for r in rows) / max(1, sum(r["dense_floats"] for r in rows)),
            "cfs": sorted({r["cf"] for r in rows})}


def compressors_main(args) -> int:
    names = [n for n in args.runs.split(",") if n]
    from horovod_gravac.harness.train import PRESETS
    dataset = PRESETS[args.preset].get("dataset")
    work = tempfile.mkdtemp(prefix="step_cost_")
    data = None
    if dataset in ("cifar10", "cifar100", "ptb"):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_synthetic_datasets.py"), work],
                       check=True, stdout=subprocess.DEVNULL)
        data = os.path.join(work, dataset)

    lines = [f"# step cost: {args.preset}, one rank, device {args.device}"
             + (f" ({torch.cuda.get_device_name(0)})" if args.device.startswith("cuda") else "")
             + f", torch {torch.__version__}; medians of steps {args.skip + 1}-{args.steps}",
             f"{'run':14s} {'step ms':>8s} {'x plain':>8s} {'x dense':>8s} {'compress':>9s} {'comm':>7s} "
             f"{'floats':>7s}  CFs sent"]
    print("\n".join(lines), flush=True)
    plain = plain_step_ms(args.preset, args.device, args.steps, args.skip)
    if plain is not None:
        lines.append(f"{'plain torch':14s} {plain:8.1f} {1.0:8.2f} {'-':>8s} {'-':>9s} {'-':>7s} {'-':>7s}  -")
        print(lines[-1], flush=True)
    dense = None
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in names:
        out = os.path.join(work, name)
        cmd = [sys.executable, "-m", "horovod_gravac.harness.train", "--preset", args.preset,
               "--device", args.device, "--steps", str(args.steps), "--eval-every", str(10 * args.steps),
               "--max-eval-batches", "1", "--log-every", str(args.steps), "--out", out] + RUNS[name]
        if data:
            cmd += ["--data", data]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            failed = proc.returncode != 0 and (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        except subprocess.TimeoutExpired:
            failed = [f"timed out after {args.timeout:g} s"]
        if failed:
            lines.append(f"{name:14s} FAILED: {failed[0] if failed else ''}")
        else:
            s = summarize(out, args.skip)
            dense = s["step"] if name == "dense" else dense
            x_plain = f"{s['step'] / plain:8.2f}" if plain else f"{'-':>8s}"
            x_dense = f"{s['step'] / dense:8.2f}" if dense else f"{'-':>8s}"
            lines.append(f"{name:14s} {s['step']:8.1f} {x_plain} {x_dense} {s['compress']:9.1f} {s['comm']:7.1f} "
                         f"{s['floats']:7.3f}  {', '.join(f'{c:g}' for c in s['cfs'])}")
        print(lines[-1], flush=True)
    lines.append(f"# harness runs and their logs: {work}")
    print(lines[-1])
    write_text("\n".join(lines), args.out)
    return 0


# ----------------------------------------------------------------------------- ddp
DDP_CONFIGS = ("allreduce", "fp16", "powersgd4", "hg-dense", "hg-fp16", "topk10", "topk100", "topk1000",
               "accordion", "gravac")


def ddp_model(name: str, num_classes: int = 1000):
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


def ddp_hook(name: str, window: int):
    """``(state, hook)``; hook None: DDP's default allreduce."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    import horovod_gravac as hg
    if name not in DDP_CONFIGS:
        raise ValueError(f"unknown configuration {name!r}; choose from {', '.join(DDP_CONFIGS)}")
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
    import torch.distributed as dist
    init = "file://" + os.path.join(tempfile.mkdtemp(), "rendezvous")
    dist.init_process_group(backend, init_method=init, rank=0, world_size=1)


def ddp_time_config(name: str, args, device) -> dict:
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model, size, label = ddp_model(args.model)
    model = model.to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    state, hook = ddp_hook(name, args.window)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(args.batch_size, 3, size, size, device=device)
    y = torch.randint(0, 1000 if args.model == "resnet50" else 10, (args.batch_size,), device=device)
    sync = device_sync(device)
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


def ddp_report(rows, args, device_name: str, world: int) -> str:
    base = next((r["median_ms"] for r in rows if r["config"] == "allreduce"), None)
    lines = [f"# DDP step cost: {rows[0]['model']} ({rows[0]['params'] / 1e6:.1f} M parameters), "
             f"batch {args.batch_size}, {world} rank(s), {device_name}",
             f"`python -m benchmarks.step_cost ddp --device {args.device}`; median of {args.steps} steps "
             f"after {args.warmup} warm-up steps; 'vs allreduce': the step time over DDP's default hook's.",
             "", "| config | ms/step (median) | ms/step (min) | vs allreduce | CF at the end |",
             "|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r['median_ms'] / base:.2f}" if base else "-"
        lines.append(f"| {r['config']} | {r['median_ms']:.1f} | {r['min_ms']:.1f} | {ratio} | {r['cf']:.0f} |")
    return "\n".join(lines) + "\n"


def ddp_main(args) -> int:
    configs = [c for c in args.configs.split(",") if c]
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
            rows.append(ddp_time_config(c, args, device))
        except Exception as e:   # one failed hook must not lose the others' figures
            print(f"{c}: failed: {type(e).__name__}: {e}", file=sys.stderr)
        if rank == 0 and rows and rows[-1]["config"] == c:
            print(f"{c}: {rows[-1]['median_ms']:.1f} ms/step", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0 and rows:
        text = ddp_report(rows, args, device_name, world)
        print(text)
        write_text(text, args.out)
    return 0 if len(rows) == len(configs) else 1


# ----------------------------------------------------------------------------- network
NETWORK_PATHS = ("dense", "hvd", "static10", "static100", "static1000", "gravac-pinned10", "accordion10")
NETWORK_MODELS = ("cnn1d", "resnet")
NETWORK_RATES = ("100mbit", "1gbit")
NETWORK_OUT = os.path.join(HERE, "results", "step_cost", "network")
BLOCK = 10          # steps per block; paths take turns block by block
BUCKET_CAP_MB = {"cnn1d": 25.0, "resnet": 0.1}


def _network_model(name: str):
    """(model, input shape without the batch)."""
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


def _network_optimizer(path: str, model, bucket_cap_mb: float):
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


def network_worker(args) -> int:
    """One rank of a ``network`` launch: every path, interleaved in blocks; rank 0 prints a
    ``STEP_TIME`` line of JSON."""
    import horovod.torch as hvd
    hvd.init()
    torch.set_num_threads(1)
    model_name, paths = args.model, args.paths.split(",")
    runs = {}
    for path in paths:
        model, shape = _network_model(model_name)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = _network_optimizer(path, model, BUCKET_CAP_MB[model_name])
        runs[path] = dict(model=model, opt=opt, times=[], stats=[])
    n_params = [p.numel() for p in runs[paths[0]]["model"].parameters()]
    g = torch.Generator().manual_seed(hvd.rank())
    x = torch.randn((32,) + shape, generator=g)
    y = torch.randint(0, 10, (32,), generator=g)
    train_interleaved(runs, x, y, args.blocks, BLOCK, plain=("hvd",))
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
            timeout: float, localhost: bool = False) -> dict:
    return launch_json(["benchmarks.step_cost", "network", "--worker", "--model", model, "--paths", ",".join(paths),
                        "--blocks", str(blocks), "--bare", str(bare)], "STEP_TIME", np_, rate, timeout,
                       force_localhost=localhost)[0]


def _rate_bps(rate: str) -> float:
    from benchmarks.netem import parse_rate
    return parse_rate(rate)


def measure_network(models, rates, paths, blocks: int, bare: int, np_: int, timeout: float,
                    localhost: bool = False) -> List[dict]:
    rows = []
    for model in models:
        compute = _launch(model, paths, None, blocks, 0, np_, timeout, localhost)
        print(f"[step_cost network] {model}: compute measured ({compute['mode']})", file=sys.stderr, flush=True)
        for rate in rates:
            data = _launch(model, paths, rate, blocks, bare, np_, timeout, localhost)
            print(f"[step_cost network] {model} at {rate} ({data['mode']})", file=sys.stderr, flush=True)
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


def write_network(rows: List[dict], out: str, command: str, np_: int = 2) -> None:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
    lines = ["# Step time against the link floor", "",
             f"Written by `{command}`; {np_} ranks, medians over interleaved blocks of {BLOCK} steps.",
             "floor (wire) = compute + bytes per rank / rate; floor (bare) = compute + the same collectives "
             "run by bare Horovod calls; hidden = share of the bare collectives' time the step did not pay.", ""]
    for (model, rate) in dict.fromkeys((r["model"], r["rate"]) for r in rows):
        part = [r for r in rows if r["model"] == model and r["rate"] == rate]
        lines += [f"## {model} at {rate}" + ("" if part[0]["mode"] == "netns" else " (localhost: NOT rate-limited)"),
                  "", "| path | collectives | buckets | CF | MB/rank | step ms | compute ms | wire ms | bare ms "
                  "| step / wire floor | step / bare floor | hidden |", "|" + "---|" * 12]
        for r in part:
            lines.append("| " + " | ".join([
                r["path"], r["transfers"], cell(r["buckets"]), cell(r["cf"], 0), cell(r["bytes_per_rank"] / 1e6, 3),
                cell(r["step_ms"]), cell(r["compute_ms"]), cell(r["wire_ms"]), cell(r["bare_ms"]),
                cell(r["vs_wire_floor"], 2), cell(r["vs_bare_floor"], 2), cell(r["hidden"], 2)]) + " |")
        lines.append("")
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines))


def network_main(args, argv: List[str]) -> int:
    if args.worker:
        return network_worker(args)
    rows = measure_network(args.models.split(","), args.rates.split(","), args.paths.split(","), args.blocks,
                           args.bare, args.np, args.timeout, args.localhost)
    command = "python -m benchmarks.step_cost" + "".join(f" {a}" for a in argv)
    write_network(rows, args.out, command, args.np)
    print(open(args.out + ".md").read())
    return 0


# ----------------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_cost",
                                description="\n\n".join(__doc__.split("\n\n")[:2]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = p.add_subparsers(dest="mode", required=True, metavar="MODE",
                             help="launches, compressors, ddp or network (the docstring says what each measures)")

    m = modes.add_parser("launches", help="what the optimizer adds to plain torch per step: launches, syncs, host ms")
    m.add_argument("--device", default="cpu")
    m.add_argument("--models", default="resnet101,vgg16")
    m.add_argument("--width", type=float, default=None, help="model width (see the docstring)")
    m.add_argument("--steps", type=int, default=10)
    m.add_argument("--rounds", type=int, default=15)
    m.add_argument("--runs", default=None, help=f"comma-separated rows (default: all): {','.join(LAUNCH_ROWS)}")
    m.add_argument("--top", type=int, default=0, help="also list the N most frequent added launches")
    m.add_argument("--out", help="also write the table here")

    m = modes.add_parser("compressors", help="each compressor in a real training step on one device (the harness)")
    m.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    m.add_argument("--preset", default="resnet101-cifar10")
    m.add_argument("--steps", type=int, default=40)
    m.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the medians")
    m.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, from {','.join(RUNS)}")
    m.add_argument("--timeout", type=float, default=300, help="seconds per harness run")
    m.add_argument("--out", help="also write the table here")

    m = modes.add_parser("ddp", help="the GraVAC DDP hook against DDP's own hooks, one process")
    m.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    m.add_argument("--model", default="resnet50", choices=("resnet50", "resnet-tiny"))
    m.add_argument("--batch-size", type=int, default=64)
    m.add_argument("--steps", type=int, default=30)
    m.add_argument("--warmup", type=int, default=10)
    m.add_argument("--window", type=int, default=20, help="GraVAC's window and Accordion's interval "
                   "(short, so that the timed steps include their checks)")
    m.add_argument("--configs", default=",".join(DDP_CONFIGS))
    m.add_argument("--out", default=None, help="also write the table to this file")

    m = modes.add_parser("network", help="ranks on emulated links: the step against compute + bytes / rate")
    m.add_argument("--models", default=",".join(NETWORK_MODELS))
    m.add_argument("--rates", default=",".join(NETWORK_RATES))
    m.add_argument("--paths", default=",".join(NETWORK_PATHS))
    m.add_argument("--blocks", type=int, default=6,
                   help=f"blocks of {BLOCK} steps per path (after one warm-up block)")
    m.add_argument("--bare", type=int, default=8, help="repeats of the bare collectives")
    m.add_argument("--np", type=int, default=2)
    m.add_argument("--timeout", type=float, default=1800.0)
    m.add_argument("--localhost", action="store_true",
                   help="ranks on plain localhost, no emulated rates (a check of the mode itself)")
    m.add_argument("--out", default=NETWORK_OUT, help="prefix of the .md and .csv written")
    m.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    m.add_argument("--model", help=argparse.SUPPRESS)
    return p


def _bad_names(args) -> Optional[str]:
    """What is wrong with the rows a mode was asked for, if anything."""
    def unknown(given, known, what):
        bad = [n for n in (given or "").split(",") if n and n not in known]
        return f"unknown {what} {', '.join(map(repr, bad))}; choose from {', '.join(known)}" if bad else None
    if args.mode == "launches":
        return unknown(args.runs, LAUNCH_ROWS, "run(s)")
    if args.mode == "compressors":
        if args.steps <= args.skip:
            return "--steps must exceed --skip"
        return unknown(args.runs, list(RUNS), "run(s)")
    if args.mode == "ddp":
        return unknown(args.configs, DDP_CONFIGS, "configuration")
    if not args.worker:
        return (unknown(args.models, NETWORK_MODELS, "model(s)") or unknown(args.paths, NETWORK_PATHS, "path(s)"))
    return None


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    problem = _bad_names(args)
    if problem:
        parser.error(f"{args.mode}: {problem}")
    if args.mode == "launches":
        return launches_main(args)
    if args.mode == "compressors":
        return compressors_main(args)
    if args.mode == "ddp":
        return ddp_main(args)
    return network_main(args, argv)


if __name__ == "__main__":
    sys.exit(main())
