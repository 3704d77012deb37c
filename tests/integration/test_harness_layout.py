"""The library / application split: the training harness lives in horovod_gravac.harness,
the library never imports it, and its modules have no second path."""
import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "horovod_gravac"
MOVED = ("train", "data", "models", "report", "demo")


def _imports(path):
    """Absolute names of the modules a file imports (relative imports resolved)."""
    rel = path.relative_to(ROOT).with_suffix("")
    package = list(rel.parts[:-1])   # a module's package; for __init__, the package itself
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            names.add(mod)
            names.update(f"{mod}.{a.name}" for a in node.names)
    return names


def test_the_library_does_not_import_the_harness():
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        if "harness" in path.relative_to(PKG).parts:
            continue
        bad = [n for n in _imports(path) if n == "horovod_gravac.harness" or
               n.startswith("horovod_gravac.harness.") or
               any(n == f"horovod_gravac.{m}" for m in MOVED)]
        if bad:
            offenders.append(f"{path.relative_to(ROOT)}: {sorted(bad)}")
    assert not offenders, offenders


@pytest.mark.parametrize("name", MOVED)
def test_harness_modules_have_one_path(name):
    assert not (PKG / f"{name}.py").exists()
    with pytest.raises(ImportError):
        importlib.import_module(f"horovod_gravac.{name}")


@pytest.mark.parametrize("module", ["horovod_gravac.harness.train", "horovod_gravac.harness.demo",
                                    "horovod_gravac.harness.report"])
def test_python_dash_m(module):
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                       timeout=120, cwd=str(ROOT), env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("usage:")
    assert "Warning" not in p.stderr, p.stderr   # e.g. runpy's found-in-sys.modules warning


def test_console_script_points_at_the_harness():
    text = (ROOT / "setup.py").read_text()
    assert "gravac-train=horovod_gravac.harness.train:main" in text


def test_benchmarks_are_a_package_without_path_hacks_or_import_cycles():
    bench = ROOT / "benchmarks"
    assert (bench / "__init__.py").exists()
    graph = {}
    for path in sorted(bench.glob("*.py")):
        text = path.read_text()
        assert "sys.path.insert" not in text and "sys.path.append" not in text, path.name
        graph[path.stem] = {n.split(".")[1] for n in _imports(path)
                            if n.startswith("benchmarks.") and n.count(".") >= 1} - {path.stem}

    def reaches(a, b, seen=()):
        return any(n == b or (n not in seen and reaches(n, b, seen + (n,))) for n in graph.get(a, ()))
    cycles = [m for m in graph if reaches(m, m)]
    assert not cycles, {m: graph[m] for m in cycles}


def _harness_graph():
    """module -> the other harness modules it imports, counting imports inside functions."""
    harness = PKG / "harness"
    graph = {}
    for path in sorted(harness.glob("*.py")):
        if path.stem == "__init__":
            continue
        graph[path.stem] = {n.split(".")[2] for n in _imports(path)
                            if n.startswith("horovod_gravac.harness.") and (harness / f"{n.split('.')[2]}.py").exists()
                            } - {path.stem}
    return graph


def test_harness_modules_import_in_a_cycle_free_order():
    """No two harness modules import each other, even lazily inside a function (data and
    synthetic did: ImageData lives in images, which both import); each imports in a fresh
    interpreter after exactly the modules it needs, in the order the graph gives."""
    import graphlib
    graph = _harness_graph()
    assert {"data", "images", "synthetic", "train"} <= set(graph)
    assert "data" not in graph["synthetic"] and "images" in graph["synthetic"] and "images" in graph["data"]
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        raise AssertionError(f"import cycle among the harness modules: {e.args[1]}") from None
    pytest.importorskip("torch")
    code = ("import importlib, sys\n"
            f"for m in {order!r}:\n"
            "    importlib.import_module('horovod_gravac.harness.' + m)\n"
            "print('imported', len(sys.modules) > 0)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=str(ROOT), env=env)
    assert p.returncode == 0 and "imported True" in p.stdout, p.stderr[-2000:]


def test_cf_schedule_changes_the_static_cf_at_its_steps():
    """``--cf-schedule 40@0,10@3``: 40x for steps 0-2, then 10x (the step index a decision is
    for is the controller's step count after observing the one before)."""
    from horovod_gravac.controllers import StepObservation
    from horovod_gravac.harness import train as T
    ctrl = T.make_controller(T.resolve_args(["--controller", "static", "--cf-schedule", "40@0, 10@3"]))
    sent = [ctrl.decision.send_cf]
    for _ in range(4):
        sent.append(ctrl.observe(StepObservation(ef_sq=1.0, min_sq=1.0, candidate_sq=1.0, step_time=0.1)).send_cf)
    assert sent == [40.0, 40.0, 40.0, 10.0, 10.0]
    assert ctrl.config() == {"type": "ScheduledCF", "plan": [[40.0, 0], [10.0, 3]]}
    for bad in ("40", "40@1,10@3", "40@0,10@0", "x@0"):
        with pytest.raises(ValueError, match="schedule"):
            T.make_controller(T.resolve_args(["--controller", "static", "--cf-schedule", bad]))
