"""process_set: only ranks 0 and 1 train; rank 2 is in the job but never involved.

Run on 3 ranks (launched by tests/integration/test_horovod_compat.py), in one of two modes:
  static:  hvd.init(process_sets=[ps]) with ps = hvd.ProcessSet([0, 1])
  dynamic: HOROVOD_DYNAMIC_PROCESS_SETS=1, hvd.init(), ps = hvd.add_process_set([0, 1])
Ranks 0 and 1 train the same model with hvd.DistributedOptimizer(process_set=ps) and
with horovod_gravac's (controller=Dense(), process_set=ps): parameters bitwise equal;
then GraVAC with process_set=ps: ranks 0 and 1 identical.  Rank 2 only waits at the
final global barrier.  Run this file alone: it initialises Horovod itself.
"""
import os

import pytest
import torch
import torch.nn.functional as F

import horovod.torch as hvd

MODE = "dynamic" if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") == "1" else "static"
if MODE == "static":
    PS = hvd.ProcessSet([0, 1])
    hvd.init(process_sets=[PS])
else:
    hvd.init()
    PS = hvd.add_process_set([0, 1])

import horovod_gravac as hg  # noqa: E402

torch.set_num_threads(1)
RANK = hvd.rank()
pytestmark = pytest.mark.sizes(3)


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    # (hvd.broadcast_parameters has no process_set argument in 0.28.1)
    for i, p in enumerate(model.state_dict().values()):
        hvd.broadcast_(p, root_rank=0, name=f"ps.init.{i}", process_set=PS)
    return model


def train(model, opt, steps):
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + RANK)
        x, y = torch.randn(12, 16, generator=g), torch.randint(0, 4, (12,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def identical(model, what):
    everyone = hvd.allgather(flat(model).unsqueeze(0), name=f"ps.ident.{what}", process_set=PS)
    assert everyone.shape[0] == 2, f"process set allgather returned {everyone.shape[0]} rows"
    assert torch.equal(everyone[0], everyone[1]), f"{what}: ranks 0 and 1 differ"


def test_process_set_dense_matches_hvd_and_excludes_rank2():
    failures = []
    if PS.included():
        assert RANK in (0, 1)
        try:
            a, b = make(), make()
            ref = hvd.DistributedOptimizer(torch.optim.SGD(a.parameters(), lr=0.05, momentum=0.9),
                                           named_parameters=a.named_parameters(), process_set=PS)
            train(a, ref, 5)
            ours = hg.DistributedOptimizer(torch.optim.SGD(b.parameters(), lr=0.05, momentum=0.9),
                                           named_parameters=b.named_parameters(), process_set=PS,
                                           controller=hg.Dense(), timeout_s=60)
            train(b, ours, 5)
            if not torch.equal(flat(a), flat(b)):
                failures.append(f"Dense with process_set differs from hvd's by {(flat(a) - flat(b)).abs().max():.3e}")
            identical(b, "dense")
        except Exception as exc:
            failures.append(f"Dense: {type(exc).__name__}: {exc}")
        for name, ctrl in (("StaticCF(10)", hg.StaticCF(10)),
                           ("GraVAC", hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=3))):
            try:
                c = make()
                opt = hg.DistributedOptimizer(torch.optim.SGD(c.parameters(), lr=0.05, momentum=0.9),
                                              named_parameters=c.named_parameters(), process_set=PS,
                                              controller=ctrl, timeout_s=60)
                train(c, opt, 8)
                identical(c, name)
            except Exception as exc:
                failures.append(f"{name}: {type(exc).__name__}: {exc}")
    else:
        assert RANK == 2
    hvd.barrier()
    assert not failures, f"process_set[{MODE}] [rank {RANK}]: " + " | ".join(failures)
