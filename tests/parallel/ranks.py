"""Shared by the multi-rank tests and the fault scenario in this folder (not a test file):
Horovod initialised, this rank and the world size, a small MLP and per-rank batches, the
optimizer under test with several buckets, and bitwise agreement across ranks."""
import dataclasses

import torch

import horovod.torch as hvd
import horovod_gravac as hg
from horovod_gravac.controllers import DEFAULT_VARIANT, DeliveredGraVAC, LadderGraVAC, PaperGraVAC, PredictiveGraVAC

hvd.init()
torch.set_num_threads(1)
RANK, SIZE = hvd.rank(), hvd.size()


def say(msg):
    if RANK == 0:
        print(msg, flush=True)


def make_model(seed=0, out=5):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, out))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


def batch(step, rank=None):
    g = torch.Generator().manual_seed(1000 * step + (RANK if rank is None else rank))
    return torch.randn(24, 32, generator=g), torch.randint(0, 5, (24,), generator=g)


def train_steps(model, opt, steps, start=0):
    for step in range(start, start + steps):
        x, y = batch(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return opt


def flat_params(model):
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def assert_identical_across_ranks(tensor, what):
    everyone = hvd.allgather(tensor.unsqueeze(0), name=f"rel.{what}")
    for r in range(SIZE):
        if not torch.equal(everyone[r], everyone[0]):
            raise AssertionError(f"{what}: rank {r} differs from rank 0 by "
                                 f"{(everyone[r] - everyone[0]).abs().max().item():.3e}")


def hg_opt(model, **kw):
    kw.setdefault("bucket_cap_mb", 0.01)   # several buckets even for a small model
    return hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                   named_parameters=model.named_parameters(), **kw)


def release(opt):
    opt.close()


class _ConstantStepTime:
    # Step time 1 s, of which 0.5 s / CF waits for communication ("predictive" fits its
    # step-time model to that wait): both a function of the CF sent alone.
    def observe(self, obs):
        return super().observe(dataclasses.replace(obs, step_time=1.0,
                                                   comm_time=0.5 / self.decision.send_cf))


_STEP_TIMED = {cls.variant: type(f"StepTimed{cls.__name__}", (_ConstantStepTime, cls), {})
               for cls in (PaperGraVAC, LadderGraVAC, DeliveredGraVAC, PredictiveGraVAC)}


def StepTimedGraVAC(variant=DEFAULT_VARIANT, **kwargs):
    """GraVAC (the rule set ``variant`` names) fed a constant step time (1 s) and a
    communication wait that depends on the CF sent alone (0.5 s / CF): throughput is then
    N * gain, and "predictive"'s step-time model a function of the CFs sent, so every
    decision depends on gradients only and a resumed run can be compared bit for bit with
    an uninterrupted one.  (Real GraVAC measures step times, which differ between any two runs.)"""
    return _STEP_TIMED[variant](variant=variant, **kwargs)
