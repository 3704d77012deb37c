"""A PyTorch Lightning script with horovod_gravac's DDP comm hook: the lines marked ``+1`` to
``+3`` are the whole change to a Lightning script that trains with ``DDPStrategy``.

    python launch/lightning_train.py --devices 2                        # 2 CPU processes (Gloo)
    python launch/lightning_train.py --accelerator gpu --devices 4      # 4 GPUs (NCCL)
    python launch/lightning_train.py --devices 2 --resume runs/lightning/last.ckpt

Lightning starts the other processes itself.  The data are synthetic (a fixed random teacher
network labels Gaussian inputs), so the script runs anywhere without downloads; the
``gravac/*`` numbers (CF sent, bytes per step, ...) go to the CSV logger's metrics.csv under
``--out``, and a checkpoint (with the hook's state) to ``--out``/last.ckpt.
Needs ``pip install "horovod_gravac[lightning]"``.
"""
import argparse

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.loggers import CSVLogger
from pytorch_lightning.strategies import DDPStrategy

import horovod_gravac as hg
from horovod_gravac.lightning import GravacCallback


class Classifier(pl.LightningModule):
    def __init__(self, width: int, lr: float):
        super().__init__()
        self.lr = lr
        self.net = torch.nn.Sequential(torch.nn.Linear(128, width), torch.nn.ReLU(),
                                       torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def dataset(n: int) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(1)
    teacher = torch.nn.Linear(128, 10)
    with torch.no_grad():
        teacher.weight.copy_(torch.randn(10, 128, generator=gen))
        x = torch.randn(n, 128, generator=gen)
        return torch.utils.data.TensorDataset(x, teacher(x).argmax(1))


def controller(args):
    if args.controller == "dense":
        return hg.Dense()
    if args.controller == "static":
        return hg.StaticCF(args.cf)
    if args.controller == "accordion":
        return hg.Accordion(low_cf=args.theta_min, high_cf=args.theta_max, threshold=0.5, interval=args.window)
    return hg.GraVAC(theta_min=args.theta_min, theta_max=args.theta_max, window=args.window)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--controller", choices=["dense", "static", "gravac", "accordion"], default="gravac")
    p.add_argument("--cf", type=float, default=10.0)
    p.add_argument("--theta-min", type=float, default=10.0)
    p.add_argument("--theta-max", type=float, default=1000.0)
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=8192, help="training samples (all ranks together)")
    p.add_argument("--batch", type=int, default=64, help="per process")
    p.add_argument("--accumulate", type=int, default=1, help="accumulate_grad_batches")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=10, help="log_every_n_steps")
    p.add_argument("--out", default="runs/lightning")
    p.add_argument("--resume", default=None, help="a checkpoint to continue from")
    args = p.parse_args()

    pl.seed_everything(0)
    model = Classifier(args.width, args.lr)
    loader = torch.utils.data.DataLoader(dataset(args.samples), batch_size=args.batch)
    state = hg.ddp.GravacState(process_group=None, compressor=hg.TopKCompressor,              # +1
                               controller=controller(args))
    trainer = pl.Trainer(
        accelerator=args.accelerator, devices=args.devices, num_nodes=args.num_nodes, max_epochs=args.epochs,
        strategy=DDPStrategy(ddp_comm_state=state, ddp_comm_hook=hg.ddp.gravac_hook),       # +2
        callbacks=[GravacCallback(state),                                                    # +3
                   ModelCheckpoint(dirpath=args.out, save_last=True)],
        accumulate_grad_batches=args.accumulate, logger=CSVLogger(args.out), log_every_n_steps=args.log_every,
        enable_progress_bar=False)
    trainer.fit(model, loader, ckpt_path=args.resume)
    if trainer.is_global_zero:
        s = state.stats
        print(f"done: {trainer.global_step} steps on {trainer.world_size} processes; last step: cf {s['cf']:g}, "
              f"bytes_sent {s['bytes_sent']}, loss {float(trainer.callback_metrics['loss']):.4f}; "
              f"metrics in {trainer.logger.log_dir}", flush=True)


if __name__ == "__main__":
    main()
