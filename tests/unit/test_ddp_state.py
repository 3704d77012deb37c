"""``hg.ddp.GravacState`` before and after its process group exists (built before
``init_process_group``, as Lightning's ``DDPStrategy(ddp_comm_state=...)`` needs), its
``metrics()`` for loggers, and ``hg.ddp.AllRanks`` on a group of this process alone.
The 2-rank runs are tests/integration/test_lightning.py and test_accelerate.py."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import horovod_gravac as hg
from horovod_gravac.checkpoint import CheckpointError


@pytest.fixture
def no_group():
    if dist.is_initialized():
        pytest.skip("a process group exists in this process already")


@pytest.fixture
def one_rank():
    if dist.is_initialized():
        pytest.skip("a process group exists in this process already")
    dist.init_process_group("gloo", init_method="file://" + os.path.join(tempfile.mkdtemp(), "rdzv"),
                            rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _train(state, steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp = DDP(model)
    ddp.register_comm_hook(state, hg.ddp.gravac_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        ddp(torch.randn(8, 16, generator=g)).square().mean().backward()
        opt.step()
    return model


def test_state_is_built_before_the_process_group(no_group):
    state = hg.ddp.GravacState(process_group=None, compressor=hg.TopKCompressor,
                               controller=hg.GraVAC(theta_min=2, theta_max=32, window=2))
    assert state.backend is None and state.stats == {} and state.metrics() == {}
    for use in (state.state_dict, lambda: state.world_size, lambda: hg.ddp.AllRanks(state).state_dict()):
        with pytest.raises(RuntimeError, match="torch.distributed is not initialized.*first hook call"):
            use()


def test_arguments_are_still_checked_at_construction(no_group):
    with pytest.raises(ValueError, match="compression must be"):
        hg.ddp.GravacState(compression="int8")
    with pytest.raises(ValueError, match="controller must be"):
        hg.ddp.GravacState(controller="gravac")


def test_group_resolved_at_the_first_hook_call(one_rank):
    state = hg.ddp.GravacState(None, compressor=hg.TopKCompressor, controller=hg.StaticCF(4))
    assert state.backend is None
    _train(state)
    assert state.world_size == 1 and state.stats["step"] == 2 and state.stats["cf"] == 4


def test_metrics_are_the_numeric_stats_as_floats(one_rank):
    state = hg.ddp.GravacState(None, compressor=hg.TopKCompressor, controller=hg.StaticCF(4))
    _train(state, steps=1)
    m = state.metrics()
    assert m["gravac/cf"] == 4.0 and m["gravac/bytes_sent"] == float(state.stats["bytes_sent"])
    assert m["gravac/skipped"] == 0.0                                   # a boolean, as 0/1
    assert "gravac/level" not in m and "gravac/transfers" not in m      # strings are left out
    assert all(type(v) is float for v in m.values())
    assert set(state.metrics(prefix="")) == {k[len("gravac/"):] for k in m}


def test_all_ranks_round_trip_and_refusals(one_rank):
    state = hg.ddp.GravacState(None, compressor=hg.TopKCompressor, controller=hg.StaticCF(4))
    _train(state)
    saved = hg.ddp.AllRanks(state).state_dict()
    assert saved["format"] == hg.ddp.ALL_RANKS_FORMAT and saved["world_size"] == 1 and list(saved["ranks"]) == [0]
    residuals = saved["ranks"][0]["residuals"]
    assert residuals and all(t.device.type == "cpu" for t in residuals.values())
    live = state.memory.residuals
    assert all(t.data_ptr() not in {r.data_ptr() for r in live.values()} for t in residuals.values())  # copies

    fresh = hg.ddp.GravacState(None, compressor=hg.TopKCompressor, controller=hg.StaticCF(4))
    hg.ddp.AllRanks(fresh).load_state_dict(saved)   # before the first step: loads as buckets appear
    assert fresh.step_index == 3
    with pytest.raises(CheckpointError, match="not an AllRanks state dict"):
        hg.ddp.AllRanks(fresh).load_state_dict(saved["ranks"][0])
    with pytest.raises(CheckpointError, match="not of this rank 0"):
        hg.ddp.AllRanks(fresh).load_state_dict(dict(saved, world_size=2, ranks={1: saved["ranks"][0]}))
    with pytest.raises(TypeError):
        hg.ddp.AllRanks(object())


_OPTIONAL = """
import importlib.abc, sys
BLOCKED = ("pytorch_lightning", "lightning", "accelerate")

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)")
        return None

sys.meta_path.insert(0, Block())
import horovod_gravac as hg
import horovod_gravac.ddp
hg.ddp.GravacState(None, controller=hg.GraVAC())
try:
    hg.lightning
except ImportError as e:
    print("refused:", e)
print("loaded:", sorted({n.split(".")[0] for n in sys.modules} & set(BLOCKED)))
"""


def test_core_and_ddp_import_without_lightning_or_accelerate():
    """Both are optional extras: the core and the DDP hook import without them, and
    ``hg.lightning`` says which extra to install."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", _OPTIONAL], capture_output=True, text=True, env=env, cwd=root,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "refused: horovod_gravac.lightning needs PyTorch Lightning: pip install 'horovod_gravac[lightning]'" \
        in p.stdout and "loaded: []" in p.stdout, p.stdout
