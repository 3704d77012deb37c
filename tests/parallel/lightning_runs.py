"""Short PyTorch Lightning trainings on 2 CPU processes (Gloo) with and without
horovod_gravac's DDP comm hook (not a test file):

    python lightning_runs.py OUT

Lightning starts the second process itself (it re-runs this script), and both run the same
``Trainer.fit`` calls one after another.  Each process writes OUT/<run>.rank<r>.pt (its final
parameters and the hook's last stats); ``tests/integration/test_lightning.py`` compares them.
Every hooked run is changed from its plain one only as README.md says: the state, the
``DDPStrategy`` arguments and ``GravacCallback``.
"""
import gc
import glob
import os
import sys
import warnings

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.strategies import DDPStrategy

import horovod_gravac as hg
from horovod_gravac.lightning import GravacCallback

warnings.filterwarnings("ignore", ".*does not have many workers.*")
OUT = sys.argv[1]


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def loader():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, 16, generator=g)   # 2 processes x 4 batches of 8
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, (x[:, :4] * 3).argmax(1)), batch_size=8)


def fit(name, controller=None, *, epochs=1, accumulate=1, logger=False, checkpoint_dir=None, resume=None,
        keep_hook_state=True):
    """One Trainer.fit; ``controller`` None: plain DDP, no hook."""
    pl.seed_everything(0, verbose=False)
    model = Net()
    callbacks, strategy, state = [], DDPStrategy(), None
    if controller is not None:
        state = hg.ddp.GravacState(process_group=None, compressor=hg.TopKCompressor, controller=controller)
        strategy = DDPStrategy(ddp_comm_state=state, ddp_comm_hook=hg.ddp.gravac_hook)
        callbacks.append(GravacCallback(state, checkpoint=keep_hook_state))
    if checkpoint_dir is not None:
        callbacks.append(ModelCheckpoint(dirpath=checkpoint_dir, save_top_k=-1, every_n_epochs=1))
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_epochs=epochs,
                         accumulate_grad_batches=accumulate, callbacks=callbacks, logger=logger,
                         log_every_n_steps=1, enable_checkpointing=checkpoint_dir is not None,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader(), ckpt_path=resume)
    torch.save({"params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
                "stats": dict(state.stats) if state is not None else None,
                "global_step": trainer.global_step},
               os.path.join(OUT, f"{name}.rank{trainer.global_rank}.pt"))


def main():
    torch.set_num_threads(1)
    # Dense(): bit for bit the plain Trainer's, with and without gradient accumulation (no_sync).
    fit("plain")
    fit("dense", hg.Dense())
    fit("plain_acc", epochs=2, accumulate=2)
    fit("dense_acc", hg.Dense(), epochs=2, accumulate=2)
    # GraVAC with accumulation: ranks identical; its stats in the logger's metrics.csv.
    fit("gravac_acc", hg.GraVAC(theta_min=2, theta_max=32, window=2), epochs=2, accumulate=2,
        logger=CSVLogger(OUT, name="gravac_acc", version=0))
    # A checkpoint at the end of epoch 0; resumed from it, the run ends where the uninterrupted
    # one does (Accordion's decisions follow the gradients alone, not measured times).
    ckpt = os.path.join(OUT, "ckpt")
    accordion = lambda: hg.Accordion(low_cf=2, high_cf=8, threshold=0.5, interval=2)   # noqa: E731
    fit("full", accordion(), epochs=3, checkpoint_dir=ckpt)
    first = sorted(glob.glob(os.path.join(ckpt, "epoch=0*.ckpt")))[0]
    fit("resumed", accordion(), epochs=3, resume=first)
    fit("resumed_without_hook_state", accordion(), epochs=3, resume=first, keep_hook_state=False)
    # Free the DDP wrappers (and the hook states) before the group goes, not at the
    # interpreter's exit, where Gloo's threads can outlive them and abort the process.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
