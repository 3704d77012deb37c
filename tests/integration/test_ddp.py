"""The DDP comm hook (``horovod_gravac.ddp``): real ranks under torchrun (Gloo, CPU), each
launch under a timeout that kills every rank; the same Top-k run through both backends;
and the DDP path in an interpreter where Horovod cannot be imported."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from launcher import PARALLEL, ROOT, horovodrun_cmd, run_parallel_tests, run_with_timeout, torchrun_cmd


@pytest.mark.parallel
@pytest.mark.slow
@pytest.mark.parametrize("np_", [2, 3])
def test_ddp_hook_on_ranks(np_):
    """Every test of parallel/test_ddp_hook.py, in one torchrun launch per size."""
    run_parallel_tests(np_, "test_ddp_hook.py", timeout=300, launcher=torchrun_cmd(np_))


@pytest.mark.parallel
@pytest.mark.slow
@pytest.mark.parametrize("np_", [2, 3])
def test_static_topk_follows_the_horovod_backends_trajectory(np_, tmp_path):
    """StaticCF(10) Top-k through DDP's hook and through hg.DistributedOptimizer: the same
    arithmetic (sparse payloads summed in rank order, then divided by N), so the same bits."""
    script = PARALLEL / "ddp_vs_horovod.py"
    ddp_out, hvd_out = tmp_path / "ddp.pt", tmp_path / "horovod.pt"
    hvd_cmd = horovodrun_cmd(np_, [sys.executable, script, "horovod", hvd_out])   # skips without Horovod
    for cmd in (torchrun_cmd(np_) + [sys.executable, str(script), "ddp", str(ddp_out)], hvd_cmd):
        rc, out = run_with_timeout(cmd, 240)
        assert rc == 0, f"{' '.join(map(str, cmd))}: exit status {rc}\n{out[-4000:]}"
    ddp, hvd = torch.load(ddp_out), torch.load(hvd_out)
    assert ddp["bytes_sent"] == hvd["bytes_sent"]
    assert torch.equal(ddp["params"], hvd["params"]), \
        f"max difference {(ddp['params'] - hvd['params']).abs().max()}"


_WITHOUT_HOROVOD = textwrap.dedent("""
    import importlib.abc, sys, tempfile, os

    class NoHorovod(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "horovod" or name.startswith("horovod."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)")
            return None

    sys.meta_path.insert(0, NoHorovod())
    try:
        import horovod
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit("the blocker let horovod through")

    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import horovod_gravac as hg
    import horovod_gravac.ddp

    init = "file://" + os.path.join(tempfile.mkdtemp(), "rdzv")
    dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp = DDP(model)
    state = hg.ddp.GravacState(None, compressor=hg.TopKCompressor,
                               controller=hg.GraVAC(theta_min=2, theta_max=32, window=2))
    ddp.register_comm_hook(state, hg.ddp.gravac_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        opt.zero_grad()
        ddp(torch.randn(8, 16)).square().mean().backward()
        opt.step()
    assert state.stats["step"] == 3 and state.stats["cf"] > 1, state.stats
    loaded = sorted(n for n in sys.modules if n == "horovod" or n.startswith("horovod."))
    assert not loaded, loaded
    dist.destroy_process_group()
    print("ok", state.stats["cf"])
""")


def test_ddp_path_runs_where_horovod_cannot_be_imported():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-c", _WITHOUT_HOROVOD], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("ok"), p.stdout + p.stderr


@pytest.mark.parallel
def test_launch_script_smoke_trains_two_local_ranks():
    """launch/run_ddp.sh with SMOKE=1: 2 local Gloo processes through the hook, 20 steps."""
    cmd = ["bash", str(ROOT / "launch" / "run_ddp.sh"), "--epsilon", "0.3", "--theta-min", "2"]
    rc, out = run_with_timeout(cmd, 240, env={"SMOKE": "1", "PYTHON": sys.executable, "DRY_RUN": "0"})
    assert rc == 0, out[-4000:]
    assert "done: 20 steps" in out and "on 2 ranks" in out, out[-4000:]
