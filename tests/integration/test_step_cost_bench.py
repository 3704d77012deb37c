"""benchmarks/step_cost.py: the per-step cost table runs end to end (one rank, CPU, a small
workload) and its rows are read from the harness runs it launched."""
import json
import os
import re

import pytest

pytest.importorskip("horovod.torch")
from benchmarks import step_cost  # noqa: E402


@pytest.mark.slow
def test_step_cost_table_rows_come_from_the_runs(tmp_path):
    out = tmp_path / "table.txt"
    assert step_cost.main(["--device", "cpu", "--preset", "cnn1d-digits", "--steps", "6", "--skip", "2",
                           "--runs", "dense,randomk-10", "--out", str(out)]) == 0
    text = out.read_text()
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line and not line.startswith(("#", "run"))}
    assert set(rows) == {"dense", "randomk-10"}, text   # no plain-torch row: a text-free, non-CIFAR preset
    assert rows["dense"][-1] == "1" and rows["randomk-10"][-1] == "10", text   # the CFs each run sent
    assert rows["dense"][2] == "-"                          # no plain-torch row to divide by
    assert float(rows["dense"][3]) == pytest.approx(1.0)   # "x dense" of the dense row itself
    run_dir = re.search(r"logs: (\S+)", text).group(1)
    with open(os.path.join(run_dir, "randomk-10", "steps.jsonl")) as f:
        steps = [json.loads(line) for line in f]
    assert len(steps) == 6
    summary = step_cost.summarize(os.path.join(run_dir, "randomk-10"), 2)
    assert float(rows["randomk-10"][1]) == pytest.approx(summary["step"], abs=0.05)


def test_step_cost_refuses_unknown_runs():
    with pytest.raises(SystemExit):
        step_cost.main(["--runs", "dense,nonsense"])
