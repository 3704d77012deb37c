#!/usr/bin/env python3
"""Investigation: does the window gain rank how much a CF hurts, across model families?

Two ranks simulated in one process on a draw of ``benchmarks/workloads.py`` (each rank its own
batches, Top-k with error feedback per rank over the flattened gradient, the average of what
they send applied by the draw's optimizer), for ``STEPS`` steps at each CF given.  Prints the
test accuracy (rank 0's share of the test set) and the delivered gain over intervals of 1, 10
and 40 steps (cos^2 of the summed sent against the summed raw gradient, as
``controllers.delivered.window_gain`` reads it over a window)::

    python -m benchmarks.gain_vs_harm 22 1 10 30 100 300   # an MLP with SGD
    python -m benchmarks.gain_vs_harm 15 1 10 30 100 300   # a 1D CNN with SGD
"""
import json
import sys

import torch

from benchmarks import workloads as W

STEPS = 150
HORIZONS = (1, 10, 40)


def run(seed: int, cf: float, steps: int = STEPS) -> dict:
    w = W.draw(seed)
    torch.manual_seed(w.seed)
    torch.set_num_threads(1)
    ranks = [W.Data(w, r, 2) for r in range(2)]
    model = ranks[0].model()
    opt = W.make_base_optimizer(w, model.parameters())
    params = list(model.parameters())
    n = sum(p.numel() for p in params)
    k = max(1, int(n / cf))
    residual = [torch.zeros(n) for _ in ranks]
    sums = {h: [torch.zeros(n), torch.zeros(n)] for h in HORIZONS}   # h -> [sent, raw]
    gains = {h: [] for h in HORIZONS}
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = w.lr_at(step)
        sent, raw = torch.zeros(n), torch.zeros(n)
        for r, data in enumerate(ranks):
            opt.zero_grad()
            data.loss(model).backward()
            g = torch.cat([p.grad.reshape(-1) for p in params])
            owed = g + residual[r]
            s = owed
            if cf > 1:
                idx = owed.abs().topk(k).indices
                s = torch.zeros(n)
                s[idx] = owed[idx]
            residual[r] = owed - s
            sent += s / 2
            raw += g / 2
        for h in HORIZONS:
            sums[h][0] += sent
            sums[h][1] += raw
            if (step + 1) % h == 0:
                a, b = sums[h]
                gains[h].append(float(a.dot(b) ** 2 / (a.dot(a) * b.dot(b) + 1e-30)))
                sums[h] = [torch.zeros(n), torch.zeros(n)]
        offset = 0
        for p in params:
            p.grad = sent[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        opt.step()
    out = {"seed": seed, "cf": cf, "accuracy": round(ranks[0].evaluate(model, lambda t: t)["accuracy"], 4)}
    out.update({f"gain_{h}": round(sum(v) / len(v), 3) for h, v in gains.items()})
    return out


if __name__ == "__main__":
    for cf in map(float, sys.argv[2:]):
        print(json.dumps(run(int(sys.argv[1]), cf)), flush=True)
