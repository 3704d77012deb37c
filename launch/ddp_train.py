"""A plain PyTorch DDP training script with horovod_gravac's comm hook: the two lines marked
``+1`` / ``+2`` are the whole change to a DDP script.  Started by ``launch/run_ddp.sh``
under ``torchrun`` (one process per GPU, or per CPU slot with ``--backend gloo``).

The data are synthetic (a fixed random teacher network labels Gaussian inputs), so the script
runs anywhere without downloads; rank 0 prints the loss, the CF sent and the bytes per step.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import horovod_gravac as hg

COMPRESSORS = {"topk": "TopKCompressor", "dgc": "DGCCompressor", "redsync": "RedSyncCompressor",
               "randomk": "RandomKCompressor", "sidco": "SIDCoCompressor", "powersgd": "PowerSGDCompressor"}


def controller(args):
    if args.controller == "dense":
        return hg.Dense()
    if args.controller == "static":
        return hg.StaticCF(args.cf)
    if args.controller == "accordion":
        return hg.Accordion(low_cf=args.theta_min, high_cf=args.theta_max, threshold=0.5, interval=args.window)
    # --epsilon unset: the default rule set's own epsilon (DEFAULT_EPSILON in controllers/gravac.py).
    return hg.GraVAC(theta_min=args.theta_min, theta_max=args.theta_max, window=args.window,
                     **({} if args.epsilon is None else {"epsilon": args.epsilon}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="nccl" if torch.cuda.is_available() else "gloo")
    p.add_argument("--controller", choices=["dense", "static", "gravac", "accordion"], default="gravac")
    p.add_argument("--compressor", choices=sorted(COMPRESSORS), default="topk")
    p.add_argument("--cf", type=float, default=10.0)
    p.add_argument("--theta-min", type=float, default=10.0)
    p.add_argument("--theta-max", type=float, default=1000.0)
    p.add_argument("--epsilon", type=float, default=None, help="GraVAC's epsilon (default: the library's)")
    p.add_argument("--window", type=int, default=500)
    p.add_argument("--compression", choices=["none", "fp16", "bf16"], default="none")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()

    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if args.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(0)   # the same initial model on every rank (DDP also broadcasts it)
    teacher = torch.nn.Linear(128, 10).to(device)
    model = torch.nn.Sequential(torch.nn.Linear(128, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, 10)).to(device)
    ddp_model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    state = hg.ddp.GravacState(process_group=None, compressor=getattr(hg, COMPRESSORS[args.compressor]),  # +1
                               controller=controller(args), compression=args.compression)
    ddp_model.register_comm_hook(state, hg.ddp.gravac_hook)                                           # +2
    opt = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)

    gen = torch.Generator(device=device).manual_seed(1 + rank)
    start = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(args.batch, 128, generator=gen, device=device)
        y = teacher(x).argmax(1)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp_model(x), y)
        loss.backward()
        opt.step()
        if rank == 0 and (step % max(1, args.steps // 20) == 0 or step == args.steps - 1):
            s = state.stats
            print(f"step {step} loss {loss.item():.4f} cf {s['cf']:g} bytes_sent {s['bytes_sent']} "
                  f"step_time {s['step_time'] * 1e3:.1f} ms", flush=True)
    if rank == 0:
        print(f"done: {args.steps} steps in {time.perf_counter() - start:.1f} s on {dist.get_world_size()} ranks",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
