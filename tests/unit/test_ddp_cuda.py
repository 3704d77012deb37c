"""The DDP hook with NCCL on a real GPU, one rank (DDP runs comm hooks at world size 1 too).
Marked ``cuda``: skipped where ``torch.cuda.is_available()`` is False (tests/conftest.py).

NCCL moves only CUDA tensors, while the consensus sends small host buffers (rank 0's
decision, the step index): ``DDPBackend`` stages them on the device.  Before it did, every
adaptive controller failed on its first check with "No backend type associated with device
type cpu".  Run with ``pytest -m cuda tests/unit/test_ddp_cuda.py`` or
``bash scripts/gpu_check.sh``.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import horovod_gravac as hg

pytestmark = pytest.mark.cuda

STEPS = 12


@pytest.fixture(scope="module")
def nccl_group():
    from benchmarks.step_cost import one_rank_group
    torch.cuda.set_device(0)
    one_rank_group("nccl")
    yield
    dist.destroy_process_group()


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def _train(controller=None, compressor=hg.TopKCompressor, hook=True, device="cuda"):
    model = _model().to(device)
    ddp = DDP(model, device_ids=[0] if device == "cuda" else None)
    state = None
    if hook:
        state = hg.ddp.GravacState(None, compressor=compressor, controller=controller)
        ddp.register_comm_hook(state, hg.ddp.gravac_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    cfs, checked = [], False
    for _ in range(STEPS):
        x = torch.randn(16, 32, generator=g).to(device)
        y = torch.randint(0, 10, (16,), generator=g).to(device)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        if state is not None:
            cfs.append(state.stats["cf"])
            checked = checked or "next_cf" in state.stats
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    return params, cfs, (state, checked)


def test_dense_hook_is_ddps_allreduce_on_nccl(nccl_group):
    ours, _, _ = _train(hg.Dense())
    ddp, _, _ = _train(hook=False)
    assert torch.equal(ours, ddp)


@pytest.mark.parametrize("case", ["static", "gravac", "gravac-paper", "accordion"])
def test_every_controller_runs_its_checks_on_nccl(nccl_group, case):
    controller = {"static": lambda: hg.StaticCF(10),
                  "gravac": lambda: hg.GraVAC(window=4),
                  "gravac-paper": lambda: hg.GraVAC(window=4, variant="paper"),
                  "accordion": lambda: hg.Accordion(low_cf=10, high_cf=100, interval=4)}[case]()
    params, cfs, (state, checked) = _train(controller)
    assert torch.isfinite(params).all()
    # GraVAC may fall back to dense (CF 1) on this small model: its gain is below ε
    assert len(cfs) == STEPS and all(cf == 1 or cf >= 10 for cf in cfs), cfs
    assert (state.stats["floats_sent"] < state.stats["dense_floats"]) == (cfs[-1] >= 10)
    # the adaptive controllers' checks went through the consensus (rank 0's decision)
    assert checked == (case != "static")
