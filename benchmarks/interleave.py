"""What the multi-rank step-time benchmarks (``rank_sweep``, ``step_cost network``) share:
training several optimizers in interleaved blocks, so that a noisy machine slows them
alike, and reading each launch's JSON line back from its ranks."""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def train_interleaved(runs: Dict[str, dict], x, y, blocks: int, block_steps: int,
                      plain: tuple = ("dense",),
                      around_block: Optional[Callable[[dict, bool], None]] = None) -> None:
    """Train each run (a dict with ``model`` and ``opt``) ``block_steps`` steps at a time,
    taking turns, ``blocks + 1`` times; block 0 warms up and is not counted.

    Appends each counted step's seconds to ``run["times"]`` and, for runs not in ``plain``
    (whose optimizer has no ``stats``), a copy of ``opt.stats`` to ``run["stats"]``.
    ``around_block(run, counted)`` is called before and after each block (a link counter,
    say)."""
    import torch.nn.functional as F
    for block in range(blocks + 1):
        counted = block > 0
        for path, run in runs.items():
            model, opt = run["model"], run["opt"]
            if around_block:
                around_block(run, counted)
            for _ in range(block_steps):
                t = time.perf_counter()
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
                if counted:
                    run["times"].append(time.perf_counter() - t)
                    if path not in plain:
                        run["stats"].append(dict(opt.stats))
            if around_block:
                around_block(run, counted)


def launch_json(module_args: List[str], tag: str, np_: int, rate: Optional[str], timeout: float,
                expect: int = 1, **run_ranks_kwargs) -> List[dict]:
    """Run ``python -m <module_args>`` on ``np_`` ranks (``benchmarks.netem.run_ranks``, one
    thread each) and return every ``<tag> {json}`` line the ranks printed, each with the
    launch's ``mode``; fewer than ``expect`` lines is an error that shows rank 0's output."""
    from benchmarks.netem import run_ranks
    env = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    results = run_ranks([sys.executable, "-m"] + module_args, np=np_, rate=rate, timeout=timeout, env=env,
                        **run_ranks_kwargs)
    found = []
    for res in results:
        for line in res.stdout.splitlines():
            if line.startswith(tag + " "):
                data = json.loads(line[len(tag) + 1:])
                data["mode"] = res.mode
                found.append(data)
    if len(found) < expect:
        raise RuntimeError(f"{len(found)} {tag} lines of {expect} from the ranks:\n" + results[0].stdout[-2000:]
                           + results[0].stderr[-2000:])
    return found


def cell(v, digits: int = 1) -> str:
    """A table cell: ``-`` for None, floats to ``digits`` places."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)
