"""The multi-rank tests of tests/parallel/, launched with horovodrun: every rank runs pytest on
the named files, and a launch passes only if every rank's pytest passed
(``launcher.run_parallel_tests``).  Each launch is bounded by a timeout that kills every rank.
Horovod registers no hooks with one rank, so only these prove anything about communication.

The compatibility launches against ``hvd.DistributedOptimizer`` are in test_horovod_compat.py,
the fault scenarios in test_faults.py.
"""
import re

import pytest

from launcher import check_parallel_tests, horovodrun_launcher, launch_parallel_tests, rank_lines, run_parallel_tests

pytestmark = pytest.mark.parallel


# One launch per job size: every rank runs these files in one pytest session, since each
# launch costs seconds of start-up on 2 cores.  A failure names its file and test in the
# ranks' output.  test_reliability_checks.py comes last: one of its tests shuts Horovod down
# and initialises it again.  test_float32_range.py runs on 2 ranks only.
ON_RANKS = {
    2: ["test_optimizer.py", "test_join_uneven.py", "test_float32_range.py", "test_float64_buckets.py",
        "test_reliability_checks.py"],
    3: ["test_optimizer.py", "test_join_uneven.py", "test_float64_buckets.py", "test_reliability_checks.py"],
}


@pytest.mark.slow
@pytest.mark.parametrize("np_", [2, 3])
def test_optimizer_join_float32_and_reliability_on_ranks(np_):
    """On 2 and 3 Gloo ranks: every test of parallel/test_optimizer.py; hvd.join() with uneven
    data under every controller with ``join_safe=True``, and the error without it naming the
    option (test_join_uneven.py); gradients at the edge of float32's range
    (test_float32_range.py, 2 ranks); float64 models under every compressor, their payloads and
    residuals in float64 (test_float64_buckets.py: 3 ranks split uneven payloads three ways and add
    in another order); non-finite gradients, consistency, bounded waits,
    checkpoints and the elastic handler (test_reliability_checks.py: every test on 2 ranks,
    those marked ``sizes(2, 3)`` also on 3)."""
    run_parallel_tests(np_, *ON_RANKS[np_], timeout=840)


@pytest.mark.slow
def test_checkpoint_resume_is_bitwise_identical(tmp_path):
    """Job 1: N+M uninterrupted steps, checkpoint at N (each rank its own file). Job 2 (a
    fresh horovodrun): load, M steps; parameters, CFs and controller state must be
    identical bit for bit, for static Top-k, GraVAC, static Random-k, GraVAC Random-k,
    Accordion (saved mid-interval), PowerSGD and DGC with momentum correction (and SIDCo,
    DGC, RedSync; known gaps would be printed as GAP)."""
    env = {"GRAVAC_CKPT_DIR": str(tmp_path)}
    run_parallel_tests(2, "test_checkpoint_jobs.py::test_ckpt_reference", timeout=300, env=env)
    assert len(list(tmp_path.glob("*.ckpt.rank*.pt"))) >= 8
    run_parallel_tests(2, "test_checkpoint_jobs.py::test_ckpt_resume", timeout=300, env=env)


@pytest.mark.slow
def test_real_elastic_driver_shrinks_and_grows(tmp_path):
    """horovodrun in elastic mode: 2 workers; the one on 127.0.0.1 dies at step 8 (world
    2 -> 1: restore, reset, residuals zeroed, EWMA factor 0.01); at step 14 the survivor
    asks for a second slot and a new worker joins with an empty optimizer (world 1 -> 2:
    sync from rank 0, factor 0.02). Both finish step 24 with identical parameters
    (parallel/test_elastic_driver.py checks it on each; both must pass)."""
    flag = tmp_path / "grow"
    discover = tmp_path / "discover.sh"
    discover.write_text(f'#!/bin/sh\nif [ -e "{flag}" ]; then echo localhost:2; '
                        f'else echo localhost:1; echo 127.0.0.1:1; fi\n')
    discover.chmod(0o755)
    launcher = horovodrun_launcher() + ["-np", "2", "--min-np", "1", "--max-np", "2",
                                        "--host-discovery-script", str(discover), "--gloo"]
    rc, out = launch_parallel_tests(2, "test_elastic_driver.py", timeout=240, launcher=launcher,
                                    env={"GRAVAC_ELASTIC_FLAG": str(flag)})
    # The two workers that finish print a pytest summary each; the one that died never gets
    # to its summary.  Under elastic restarts the rank prefix of a worker's lines is the one
    # it was launched with, so both finishers can carry the same prefix: count summaries,
    # not ranks.
    if rc is None or rc != 0:
        check_parallel_tests("elastic pytest of test_elastic_driver.py", rc, out, 240, range(2))
    summaries = [text.strip() for _, text in rank_lines(out) if re.match(r"=+ .* in [\d.]+s", text.strip())]
    clean = [t for t in summaries if " passed" in t and "failed" not in t and "error" not in t]
    assert len(clean) >= 2 and len(clean) == len(summaries), \
        f"elastic run: {len(clean)} clean pytest summaries of {len(summaries)}, want 2 or more\n{out[-6000:]}"
