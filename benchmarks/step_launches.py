"""What does ``hg.DistributedOptimizer`` add to a training step?  Dispatched operations and
host time, over plain torch.

    .venv/bin/python -m benchmarks.step_launches                 # CPU: the accelerators' paths, emulated
    python -m benchmarks.step_launches --device cuda             # on a GPU

On a GPU every dispatched operation costs host time, and every one that is not a view also
launches a kernel; a backward of many small layers (ResNet101 at batch 32 on an H100) is
bound by those launches, so work the optimizer adds per *parameter* (one ``copy_`` per
gradient, 314 of them for ResNet101) adds to the step even where the GPU has time to spare.
This counts, per step, what the optimizer's bucket hooks and ``step()`` add to plain torch
(the same backward and SGD step with no distributed optimizer) on a model's parameter list:

* ``launches``: operations that run a kernel; ``views``: operations that only make a view
  (dispatched, no kernel); ``syncs``: host synchronisations (``.item()``, ``nonzero``, ...);
* ``ms``: the wall time of a step, median over ``--rounds`` interleaved rounds of ``--steps``
  steps, and what it adds to plain torch.  The loss is ``sum(w * p.sum())`` over the
  parameters, so the backward is a few operations per parameter and the step is bound by
  dispatch, not arithmetic: the time is the host overhead a launch-bound GPU step would see.

One rank (Horovod's own optimizer adds nothing with one rank; this package's hooks still run).
On the CPU the accelerators' code paths are forced, as ``tests/unit/test_host_syncs.py`` does
(``--path cpu``: the CPU's own).  Rows: the dense controller, DGC and Top-k at 10x, and GraVAC
with DGC.  Models: the harness's ResNet101 (314 tensors) and VGG16 (32), at ``--width``
(default: the paper's size on a GPU; ResNet101 stem 8 and VGG16 x0.125 on the CPU, where
copying the full 42.5M entries would hide the dispatch cost).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


def optimizers():
    """name -> keyword arguments of hg.DistributedOptimizer (None: plain torch)."""
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


def measure(model_name: str, width, device, steps: int, rounds: int, names):
    loops = {name: Loop(model_name, width, device, kw) for name, kw in optimizers().items() if name in names}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--path", choices=["accelerator", "cpu"], default=None,
                    help="code paths on a CPU device (default: accelerator; a GPU runs its own)")
    ap.add_argument("--models", default="resnet101,vgg16")
    ap.add_argument("--width", type=float, default=None, help="model width (see the docstring)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--runs", default=None, help="comma-separated rows (default: all)")
    ap.add_argument("--top", type=int, default=0, help="also list the N most frequent added launches")
    args = ap.parse_args(argv)
    import horovod.torch as hvd
    hvd.init()
    device = torch.device(args.device)
    names = list(optimizers())
    if args.runs:
        names = ["plain torch"] + [n for n in args.runs.split(",") if n and n != "plain torch"]
    path = args.path or ("accelerator" if device.type == "cpu" else device.type)
    forced = accelerator_paths() if device.type == "cpu" and path == "accelerator" else contextlib.nullcontext()
    print(f"# step launches: device {device}"
          + (f" ({torch.cuda.get_device_name(0)})" if device.type == "cuda" else "")
          + f", {path} code paths, torch {torch.__version__}, one rank; ms: median of {args.rounds} "
          f"interleaved rounds of {args.steps} steps", flush=True)
    with forced:
        for model_name in args.models.split(","):
            default = {"resnet101": 8, "vgg16": 0.125}.get(model_name) if device.type == "cpu" else None
            width = args.width if args.width is not None else default
            counts, ms, n_params, n_entries = measure(model_name, width, device, args.steps, args.rounds, names)
            base, base_ms = counts["plain torch"], ms["plain torch"]
            print(f"\n## {model_name} (width {width if width is not None else 'full'}): {n_params} parameter "
                  f"tensors, {n_entries:,} entries; added to plain torch per step")
            print(f"{'run':12s} {'launches':>9s} {'views':>7s} {'syncs':>6s} {'step ms':>8s} {'added ms':>9s}")
            for name in names:
                c = counts[name]
                if name == "plain torch":
                    print(f"{name:12s} {c.launches:9d} {c.views:7d} {c.syncs:6d} {ms[name]:8.2f} {'-':>9s}"
                          "   (its own totals)")
                    continue
                print(f"{name:12s} {c.launches - base.launches:9d} {c.views - base.views:7d} "
                      f"{c.syncs - base.syncs:6d} {ms[name]:8.2f} {ms[name] - base_ms:9.2f}")
                if args.top:
                    added = c.names.copy()
                    added.subtract(base.names)
                    top = [f"{n.replace('aten::', '')} {v}" for n, v in added.most_common(args.top) if v > 0]
                    print(f"{'':12s} {', '.join(top)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
