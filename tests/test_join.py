"""hvd.join() with uneven data: every controller with DistributedOptimizer(join_safe=True),
on 2 and 3 Gloo ranks (and the error without the option names it); the tests are in
parallel/test_join_uneven.py."""
import pytest

from launcher import run_parallel_tests


@pytest.mark.parametrize("np_", [2, 3])
def test_join_with_uneven_data_under_every_controller(np_):
    run_parallel_tests(np_, "test_join_uneven.py", timeout=300)
