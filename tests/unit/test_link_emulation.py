"""The emulated link (``link_emulation.py``): each collective also costs the bytes a rank sends
by the ring algorithms at the rate, queued one behind the other; results pass through as they are."""
import time

import pytest
import torch

from horovod_gravac.backend import CollectiveBackend
from horovod_gravac.link_emulation import EMULATE_ENV, EmulatedLinkBackend, emulated


class _Instant(CollectiveBackend):
    """Completes every collective at once; ``wait`` returns what was submitted."""

    def __init__(self, world=2, me=0):
        self.world, self.me = world, me

    def rank(self):
        return self.me

    def size(self):
        return self.world

    def allreduce_async(self, tensor, name, op=None, prescale_factor=1.0, postscale_factor=1.0):
        return tensor

    def allgather_async(self, tensor, name):
        return tensor

    def alltoall_async(self, tensor, splits, name):
        return tensor

    def pair_exchange_async(self, block, name):
        return block

    def broadcast_async_(self, tensor, name, root=0):
        return tensor

    def wait(self, handle, name, timeout=None):
        return handle


RATE = "8mbit"   # one byte a microsecond


@pytest.mark.parametrize("world,call,expected_bytes", [
    (2, lambda b, t: b.allreduce_async(t, "a"), 4000),            # 2 (P-1)/P of 4000 bytes
    (4, lambda b, t: b.allreduce_async(t, "a"), 6000),
    (4, lambda b, t: b.allgather_async(t, "g"), 12000),           # (P-1) times its own
    (2, lambda b, t: b.pair_exchange_async(t, "p"), 4000),
    (4, lambda b, t: b.alltoall_async(t, [250, 250, 250, 250], "x"), 3000),   # rows for the others
    (3, lambda b, t: b.broadcast_async_(t, "b"), 4000),
])
def test_bytes_by_the_ring_algorithms(world, call, expected_bytes):
    backend = EmulatedLinkBackend(_Instant(world), RATE)
    handle = call(backend, torch.zeros(1000))
    assert handle.nbytes == expected_bytes
    assert backend.wait(handle, "n") is handle.inner
    assert backend.wire_seconds == pytest.approx(expected_bytes * 1e-6)


def test_a_wait_lasts_the_wire_time_and_queued_transfers_add_up():
    backend = EmulatedLinkBackend(_Instant(2), RATE)
    t = torch.zeros(10_000)   # 40 kB: 40 ms at 8 Mbit/s
    first, second = backend.allreduce_async(t, "a"), backend.allreduce_async(t, "b")
    t0 = time.perf_counter()
    backend.wait(first, "a")
    t1 = time.perf_counter()
    backend.wait(second, "b")
    t2 = time.perf_counter()
    assert 0.039 <= t1 - t0 < 0.5 and 0.039 <= t2 - t1 < 0.5
    assert backend.wire_seconds == pytest.approx(0.08)


def test_results_pass_through_unchanged():
    backend = EmulatedLinkBackend(_Instant(2), "10gbit")
    t = torch.arange(5.0)
    assert torch.equal(backend.wait(backend.allreduce_async(t, "a"), "a"), t)
    assert backend.rank() == 0 and backend.size() == 2
    assert backend.broadcast_object({"cf": 10.0}, "o") == {"cf": 10.0}   # the object collectives ride on it


def test_one_rank_pays_nothing():
    backend = EmulatedLinkBackend(_Instant(1), RATE)
    backend.wait(backend.allreduce_async(torch.zeros(1000), "a"), "a")
    backend.wait(backend.broadcast_async_(torch.zeros(1000), "b"), "b")
    assert backend.wire_seconds == 0.0


def test_the_variable_turns_it_on_and_a_bad_rate_names_the_variable(monkeypatch):
    inner = _Instant()
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    assert emulated(inner) is inner
    monkeypatch.setenv(EMULATE_ENV, "100mbit")
    wrapped = emulated(inner)
    assert isinstance(wrapped, EmulatedLinkBackend) and wrapped.bytes_per_second == pytest.approx(12.5e6)
    monkeypatch.setenv(EMULATE_ENV, "fast")
    with pytest.raises(ValueError, match=EMULATE_ENV):
        emulated(inner)


def test_the_harness_flag_is_checked_and_recorded():
    from horovod_gravac.harness import train as T
    assert T.resolve_args(["--preset", "digits", "--emulate-link", "25mbit", "--out", "x"]).emulate_link == "25mbit"
    assert T.resolve_args(["--preset", "digits", "--out", "x"]).emulate_link is None
    with pytest.raises(SystemExit):
        T.resolve_args(["--preset", "digits", "--emulate-link", "quick", "--out", "x"])
