"""The embedded default (``python -m horovod_gravac.harness.demo``, what
scripts/quickstart.sh runs): a short real run of both workloads, one report each."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from horovod_gravac.harness import demo

ROOT = Path(__file__).resolve().parents[2]


def test_runs_cover_both_workloads_with_the_papers_gravac():
    presets = {preset for _, preset, _ in demo.RUNS}
    assert presets == {"digits", "ngram-pydoc-chars"}
    flags = dict((name, f) for name, _, f in demo.RUNS)["ngram-gravac-eps0.9"]
    assert flags[flags.index("--epsilon") + 1] == "0.9" and flags[flags.index("--policy") + 1] == "exponential"


@pytest.mark.parallel
@pytest.mark.slow
def test_short_demo_writes_one_report_per_workload(tmp_path):
    if importlib.util.find_spec("horovod") is None:
        pytest.skip("Horovod is not installed (run scripts/setup.sh)")
    out = tmp_path / "demo"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "horovod_gravac.harness.demo", "--out", str(out),
                        "--steps", "20",
                        "--quiet", "--timeout", "150", "--only", "dense,gravac-eps0.9,ngram-dense,ngram-gravac-eps0.9"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, env=env,
                       cwd=str(ROOT))
    assert p.returncode == 0, p.stdout[-4000:]
    assert "## digits" in p.stdout and "## ngram-pydoc-chars" in p.stdout
    assert "target check ngram-gravac-eps0.9" in p.stdout and "target check gravac-eps0.9" in p.stdout
    summary = json.loads((out / "demo_summary.json").read_text())
    assert set(summary["workloads"]) == {"digits", "ngram-pydoc-chars"}
    for preset, w in summary["workloads"].items():
        assert {r["run"] for r in w["table"]} <= {"dense", "gravac-eps0.9", "ngram-dense", "ngram-gravac-eps0.9"}
        assert len(w["table"]) == 2 and len(w["targets"]) == 1
        assert (out / preset / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / preset / "cf.png").stat().st_size > 1000
