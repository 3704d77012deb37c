"""Gradients at the edge of float32's range, on 2 real ranks (launched by tests/integration/test_parallel.py).

* a finite float64 gradient beyond float32's range (1e39) on one rank cannot travel in the
  float32 wire: it counts as non-finite, so every rank's gradient is non-finite that step
  (a loss scaler skips it everywhere), and no residual or parameter is poisoned;
* a large but finite float32 entry (1e20) is an ordinary gradient: it is sent, not dropped
  (its squared norm, 1e40, overflows float32 but the norms are summed in float64).
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


def test_float64_beyond_float32_is_nonfinite():
    for name, ctrl in CONTROLLERS:
        m = model(torch.float64)
        opt = hg.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(),
                                      controller=ctrl(), timeout_s=60)
        for step in range(5):
            poisoned_step(m, opt, step, 1e39 if step == 2 else None, {SIZE - 1})
            bad = not all(torch.isfinite(p.grad).all() for p in m.parameters())
            seen = hvd.allgather_object(bad, name=f"f64.{name}.{step}")
            if seen != [step == 2] * SIZE:
                raise AssertionError(f"{name}: non-finite seen per rank at step {step}: {seen}")
            if not bad:
                with opt.skip_synchronize():
                    opt.step()
        for res in opt.gravac_state_dict()["residuals"].values():
            if not torch.isfinite(res).all():
                raise AssertionError(f"{name}: a residual was poisoned")
        flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
        if not torch.isfinite(flat).all():
            raise AssertionError(f"{name}: parameters became non-finite")
        everyone = hvd.allgather(flat.unsqueeze(0), name=f"f64.final.{name}")
        if not all(torch.equal(everyone[r], everyone[0]) for r in range(SIZE)):
            raise AssertionError(f"{name}: ranks differ")
        for h in opt._hooks:
            h.remove()


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
        for h in opt._hooks:
            h.remove()


def test_float64_bucket_zeroed_on_one_rank_keeps_the_wire_dtype():
    """``nonfinite="zero"``: the rank whose float64 gradient does not fit float32 sends zeros;
    a dense float64 bucket must still travel as float64 there (Horovod fails a collective
    whose dtype differs between ranks), and every rank gets the same finite update."""
    for name, ctrl in CONTROLLERS:
        m = model(torch.float64)
        opt = hg.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), m.named_parameters(),
                                      controller=ctrl(), timeout_s=60, nonfinite="zero")
        for step in range(4):
            poisoned_step(m, opt, step, 1e39 if step == 1 else None, {SIZE - 1})
            if not all(torch.isfinite(p.grad).all() for p in m.parameters()):
                raise AssertionError(f"{name}: a non-finite gradient reached step {step}")
            with opt.skip_synchronize():
                opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
        everyone = hvd.allgather(flat.unsqueeze(0), name=f"f64zero.final.{name}")
        if not all(torch.equal(everyone[r], everyone[0]) for r in range(SIZE)):
            raise AssertionError(f"{name}: ranks differ")
        for h in opt._hooks:
            h.remove()
