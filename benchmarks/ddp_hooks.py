"""Step time of DDP's own comm hooks against horovod_gravac's, 2 ranks on an emulated link.

    python -m benchmarks.ddp_hooks --rate 100mbit --rate 1gbit        # as root (namespaces)
    python -m benchmarks.ddp_hooks --rate 1gbit --steps 5 --quick      # a smoke

Each rank runs in its own network namespace behind a token-bucket link (``benchmarks/netem.py``;
without root it falls back to plain localhost and says so).  On every rank the same model
(an MLP of ``--width``; 1.1M parameters at the default 512) trains on synthetic batches under
each hook in turn: DDP's default allreduce, ``fp16_compress_hook``, PowerSGD at ranks 1, 2
and 4 (``start_powerSGD_iter=2``: the step times are read after it, past the warm-up), and
``hg.ddp.gravac_hook`` with static Top-k 10x and 100x, Accordion (Top-k, 10x/100x) and the
default GraVAC (Top-k, theta 10..1000, window 5 so that it moves within the run).  Rank 0
prints one JSON line per hook: median and mean step time over the timed steps (after
``--warmup`` steps), the CF sent at the end and the bytes it sent per step.

PowerSGD (torch 2.13, Gloo, CPU) hung in every launch on the emulated link, and also under
plain ``torchrun`` on loopback once the model is large (a 2048-wide MLP), past
``start_powerSGD_iter``; DDP's default hook on the same model does not.  Each hook therefore
runs in a launch of its own, bounded by ``--timeout``, and a hang is reported as a failed row.

This measures step time only; whether a hook reaches dense accuracy sooner is
``benchmarks/adaptivity.py``'s question (Horovod path).
"""
import argparse
import json
import os
import statistics
import sys
import time

HOOKS = ["allreduce", "fp16", "powersgd1", "powersgd2", "powersgd4", "topk10", "topk100", "accordion", "gravac"]
QUICK = ["allreduce", "fp16", "powersgd1", "topk10", "gravac"]


def make_hook(name, dist, hg):
    """(state, hook) for ``ddp_model.register_comm_hook``; (None, None): DDP's default."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if name == "allreduce":
        return None, None
    if name == "fp16":
        return None, default_hooks.fp16_compress_hook
    if name.startswith("powersgd"):
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=int(name[8:]),
                                            start_powerSGD_iter=2, min_compression_rate=0.5)
        return state, powerSGD_hook.powerSGD_hook
    controller = {"topk10": lambda: hg.StaticCF(10), "topk100": lambda: hg.StaticCF(100),
                  "accordion": lambda: hg.Accordion(10, 100, 0.5, 5),
                  "gravac": lambda: hg.GraVAC(theta_min=10, theta_max=1000, window=5)}[name]()
    return hg.ddp.GravacState(None, compressor=hg.TopKCompressor, controller=controller), hg.ddp.gravac_hook


def rank_main(args):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import horovod_gravac as hg

    rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=size)
    torch.set_num_threads(1)
    for name in args.hooks:
        torch.manual_seed(0)
        w = args.width
        model = torch.nn.Sequential(torch.nn.Linear(256, w), torch.nn.ReLU(), torch.nn.Linear(w, w),
                                    torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                                    torch.nn.Linear(w, w), torch.nn.ReLU(), torch.nn.Linear(w, 10))
        ddp = DDP(model)
        state, hook = make_hook(name, dist, hg)
        if hook is not None:
            ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        gen = torch.Generator().manual_seed(rank)
        times = []
        dist.barrier()
        for step in range(args.warmup + args.steps):
            x = torch.randn(32, 256, generator=gen)
            y = torch.randint(0, 10, (32,), generator=gen)
            t0 = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
        stats = getattr(state, "stats", None) or {}
        if rank == 0:
            print(json.dumps({"hook": name, "parameters": sum(p.numel() for p in model.parameters()),
                              "median_step_s": statistics.median(times), "mean_step_s": statistics.mean(times),
                              "steps": len(times), "cf": stats.get("cf"), "bytes_sent": stats.get("bytes_sent")}),
                  flush=True)
        dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", action="append", help="link rate per rank (netem syntax: 100mbit, 1gbit); repeatable")
    p.add_argument("--delay", default=None, help="one-way delay, e.g. 1ms")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--hooks", nargs="+", choices=HOOKS, default=None)
    p.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    p.add_argument("--timeout", type=float, default=600, help="seconds per hook's launch")
    p.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)   # inside a rank
    args = p.parse_args(argv)
    args.hooks = args.hooks or (QUICK if args.quick else HOOKS)
    if args.rank:
        return rank_main(args)

    from benchmarks.netem import EmulatedCluster, RanksFailed, launch_ranks
    rows = []
    for rate in args.rate or ["1gbit"]:
        with EmulatedCluster(args.np, rate, args.delay) as cluster:
            env = {"MASTER_ADDR": cluster.address(0), "GLOO_SOCKET_IFNAME": cluster.iface, "OMP_NUM_THREADS": "1"}
            for i, hook in enumerate(args.hooks):   # one launch per hook: a hang costs that hook only
                cmd = [sys.executable, "-m", "benchmarks.ddp_hooks", "--rank", "--steps", str(args.steps),
                       "--warmup", str(args.warmup), "--width", str(args.width), "--hooks", hook]
                try:
                    results = launch_ranks(cluster, cmd, args.timeout, env=dict(env, MASTER_PORT=str(29517 + i)))
                except RanksFailed as exc:
                    row = {"hook": hook, "rate": rate, "mode": cluster.mode,
                           "failed": str(exc).splitlines()[0]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    continue
                for line in results[0].stdout.splitlines():
                    if line.startswith("{"):
                        row = dict(json.loads(line), rate=rate, mode=cluster.mode)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    base = {r["rate"]: r["median_step_s"] for r in rows if r["hook"] == "allreduce" and "failed" not in r}
    print(f"\n{'rate':>8} {'hook':>10} {'median ms':>10} {'vs allreduce':>13} {'cf':>6} {'bytes/step':>11}")
    for r in rows:
        if "failed" in r:
            print(f"{r['rate']:>8} {r['hook']:>10}  failed: {r['failed']}")
            continue
        rel = r["median_step_s"] / base[r["rate"]] if r["rate"] in base else float("nan")
        cf = "" if r["cf"] is None else f"{r['cf']:g}"
        sent = "" if r["bytes_sent"] is None else str(r["bytes_sent"])
        print(f"{r['rate']:>8} {r['hook']:>10} {r['median_step_s'] * 1e3:>10.1f} {rel:>12.2f}x {cf:>6} {sent:>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
