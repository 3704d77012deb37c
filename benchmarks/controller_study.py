#!/usr/bin/env python3
"""Offline controller study: a GraVAC rule on the row LSTM and the 1D CNN in minutes, with
no network and no Horovod.

Not a timing benchmark.  It replays ``benchmarks/adaptivity.py``'s two heavy workloads
(300 steps, lr x0.1 after step 220, window 20, evaluation every 20 steps) with two workers
simulated in one process: each computes its gradient on its own batch of 32, keeps its own
error-feedback residual, and sends exact Top-k of one flat bucket at the CF the controller
decided; the update is the mean of what was sent.  The real controller (``GraVAC``,
``StaticCF``) is fed the statistics it decides from (window sums for ``"delivered"``, the
paper's per-step gains of theta_min and of the multi-level candidate for ``"paper"`` and
``"ladder"``; under ``"delivered"`` and ``"predictive"`` the per-step gains in its history
read 0).  Step time is modelled, ``a + b / CF`` ms (dense: ``d``), fitted to the committed
adaptivity medians at 100 Mbit/s, with +-10 % noise, so the throughput comparisons have
something to compare; the communication wait a controller reads (``comm_time``) is its
``b / CF`` part.  The point is accuracy: what a rule's CF choices do to the model, per seed.

    python -m benchmarks.controller_study --seeds 42,1,2,3,4 \\
        --specs 'static:1' 'static:10' 'gravac:{"variant": "delivered", "hold_windows": 0}'

Each spec is ``static:CF`` or ``gravac:{json keyword arguments}`` (``window`` defaults to
20).  Output: one JSON line per run (``--out``, appended; runs already there are skipped)
and a summary per workload and spec: the mean over seeds of the last four evaluations
against ``static:1`` (dense) in pp, runs that reached dense's final accuracy within 0.5 pp,
and the median modelled time to it as a speed-up over ``static:10``.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from horovod_gravac.controllers import DENSE, Controller, Dense, GraVAC, StaticCF, StepObservation

# workload -> model flags, lr, weight decay, step-time model (a, b, dense) in ms at 100 Mbit/s:
# a + b/CF fitted to the adaptivity benchmark's medians for Top-k 10x and 1000x on 2 ranks.
WORKLOADS = {
    "rowlstm": dict(model="rowlstm", width=256, lr=0.1, weight_decay=0.0, cost=(22.0, 970.0, 320.0)),
    "cnn1d": dict(model="cnn1d", width=64, lr=0.05, weight_decay=1e-4, cost=(47.0, 1667.0, 577.0)),
}
WORKERS, BATCH = 2, 32
LATE_EVALS = 4
Eval = Tuple[int, float, float, float]   # step, modelled seconds, test accuracy %, CF sent most in the interval


def make_controller(spec: str) -> Controller:
    kind, _, arg = spec.partition(":")
    if kind == "static":
        cf = float(arg)
        return Dense() if cf == DENSE else StaticCF(cf)
    if kind == "gravac":
        kwargs = {"window": 20, "variant": "paper", **(json.loads(arg) if arg else {})}
        return GraVAC(**kwargs)
    raise ValueError(f"spec must be static:CF or gravac:{{json}}, got {spec!r}")


def _top(acc: torch.Tensor, cf: float) -> torch.Tensor:
    if cf == DENSE:
        return acc.clone()
    sent = torch.zeros_like(acc)
    idx = acc.abs().topk(max(1, int(acc.numel() / cf))).indices
    sent[idx] = acc[idx]
    return sent


class Batches:
    """Each simulated worker's next batch of ``BATCH`` training digits: one seeded permutation,
    drawn again once it runs out (the workers take turns on it)."""

    def __init__(self, data, seed: int):
        self.data = data
        self.order = torch.Generator().manual_seed(seed)
        self.perm, self.pos = torch.randperm(len(data.train_y), generator=self.order), 0

    def next(self) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.pos + BATCH > len(self.perm):
            self.perm, self.pos = torch.randperm(len(self.data.train_y), generator=self.order), 0
        idx = self.perm[self.pos:self.pos + BATCH]
        self.pos += BATCH
        return self.data.train_x[idx], self.data.train_y[idx]


def flat_gradient(model: torch.nn.Module, params, batch) -> torch.Tensor:
    """The model's gradient on ``batch`` as one flat vector, in ``params``' order."""
    model.zero_grad()
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    return torch.cat([p.grad.reshape(-1) for p in params])


def set_gradients(params, update: torch.Tensor) -> None:
    """Each parameter's ``grad`` from its slice of the flat ``update``."""
    offset = 0
    for p in params:
        p.grad = update[offset:offset + p.numel()].view_as(p).clone()
        offset += p.numel()


