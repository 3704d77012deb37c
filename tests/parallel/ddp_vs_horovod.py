"""One training run with static Top-k, through either backend (not a test file):

    horovodrun -np 2 -H localhost:2 --gloo python ddp_vs_horovod.py horovod OUT
    torchrun --standalone --nproc_per_node 2 ddp_vs_horovod.py ddp OUT

The same model, seed, batches and optimizer; one bucket in both (Horovod's optimizer at
bucket_cap_mb=25, DDP's first bucket of 1 MiB), whose parameters may be in another order
(Top-k's choice does not depend on it).  Rank 0 writes the final parameters and the
per-step bytes to OUT; ``tests/test_ddp.py`` compares the two files."""
import sys

import torch

import horovod_gravac as hg

STEPS = 12


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                               torch.nn.ReLU(), torch.nn.Linear(64, 5))


def batch(step, rank):
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(24, 32, generator=g), torch.randint(0, 5, (24,), generator=g)


def main(backend, out):
    torch.set_num_threads(1)
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if backend == "horovod":
        import horovod.torch as hvd
        hvd.init()
        rank = hvd.rank()
        opt = hg.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                      compressor=hg.TopKCompressor, controller=hg.StaticCF(10))
        net = model
        stats = lambda: opt.stats   # noqa: E731
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        net = DDP(model)
        state = hg.ddp.GravacState(None, compressor=hg.TopKCompressor, controller=hg.StaticCF(10))
        net.register_comm_hook(state, hg.ddp.gravac_hook)
        opt = sgd
        stats = lambda: state.stats   # noqa: E731
    sent = []
    for step in range(STEPS):
        x, y = batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
        sent.append(stats()["bytes_sent"])
    if rank == 0:
        torch.save({"params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
                    "bytes_sent": sent}, out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
