"""What does changing the one line cost?  Step time of ``hg.DistributedOptimizer`` against
``hvd.DistributedOptimizer`` on the same model.

Run under horovodrun (loopback, no bandwidth limit), e.g.
    horovodrun -np 2 -H localhost:2 --gloo python -m benchmarks.horovod_parity

Each optimizer trains its own copy of the same model on the same batch.  The configurations
take turns in short blocks (``--rounds`` rounds of ``--steps`` steps), so noise on a shared
machine hits them alike; each is reported as its median step time and as the median over
rounds of its block mean divided by ``hvd.DistributedOptimizer``'s block mean in the same
round.  Rows:

* ``hvd``: ``hvd.DistributedOptimizer`` (Horovod's fusion buffer, its background thread);
* ``hg-dense``: ``hg.DistributedOptimizer`` with its default controller, ``hg.Dense()``;
* ``hg-dense-fp16``: the same with ``compression=hvd.Compression.fp16``, against ``hvd`` with it;
* ``hg-topk10``: ``StaticCF(10)`` with Top-k, for scale (it sends a fifth of the floats).

Models: ``mlp`` (four linear layers, ``--width``), ``cnn`` (the harness's TinyCNN on 32x32
images, batch 32) and ``resnet`` (the harness's ResNet101 at stem width 8, batch 8: 314
parameter tensors, most of them small, the case where Horovod's per-tensor fusion and this
package's buckets differ most).
"""
import argparse
import statistics
import time

import torch

import horovod.torch as hvd
import horovod_gravac as hg


def timed_steps(model, opt, x, y, steps):
    """Wall seconds of each of ``steps`` training steps on one batch (zero_grad, forward,
    backward, ``opt.step()``)."""
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        out.append(time.perf_counter() - t0)
    return out


def make_model(kind: str, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":   # four linear layers
        return torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                   torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
                                   torch.nn.Linear(width, 10))
    from horovod_gravac.harness.models import build_model
    if kind == "resnet":   # ResNet101's 314 parameter tensors at a width a CPU steps through
        return build_model("resnet101", 10, width=8, in_channels=3)
    return build_model("tinycnn", 10, width=width // 16, in_channels=3, image_size=32)


def batch(kind: str, rank: int):
    g = torch.Generator().manual_seed(rank)
    if kind == "mlp":
        x = torch.randn(64, 256, generator=g)
    else:
        x = torch.randn(32 if kind == "cnn" else 8, 3, 32, 32, generator=g)
    return x, torch.randint(0, 10, (x.shape[0],), generator=g)


def build(name: str, kind: str, width: int):
    model = make_model(kind, width)
    # Distinct parameter names per configuration: every optimizer's collectives are named by them.
    named = [(f"{name}.{n}", p) for n, p in model.named_parameters()]
    sgd = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    fp16 = hvd.Compression.fp16 if name.endswith("fp16") else hvd.Compression.none
    if name.startswith("hvd"):
        opt = hvd.DistributedOptimizer(sgd, named_parameters=named, compression=fp16)
    elif name == "hg-topk10":
        opt = hg.DistributedOptimizer(sgd, named_parameters=named, compressor=hg.TopKCompressor,
                                      controller=hg.StaticCF(10))
    else:
        opt = hg.DistributedOptimizer(sgd, named_parameters=named, compression=fp16)
    return model, opt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mlp,cnn,resnet")
    ap.add_argument("--width", type=int, default=1024, help="mlp: hidden width (params ~ 2 width^2); "
                                                            "cnn: 16x TinyCNN's first channels")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args(argv)
    hvd.init()
    torch.set_num_threads(1)
    names = ["hvd", "hg-dense", "hvd-fp16", "hg-dense-fp16", "hg-topk10"]
    out = []
    for kind in args.models.split(","):
        runners = [(name, *build(name, kind, args.width)) for name in names]
        x, y = batch(kind, hvd.rank())
        blocks = {name: [] for name in names}
        times = {name: [] for name in names}
        for rnd in range(args.rounds + 1):   # round 0 warms up
            for name, model, opt in runners:
                block = timed_steps(model, opt, x, y, args.steps)
                if rnd:
                    times[name].extend(block)
                    blocks[name].append(statistics.fmean(block))
        nparams = sum(p.numel() for p in runners[0][1].parameters())
        out.append(f"# {kind}: {nparams / 1e6:.2f}M parameters in {len(list(runners[0][1].parameters()))} "
                   f"tensors, {hvd.size()} ranks, median of {args.rounds}x{args.steps} interleaved steps")
        out.append(f"{'optimizer':<15} {'step ms':>8} {'vs hvd':>7}   (per round, median)")
        for name in names:
            ref = "hvd-fp16" if name.endswith("fp16") else "hvd"
            ratio = statistics.median(a / b for a, b in zip(blocks[name], blocks[ref]))
            out.append(f"{name:<15} {statistics.median(times[name]) * 1e3:8.2f} {ratio:6.2f}x"
                       + ("" if name != ref else "   (reference)"))
    if hvd.rank() == 0:
        print("\n".join(out))


if __name__ == "__main__":
    main()
