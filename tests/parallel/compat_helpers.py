"""Shared by the tests/parallel/test_compat_*.py files (not a test file): the models,
data, loops and comparisons of the drop-in checks, ``horovod_gravac.DistributedOptimizer``
against ``hvd.DistributedOptimizer``.

Each test builds fresh models and optimizers.  Where a test compares with Horovod, the
Horovod run and the horovod_gravac run use the same script, seed and data, one after the
other in the same process.  Bitwise comparisons are made on 2 ranks (a sum of two floats
does not depend on the order); with 3 or more ranks Horovod's ring may sum in another
order, so those comparisons use a tight tolerance and say so.
"""
import os
import traceback
import warnings

import torch
import torch.nn.functional as F

import horovod.torch as hvd
import horovod_gravac as hg
from ranks import StepTimedGraVAC  # noqa: F401  (GraVAC whose decisions do not read the clock)

hvd.init()
torch.set_num_threads(1)
RANK, SIZE = hvd.rank(), hvd.size()
TIMEOUT_S = float(os.environ.get("COMPAT_TIMEOUT_S", "60"))   # per collective, in our optimizer
BITWISE = SIZE == 2
warnings.filterwarnings("ignore", message=".*num_groups.*")


def note(msg):
    if RANK == 0:
        print(f"NOTE {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# Models, data, loops
class Net(torch.nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 32)
        self.fc3 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class EmbNet(torch.nn.Module):
    """An nn.Embedding(sparse=True) followed by a dense head (Horovod's sparse test pattern)."""

    def __init__(self, seed=0, sparse=True, head=True):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(50, 8, sparse=sparse)
        self.head = torch.nn.Linear(8, 4) if head else None

    def forward(self, idx):
        h = self.emb(idx).mean(1)
        return self.head(h) if self.head is not None else h[:, :4]


def make(cls=Net, **kw):
    model = cls(**kw)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model


def batch(step, rank=None):
    g = torch.Generator().manual_seed(1000 * step + (RANK if rank is None else rank))
    return torch.randn(12, 16, generator=g), torch.randint(0, 4, (12,), generator=g)


def emb_batch(step):
    g = torch.Generator().manual_seed(7000 + 1000 * step + RANK)
    # few distinct rows per batch, with repeats: duplicated sparse indices on a rank
    return torch.randint(0, 50, (6, 5), generator=g), torch.randint(0, 4, (6,), generator=g)


def loss_of(model, step, data=batch):
    x, y = data(step)
    return F.cross_entropy(model(x), y)


def train(model, opt, steps, data=batch, bpps=1, first=0):
    for step in range(first, first + steps):
        opt.zero_grad()
        for micro in range(bpps):
            loss_of(model, step * bpps + micro, data).backward()
        opt.step()
    return opt


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def sgd(model, lr=0.05, momentum=0.9, params=None):
    return torch.optim.SGD(model.parameters() if params is None else params, lr=lr, momentum=momentum)


def hvd_opt(model, base=None, **kw):
    return hvd.DistributedOptimizer(base or sgd(model), named_parameters=model.named_parameters(), **kw)


def hg_opt(model, base=None, **kw):
    kw.setdefault("timeout_s", TIMEOUT_S)
    return hg.DistributedOptimizer(base or sgd(model), named_parameters=model.named_parameters(), **kw)


_tag = [0]


def assert_ranks_identical(tensor, what, process_set=None):
    _tag[0] += 1
    kw = {} if process_set is None else {"process_set": process_set}
    everyone = hvd.allgather(tensor.detach().reshape(1, -1), name=f"compat.ident.{_tag[0]}", **kw)
    for r in range(everyone.shape[0]):
        if not torch.equal(everyone[r], everyone[0]):
            diff = (everyone[r] - everyone[0]).abs().max().item()
            raise AssertionError(f"{what}: parameters of rank {r} differ from rank 0 by {diff:.3e} "
                                 f"(ranks must stay bitwise identical)")


def assert_same(ref, got, what, bitwise=None, atol=1e-6):
    """``got`` (horovod_gravac) equals ``ref`` (Horovod): bitwise on 2 ranks, else within atol."""
    bitwise = BITWISE if bitwise is None else bitwise
    if not torch.isfinite(got).all():
        raise AssertionError(f"{what}: horovod_gravac's parameters hold NaN/Inf")
    if bitwise:
        if not torch.equal(ref, got):
            diff = (ref - got).abs().max().item()
            n = int((ref != got).sum())
            raise AssertionError(f"{what}: differs from hvd.DistributedOptimizer (bitwise required) "
                                 f"in {n}/{ref.numel()} entries, max |diff| {diff:.3e}")
    else:
        diff = (ref - got).abs().max().item()
        if not diff <= atol:
            raise AssertionError(f"{what}: differs from hvd.DistributedOptimizer by {diff:.3e} > {atol}")


def record_failure(failures, name, exc):
    """Keep going after a failed variant; print where it failed (this rank)."""
    failures.append(f"{name}: {type(exc).__name__}: {exc}")
    tb = traceback.format_exception(exc)
    print(f"TRACE [{name}] [rank {RANK}]:\n  " + "  ".join(tb[-4:]).rstrip()[-1500:], flush=True)


def rank0_restores(model, opt, saved):
    """Horovod's resume recipe: rank 0 loads ``saved()`` (model and optimizer state dicts),
    then every rank takes rank 0's parameters and optimizer state."""
    if RANK == 0:
        model_state, opt_state = saved()
        model.load_state_dict(model_state)
        opt.load_state_dict(opt_state)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)


def release(opt):
    """Remove the optimizer's hooks where it can (horovod_gravac's ``close()``)."""
    close = getattr(opt, "close", None)
    if callable(close):
        close()
