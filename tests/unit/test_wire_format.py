"""The sparse wire format and the statistics that ride in a bucket's collective
(``wire.py``), checked on one process by emulating what a collective returns."""
import pytest
import torch

from horovod_gravac import wire
from horovod_gravac.compressors import SparsePayload


def payload(values, indices):
    return SparsePayload(torch.tensor(values, dtype=torch.float32), torch.tensor(indices, dtype=torch.int32))


def test_pack_without_stats_is_eight_bytes_per_entry():
    packed = wire.pack(payload([1.5, -2.0], [3, 0]))
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
    packed = [wire.pack(p, torch.tensor(s, dtype=torch.float64), numel) for p, s in ranks]
    assert [t.shape[0] for t in packed] == [13 + 3, 13, 13 + 1]
    gathered = torch.cat(packed)          # what hvd.allgather returns on every rank
    stats = wire.read_header_stats(gathered, world=3, n=6)
    expected = torch.tensor([s for _, s in ranks], dtype=torch.float64).sum(0) / 3
    assert torch.equal(stats, expected)   # float64, bit for bit
    dense = wire.unpack_sum(gathered, numel)
    assert dense.shape == (numel,)
    assert dense.tolist() == [1.0, 0, 0, 0, 12.0, 0, 0, 0, 0, 3.0]


def test_headers_read_back_when_copying_to_the_cpu_makes_a_fresh_contiguous_column(monkeypatch):
    """On a GPU, ``gathered[rows, 0].cpu()`` is a fresh contiguous copy, so the statistics
    words after the row count sit at an odd storage offset and cannot be viewed as float64
    in place (an H200 run raised there).  Emulated here by a ``cpu()`` that copies."""
    stats = [torch.tensor([1.5, -2.0, 3.25, 0.0, 1e-300, 7.0], dtype=torch.float64) * (r + 1) for r in range(3)]
    gathered = torch.cat([wire.pack(payload([1.0] * r, list(range(r))), s, 4) for r, s in enumerate(stats)])
    monkeypatch.setattr(torch.Tensor, "cpu", lambda self: self.clone(memory_format=torch.contiguous_format))
    assert torch.equal(wire.read_header_stats(gathered, world=3, n=6), torch.stack(stats).sum(0) / 3)
    words = torch.cat([torch.tensor([7], dtype=torch.int32), stats[0].view(torch.int32)])
    assert words[1:].storage_offset() == 1 and words[1:].is_contiguous()
    assert torch.equal(wire.words_as_float64(words[1:]), stats[0])


def test_a_gather_whose_headers_do_not_add_up_is_an_error():
    packed = wire.pack(payload([1.0], [2]), torch.zeros(6, dtype=torch.float64), 5)
    with pytest.raises(RuntimeError, match="statistics header"):
        wire.read_header_stats(torch.cat([packed, packed[:3]]), world=2, n=6)
    with pytest.raises(RuntimeError, match="disagree"):
        wire.read_header_stats(torch.cat([packed, packed]), world=1, n=6)


def test_stats_appended_to_an_allreduce_come_back_and_leave_the_tensor_alone():
    flat = torch.arange(5, dtype=torch.float32)
    stats = torch.tensor([3.0, 1.0e-3, 123456.789, 0.0, 2.0, 1.0], dtype=torch.float64)
    sent = wire.with_stats(flat, stats)
    assert sent.dtype == torch.float32 and sent.numel() == 11
    assert sent.data_ptr() != flat.data_ptr()       # a copy: the residual buffer is untouched
    tensor, back = wire.split_stats(sent, 6)
    assert torch.equal(tensor, flat) and back.dtype == torch.float64
    assert torch.allclose(back, stats, rtol=1e-7, atol=0)
    big = wire.split_stats(wire.with_stats(flat, torch.tensor([1e39] + [0.0] * 5, dtype=torch.float64)), 6)[1]
    assert big[0] == float("inf")   # beyond float32: the optimizer treats the step as non-finite


def test_sum_of_colliding_rows_is_deterministic_and_switch_is_restored(monkeypatch):
    """Where index_add_ adds with atomics (CUDA), unpack_sum switches PyTorch's
    deterministic algorithms on for the call and restores the previous state."""
    calls = []
    real = torch.use_deterministic_algorithms
    monkeypatch.setattr(torch, "use_deterministic_algorithms",
                        lambda mode, warn_only=False: (calls.append((mode, warn_only)), real(mode, warn_only=warn_only)))
    g = torch.Generator().manual_seed(0)
    rows = [wire.pack(payload(torch.randn(50, generator=g).tolist(),
                              torch.randperm(60, generator=g)[:50].int().tolist())) for _ in range(3)]
    gathered = torch.cat(rows)
    plain = wire.unpack_sum(gathered, 60)
    assert calls == []                                   # the CPU adds in order without it
    monkeypatch.setattr(wire, "_adds_with_atomics", lambda t: True)
    assert torch.equal(wire.unpack_sum(gathered, 60), plain)
    assert calls == [(True, True), (False, False)]
    assert not torch.are_deterministic_algorithms_enabled()
    # a user who enabled it already keeps it: nothing is switched
    calls.clear()
    real(True)
    try:
        wire.unpack_sum(gathered, 60)
        assert calls == [] and torch.are_deterministic_algorithms_enabled()
    finally:
        real(False)


