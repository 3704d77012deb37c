"""hvd.join() with uneven data: every controller with DistributedOptimizer(join_safe=True),
on 2 and 3 Gloo ranks (and the error without the option names it)."""
from pathlib import Path

import pytest

from conftest import run_ranks

CHECKS = Path(__file__).parent / "dist" / "join_checks.py"
KINDS = ["dense", "static", "dgc", "randomk", "gravac", "accordion"]


@pytest.mark.parametrize("np_", [2, 3])
def test_join_with_uneven_data_under_every_controller(np_):
    proc = run_ranks(np_, CHECKS, *KINDS, timeout=300)
    assert proc.returncode == 0, f"{np_} ranks: rc={proc.returncode}\n{proc.stdout[-6000:]}"
    assert all(f"ok {k}" in proc.stdout for k in KINDS), proc.stdout[-6000:]