def setup(workload: str, seed: int):
    """``(data, model, optimizer)`` of a workload: digits, the model seeded with ``seed``, SGD
    with momentum; one thread."""
    from horovod_gravac.harness.data import load_digits_data
    from horovod_gravac.harness.models import build_model
    torch.set_num_threads(1)
    w = WORKLOADS[workload]
    data = load_digits_data()
    torch.manual_seed(seed)
    model = build_model(w["model"], 10, width=w["width"], in_channels=1, image_size=8)
    opt = torch.optim.SGD(model.parameters(), lr=w["lr"], momentum=0.9, weight_decay=w["weight_decay"])
    return data, model, opt


def simulate(workload: str, spec: str, seed: int, steps: int = 300, window: int = 20,
             lr_drop_after: int = 220, eval_every: int = 20) -> List[Eval]:
    w = WORKLOADS[workload]
    data, model, opt = setup(workload, seed)
    ctrl = make_controller(spec)
    if isinstance(ctrl, GraVAC):
        ctrl.set_world_size(WORKERS)
        window = ctrl.window   # the window sums must close where the controller checks
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    residual = [torch.zeros(n) for _ in range(WORKERS)]
    owed = [r.clone() for r in residual]          # G of the window ("delivered")
    delivered = [torch.zeros(n) for _ in range(WORKERS)]   # D of the window
    batches = Batches(data, seed)
    jitter = random.Random(seed)
    a, b, dense_ms = w["cost"]
    # Only the paper's and the ladder's rules decide from the per-step gains; static CFs and
    # "delivered" (which decides from the window sums) are spared a Top-k per worker and step.
    paper_gains = isinstance(ctrl, GraVAC) and not ctrl.tracks_delivery
    seconds, evals, sent_cfs = 0.0, [], []
    for step in range(1, steps + 1):
        if step == lr_drop_after + 1:
            for group in opt.param_groups:
                group["lr"] *= 0.1
        d = ctrl.decision
        sent_cfs.append(d.send_cf)
        update = torch.zeros(n)
        ef_sq = min_sq = cand_sq = 0.0
        for r in range(WORKERS):
            grad = flat_gradient(model, params, batches.next())
            acc = residual[r] + grad
            ef_sq += float(acc @ acc) / WORKERS
            if paper_gains and d.theta_min > DENSE:   # theta_min's gain, the candidate's from its payload
                top = acc.abs().topk(max(1, int(n / d.theta_min))).values
                min_sq += float(top @ top) / WORKERS
                k = max(1, int(n / max(d.candidate_cf, d.theta_min)))
                cand_sq += float(top[:k] @ top[:k]) / WORKERS
            sent = _top(acc, d.send_cf)
            residual[r] = acc - sent
            owed[r] += grad
            delivered[r] += sent
            update += sent / WORKERS
        set_gradients(params, update)
        opt.step()
        ms = (dense_ms if d.send_cf == DENSE else a + b / d.send_cf) * jitter.uniform(0.9, 1.1)
        seconds += ms / 1000
        sums = {}
        if ctrl.interval_ends_at(step) if ctrl.accumulation_interval is not None or ctrl.tracks_delivery \
                else step % window == 0:
            sums = dict(accumulated_sq=sum(float(g @ g) for g in owed) / WORKERS,
                        window_dot=sum(float(g @ s) for g, s in zip(owed, delivered)) / WORKERS,
                        window_sent_sq=sum(float(s @ s) for s in delivered) / WORKERS)
            owed = [r.clone() for r in residual]
            delivered = [torch.zeros(n) for _ in range(WORKERS)]
        comm_ms = ms - a * ms / (dense_ms if d.send_cf == DENSE else a + b / d.send_cf)   # the jittered b / CF
        ctrl.observe(StepObservation(ef_sq=ef_sq, min_sq=min_sq, candidate_sq=cand_sq, step_time=ms / 1000,
                                     samples=float(WORKERS * BATCH), comm_time=comm_ms / 1000, **sums))
        if step % eval_every == 0:
            model.eval()
            with torch.no_grad():
                accuracy = 100.0 * float((model(data.test_x).argmax(1) == data.test_y).float().mean())
            model.train()
            recent = sent_cfs[-eval_every:]
            evals.append((step, seconds, accuracy, max(set(recent), key=recent.count)))
    return evals


