"""The documentation holds: every ``docs/*.md`` path named in code and docs exists (with the
heading a ``#anchor`` names), so does every benchmark named (``benchmarks/NAME.py``,
``python -m benchmarks.NAME``), every relative link of a Markdown file leads somewhere, and the
worked examples of docs/implementing.md run as they are: each complete script there (a Python
block that calls ``hvd.init()``) in its own process, one rank."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import ROOT

DOC = ROOT / "docs" / "implementing.md"

# What the link check reads: the checkout's text files, not the environment or run outputs.
_SKIP_DIRS = {"__pycache__", "reports", "runs", "build", "dist"}
_TEXT = {".py", ".md", ".sh", ".txt", ".toml", ".cfg", ".yml", ".yaml", ".ini", ".in"}
# docs/<name>.md (also ../docs/<name>.md), not part of a longer path such as torch/docs/<name>.md
_DOC_PATH = re.compile(r"(?<![\w/.-])(?:\.\./)*(docs/[\w.-]+\.md)(?:#([\w-]+))?")
_MD_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _text_files():
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith(".")
                         and not d.endswith(".egg-info"))
        for name in sorted(files):
            path = Path(folder) / name
            if path.suffix in _TEXT or name == "Dockerfile":
                yield path


def _anchors(md: Path) -> set:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped,
    spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#+\s+(.*)$", md.read_text(), re.M)}


def _broken(source: Path, target: Path, anchor: str, named: str):
    if not target.exists():
        return f"{source.relative_to(ROOT)}: {named} does not exist"
    if anchor and target.suffix == ".md" and anchor not in _anchors(target):
        return f"{source.relative_to(ROOT)}: {named}: no heading #{anchor} in {target.relative_to(ROOT)}"
    return None


def test_every_docs_path_named_in_code_and_docs_exists():
    broken, named = [], 0
    for path in _text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for m in _DOC_PATH.finditer(text):
            named += 1
            broken.append(_broken(path, ROOT / m.group(1), m.group(2), m.group(0)))
        if path.suffix == ".md":
            for m in _MD_LINK.finditer(text):
                target = m.group(1)
                if re.match(r"[a-z]+:", target) or target.startswith("#"):
                    continue   # a URL, or a heading of the same file
                file, _, anchor = target.partition("#")
                named += 1
                broken.append(_broken(path, (path.parent / file).resolve(), anchor, target))
    broken = [b for b in broken if b]
    assert named > 30, f"the link check found only {named} references: is it reading the checkout?"
    assert not broken, "\n".join(broken)


# benchmarks/<name>.py and python -m benchmarks.<name>; NAME-like placeholders are not names
_BENCHMARK = re.compile(r"(?<![\w/.-])(?:benchmarks/([a-z_]\w*)\.py|-m\s+benchmarks\.([a-z_]\w*))")
# Run outputs keep the command line of the commit they were measured at.
_RESULTS = ROOT / "benchmarks" / "results"


def test_every_benchmark_named_in_code_and_docs_exists():
    missing, named = [], 0
    for path in _text_files():
        if _RESULTS in path.parents:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for m in _BENCHMARK.finditer(text):
            named += 1
            if not (ROOT / "benchmarks" / f"{m.group(1) or m.group(2)}.py").exists():
                missing.append(f"{path.relative_to(ROOT)}: {m.group(0)} does not exist")
    assert named > 30, f"the check found only {named} benchmark names: is it reading the checkout?"
    assert not missing, "\n".join(missing)
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
