"""The sparse allreduce and the choice of exchange on real ranks: tests/parallel/test_sparse_allreduce.py
under horovodrun and tests/parallel/test_ddp_sparse_allreduce.py under torchrun, each launch
under a timeout that kills every rank.  The default run takes one size of each (4 Horovod
ranks, 3 DDP ranks); ``bash scripts/test.sh -m scale`` runs 2, 3, 5 and 8 Horovod ranks and 2,
4, 5 and 8 DDP ranks (about 5 minutes on 2 cores).  The rank that dies mid-exchange is in
test_faults.py."""
import pytest

from launcher import run_parallel_tests, torchrun_cmd

pytestmark = pytest.mark.parallel


@pytest.mark.parametrize("np_", [pytest.param(n, marks=() if n == 4 else pytest.mark.scale) for n in (2, 3, 4, 5, 8)])
def test_sparse_allreduce_under_horovodrun(np_):
    run_parallel_tests(np_, "test_sparse_allreduce.py", timeout=300 + 60 * np_)


@pytest.mark.parametrize("np_", [pytest.param(n, marks=() if n == 3 else pytest.mark.scale) for n in (2, 3, 4, 5, 8)])
def test_sparse_allreduce_under_torchrun(np_):
    run_parallel_tests(np_, "test_ddp_sparse_allreduce.py", timeout=200 + 40 * np_, launcher=torchrun_cmd(np_))
