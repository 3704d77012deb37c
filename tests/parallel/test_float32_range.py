"""Gradients at the edge of float32's range, on 2 real ranks (launched by tests/integration/test_parallel.py).

A large but finite float32 entry (1e20) is an ordinary gradient: it is sent, not dropped
(its squared norm, 1e40, overflows float32 but the norms are summed in float64).  Float64
gradients beyond float32's range travel in float64 buckets: parallel/test_float64_buckets.py.
"""
import torch

import horovod.torch as hvd
import horovod_gravac as hg

hvd.init()
torch.set_num_threads(1)
RANK, SIZE = hvd.rank(), hvd.size()
CONTROLLERS = [("dense", hg.Dense), ("static", lambda: hg.StaticCF(4)),
               ("gravac", lambda: hg.GraVAC(theta_min=2, theta_max=16, epsilon=0.3, window=2))]


def model(dtype):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).to(dtype)
    hvd.broadcast_parameters(m.state_dict(), 0)
    return m


def poisoned_step(m, opt, step, value, ranks):
    """One step whose first weight gradient holds ``value`` at entry 0 on ``ranks`` (set by
    a tensor hook, which runs before accumulation, so the optimizer's hooks see it)."""
    def poison(grad):
        grad = grad.clone()
        grad.view(-1)[0] = value
        return grad
    handle = m[0].weight.register_hook(poison) if RANK in ranks and value is not None else None
    g = torch.Generator().manual_seed(100 * step + RANK)
    x, y = torch.randn(4, 8, generator=g).to(m[0].weight.dtype), torch.randint(0, 3, (4,), generator=g)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(m(x), y).backward()
    if handle is not None:
        handle.remove()
    opt.synchronize()


def test_large_finite_float32_is_sent():
    for name, ctrl in CONTROLLERS:
        m = model(torch.float32)
        opt = hg.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=1e-30), m.named_parameters(),
                                      controller=ctrl(), timeout_s=60)
        poisoned_step(m, opt, 0, 1e20, {SIZE - 1})
        got = float(m[0].weight.grad.view(-1)[0])
        # Top-k keeps the largest entry, so every controller sends it: the average is 1e20 / N
        # plus the other ranks' ordinary gradients.
        if not (abs(got - 1e20 / SIZE) < 1e20 / SIZE * 1e-3):
            raise AssertionError(f"{name}: the 1e20 entry did not arrive (aggregated {got:.6g})")
        with opt.skip_synchronize():
            opt.step()
        flagged = hvd.allgather_object(opt.stats["nonfinite_buckets"], name=f"big.{name}")
        if any(flagged):
            raise AssertionError(f"{name}: a finite gradient was flagged non-finite: {flagged}")
        opt.close()
