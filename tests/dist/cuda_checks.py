"""The optimizer on CUDA under horovodrun, one GPU per rank.

Run by scripts/gpu_check.sh (NOT YET RUN ON A GPU):

    horovodrun -np 2 -H localhost:2 python tests/dist/cuda_checks.py

For every compressor (and GraVAC / Accordion where they apply) it trains a small model on
``cuda:<local rank>`` for a few steps and checks that parameters stay finite and
bitwise identical across ranks (every rank must add the gathered payloads in the same
order: ``comm.unpack_sum`` runs under PyTorch's deterministic mode on CUDA).  Rank 0
prints ``PASS <case>`` or ``FAIL <case>: <error>`` per case, and ``CUDA_CHECKS <passed>/<total>``.
Exits 1 if any case failed.
"""
import sys
import time
import traceback

import torch

import horovod.torch as hvd
import horovod_gravac as hg
from horovod_gravac.compressors import (DGCCompressor, PowerSGDCompressor, RandomKCompressor,
                                        RedSyncCompressor, SIDCoCompressor, TopKCompressor)

hvd.init()
RANK, SIZE = hvd.rank(), hvd.size()
if not torch.cuda.is_available():
    print("cuda_checks: torch.cuda.is_available() is False", flush=True)
    sys.exit(2)
torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
DEVICE = torch.device("cuda", torch.cuda.current_device())


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
}


def run_case(name, compressor, controller, steps=10):
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(name.rsplit("-", 1)[-1], torch.float32)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(DEVICE, dtype)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
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
    for h in opt._hooks:
        h.remove()
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()]).cpu()
    if not torch.isfinite(flat).all():
        raise AssertionError("parameters became non-finite")
    everyone = hvd.allgather_object(flat, name=f"cuda.{name}")
    for r, other in enumerate(everyone):
        if not torch.equal(other, everyone[0]):
            raise AssertionError(f"rank {r} differs from rank 0 by {(other - everyone[0]).abs().max().item():.3e}")
    return cfs, ms


def main():
    say(f"cuda_checks: {SIZE} rank(s), {torch.cuda.get_device_name(DEVICE)}, torch {torch.__version__}, "
        f"Horovod nccl_built={hvd.nccl_built()} cuda_built={hvd.cuda_built()}")
    passed = 0
    for name, (compressor, controller) in CASES.items():
        try:
            cfs, ms = run_case(name, compressor, controller())
            ok = hvd.allgather_object(True, name=f"ok.{name}")
        except Exception as exc:   # keep going: report every case
            detail = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
            ok = None
            try:
                ok = hvd.allgather_object(False, name=f"ok.{name}")
            except Exception:
                pass
            say(f"FAIL {name}: {detail[:500]}")
            if ok is None:   # the collectives themselves broke: nothing more can run
                break
            continue
        if all(ok):
            passed += 1
            say(f"PASS {name}: cfs {cfs}, {ms:.1f} ms/step")
        else:
            say(f"FAIL {name}: failed on ranks {[r for r, o in enumerate(ok) if not o]}")
    say(f"CUDA_CHECKS {passed}/{len(CASES)}")
    return 0 if passed == len(CASES) else 1


if __name__ == "__main__":
    sys.exit(main())
