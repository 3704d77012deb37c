"""Real multi-rank tests: every check in dist/optimizer_checks.py on 2 and 3 Gloo ranks.

Horovod registers no hooks with one rank, so only these prove anything about
communication.  Each run is bounded by a timeout that kills every rank.
"""
from pathlib import Path

import pytest

from conftest import run_ranks

CHECKS = Path(__file__).parent / "dist" / "optimizer_checks.py"
EXPECTED = ["dense_matches_horovod", "static_cf1_is_dense", "sparse_aggregate_by_hand",
            "identical_after_training", "uneven_k", "randomk_shared_sends_no_indices",
            "gravac_changes_cf_without_hang", "mismatched_config_fails_everywhere",
            "nan_gradient_keeps_ranks_identical", "backward_passes_per_step",
            "powersgd_full_rank_equals_dense_and_accordion_switches",
            "overlapped_consensus_matches_synchronous", "broadcast_object_small_and_large",
            "two_optimizers_in_flight", "carried_stats_are_complete_averages"]


@pytest.mark.parametrize("np_", [2, 3])
def test_optimizer_checks(np_):
    proc = run_ranks(np_, CHECKS, "all", timeout=300)
    passed = {line.split("PASS ", 1)[1].strip() for line in proc.stdout.splitlines() if "PASS " in line}
    missing = [c for c in EXPECTED if c not in passed]
    assert proc.returncode == 0 and not missing, \
        f"{np_} ranks: rc={proc.returncode}, failed/missing {missing}\n{proc.stdout[-6000:]}"
