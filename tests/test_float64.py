"""Float64 models under compression on 2 and 3 Gloo ranks (see parallel/test_float64_buckets.py):
3 ranks split uneven payloads and slots three ways and add in another order."""
import pytest

from launcher import run_parallel_tests


@pytest.mark.parametrize("np_", [2, 3])
def test_float64_buckets_on_ranks(np_):
    run_parallel_tests(np_, "test_float64_buckets.py", timeout=600)
