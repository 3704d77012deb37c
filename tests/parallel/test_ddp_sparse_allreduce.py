"""The sparse allreduce through the DDP comm hook (``torch.distributed``'s ``all_to_all_single``
with split sizes and ``all_gather``, on Gloo): every rank runs this file under

    torchrun --standalone --nproc_per_node N --tee 3 -m pytest tests/parallel/test_ddp_sparse_allreduce.py

(tests/integration/test_sparse_allreduce_ranks.py launches it: 3 ranks in the default run, 2, 4, 5
and 8 with ``-m scale``).  Ranks bitwise identical; the allgather path's bits when nothing
is dropped; uneven and empty payloads; float64 models; the exchange reported in stats."""
import datetime
import os

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import horovod_gravac as hg
import horovod_gravac.ddp  # noqa: F401
from horovod_gravac import transfers

if "TORCHELASTIC_RUN_ID" in os.environ and not dist.is_initialized():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
RANK = dist.get_rank() if dist.is_initialized() else 0
SIZE = dist.get_world_size() if dist.is_initialized() else 1


def train(exchange, compressor=hg.TopKCompressor, controller=None, steps=6, dtype=torch.float32,
          zero_grad_rank=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 5)).to(dtype)
    ddp = DDP(model, bucket_cap_mb=0.02)
    state = hg.ddp.GravacState(None, compressor=compressor, controller=controller or hg.StaticCF(10),
                               exchange=exchange)
    ddp.register_comm_hook(state, hg.ddp.gravac_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        g = torch.Generator().manual_seed(1000 * step + RANK)
        x = torch.randn(32, 32, generator=g).to(dtype)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(x), x[:, :5].argmax(1))
        (loss * (0.0 if RANK == zero_grad_rank else 1.0)).backward()
        opt.step()
    return torch.cat([p.detach().double().reshape(-1) for p in model.parameters()]), state


def assert_identical(tensor, what):
    everyone = [torch.empty_like(tensor) for _ in range(SIZE)]
    dist.all_gather(everyone, tensor)
    for r in range(SIZE):
        assert torch.equal(everyone[r], everyone[0]), \
            f"{what}: rank {r} differs from rank 0 by {(everyone[r] - everyone[0]).abs().max().item():.3e}"


@pytest.mark.parametrize("name,compressor", [("topk", hg.TopKCompressor), ("dgc", hg.DGCCompressor),
                                             ("sidco", hg.SIDCoCompressor)])
def test_ranks_stay_bitwise_identical(name, compressor):
    params, state = train("sparse_allreduce", compressor)
    assert_identical(params, name)
    assert state.stats["transfers"] == "sparse_allreduce" and 0 < state.stats["kept_share"] <= 1


def test_gravac_decides_alike():
    params, state = train("sparse_allreduce", controller=hg.GraVAC(theta_min=2, theta_max=32, epsilon=0.3, window=3),
                          steps=10)
    assert_identical(params, "gravac")
    assert_identical(torch.tensor([state.controller.decision.send_cf]), "gravac.cf")


def test_when_nothing_is_dropped_it_trains_bit_for_bit_as_the_allgather(monkeypatch):
    monkeypatch.setattr(transfers.SparseAllreduce, "KEEP", 1e9)
    ours, _ = train("sparse_allreduce", hg.DGCCompressor)
    theirs, _ = train("allgather", hg.DGCCompressor)
    assert torch.equal(ours, theirs)


def test_uneven_and_empty_payloads_and_float64():
    params, state = train("sparse_allreduce", lambda cf: hg.TopKCompressor(cf, send_zeros=False),
                          zero_grad_rank=SIZE - 1)
    assert_identical(params, "empty")
    if RANK == SIZE - 1:
        assert state.stats["floats_sent"] == 0
    params, state = train("sparse_allreduce", hg.DGCCompressor, dtype=torch.float64)
    assert_identical(params, "float64")
    assert all(r.dtype == torch.float64 for r in state.memory.residuals.values())


def test_auto_reports_its_choice_and_the_model():
    params, state = train("auto")
    assert_identical(params, "auto")
    model = state.comm_model
    assert state.stats["exchange"] == "auto"
    assert state.stats["dense_model_s"] == pytest.approx(model.step_seconds(1))
    assert sorted(set(model.kinds(10))) == sorted(set(state.stats["transfers"].split("+")))


def test_the_controller_is_handed_the_model_of_ddps_buckets():
    """GraVAC's step-time model ranks dense among the CFs through the exchange model; DDP's
    buckets are known once a step has run, so the hook hands the model over then (and again
    if DDP rebuilds them)."""
    ctrl = hg.GraVAC(window=16)
    params, state = train("auto", controller=ctrl)
    assert_identical(params, "handed")
    assert ctrl.comm_model is not None
    assert [b.numel for b in ctrl.comm_model.buckets] == [b.numel for b in state.comm_model.buckets]
    assert ctrl.comm_model.world == SIZE
