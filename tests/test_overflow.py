"""Gradients at the edge of float32's range, on 2 Gloo ranks (see parallel/test_float32_range.py)."""
from launcher import run_parallel_tests


def test_float32_range_edges():
    run_parallel_tests(2, "test_float32_range.py", timeout=240)
