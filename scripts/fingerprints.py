"""Fingerprints of training: a hash of the parameters after 7 steps, for every controller x
compressor (and join_safe, nonfinite="zero", momentum correction, local clipping, fp16/bf16,
float64, a mixed float32/float64 model), on real ranks.  A change that should not alter any
result (a refactor) must leave every line the same:

    timeout 900 .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python scripts/fingerprints.py > before.txt
    ... change ...
    timeout 900 .venv/bin/horovodrun -np 2 -H localhost:2 --gloo .venv/bin/python scripts/fingerprints.py > after.txt
    diff <(grep HASH before.txt) <(grep HASH after.txt)

The optimizer's clock is replaced by one that moves 1 ms a call, so GraVAC's throughput
readings, and so its decisions, repeat from run to run; unseeded Random-k draws from a fixed
per-rank seed.  The hashes depend on the machine's kernels (AVX-512 or not) and the torch
version: compare runs on one machine."""
import hashlib
import sys

import torch

import horovod.torch as hvd
import horovod_gravac as hg
from horovod_gravac.compressors import (DGCCompressor, PowerSGDCompressor, RandomKCompressor,
                                        RedSyncCompressor, SIDCoCompressor, TopKCompressor)

hvd.init()
torch.set_num_threads(1)
RANK = hvd.rank()


class FakeTime:
    """A clock that moves 1 ms a call: GraVAC's throughputs (and decisions) reproducible."""
    t = 0.0

    def perf_counter(self):
        FakeTime.t += 1e-3
        return FakeTime.t


import horovod_gravac.optimizer as _opt  # noqa: E402
import horovod_gravac.selection.randomk as _rk  # noqa: E402
_opt.time = FakeTime()
_rk.secrets.randbits = lambda n: 987654321 + RANK   # seed=None: per-rank, but reproducible

COMPRESSORS = {
    "topk": TopKCompressor, "dgc": DGCCompressor, "redsync": RedSyncCompressor,
    "sidco": SIDCoCompressor, "randomk": RandomKCompressor,
    "randomk_noseed": lambda cf: RandomKCompressor(cf=cf, seed=None),
    "powersgd": PowerSGDCompressor,
}
CONTROLLERS = {
    "dense": hg.Dense,
    "static": lambda: hg.StaticCF(4),
    "gravac_ladder": lambda: hg.GraVAC(theta_min=2, theta_max=32, epsilon=0.3, window=2, variant="ladder"),
    "gravac_predictive": lambda: hg.GraVAC(theta_min=2, theta_max=32, epsilon=0.3, window=8, variant="predictive"),
    "gravac_paper": lambda: hg.GraVAC(theta_min=2, theta_max=32, epsilon=0.3, window=2, variant="paper"),
    "gravac_delivered": lambda: hg.GraVAC(theta_min=2, theta_max=32, epsilon=0.3, window=2,
                                          variant="delivered", hold_windows=0),
    "gravac_split": lambda: hg.GraVAC(theta_min=2, theta_max=32, epsilon=0.3, window=2, split_rungs=True,
                                      policy="geometric"),
    "accordion": lambda: hg.Accordion(low_cf=2, high_cf=8, interval=2),
}


def model(dtype, mixed=False):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(4 * 6 * 6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    m = m.to(dtype)
    if mixed:
        m[3].to(torch.float64 if dtype == torch.float32 else torch.float32)
    # (the same seed on every rank: identical parameters)
    return m


def run(tag, dtype, comp, ctrl, mixed=False, **kw):
    m = model(dtype, mixed)
    opt = hg.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.0 if kw.get(
        "momentum_correction") else 0.9), m.named_parameters(), compressor=comp, controller=ctrl(),
        bucket_cap_mb=0.002, timeout_s=120, **kw)
    for step in range(7):
        g = torch.Generator().manual_seed(100 * step + RANK)
        x = torch.randn(5, 2, 8, 8, generator=g)
        y = torch.randint(0, 3, (5,), generator=g)
        opt.zero_grad()
        out = m(x.to(m[0].weight.dtype)) if not mixed else m[5](m[4](m[3](m[2](m[1](m[0](x.to(dtype)))).to(
            m[3].weight.dtype)).to(m[5].weight.dtype)))
        torch.nn.functional.cross_entropy(out.float(), y).backward()
        opt.step()
    h = hashlib.sha256()
    for p in m.parameters():
        h.update(p.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    opt.close()
    if RANK == 0:
        print(f"HASH {tag} {h.hexdigest()[:16]}", flush=True)


for cname, comp in COMPRESSORS.items():
    for kname, ctrl in CONTROLLERS.items():
        if cname == "powersgd" and kname.startswith("gravac"):
            continue
        run(f"f32.{cname}.{kname}", torch.float32, comp, ctrl)
        if kname in ("static", "gravac_ladder"):
            run(f"f32.{cname}.{kname}.join", torch.float32, comp, ctrl, join_safe=True)
    run(f"f32.{cname}.static.zero", torch.float32, comp, CONTROLLERS["static"], nonfinite="zero")
run("f32.dgc.static.momentum", torch.float32, DGCCompressor, CONTROLLERS["static"], momentum_correction=0.9)
run("f32.dgc.gravac.momentum", torch.float32, DGCCompressor, CONTROLLERS["gravac_ladder"], momentum_correction=0.9)
run("f32.topk.static.clip", torch.float32, TopKCompressor, CONTROLLERS["static"], local_clip_norm=0.1)
for dt in (torch.float16, torch.bfloat16):
    for kname in ("dense", "static", "gravac_ladder"):
        run(f"{dt}.topk.{kname}", dt, TopKCompressor, CONTROLLERS[kname])
# float64: Dense must stay; the rest is expected to change (more precise)
for kname in CONTROLLERS:
    run(f"f64.topk.{kname}", torch.float64, TopKCompressor, CONTROLLERS[kname])
run("f64.topk.dense.join", torch.float64, TopKCompressor, CONTROLLERS["dense"], join_safe=True)
run("f64.dgc.dense.momentum", torch.float64, DGCCompressor, CONTROLLERS["dense"], momentum_correction=0.9)
run("f64.powersgd.accordion", torch.float64, PowerSGDCompressor, CONTROLLERS["accordion"])
# mixed float32/float64: Dense expected unchanged (elementwise averages), others split
for kname in ("dense", "static", "gravac_ladder"):
    run(f"mixed.topk.{kname}", torch.float32, TopKCompressor, CONTROLLERS[kname], mixed=True)
print("DONE", RANK, flush=True)
