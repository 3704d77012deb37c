"""Investigation: where GraVAC()'s time to the target over the best static CF goes, on the
generalization draws whose run folders are on disk (``python -m benchmarks.generalization
--seeds S --out DIR`` writes them).  Answered in docs/benchmarks.md, "Seventeenth evaluation".

    python -m benchmarks.time_split --out DIR --seeds 1084-1136 split|offsets|loss|failures|weighted
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

from . import adaptivity as A
from . import generalization as G


def steps_of(run: str):
    with open(os.path.join(run, "steps.jsonl")) as f:
        return [json.loads(line) for line in f]


def history(run: str):
    with open(os.path.join(run, "summary.json")) as f:
        return json.load(f).get("controller_history", [])


def first_step_on_target(run: dict, d: dict):
    scores = A.score(run["evals"], d["metric"])
    ok = [e["step"] for e, v in zip(run["evals"], scores)
          if (v <= d["target"] if d["metric"] == "perplexity" else v >= d["target"])]
    return ok[0] if ok else None


def split(draws, out):
    """Steps to the target and time per step over the best static CF's; up to the default's
    target step, what its 10x steps cost over the CF after them, and the rest."""
    for d in draws:
        if d["comm_share"] < 0.5 or d["best_static"] is None or d["rows"]["gravac"]["tta_s"] is None:
            continue
        runs = G.draw_dir(out, d["seed"])
        mine, best = (d["rows"][n] for n in ("gravac", d["best_static"]))
        s_mine = first_step_on_target(G.load(os.path.join(runs, "gravac")), d)
        s_best = first_step_on_target(G.load(os.path.join(runs, d["best_static"])), d)
        best_ms = 1000 * best["tta_s"] / s_best
        steps = [r for r in steps_of(os.path.join(runs, "gravac")) if r["step"] <= s_mine and r.get("step_time")]
        at10 = [r["step_time"] for r in steps if r["cf"] == 10.0]
        higher = [r["step_time"] for r in steps if r["cf"] != 10.0]
        mean_higher = statistics.mean(higher) if higher else 0.0
        excess = sum(r["step_time"] for r in steps) - len(steps) * best_ms / 1000
        print(f"{d['seed']} {d['family']} steps {s_mine / s_best:.2f}x, per step "
              f"{1000 * mine['tta_s'] / s_mine / best_ms:.2f}x; excess {excess:.1f} s, of which 10x "
              f"({len(at10)} steps) {sum(t - mean_higher for t in at10):.1f} s")


def offsets(seeds, out):
    """The median over the communication-bound accuracy draws at other target offsets."""
    for off in (0.3, 0.4, 0.5, 0.6, 0.7):
        G.TOLERANCE_PP = off
        ratios = []
        for s in seeds:
            d = G.analyse_draw(s, out, False)
            if d is None or not d.get("timings_ms") or d["metric"] == "perplexity" or d["comm_share"] < 0.5 \
                    or d["best_static"] is None:
                continue
            g = d["rows"]["gravac"]["tta_s"]
            ratios.append(float("inf") if g is None else g / d["rows"][d["best_static"]]["tta_s"])
        print(f"-{off} pp: {len(ratios)} draws, median {statistics.median(ratios):.2f}x")


def loss(draws, out):
    """Each static CF's mean training loss over 10x's, per eighth of the run."""
    for d in draws:
        runs = G.draw_dir(out, d["seed"])
        base = [r.get("loss") for r in steps_of(os.path.join(runs, "topk10"))]
        q = len(base) // 8
        for c in ("topk30", "topk100", "topk300", "topk1000"):
            mine = [r.get("loss") for r in steps_of(os.path.join(runs, c))]
            per = []
            for k in range(8):
                a = [x for x in mine[k * q:(k + 1) * q] if x is not None]
                b = [x for x in base[k * q:(k + 1) * q] if x is not None]
                per.append(statistics.mean(a) / statistics.mean(b))
            print(d["seed"], d["family"], c, "reaches" if d["rows"][c]["tta_s"] is not None else "misses",
                  " ".join(f"{x:.2f}" for x in per))


def failures(draws, out):
    """The run's first coherence failure: its step, and the window cosine before the climb."""
    for d in draws:
        h = history(os.path.join(G.draw_dir(out, d["seed"]), "gravac"))
        i = next((k for k, x in enumerate(h) if x.get("delayed_signal")), None)
        if i is not None:
            before = h[i - 1].get("coherence") if i else None
            print(d["seed"], d["family"], "failed at step", h[i]["step"], "cf", h[i]["evaluated_cf"],
                  "cosine before", None if before is None else round(before, 3))


def weighted(draws, out, epsilon=0.9, ranks=2):
    """Per draw, the highest rung that epsilon on the loss weighted by the signal share would
    have admitted above the rule's choice at some check, and the cosine there."""
    ladder = (10, 20, 40, 80, 160, 320, 640, 1000)
    for d in draws:
        found = []
        for h in history(os.path.join(G.draw_dir(out, d["seed"]), "gravac")):
            g, sent, c = h.get("judged_gain"), h.get("evaluated_cf"), h.get("coherence")
            chosen = h.get("send_cf", h.get("theta_min"))
            if g is None or c is None or chosen is None or not sent or sent <= 1 or h.get("delayed_signal") \
                    or h.get("move") in ("hold", "dense") or not h.get("predicted_step"):
                continue
            share = ranks * max(c, 0.0) / (1 + (ranks - 1) * max(c, 0.0))
            top = max(cf for cf in ladder if cf <= sent * 16
                      and (cf <= sent or 1 - (1 - g) * cf / sent * share >= epsilon))
            if top > chosen:
                found.append((top, h["step"], round(c, 3), chosen))
        if found:
            top, step, c, chosen = max(found)
            print(d["seed"], d["family"], "weighted admits", top, "at step", step, "cosine", c, "rule", chosen)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seeds", default="1084-1136")
    p.add_argument("what", choices=["split", "offsets", "loss", "failures", "weighted"])
    a = p.parse_args()
    seeds = G.parse_seeds(a.seeds)
    if a.what == "offsets":
        return offsets(seeds, a.out)
    draws = [d for s in seeds if (d := G.analyse_draw(s, a.out, False)) is not None and d.get("timings_ms")]
    {"split": split, "loss": loss, "failures": failures, "weighted": weighted}[a.what](draws, a.out)


if __name__ == "__main__":
    main()
