"""Real multi-rank tests: every test of parallel/test_optimizer.py on 2 and 3 Gloo ranks.

Horovod registers no hooks with one rank, so only these prove anything about
communication.  Each run is bounded by a timeout that kills every rank.
"""
import pytest

from launcher import run_parallel_tests


@pytest.mark.parametrize("np_", [2, 3])
def test_optimizer_on_ranks(np_):
    run_parallel_tests(np_, "test_optimizer.py", timeout=300)