def test_step_stats_round_trip_in_wire_order():
    """StepStats names the positions of the statistics vector that rides with the carrier."""
    s = wire.StepStats(ef_sq=1.0, min_sq=2.0, candidate_sq=3.0, grad_sq=4.0, accumulated_sq=5.0,
                       window_dot=6.0, window_sent_sq=7.0, nonfinite=1.0, lag_dot=8.0, lag_now_sq=9.0,
                       lag_prev_sq=10.0)
    t = s.to_tensor()
    assert t.dtype == torch.float64 and t.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 1.0, 8.0, 9.0, 10.0]
    assert wire.N_STATS == 11 and wire.StepStats.from_tensor(t) == s


# -- float64 payloads and the dtype the wire says it carries --------------------------------
def payload64(values, indices):
    return SparsePayload(torch.tensor(values, dtype=torch.float64), torch.tensor(indices, dtype=torch.int32))


# digits float32 would round away, a finite value beyond float32's range, and its smallest normal
EXACT64 = [1.0000000001, -1e39, 2.0 ** -1022, 0.1]


def test_float64_values_travel_in_three_word_rows_bit_for_bit():
    packed = wire.pack(payload64(EXACT64, [5, 0, 9, 3]))
    assert packed.dtype == torch.int32 and packed.shape == (4, 3)   # 12 bytes an entry
    assert wire.row_words(torch.float64) == 3 and wire.row_words(torch.float32) == 2
    assert wire.row_words(torch.float16) == 2   # half precision travels as float32
    assert packed[:, 2].tolist() == [5, 0, 9, 3]
    assert packed[:, :2].contiguous().view(torch.float64).view(-1).tolist() == EXACT64
    dense = wire.unpack_sum(packed, 10, torch.float64)
    assert dense.dtype == torch.float64
    want = torch.zeros(10, dtype=torch.float64)
    want[[5, 0, 9, 3]] = torch.tensor(EXACT64, dtype=torch.float64)
    assert torch.equal(dense, want)
    # float32 payloads keep their two-word rows, bit for bit as before
    assert wire.pack(payload([1.5], [2])).shape == (1, 2)


def test_float64_headers_survive_an_uneven_gather_and_are_dropped_from_the_sum():
    numel = 10
    ranks = [(payload64([1.0000000001, 2.0, 1e39], [0, 4, 9]), [4.0, 3.0, 1e78, 2.5, 0.0, 0.0]),
             (payload64([], []), [2.0, 1.0, 0.5, 1.0e300, 7.0, 1.0]),
             (payload64([10.0], [4]), [6.0, 5.0, 0.25, 0.5, 0.0, 0.0])]
    packed = [wire.pack(p, torch.tensor(s, dtype=torch.float64), numel) for p, s in ranks]
    assert [tuple(t.shape) for t in packed] == [(13 + 3, 3), (13, 3), (13 + 1, 3)]
    gathered = torch.cat(packed)
    assert torch.equal(wire.read_header_stats(gathered, world=3, n=6),
                       torch.tensor([s for _, s in ranks], dtype=torch.float64).sum(0) / 3)
    dense = wire.unpack_sum(gathered, numel, torch.float64)
    assert dense.tolist() == [1.0000000001, 0, 0, 0, 12.0, 0, 0, 0, 0, 1e39]


def test_float64_join_safe_slots_sum_to_every_payload_and_its_statistics():
    """join_safe's slotted allreduce: each rank's slot in a buffer of the payload's width;
    a joined rank's slot is zeros (an empty payload, statistics zero)."""
    numel, world, cap = 8, 3, 4
    stats = [torch.tensor([float(r + 1)] * 6, dtype=torch.float64) for r in range(world)]
    slots = [wire.pack_slot(payload64([1.0000000001 * (r + 1)], [r]), stats[r], numel, world, r, cap, 6)
             for r in range(2)]
    assert all(t.shape == (world * wire.slot_rows(cap, 6), 3) for t in slots)
    summed = slots[0] + slots[1]   # rank 2 joined: adds zeros
    assert torch.equal(wire.read_slot_stats(summed, world, cap, 6), (stats[0] + stats[1]) / world)
    dense = wire.unpack_sum(summed, numel, torch.float64)
    assert dense[:3].tolist() == [1.0000000001, 2.0000000002, 0.0] and not dense[3:].any()


@pytest.mark.parametrize("sent,expected", [(torch.float64, torch.float32), (torch.float32, torch.float64)])
def test_a_payload_read_as_the_wrong_dtype_is_an_error_naming_the_bucket(sent, expected):
    """The rows' width says which dtype they carry; a rank whose bucket expects the other
    dtype refuses to read them (Horovod itself refuses to gather rows of different widths)."""
    made = payload64 if sent == torch.float64 else payload
    packed = wire.pack(made([1.0, 2.0], [0, 1]), torch.zeros(6, dtype=torch.float64), 4)
    assert wire.rows_dtype(packed, sent, "gravac.bucket.3") == sent
    with pytest.raises(RuntimeError, match=f"bucket gravac.bucket.3 arrived as rows of "
                                           f"{wire.row_words(sent)} int32 words \\({sent} values\\).*"
                                           f"sends {expected} values"):
        wire.unpack_sum(packed, 4, expected, "gravac.bucket.3")
    with pytest.raises(RuntimeError, match="bucket gravac.bucket.3 arrived as a tensor of shape \\(8,\\)"):
        wire.rows_dtype(torch.zeros(8, dtype=torch.int32), sent, "gravac.bucket.3")
