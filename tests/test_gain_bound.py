"""benchmarks/gain_bound.py: the fewest entries that keep eps of the squared norm, the
per-layer floor it is compared with, and the oracle's step time."""
import pytest
import torch

pytest.importorskip("sklearn")
from benchmarks import gain_bound  # noqa: E402


def test_floor_count_is_the_fewest_largest_entries_that_keep_eps():
    x = torch.tensor([0.0, 3.0, -1.0, 2.0, 1.0])   # squares 9, 4, 1, 1: total 15
    assert gain_bound.floor_count(x, 0.5) == 1      # 9 / 15 = 0.6
    assert gain_bound.floor_count(x, 0.7) == 2      # 13 / 15 = 0.87
    assert gain_bound.floor_count(x, 0.9) == 3      # 14 / 15 = 0.93
    assert gain_bound.floor_count(x, 1.0) == 4      # the zero is never needed
    assert gain_bound.floor_count(torch.zeros(4), 0.7) == 1


def test_no_split_between_layers_needs_fewer_entries_than_the_bucket_floor():
    torch.manual_seed(0)
    layers = [torch.randn(300) * 5, torch.distributions.Laplace(0.0, 0.1).sample((2000,)), torch.randn(50)]
    flat = torch.cat(layers)
    for eps in (0.5, 0.7, 0.9):
        bucket = gain_bound.floor_count(flat, eps)
        assert sum(gain_bound.floor_count(part, eps) for part in layers) >= bucket
        # and the bucket floor's entries do keep eps, one fewer does not
        sq = (flat.double() ** 2).sort(descending=True).values
        assert sq[:bucket].sum() >= eps * sq.sum() > sq[:bucket - 1].sum()
    assert gain_bound.rung_gain(flat, 1.0) == pytest.approx(1.0)


def test_oracle_falls_back_to_dense_below_theta_min_and_caps_at_theta_max():
    cost = (10.0, 100.0, 50.0)
    assert gain_bound.oracle_ms(5.0, cost) == 50.0
    assert gain_bound.oracle_ms(20.0, cost) == pytest.approx(15.0)
    assert gain_bound.oracle_ms(1e6, cost) == pytest.approx(10.1)
    assert gain_bound.oracle_ms(5.0, cost, fallback=False) == pytest.approx(20.0)


def test_the_report_runs_end_to_end_on_a_short_run():
    rows = gain_bound.measure("rowlstm", seed=0, steps=4, every=2)
    assert len(rows) == 2 * gain_bound.WORKERS
    for r in rows:
        for eps in gain_bound.EPSILONS:
            assert r[f"cf_layers@{eps}"] <= r[f"cf_bucket@{eps}"] + 1e-9
        assert 0.0 < r["gain@1000"] <= r["gain@100"] <= r["gain@40"] <= r["gain@20"] <= r["gain@10"] <= 1.0
    text = gain_bound.report("rowlstm", rows, 4)
    assert text.startswith("rowlstm (4 probes") and "1-4" in text
