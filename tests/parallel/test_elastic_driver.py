"""Horovod elastic under a real driver, launched by tests/integration/test_parallel.py as
``horovodrun --min-np 1 --max-np 2 --host-discovery-script ...`` (skipped in any other
launch).  The discovery script lists localhost:1 and 127.0.0.1:1, then localhost:2 once
$GRAVAC_ELASTIC_FLAG exists.
"""
import os
import time
from pathlib import Path

import pytest
import torch

import horovod.torch as hvd
import horovod_gravac as hg
from horovod_gravac.elastic import TorchState

from ranks import flat_params, train_steps

pytestmark = pytest.mark.skipif(os.environ.get("HOROVOD_ELASTIC") != "1" or not os.environ.get("GRAVAC_ELASTIC_FLAG"),
                                reason="runs under horovodrun's elastic driver (tests/integration/test_parallel.py)")
STEPS, FAIL_AT, GROW_AT = 24, 8, 14


def test_elastic_driver_shrinks_and_grows():
    """The worker on 127.0.0.1 dies at step FAIL_AT; the survivor restores its last
    commit, gets a 1-rank world, resets and trains on (residuals zeroed, EWMA factor 0.01);
    at GROW_AT it asks for a second slot, a new worker joins (its optimizer state is empty)
    and syncs from rank 0 (factor 0.02).  Both finish step STEPS with identical parameters."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    # No collective outside the elastic run function: a joining worker would call it alone.
    opt = hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=model.named_parameters(), bucket_cap_mb=0.01,
                                  controller=hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.2, window=3),
                                  check_consistency=False, timeout_s=60)
    state = TorchState(model=model, optimizer=opt, step=0)
    host = os.environ.get("HOROVOD_HOSTNAME", "?")
    seen = []

    @hvd.elastic.run
    def train(state):
        while state.step < STEPS:
            if state.step == FAIL_AT and host == "127.0.0.1":
                print(f"worker on {host} dies at step {state.step}", flush=True)
                os._exit(1)
            if state.step == GROW_AT and hvd.size() == 1:
                Path(os.environ["GRAVAC_ELASTIC_FLAG"]).touch()   # discovery now offers 2 slots
                for _ in range(600):   # until the driver notices: HostsUpdatedInterrupt
                    state.check_host_updates()
                    time.sleep(0.1)
            residual_max = max((float(r.abs().max()) for r in opt.residuals().values()), default=0.0)
            seen.append((state.step, hvd.size(), opt.world_size, opt.controller.world_size,
                         opt.controller._gain_min.alpha, residual_max))
            train_steps(model, opt, 1, start=state.step)
            state.step += 1
            state.commit()

    train(state)
    sizes = [s[1] for s in seen]
    shrunk = next((s for s in seen if s[1] == 1), None)
    grown = next((s for s in seen if s[1] == 2 and shrunk and s[0] > shrunk[0]), None)
    flat = flat_params(model)
    everyone = hvd.allgather(flat.unsqueeze(0), name="elastic.final")
    same = all(torch.equal(everyone[r], everyone[0]) for r in range(hvd.size()))
    report = (f"host={host} rank={hvd.rank()} size={hvd.size()} first_step={seen[0][0]} "
              f"sizes={sorted(set(sizes))} final_step={state.step} shrunk={shrunk} grown={grown} "
              f"identical={same} finite={bool(torch.isfinite(flat).all())}")
    print(f"ELASTIC {report}", flush=True)
    # The workers at the end: the survivor (from step 0) and the one that joined.
    first_steps = hvd.allgather_object(seen[0][0], name="elastic.first_steps")
    assert sorted(first_steps) == [0, GROW_AT], f"the last workers started at steps {first_steps}; {report}"
    assert state.step == STEPS and same and bool(torch.isfinite(flat).all()), report
    if seen[0][0] == 0:   # the survivor: world 2 -> 1 -> 2
        assert sorted(set(sizes)) == [1, 2] and shrunk == (FAIL_AT, 1, 1, 1, 0.01, 0.0), report
        assert grown == (GROW_AT, 2, 2, 2, 0.02, 0.0), report
