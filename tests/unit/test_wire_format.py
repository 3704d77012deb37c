"""The sparse wire format and the statistics that ride in a bucket's collective
(``comm.py``), checked on one process by emulating what a collective returns."""
import pytest
import torch

from horovod_gravac import comm, wire
from horovod_gravac.compressors import SparsePayload


def payload(values, indices):
    return SparsePayload(torch.tensor(values, dtype=torch.float32), torch.tensor(indices, dtype=torch.int32))


def test_pack_without_stats_is_eight_bytes_per_entry():
    packed = comm.pack(payload([1.5, -2.0], [3, 0]))
    assert packed.dtype == torch.int32 and packed.shape == (2, 2)
    assert packed[:, 1].tolist() == [3, 0]
    assert packed[:, 0].view(torch.float32).tolist() == [1.5, -2.0]


def test_headers_survive_an_uneven_gather_and_are_dropped_from_the_sum():
    numel = 10
    ranks = [  # uneven k, colliding indices, and a rank that keeps nothing
        (payload([1.0, 2.0, 3.0], [0, 4, 9]), [4.0, 3.0, 1.0e-300, 2.5, 0.0, 0.0]),
        (payload([], []), [2.0, 1.0, 0.5, 1.0e300, 7.0, 1.0]),
        (payload([10.0], [4]), [6.0, 5.0, 0.25, 0.5, 0.0, 0.0]),
    ]
    packed = [comm.pack(p, torch.tensor(s, dtype=torch.float64), numel) for p, s in ranks]
    assert [t.shape[0] for t in packed] == [13 + 3, 13, 13 + 1]
    gathered = torch.cat(packed)          # what hvd.allgather returns on every rank
    stats = comm.read_header_stats(gathered, world=3, n=6)
    expected = torch.tensor([s for _, s in ranks], dtype=torch.float64).sum(0) / 3
    assert torch.equal(stats, expected)   # float64, bit for bit
    dense = comm.unpack_sum(gathered, numel)
    assert dense.shape == (numel,)
    assert dense.tolist() == [1.0, 0, 0, 0, 12.0, 0, 0, 0, 0, 3.0]


def test_headers_read_back_when_copying_to_the_cpu_makes_a_fresh_contiguous_column(monkeypatch):
    """On a GPU, ``gathered[rows, 0].cpu()`` is a fresh contiguous copy, so the statistics
    words after the row count sit at an odd storage offset and cannot be viewed as float64
    in place (an H200 run raised there).  Emulated here by a ``cpu()`` that copies."""
    stats = [torch.tensor([1.5, -2.0, 3.25, 0.0, 1e-300, 7.0], dtype=torch.float64) * (r + 1) for r in range(3)]
    gathered = torch.cat([comm.pack(payload([1.0] * r, list(range(r))), s, 4) for r, s in enumerate(stats)])
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self: self.clone(memory_format=torch.contiguous_format))
    assert torch.equal(comm.read_header_stats(gathered, world=3, n=6), torch.stack(stats).sum(0) / 3)
    words = torch.cat([torch.tensor([7], dtype=torch.int32), stats[0].view(torch.int32)])
    assert words[1:].storage_offset() == 1 and words[1:].is_contiguous()
    assert torch.equal(wire.words_as_float64(words[1:]), stats[0])


def test_a_gather_whose_headers_do_not_add_up_is_an_error():
    packed = comm.pack(payload([1.0], [2]), torch.zeros(6, dtype=torch.float64), 5)
    with pytest.raises(RuntimeError, match="statistics header"):
        comm.read_header_stats(torch.cat([packed, packed[:3]]), world=2, n=6)
    with pytest.raises(RuntimeError, match="disagree"):
        comm.read_header_stats(torch.cat([packed, packed]), world=1, n=6)


def test_stats_appended_to_an_allreduce_come_back_and_leave_the_tensor_alone():
    flat = torch.arange(5, dtype=torch.float32)
    stats = torch.tensor([3.0, 1.0e-3, 123456.789, 0.0, 2.0, 1.0], dtype=torch.float64)
    sent = comm.with_stats(flat, stats)
    assert sent.dtype == torch.float32 and sent.numel() == 11
    assert sent.data_ptr() != flat.data_ptr()       # a copy: the residual buffer is untouched
    tensor, back = comm.split_stats(sent, 6)
    assert torch.equal(tensor, flat) and back.dtype == torch.float64
    assert torch.allclose(back, stats, rtol=1e-7, atol=0)
    big = comm.split_stats(comm.with_stats(flat, torch.tensor([1e39] + [0.0] * 5, dtype=torch.float64)), 6)[1]
    assert big[0] == float("inf")   # beyond float32: the optimizer treats the step as non-finite


def test_sum_of_colliding_rows_is_deterministic_and_switch_is_restored(monkeypatch):
    """Where index_add_ adds with atomics (CUDA), unpack_sum switches PyTorch's
    deterministic algorithms on for the call and restores the previous state."""
    calls = []
    real = torch.use_deterministic_algorithms
    monkeypatch.setattr(torch, "use_deterministic_algorithms",
                        lambda mode, warn_only=False: (calls.append((mode, warn_only)), real(mode, warn_only=warn_only)))
    g = torch.Generator().manual_seed(0)
    rows = [comm.pack(payload(torch.randn(50, generator=g).tolist(),
                              torch.randperm(60, generator=g)[:50].int().tolist())) for _ in range(3)]
    gathered = torch.cat(rows)
    plain = comm.unpack_sum(gathered, 60)
    assert calls == []                                   # the CPU adds in order without it
    monkeypatch.setattr(wire, "_adds_with_atomics", lambda t: True)
    assert torch.equal(comm.unpack_sum(gathered, 60), plain)
    assert calls == [(True, True), (False, False)]
    assert not torch.are_deterministic_algorithms_enabled()
    # a user who enabled it already keeps it: nothing is switched
    calls.clear()
    real(True)
    try:
        comm.unpack_sum(gathered, 60)
        assert calls == [] and torch.are_deterministic_algorithms_enabled()
    finally:
        real(False)


def test_step_stats_round_trip_in_wire_order():
    """StepStats names the positions of the statistics vector that rides with the carrier."""
    s = wire.StepStats(ef_sq=1.0, min_sq=2.0, candidate_sq=3.0, grad_sq=4.0, accumulated_sq=5.0,
                       window_dot=6.0, window_sent_sq=7.0, nonfinite=1.0)
    t = s.to_tensor()
    assert t.dtype == torch.float64 and t.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 1.0]
    assert wire.N_STATS == 8 and wire.StepStats.from_tensor(t) == s
    assert comm.N_STATS == wire.N_STATS and comm.pack is wire.pack
