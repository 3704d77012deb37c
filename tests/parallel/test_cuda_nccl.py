"""The optimizer on CUDA under horovodrun, one GPU per rank.  Marked ``cuda``: skipped
where torch.cuda.is_available() is False (tests/conftest.py).

Run by scripts/gpu_check.sh (its latest output: benchmarks/results/gpu/nccl_optimizer.txt):

    horovodrun -np 2 -H localhost:2 --gloo python -m pytest -v -s tests/parallel/test_cuda_nccl.py

For every compressor (and GraVAC / Accordion where they apply) it trains a small model on
``cuda:<local rank>`` for a few steps and checks that parameters stay finite and
bitwise identical across ranks (every rank must add the gathered payloads in the same
order: ``comm.unpack_sum`` runs under PyTorch's deterministic mode on CUDA).  Each case
prints its CFs and milliseconds per step (shown with ``-s``).
"""
import time

import pytest
import torch

import horovod.torch as hvd
import horovod_gravac as hg
from horovod_gravac.compressors import (DGCCompressor, PowerSGDCompressor, RandomKCompressor,
                                        RedSyncCompressor, SIDCoCompressor, TopKCompressor)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
if torch.cuda.is_available():
    torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
    DEVICE = torch.device("cuda", torch.cuda.current_device())
pytestmark = pytest.mark.cuda


def say(msg):
    if RANK == 0:
        print(msg, flush=True)


CASES = {
    "dense": (TopKCompressor, lambda: hg.Dense()),
    "topk-static10": (TopKCompressor, lambda: hg.StaticCF(10)),
    "topk-gravac": (TopKCompressor, lambda: hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3)),
    "randomk-static10": (RandomKCompressor(cf=10, seed=7), lambda: hg.StaticCF(10)),
    "randomk-gravac": (RandomKCompressor(cf=2, seed=7),
                       lambda: hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3)),
    "dgc-static10": (DGCCompressor, lambda: hg.StaticCF(10)),
    "dgc-gravac": (DGCCompressor, lambda: hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3)),
    "redsync-static10": (RedSyncCompressor, lambda: hg.StaticCF(10)),
    "sidco-static10": (SIDCoCompressor, lambda: hg.StaticCF(10)),
    "powersgd-static4": (PowerSGDCompressor, lambda: hg.StaticCF(4)),
    "topk-accordion": (TopKCompressor, lambda: hg.Accordion(low_cf=2, high_cf=16, interval=3)),
    "topk-static10-fp16": (TopKCompressor, lambda: hg.StaticCF(10)),
    "topk-static10-bf16": (TopKCompressor, lambda: hg.StaticCF(10)),
    # Dense buckets of one dtype travel in it, as with hvd.DistributedOptimizer: fp16 through
    # hvd.Compression.fp16, float64 as float64 (g + residual formed in float64).
    "dense-fp16": (TopKCompressor, lambda: hg.Dense()),
    "dense-f64": (TopKCompressor, lambda: hg.Dense()),
    "topk-static10-f64": (TopKCompressor, lambda: hg.StaticCF(10)),
    "topk-gravac-f64": (TopKCompressor, lambda: hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3)),
    # compressed float64 buckets travel in float64 (12-byte rows, float64 residuals)
    "randomk-static10-f64": (RandomKCompressor(cf=10, seed=7), lambda: hg.StaticCF(10)),
    "dgc-static10-f64": (DGCCompressor, lambda: hg.StaticCF(10)),
    "redsync-static10-f64": (RedSyncCompressor, lambda: hg.StaticCF(10)),
    "sidco-static10-f64": (SIDCoCompressor, lambda: hg.StaticCF(10)),
    "powersgd-static4-f64": (PowerSGDCompressor, lambda: hg.StaticCF(4)),
    "topk-accordion-f64": (TopKCompressor, lambda: hg.Accordion(low_cf=2, high_cf=16, interval=3)),
}


@pytest.fixture(scope="module", autouse=True)
def describe():
    say(f"test_cuda_nccl: {SIZE} rank(s), {torch.cuda.get_device_name(DEVICE)}, torch {torch.__version__}, "
        f"Horovod nccl_built={hvd.nccl_built()} cuda_built={hvd.cuda_built()}")


def run_case(name, compressor, controller, steps=10):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}.get(name.rsplit("-", 1)[-1], torch.float32)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(DEVICE)
    # Broadcast before the cast: Horovod 0.28.1's collectives reject bfloat16 tensors
    # (broadcast_parameters on a bf16 model raises "Tensor type torch.cuda.BFloat16Tensor is
    # not supported", seen on an H200); the optimizer's own bf16 traffic is float32 (fp16
    # buckets sent dense travel in fp16, which Horovod takes).
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    model.to(dtype)
    opt = hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=model.named_parameters(), compressor=compressor,
                                  controller=controller, bucket_cap_mb=0.1, timeout_s=120)
    cfs = []
    t0 = time.perf_counter()
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + RANK)
        x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x.to(DEVICE, dtype)).float(), y.to(DEVICE)).backward()
        opt.step()
        cfs.append(opt.stats["cf"])
    torch.cuda.synchronize()
    ms = 1000 * (time.perf_counter() - t0) / steps
    opt.close()
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()]).cpu()
    if not torch.isfinite(flat).all():
        raise AssertionError("parameters became non-finite")
    everyone = hvd.allgather_object(flat, name=f"cuda.{name}")
    for r, other in enumerate(everyone):
        if not torch.equal(other, everyone[0]):
            raise AssertionError(f"rank {r} differs from rank 0 by {(other - everyone[0]).abs().max().item():.3e}")
    return cfs, ms


@pytest.mark.parametrize("name", list(CASES))
def test_optimizer_on_cuda(name):
    compressor, controller = CASES[name]
    cfs, ms = run_case(name, compressor, controller())
    say(f"{name}: cfs {cfs}, {ms:.1f} ms/step")
