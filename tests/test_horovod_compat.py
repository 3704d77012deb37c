"""``horovod_gravac.DistributedOptimizer`` as a drop-in for ``hvd.DistributedOptimizer``.

Every test here is one named check of tests/dist/compat_checks.py (or compat_process_set.py)
run on real Horovod ranks.  To keep the file fast, the checks are batched: one
horovodrun launch per group below, run once and shared by the tests of that group;
each test passes only if its check printed ``PASS``.  Every launch has a timeout that
kills all its ranks, and the optimizer's own ``timeout_s`` bounds each collective.

The package under test is the one on ``$HOROVOD_GRAVAC_TEST_ROOT`` if set (a checkout
directory), else this checkout; e.g. to test another checkout's package with these tests:
``HOROVOD_GRAVAC_TEST_ROOT=/path/to/checkout python -m pytest tests/test_horovod_compat.py``.
"""
import os
import re
import sys
import time
from pathlib import Path

import pytest

from launcher import ROOT, horovodrun_cmd, run_with_timeout

HERE = Path(__file__).parent
CHECKS = HERE / "dist" / "compat_checks.py"
PROCESS_SET = HERE / "dist" / "compat_process_set.py"
IMPL_ROOT = Path(os.environ.get("HOROVOD_GRAVAC_TEST_ROOT", str(ROOT))).resolve()


def launch(np_, script, args, timeout, mpi=False, env=None):
    """horovodrun ``script args`` on ``np_`` local ranks; returns (returncode or None on timeout, output)."""
    cmd = horovodrun_cmd(np_, [sys.executable, script, *args], gloo=not mpi)
    # Horovod itself aborts a stalled collective instead of waiting forever
    full_env = dict(HOROVOD_STALL_CHECK_TIME_SECONDS="30",
                    HOROVOD_STALL_SHUTDOWN_TIME_SECONDS=str(max(60, timeout - 30)))
    if mpi:
        full_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                        OMPI_MCA_btl_vader_single_copy_mechanism="none")
    full_env.update(env or {})
    start = time.monotonic()
    rc, out = run_with_timeout(cmd, timeout, env=full_env, pythonpath=IMPL_ROOT)
    if rc is None:
        out += f"\n*** TIMEOUT after {timeout}s: a rank hung; every rank was killed ***\n"
    out += f"\n[launch took {time.monotonic() - start:.1f}s]\n"
    return rc, out


# group -> (ranks, checks, timeout seconds)
GROUPS = {
    "np2-api-dense-sparse-compressed": (2, [
        "api_signature", "api_methods_and_positional_construction", "adasum_rejected_at_construction",
        "dense_bitwise_variants", "dense_fp16_is_fp16_on_the_wire", "set_backward_passes_per_step",
        "sparse_embedding_sgd_dense_controller", "sparse_embedding_sparseadam_dense_controller",
        "sparse_embedding_compressed_ranks_identical", "compressed_ranks_identical",
        "freeze_mid_training", "unfreeze_layer_frozen_at_wrap_time", "add_param_group_after_wrapping"], 240),
    "np2-amp": (2, [
        "amp_overflow_on_one_rank_dense_matches_hvd", "amp_natural_overflow_dense_matches_hvd",
        "amp_overflow_on_one_rank_compressed_every_rank_skips",
        "amp_grad_scaler_scale_invariant_compressed"], 150),
    "np2-hang-prone": (2, [
        "no_hang_user_collectives", "no_hang_two_gravac_optimizers_and_user_collectives",
        "broadcast_optimizer_state_fresh_does_not_step", "resume_recipe",
        # join last: if Horovod shuts down on a join failure, the checks after it cannot run
        "join_uneven_dense_matches_hvd", "join_uneven_data"], 240),
    "np2-stock": (2, ["stock_hvd_optimizer_with_hg_compressor"], 120),
    "np3": (3, [
        "no_hang_user_collectives", "compressed_ranks_identical",
        "broadcast_optimizer_state_fresh_does_not_step", "resume_recipe", "join_uneven_data"], 300),
}

_results = {}


def group_result(group):
    if group not in _results:
        np_, checks, timeout = GROUPS[group]
        _results[group] = launch(np_, CHECKS, checks, timeout)
    return _results[group]


_PREFIX = re.compile(r"^\[[\d,]+\]<std(?:out|err)>:")


def check_outcome(rc, out, name, np_):
    lines = [_PREFIX.sub("", line) for line in out.splitlines()]   # horovodrun's "[r]<stdout>:"
    # (under MPI the next rank's "[1,0]<stdout>:" prefix may follow on the same line)
    if re.search(rf"(^|>:)PASS {re.escape(name)}(?![\w])", out, re.M):
        return
    fails = [line for line in lines if line.startswith(f"FAIL {name} ")]
    if fails:
        # the failure lines plus the traceback lines that follow them
        i = lines.index(fails[0])
        detail = "\n".join(lines[i:i + 8])
        pytest.fail(f"{np_} ranks, check {name} failed:\n{detail}\n" +
                    "\n".join(fails[1:]), pytrace=False)
    pytest.fail(f"{np_} ranks, check {name} did not complete (rc={rc}); launch output tail:\n"
                f"{out[-5000:]}", pytrace=False)


CASES = [(g, c) for g, (_, checks, _) in GROUPS.items() for c in checks]


@pytest.mark.parametrize("group,check", CASES, ids=[f"{g.split('-')[0]}-{c}" for g, c in CASES])
def test_compat(group, check):
    rc, out = group_result(group)
    check_outcome(rc, out, check, GROUPS[group][0])


def test_compat_launches_exit_zero():
    """Every launch above exited 0 (no rank crashed after its checks)."""
    bad = {g: r[0] for g, r in _results.items() if r[0] != 0}
    assert not bad, f"launches with non-zero exit status (None: timeout): {bad}"


# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_process_set_dense_matches_hvd_and_excludes_rank2(mode):
    env = {"HOROVOD_DYNAMIC_PROCESS_SETS": "1"} if mode == "dynamic" else {}
    rc, out = launch(3, PROCESS_SET, [mode], 180, env=env)
    assert rc == 0 and re.search(r"PASS process_set$", out, re.M), f"process_set ({mode}) rc={rc}\n{out[-5000:]}"


def test_no_hang_user_collectives_under_mpi():
    rc, out = launch(2, CHECKS, ["no_hang_user_collectives"], 180, mpi=True)
    if rc != 0 and re.search(r"MPI (is )?not (built|available|supported)|mpirun.*not found|"
                             r"requires.*MPI|Horovod was not compiled with MPI", out, re.I) \
            and "PASS" not in out:
        pytest.skip(f"MPI not usable here: {out[-400:]}")
    check_outcome(rc, out, "no_hang_user_collectives", 2)
    assert rc == 0, out[-3000:]
