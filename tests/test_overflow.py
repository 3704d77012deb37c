"""Gradients at the edge of float32's range, on 2 Gloo ranks (see dist/overflow_checks.py)."""
from pathlib import Path

from conftest import run_ranks

CHECKS = Path(__file__).parent / "dist" / "overflow_checks.py"


def test_float32_range_edges():
    proc = run_ranks(2, CHECKS, timeout=240)
    assert proc.returncode == 0, proc.stdout[-6000:]
    for name in ("float64_beyond_float32_is_nonfinite", "large_finite_float32_is_sent"):
        assert f"ok {name}" in proc.stdout, proc.stdout[-6000:]
