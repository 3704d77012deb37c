#!/usr/bin/env python3
"""When would the first coherence failure's wait have ended on fewer readings?

Replays, on the kept run folders of generalization draws (``<out>/runs/seedS/gravac``, with
per-step cosines in ``steps.jsonl``), an earlier end of that wait: checked at every step once
``k`` readings at theta_min follow the failure's first probe interval (which still delivers
the failed CF's backlog), ending when those ``k`` readings' mean plus ``RELEASE_Z`` standard
errors (:func:`~horovod_gravac.coherence.mean_upper_bound`), times the run's recorded
``signal_rise``, is under the threshold.  The controller ends it only on a whole window read
since the failure.  Prints, per draw with a coherence failure: its family, window, probe
interval, the failure's step, the rise, the step the wait really ended (``released``), the
first step a CF above theta_min was sent again, and the replayed end for each ``k``::

    python -m benchmarks.release_replay --out /work/gen-eval --seeds 1102-1136
"""
from __future__ import annotations

import argparse
import json
import os

from benchmarks.generalization import parse_seeds
from horovod_gravac.coherence import hold_coherence, mean_upper_bound
from horovod_gravac.controllers.predictive import PredictiveGraVAC


def replay(run: str, ks) -> dict:
    cfg = json.load(open(os.path.join(run, "config.json")))
    window, ranks = cfg["window"], cfg.get("world_size", 2)
    probe = max(1, window // 4)
    history = json.load(open(os.path.join(run, "summary.json")))["controller_history"]
    steps = [json.loads(line) for line in open(os.path.join(run, "steps.jsonl"))]
    cosine = {s["step"]: s.get("coherence") for s in steps}
    failures = [h for h in history if h.get("delayed_signal")]
    if not failures or not any(c is not None for c in cosine.values()):
        return {}
    failed = failures[0]["step"]
    theta_min = min(s["cf"] for s in steps if s["cf"])
    rise = next((h["signal_rise"] for h in history
                 if h["step"] >= failed + probe and h.get("signal_rise") is not None), failures[0].get("signal_rise"))
    resumed = next((s["step"] for s in steps if s["step"] > failed and s["cf"] and s["cf"] > theta_min), None)
    out = {"family": cfg["workload"]["family"], "window": window, "probe": probe, "failed": failed,
           "rise": rise, "released": next((h["step"] for h in history if h.get("signal_wait_released")), None),
           "resumed": resumed}
    threshold = hold_coherence(ranks)
    for k in ks:
        out[f"k{k}"] = None
        for t in range(failed + probe + k, (resumed or len(steps)) + 1):
            bound = mean_upper_bound([cosine.get(s) for s in range(t - k + 1, t + 1)], PredictiveGraVAC.RELEASE_Z)
            if bound is not None and rise and bound * rise < threshold:
                out[f"k{k}"] = t
                break
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.release_replay", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="a generalization --out folder with its runs/")
    p.add_argument("--seeds", required=True)
    p.add_argument("--k", default="16,24,33", help="readings per replayed check")
    args = p.parse_args(argv)
    ks = [int(k) for k in args.k.split(",")]
    for seed in parse_seeds(args.seeds):
        run = os.path.join(args.out, "runs", f"seed{seed}", "gravac")
        if not os.path.exists(os.path.join(run, "steps.jsonl")):
            continue
        r = replay(run, ks)
        if r:
            print(seed, " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
