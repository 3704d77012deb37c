"""The Horovod-free core: controllers, gain, throughput, policies, the wire format and the
compressors' selection logic (``horovod_gravac.selection``) import without Horovod, and the
compressors (``horovod_gravac.compressors``) are Horovod ``Compressor`` subclasses built on it."""
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SELECTION = sorted("horovod_gravac.selection" + ("" if p.stem == "__init__" else "." + p.stem)
                   for p in (ROOT / "horovod_gravac" / "selection").glob("*.py"))
PURE = ["horovod_gravac", "horovod_gravac.controllers", "horovod_gravac.gain", "horovod_gravac.throughput",
        "horovod_gravac.policy", "horovod_gravac.wire", "horovod_gravac.buckets"] + SELECTION

# Imports each module named in argv in a fresh process of its own (forked from one that has
# loaded only torch and NumPy, so that the ~20 imports cost one interpreter start) and
# prints, as JSON, the Horovod modules each import loaded ("<parent>": those loaded before).
_LOADED = """
import importlib, json, os, sys
import numpy, torch

def horovod_modules():
    return sorted(n for n in sys.modules if n == "horovod" or n.startswith("horovod."))

results = {"<parent>": horovod_modules()}
for name in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
            out = horovod_modules()
        except BaseException as e:
            out = "import failed: " + repr(e)
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    results[name] = json.loads(data)
print(json.dumps(results))
"""


def _python(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


@pytest.fixture(scope="module")
def loaded():
    pytest.importorskip("torch")
    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    results = json.loads(_python("-c", _LOADED, *PURE))
    assert results.pop("<parent>") == []
    return results


def test_the_selection_package_is_listed():
    assert "horovod_gravac.selection.topk" in SELECTION and "horovod_gravac.selection.sidco" in SELECTION


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_horovod(module, loaded):
    assert loaded[module] == [], f"importing {module} loaded {loaded[module]}"


def test_selectors_run_where_horovod_cannot_be_imported():
    """With ``import horovod`` failing, every pure module imports and every selector selects."""
    pytest.importorskip("torch")
    script = f"""
import importlib, sys
sys.modules["horovod"] = None          # any import of horovod or horovod.* now fails
for name in {PURE!r}:
    importlib.import_module(name)
import torch
from horovod_gravac.cf import kept_count
from horovod_gravac.selection import (DGCSelector, RandomKSelector, RedSyncSelector, SIDCoSelector,
                                      TopKSelector)
x = torch.distributions.Laplace(0.0, 1.0).sample((200_000,))
for sel in (TopKSelector(100), DGCSelector(100), RedSyncSelector(100), SIDCoSelector(100), RandomKSelector(100)):
    p = sel.select_payload(x, kept_count(x.numel(), sel.cf))
    assert torch.equal(p.values, x[p.indices.long()]), sel
print("ok")
"""
    assert _python("-c", script) == "ok"


#: The rest of the core: everything but the Horovod backend, the optimizer and elastic.  They
#: import where Horovod cannot be imported (the compressors still subclass Horovod's
#: ``Compressor`` when it is there, so importing them loads it then).
CORE = ["horovod_gravac." + m for m in (
    "compressors", "error_feedback", "accounting", "encoder", "transfers", "lowrank", "consensus",
    "checkpoint", "comm", "backend", "link_emulation", "pipeline", "options", "sparse")]
HOROVOD_ONLY = ["horovod_gravac.horovod_backend", "horovod_gravac.optimizer", "horovod_gravac.elastic"]


def test_the_core_imports_where_horovod_cannot_be_imported():
    """Only the Horovod backend, the optimizer and elastic need Horovod; the core modules
    (the encoder, transfers, consensus, error feedback...) import without it."""
    pytest.importorskip("torch")
    script = f"""
import importlib, sys
sys.modules["horovod"] = None          # any import of horovod or horovod.* now fails
for name in {CORE!r}:
    importlib.import_module(name)
refused = []
for name in {HOROVOD_ONLY!r}:
    try:
        importlib.import_module(name)
    except ImportError:
        refused.append(name)
print(refused)
"""
    assert _python("-c", script) == repr(HOROVOD_ONLY)


def test_core_modules_name_no_collective_library():
    """The core reaches collectives only through the backend it is handed: no module but the
    Horovod backend, the optimizer and elastic (and the training harness) imports Horovod."""
    package = ROOT / "horovod_gravac"
    allowed = {package / "horovod_backend.py", package / "optimizer.py", package / "elastic.py"}
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path in allowed or "harness" in path.parts:
            continue
        for line in path.read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith(("import horovod.", "from horovod.", "import horovod ")) \
                    or stripped == "import horovod":
                offenders.append(f"{path.relative_to(ROOT)}: {stripped}")
    # (compressors/base.py imports Horovod's Compressor as its base where Horovod is installed)
    assert [o for o in offenders if "compressors/base.py" not in o] == [], offenders


def test_compressors_are_horovod_compressors():
    hc = pytest.importorskip("horovod.torch.compression")
    from horovod_gravac import compressors
    from horovod_gravac.compressors import GradientCompressor, SparseCompressor, TopKCompressor
    classes = [getattr(compressors, n) for n in compressors.__all__ if inspect.isclass(getattr(compressors, n))]
    for cls in classes:
        if issubclass(cls, tuple) or cls is GradientCompressor:   # the payload types, the interface
            continue
        assert issubclass(cls, hc.Compressor), cls
        assert issubclass(cls, GradientCompressor), cls
    assert isinstance(TopKCompressor(10), hc.Compressor)
    assert isinstance(TopKCompressor(10), SparseCompressor)


@pytest.mark.parametrize("name", ["TopK", "DGC", "RedSync", "SIDCo", "RandomK"])
def test_each_compressor_is_its_selector_on_the_horovod_base(name):
    """``XCompressor`` adds no code to ``XSelector``: the selection logic stays in the pure package,
    and the class chain stays short (the compressor, SparseCompressor, Horovod's Compressor)."""
    pytest.importorskip("horovod.torch")
    import inspect
    from horovod_gravac import compressors, selection
    from horovod_gravac.compressors import SparseCompressor
    cls, selector = getattr(compressors, f"{name}Compressor"), getattr(selection, f"{name}Selector")
    assert cls.selector_class is selector and cls.__mro__[1] is SparseCompressor and len(cls.__mro__) <= 4
    assert isinstance(cls(10).selector, selector) and inspect.signature(cls) == inspect.signature(selector)
    # (__slotnames__: copyreg's cache, set on the class once an instance has been copied)
    assert set(vars(cls)) <= {"__module__", "__qualname__", "__doc__", "__firstlineno__", "__static_attributes__",
                              "__slotnames__", "selector_class", "__signature__"}


def test_payload_types_are_the_pure_ones():
    pytest.importorskip("horovod.torch")
    from horovod_gravac import compressors
    from horovod_gravac.selection import payload
    assert compressors.SparsePayload is payload.SparsePayload
    assert compressors.SparseContext is payload.SparseContext
