"""Short Hugging Face Accelerate trainings on 2 CPU processes (Gloo) with and without
horovod_gravac's DDP comm hook (not a test file):

    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 accelerate_runs.py OUT

Both processes run the same loops one after another.  Each writes OUT/<run>.rank<r>.pt (its
final parameters, the hook's last stats and its optimizer steps), and rank 0 OUT/<run>.log.json
(what ``accelerator.log`` received); ``tests/integration/test_accelerate.py`` compares them.
Every hooked run is changed from its plain one only as README.md says: the state,
``register_comm_hook`` on the prepared model, ``register_for_checkpointing(hg.ddp.AllRanks(state))``
and ``accelerator.log(state.metrics(), step=...)``.
"""
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.tracking import GeneralTracker

import horovod_gravac as hg

OUT = sys.argv[1]


class Recorder(GeneralTracker):
    """An Accelerate tracker that keeps what it is given (rank 0's, as every tracker's)."""
    name = "recorder"
    requires_logging_directory = False

    def __init__(self, path):
        super().__init__()
        self.path, self.rows = path, []

    @property
    def tracker(self):
        return self.rows

    def log(self, values, step=None, **kwargs):
        self.rows.append({"step": step, **values})

    def finish(self):
        with open(self.path, "w") as f:
            json.dump(self.rows, f)


def loader():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(128, 16, generator=g)   # 2 processes x 8 batches of 8
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, (x[:, :4] * 3).argmax(1)), batch_size=8)


def run(name, make_controller=None, *, accumulate=1, log=False, save_at=None, resume=None, keep_hook_state=True):
    """One training loop over the 8 batches; ``make_controller`` None: plain DDP, no hook.
    ``save_at``: save_state after that many batches (to OUT/<name>.ckpt); ``resume``: a
    save_state directory to load, then continue after the batches it had seen."""
    accelerator = Accelerator(gradient_accumulation_steps=accumulate,
                              log_with=[Recorder(os.path.join(OUT, f"{name}.log.json"))] if log else None)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer, data = accelerator.prepare(model, optimizer, loader())
    state = None
    if make_controller is not None:
        state = hg.ddp.GravacState(process_group=None, compressor=hg.TopKCompressor, controller=make_controller())
        model.register_comm_hook(state, hg.ddp.gravac_hook)
        # (without the hook state: an unused state of the same settings takes the checkpoint's)
        kept = state if keep_hook_state else hg.ddp.GravacState(None, compressor=hg.TopKCompressor,
                                                                controller=make_controller())
        accelerator.register_for_checkpointing(hg.ddp.AllRanks(kept))
    if log:
        accelerator.init_trackers("gravac")
    done = 0
    if resume is not None:
        accelerator.load_state(resume)
        done = int(open(os.path.join(resume, "batches")).read())
        data = accelerator.skip_first_batches(data, done)
    steps = 0
    for x, y in data:
        with accelerator.accumulate(model):
            accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
        done += 1
        if accelerator.sync_gradients:
            steps += 1
            if log:
                accelerator.log(state.metrics(), step=state.stats["step"])
        if done == save_at:
            path = os.path.join(OUT, f"{name}.ckpt")
            accelerator.save_state(path)
            if accelerator.is_main_process:
                with open(os.path.join(path, "batches"), "w") as f:
                    f.write(str(done))
            accelerator.wait_for_everyone()
    params = torch.cat([p.detach().reshape(-1) for p in accelerator.unwrap_model(model).parameters()])
    torch.save({"params": params, "stats": dict(state.stats) if state is not None else None, "steps": steps},
               os.path.join(OUT, f"{name}.rank{accelerator.process_index}.pt"))
    for tracker in accelerator.trackers:   # (end_training would also destroy the process group)
        tracker.finish()
    # Free DDP (and the hook's state) now, not at the interpreter's exit after the group is
    # gone: there, Gloo's threads can outlive them and abort the process.
    del model, optimizer, data, state
    accelerator.free_memory()
    gc.collect()


def main():
    torch.set_num_threads(1)
    # Dense(): bit for bit plain DDP, with and without accumulate() (no_sync).
    run("plain")
    run("dense", hg.Dense)
    run("plain_acc", accumulate=2)
    run("dense_acc", hg.Dense, accumulate=2)
    # GraVAC with accumulation: ranks identical; its stats reach accelerator.log.
    run("gravac_acc", lambda: hg.GraVAC(theta_min=2, theta_max=32, window=2), accumulate=2, log=True)
    # save_state after 4 of 8 batches; load_state and the other 4 end where the uninterrupted
    # run does (Accordion's decisions follow the gradients alone, not measured times).
    accordion = lambda: hg.Accordion(low_cf=2, high_cf=8, threshold=0.5, interval=2)   # noqa: E731
    run("full", accordion, save_at=4)
    run("resumed", accordion, resume=os.path.join(OUT, "full.ckpt"))
    run("resumed_without_hook_state", accordion, resume=os.path.join(OUT, "full.ckpt"), keep_hook_state=False)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
