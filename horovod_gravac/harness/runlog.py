"""The run directory: what :mod:`horovod_gravac.harness.train` writes, and the one reader.

Rank 0 writes to ``--out``:

``config.json``   every setting, the world size, parameter count
``steps.jsonl``   one line per step: ``opt.stats`` plus loss, lr, data/iteration time
``eval.jsonl``    one line per evaluation: test loss and accuracy/top-5 (images, hashed
                  features) or perplexity (language model), over all ranks' shards
``summary.json``  final and best metrics, floats sent vs dense, time, loader fraction;
                  written last, so its presence marks a finished run

:class:`RunWriter` writes them; :func:`load_run` reads them back as a :class:`RunLog`
(the report, the demo, the benchmarks and the tests all read through it). Nothing here
imports torch: the reader runs wherever the report does.
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import List

CONFIG = "config.json"
STEPS = "steps.jsonl"
EVALS = "eval.jsonl"
SUMMARY = "summary.json"


# --------------------------------------------------------------------------- writing
def jsonable(v):
    """``v`` with tensors as numbers/lists and non-finite floats as JSON-safe values
    (NaN -> null, +-inf -> +-1e308), so every line is strict JSON."""
    torch = sys.modules.get("torch")   # a tensor can exist only if torch is imported
    if torch is not None and isinstance(v, torch.Tensor):
        return v.item() if v.numel() == 1 else v.tolist()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return str(v)


class RunWriter:
    """Rank 0's files in the run directory (other ranks pass ``enabled=False`` and write
    nothing)."""

    def __init__(self, out: str, enabled: bool):
        self.enabled, self.out = enabled, out
        if enabled:
            os.makedirs(out, exist_ok=True)
            self._steps = open(os.path.join(out, STEPS), "w")
            self._eval = open(os.path.join(out, EVALS), "w")

    def write_json(self, name: str, obj) -> None:
        if self.enabled:
            with open(os.path.join(self.out, name), "w") as f:
                json.dump(jsonable(obj), f, indent=2, sort_keys=True)

    def config(self, config: dict) -> None:
        self.write_json(CONFIG, config)

    def summary(self, summary: dict) -> None:
        self.write_json(SUMMARY, summary)

    def step(self, record: dict) -> None:
        if self.enabled:
            self._steps.write(json.dumps(jsonable(record)) + "\n")

    def eval(self, record: dict) -> None:
        if self.enabled:
            self._eval.write(json.dumps(jsonable(record)) + "\n")
            self._eval.flush()

    def close(self) -> None:
        if self.enabled:
            self._steps.close()
            self._eval.close()


# --------------------------------------------------------------------------- reading
def read_jsonl(path: str) -> List[dict]:
    """The records of a JSON-lines file; [] if it is missing. A line that does not parse
    is skipped: a run killed mid-write leaves a partial last line."""
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    return rows


def read_json(path: str) -> dict:
    """A JSON file's object; {} if it is missing."""
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    return {}


@dataclass
class RunLog:
    """One run directory, read back. Files that are missing read as empty."""
    path: str
    config: dict = field(default_factory=dict)
    steps: List[dict] = field(default_factory=list)
    evals: List[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        """summary.json is written last: a run without it did not finish."""
        return bool(self.summary)


def is_finished(path: str) -> bool:
    """Whether ``path`` holds a finished run (its summary.json exists), without reading it."""
    return os.path.exists(os.path.join(path, SUMMARY))


def load_run(path: str) -> RunLog:
    """Read a run directory written by :class:`RunWriter`.

    Raises FileNotFoundError if ``path`` is not a directory; missing files read as empty
    (check :attr:`RunLog.finished` or the lists)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"run directory {path!r} does not exist")
    return RunLog(path=str(path), config=read_json(os.path.join(path, CONFIG)),
                  steps=read_jsonl(os.path.join(path, STEPS)),
                  evals=read_jsonl(os.path.join(path, EVALS)),
                  summary=read_json(os.path.join(path, SUMMARY)))
