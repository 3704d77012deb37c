"""The worked examples of docs/implementing.md run as they are: each complete script there (a
Python block that calls ``hvd.init()``) in its own process, one rank."""
import os
import re
import subprocess
import sys

import pytest

from launcher import ROOT

DOC = ROOT / "docs" / "implementing.md"
SCRIPTS = [block for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if "hvd.init()" in block]


def test_the_doc_has_both_examples():
    assert len(SCRIPTS) == 2
    assert "class PlainTopK(hg.SparseCompressor)" in SCRIPTS[0]
    assert "class GainGuard(hg.Controller)" in SCRIPTS[1]


@pytest.mark.parametrize("index", range(len(SCRIPTS)), ids=["compressor", "controller"])
def test_example_runs(index, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(SCRIPTS[index])
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert ("sent CF" in proc.stdout) if index == 0 else ("levels" in proc.stdout), proc.stdout
