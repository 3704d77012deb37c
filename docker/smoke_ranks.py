"""Multi-rank smoke test of an installed horovod_gravac: Dense and GraVAC training, ranks identical.

    horovodrun -np 2 -H localhost:2 --gloo python docker/smoke_ranks.py
    horovodrun -np 2 -H node1:1,node2:1 --gloo python docker/smoke_ranks.py   # two containers

Each rank trains a small MLP on its own shard of scikit-learn's digits (shipped inside the
package, nothing is downloaded) for STEPS steps, once with hg.Dense() and once with
hg.GraVAC (Top-k, theta 10..1000, a short window so the compression factor moves). After
each run every rank hashes its parameters; rank 0 prints one line per rank (host, hash) and
the run fails unless all hashes agree and the loss fell. Runs on the GPU when there is one
(one per local rank), else on the CPU. Exit status 0 only if both runs pass on every rank.
"""
import hashlib
import os
import socket
import sys

import horovod.torch as hvd
import numpy as np
import torch
from sklearn.datasets import load_digits

import horovod_gravac as hg

STEPS = int(os.environ.get("SMOKE_STEPS", "60"))
BATCH = 32


def param_hash(model):
    h = hashlib.sha256()
    for _, p in sorted(model.named_parameters()):
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def train(name, controller, device, x, y):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to(device)
    opt = hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=model.named_parameters(),
                                  compressor=hg.TopKCompressor, controller=controller)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    g = torch.Generator().manual_seed(1000 + hvd.rank())          # each rank its own batches
    losses, cfs = [], []
    for _ in range(STEPS):
        idx = torch.randint(0, x.shape[0], (BATCH,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        losses.append(hvd.allreduce(loss.detach().cpu(), name=f"{name}.loss.{len(losses)}").item())
        cfs.append(opt.stats.get("cf", 1.0))
    mine = (hvd.rank(), socket.gethostname(), device.type, param_hash(model))
    every = hvd.allgather_object(mine, name=f"{name}.hash")
    ok = len({h for *_, h in every}) == 1 and np.mean(losses[-10:]) < losses[0]
    if hvd.rank() == 0:
        for r, host, dev, h in every:
            print(f"[smoke] {name}: rank {r} on {host} ({dev}) parameters {h}")
        print(f"[smoke] {name}: loss {losses[0]:.3f} -> {np.mean(losses[-10:]):.3f}, "
              f"CFs sent {sorted(set(cfs))}, ranks identical: {len({h for *_, h in every}) == 1} "
              f"-> {'PASS' if ok else 'FAIL'}")
    return ok


def main():
    hvd.init()
    if torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank() % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    torch.set_num_threads(1)
    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32, device=device)
    y = torch.tensor(d.target, dtype=torch.long, device=device)
    if hvd.rank() == 0:
        print(f"[smoke] {hvd.size()} ranks, torch {torch.__version__}, device {device}, "
              f"NCCL built: {hvd.nccl_built()}, {STEPS} steps")
    results = [train("dense", hg.Dense(), device, x, y),
               train("gravac", hg.GraVAC(theta_min=10, theta_max=1000, epsilon=0.7, window=10,
                                         policy="exponential"), device, x, y)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