def _run(job) -> str:
    workload, spec, seed = job
    return json.dumps({"workload": workload, "spec": spec, "seed": seed, "evals": simulate(workload, spec, seed)})


def summary(lines: Sequence[str], specs: Sequence[str], seeds: Sequence[int]) -> str:
    runs = {}
    for line in lines:
        r = json.loads(line)
        runs[(r["workload"], r["spec"], r["seed"])] = r["evals"]

    def tta(evals, target) -> Optional[float]:
        return next((t for _, t, acc, _ in evals if acc >= target - 1e-9), None)

    out = []
    for workload in WORKLOADS:
        out.append(f"{workload}: last {LATE_EVALS} evaluations vs dense (pp, mean over seeds; per seed), "
                   "runs within 0.5 pp of dense's final, median modelled TTA speed-up over static:10")
        for spec in specs:
            late, hits, ups, n = [], 0, [], 0
            for s in seeds:
                ev, dense, ref = (runs.get((workload, x, s)) for x in (spec, "static:1", "static:10"))
                if not ev or not dense:
                    continue
                n += 1
                late.append(statistics.mean(e[2] for e in ev[-LATE_EVALS:])
                            - statistics.mean(e[2] for e in dense[-LATE_EVALS:]))
                target = dense[-1][2] - 0.5
                mine = tta(ev, target)
                hits += mine is not None
                if ref:
                    theirs = tta(ref, target)
                    ups.append(0.0 if mine is None else (float("inf") if theirs is None else theirs / mine))
            if n:
                up = f"{statistics.median(ups):.2f}x" if ups else "-"
                out.append(f"  {spec:60s} {statistics.mean(late):+.2f} ({' '.join(f'{v:+.1f}' for v in late)})"
                           f"  reached {hits}/{n}  {up}")
    return "\n".join(out) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--specs", nargs="+", required=True)
    p.add_argument("--seeds", default="42,1,2,3,4")
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--out", default="/tmp/controller_study.jsonl", help="JSON lines, appended; reused")
    p.add_argument("--jobs", type=int, default=2)
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    specs = list(dict.fromkeys(["static:1", "static:10", *args.specs]))
    for spec in specs:
        make_controller(spec)   # fail fast on a bad spec
    done = set()
    if os.path.exists(args.out):
        with open(args.out) as f:
            done = {(r["workload"], r["spec"], r["seed"]) for r in map(json.loads, f)}
    jobs = [(w, sp, s) for sp in specs for w in args.workloads.split(",") for s in seeds
            if (w, sp, s) not in done]
    with ProcessPoolExecutor(args.jobs) as ex, open(args.out, "a") as f:
        for line in ex.map(_run, jobs):
            f.write(line + "\n")
            f.flush()
    with open(args.out) as f:
        print(summary(f.read().splitlines(), specs, seeds), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
