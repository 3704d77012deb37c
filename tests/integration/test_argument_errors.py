"""A refused argument fails every rank with the same message, on real ranks.

``compressor=hvd.Compression.fp16`` (Horovod's compression where this package's compressor
goes) is the mistake a Horovod user makes first.  On 2 ranks under horovodrun, every rank
must print the error that says which argument takes which, even when one rank reaches the
constructor seconds after the other: the ranks meet in the start-up check before raising, so
the first rank to exit cannot end the job (horovodrun stopping the peer, or a Gloo read
failing on it) before the peer has said why (tests/parallel/argument_mistake.py)."""
import pytest

from conftest import run_ranks
from launcher import PARALLEL, rank_lines

pytestmark = [pytest.mark.parallel]
SCRIPT = PARALLEL / "argument_mistake.py"
MESSAGE = "Horovod's compressions go to compression="
# What a rank shows when it lost its connection or waited out a peer instead of raising.
# (horovodrun may still stop a rank that has raised, during its exit: "Terminated" after it.)
NOT_RAISED = ("Read error", "Connection reset", "Connection closed by peer", "gloo::", "HorovodInternalError",
              "CollectiveTimeoutError", "Horovod has been shut down")


def _lost(out):
    return [f"[{rank}] {text}" for rank, text in rank_lines(out) if any(w in text for w in NOT_RAISED)]


def _errors(out):
    """rank -> the ValueError lines it printed."""
    found = {}
    for rank, text in rank_lines(out):
        if text.startswith("ValueError: "):
            found.setdefault(rank, []).append(text)
    return found


@pytest.mark.parametrize("late", [0, 1])
def test_every_rank_says_where_horovods_compression_goes(late):
    proc = run_ranks(2, SCRIPT, "all", late, timeout=120)
    out = proc.stdout
    assert proc.returncode != 0, out[-4000:]
    errors = _errors(out)
    assert set(errors) == {0, 1}, f"not every rank raised the ValueError:\n{out[-4000:]}"
    assert errors[0] == errors[1], errors          # the same message on both ranks
    (line,) = errors[0]
    assert MESSAGE in line and "compressor=hvd.Compression.fp16" in line and "go to compressor=" in line, line
    assert not _lost(out), out[-4000:]
    assert "CONSTRUCTED" not in out


def test_one_ranks_mistake_stops_every_rank_with_its_message():
    """Only rank 1 passes the wrong compressor (rank 0 a valid one, and late): rank 0 raises
    rank 1's error at the start-up check, naming the rank, instead of waiting there."""
    proc = run_ranks(2, SCRIPT, "1", 0, timeout=120)
    out = proc.stdout
    assert proc.returncode != 0, out[-4000:]
    errors = _errors(out)
    assert set(errors) == {0, 1}, f"not every rank raised the ValueError:\n{out[-4000:]}"
    assert errors[0] == errors[1], errors
    assert MESSAGE in errors[0][0] and "raised on rank(s) 1" in errors[0][0], errors
    assert not _lost(out), out[-4000:]


def test_one_ranks_unreadable_emulated_link_stops_every_rank_naming_the_variable():
    """Only rank 1 has ``$HOROVOD_GRAVAC_EMULATE_LINK=fast``: it is refused with the other
    arguments, so rank 0 raises the same error at the start-up check instead of waiting."""
    proc = run_ranks(2, SCRIPT, "1", 0, "link", timeout=120)
    out = proc.stdout
    assert proc.returncode != 0, out[-4000:]
    errors = _errors(out)
    assert set(errors) == {0, 1}, f"not every rank raised the ValueError:\n{out[-4000:]}"
    assert errors[0] == errors[1], errors
    assert "$HOROVOD_GRAVAC_EMULATE_LINK" in errors[0][0] and "raised on rank(s) 1" in errors[0][0], errors
    assert not _lost(out), out[-4000:]
