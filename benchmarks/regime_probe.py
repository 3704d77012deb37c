#!/usr/bin/env python3
"""Investigation: what separates a draw that a CF above theta_min hurts from one it does not,
read from a dense run's own gradients, window by window?

Two ranks simulated in one process on a draw of ``benchmarks/workloads.py`` (as
``gain_vs_harm.py`` did), dense SGD (or Top-k with error feedback at ``--cf``), the draw's full
step count.  Per window (a twelfth of the steps), prints the mean training loss, a rank's mean
consecutive-gradient cosine, the mean signal power ``<g_t, g_t-1>`` (per rank) relative to the
first window's, the mean ``|g|^2`` relative to the first window's, and the test accuracy::

    python -m benchmarks.regime_probe 22 15 1009 1011
"""
import argparse
import json

import torch

from benchmarks import workloads as W


def run(seed: int, cf: float = 1.0) -> dict:
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
    prev = [None, None]
    window = w.window
    rows, acc = [], {"loss": 0.0, "cos": 0.0, "dot": 0.0, "sq": 0.0, "cnt": 0, "dcnt": 0}
    for step in range(w.steps):
        for group in opt.param_groups:
            group["lr"] = w.lr_at(step)
        sent = torch.zeros(n)
        for r, data in enumerate(ranks):
            opt.zero_grad()
            loss = data.loss(model)
            loss.backward()
            acc["loss"] += float(loss.detach()) / 2
            g = torch.cat([p.grad.reshape(-1) for p in params])
            acc["sq"] += float(g.dot(g)) / 2
            if prev[r] is not None:
                d = float(g.dot(prev[r]))
                acc["dot"] += d / 2
                acc["cos"] += d / (float(g.norm() * prev[r].norm()) + 1e-30) / 2
            prev[r] = g
            owed = g + residual[r]
            s = owed
            if cf > 1:
                idx = owed.abs().topk(k).indices
                s = torch.zeros(n)
                s[idx] = owed[idx]
            residual[r] = owed - s
            sent += s / 2
        acc["cnt"] += 1
        acc["dcnt"] += 1 if step > 0 else 0
        offset = 0
        for p in params:
            p.grad = sent[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        opt.step()
        if (step + 1) % window == 0 or step + 1 == w.steps:
            ev = ranks[0].evaluate(model, lambda t: t)
            rows.append({"step": step + 1, "loss": acc["loss"] / acc["cnt"], "cos": acc["cos"] / max(acc["dcnt"], 1),
                         "dot": acc["dot"] / max(acc["dcnt"], 1), "sq": acc["sq"] / acc["cnt"],
                         "lr": w.lr_at(step), **{k2: v for k2, v in ev.items() if k2 in ("accuracy", "perplexity")}})
            acc = {"loss": 0.0, "cos": 0.0, "dot": 0.0, "sq": 0.0, "cnt": 0, "dcnt": 0}
    return {"seed": seed, "cf": cf, "workload": w.describe(), "rows": rows}


def show(res: dict) -> None:
    rows = res["rows"]
    d0, s0 = rows[0]["dot"] or 1e-30, rows[0]["sq"] or 1e-30
    print(f"# seed {res['seed']} cf {res['cf']}: {res['workload']}")
    print("step   loss    cos    dot/d0   sq/s0   acc")
    for r in rows:
        m = r.get("accuracy", r.get("perplexity", float("nan")))
        print(f"{r['step']:5d} {r['loss']:7.4f} {r['cos']:6.3f} {r['dot'] / d0:8.4f} {r['sq'] / s0:8.4f} {m:7.3f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("seeds", type=int, nargs="+")
    p.add_argument("--cf", type=float, default=1.0)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    for s in a.seeds:
        res = run(s, a.cf)
        show(res)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(res) + "\n")
