"""A Hugging Face Accelerate script with horovod_gravac's DDP comm hook: the lines marked
``+1`` to ``+3`` are the whole change to an Accelerate training loop (``+4`` logs the hook's
numbers, optional).

    accelerate launch --multi_gpu --num_processes 4 launch/accelerate_train.py          # 4 GPUs
    ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes 2 \\
        launch/accelerate_train.py                                                     # 2 CPU processes
    ... launch/accelerate_train.py --resume runs/accelerate/step_100

(Accelerate starts several processes through torchrun only under ``--multi_gpu``;
``ACCELERATE_USE_CPU=1`` makes them CPU processes on Gloo.)  The data are synthetic (a fixed
random teacher network labels Gaussian inputs), so the script runs anywhere without
downloads.  ``accelerator.save_state`` writes ``--out``/step_<n> every ``--save-every`` steps,
with every rank's hook state; ``--resume`` continues from one.  The ``gravac/*`` numbers go to
``accelerator.log`` (to the trackers given with ``--log-with``) and rank 0 prints some.
Needs ``pip install "horovod_gravac[accelerate]"``.
"""
import argparse
import os

import torch
from accelerate import Accelerator

import horovod_gravac as hg


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
    p.add_argument("--controller", choices=["dense", "static", "gravac", "accordion"], default="gravac")
    p.add_argument("--cf", type=float, default=10.0)
    p.add_argument("--theta-min", type=float, default=10.0)
    p.add_argument("--theta-max", type=float, default=1000.0)
    p.add_argument("--window", type=int, default=100)
    p.add_argument("--samples", type=int, default=16384, help="training samples (all processes together)")
    p.add_argument("--batch", type=int, default=64, help="per process")
    p.add_argument("--accumulate", type=int, default=1, help="gradient_accumulation_steps")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--save-every", type=int, default=100, help="optimizer steps between save_state (0: never)")
    p.add_argument("--log-with", default=None, help="an Accelerate tracker (tensorboard, wandb, ...)")
    p.add_argument("--out", default="runs/accelerate")
    p.add_argument("--resume", default=None, help="a directory written by save_state")
    args = p.parse_args()

    accelerator = Accelerator(gradient_accumulation_steps=args.accumulate, log_with=args.log_with,
                              project_dir=args.out)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loader = torch.utils.data.DataLoader(dataset(args.samples), batch_size=args.batch)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    state = hg.ddp.GravacState(process_group=None, compressor=hg.TopKCompressor,   # +1
                               controller=controller(args))
    model.register_comm_hook(state, hg.ddp.gravac_hook)                            # +2 (a DDP model: 2+ processes)
    accelerator.register_for_checkpointing(hg.ddp.AllRanks(state))                 # +3 save_state/load_state carry it
    accelerator.init_trackers("gravac", config=vars(args))

    done = 0   # batches
    if args.resume:
        accelerator.load_state(args.resume)
        done = int(os.path.basename(os.path.normpath(args.resume)).rsplit("_", 1)[-1]) * args.accumulate
    batches = accelerator.skip_first_batches(loader, done) if done else loader
    for x, y in batches:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        done += 1
        if not accelerator.sync_gradients:
            continue
        step = done // args.accumulate
        accelerator.log({"loss": loss.item(), **state.metrics()}, step=step)   # +4
        if step % 20 == 0:
            s = state.stats
            accelerator.print(f"step {step} loss {loss.item():.4f} cf {s['cf']:g} bytes_sent {s['bytes_sent']}")
        if args.save_every and step % args.save_every == 0:
            accelerator.save_state(os.path.join(args.out, f"step_{step}"))
    s = state.stats
    accelerator.print(f"done: {done // args.accumulate} steps on {accelerator.num_processes} processes; "
                      f"last step: cf {s['cf']:g}, bytes_sent {s['bytes_sent']}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
