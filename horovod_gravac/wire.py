"""The wire format of bucket payloads and of the step statistics (pure torch: no Horovod).

``comm.py`` (the one place Horovod is called) re-exports these helpers; ``transfers.py``
builds each bucket's collective from them.

Wire format of a sparse payload: one contiguous int32 tensor of shape (k, w), a row
per kept entry: the value's bits in the first ``w - 1`` words, the int32 flat index in
the last.  Float32 values take one word (``w = 2``, 8 bytes an entry); float64 values,
those of a bucket of float64 parameters, take two (``w = 3``, 12 bytes an entry), so
they are never rounded to float32.  One ``hvd.allgather`` per bucket concatenates
every rank's rows along dim 0, whatever k each rank chose, so no sizes need to be
exchanged first.  Aggregation *adds* colliding indices (``index_add_``, in the values'
dtype), then divides by the number of ranks.

The row width is the dtype's header: Horovod compares every rank's shape (and dtype)
before it moves a byte and fails the collective when they differ, so a rank never
reads another rank's words as the wrong type; each reader also checks the width
against its bucket's dtype (:func:`rows_dtype`), and the backend's ``wait`` names the bucket
when Horovod refuses a mismatch.

Payloads whose indices are the same on every rank (Random-k with a shared seed)
skip the indices: a dense allreduce of the k values (4 or 8 bytes per entry).

Statistics ride along: an adaptive controller needs every step's squared norms
averaged over the ranks.  Instead of a collective of their own (or a Horovod grouped
operation, which copies the whole bucket through the fusion buffer), they travel
inside one bucket's own tensor:

* allgather: each rank's block starts with ``1 + 2 * n`` header rows whose index
  column points at a slack slot just past the bucket (so ``index_add_`` needs no
  parsing and drops them): row 0 holds the block's payload row count, the next
  rows the n float64 statistics as int32 words (in the first column, whatever
  the width).  Every rank reads every rank's
  header (N small reads) and averages in rank order: the same bits everywhere;
* allreduce: the statistics are appended to the tensor in its dtype and averaged with
  it.  As float32: about 7 significant digits (plenty for gains compared with epsilon
  and omega), float32's range (a sum of squares past 3.4e38 arrives as inf, and the
  optimizer then treats the step as non-finite); a float64 bucket carries them in
  float64.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import astuple, dataclass, fields
from typing import List, Optional

import torch

from .selection.payload import SparsePayload


@dataclass(frozen=True)
class StepStats:
    """One rank's statistics of a step, as they ride with the carrier bucket (and, once
    averaged over the ranks, what an adaptive controller observes).  All unscaled."""

    ef_sq: float = 0.0            # ||g_ef||^2: the error-fed gradient
    min_sq: float = 0.0           # ||g_min||^2: compressed at theta_min
    candidate_sq: float = 0.0     # ||g_c||^2: compressed at the candidate CF
    grad_sq: float = 0.0          # ||g||^2: the raw gradient
    accumulated_sq: float = 0.0   # ||G||^2, G the interval's gradient sum (at an interval's end, else 0)
    window_dot: float = 0.0       # <D, G>, D what was sent over the interval (GraVAC "delivered")
    window_sent_sq: float = 0.0   # ||D||^2
    nonfinite: float = 0.0        # 1.0: some bucket of some rank held NaN/Inf
    lag_dot: float = 0.0          # <g_t, g_t-1> on the sampled coordinates (coherence.py)
    lag_now_sq: float = 0.0       # |g_t|^2 there
    lag_prev_sq: float = 0.0      # |g_t-1|^2 there

    def to_tensor(self) -> torch.Tensor:
        """The float64 vector that travels (field order is the wire order)."""
        return torch.tensor(astuple(self), dtype=torch.float64)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> "StepStats":
        return cls(*t.tolist())

    def to_list(self) -> List[float]:
        return list(astuple(self))


#: Statistics per step and rank (the length of ``StepStats.to_tensor()``).
N_STATS = len(fields(StepStats))


#: int32 words of a payload row, by the dtype of its values: the value's words, then the index.
ROW_WORDS = {torch.float32: 2, torch.float64: 3}


def row_words(dtype: torch.dtype) -> int:
    """Words of a payload row for values of ``dtype`` (float64: 3, everything else: 2, as
    it travels as float32)."""
    return ROW_WORDS[torch.float64 if dtype == torch.float64 else torch.float32]


def rows_dtype(wire: torch.Tensor, expected: torch.dtype, name: str = "") -> torch.dtype:
    """The dtype of the values in a (gathered or summed) wire buffer, read from its row width;
    ``RuntimeError`` naming the bucket ``name`` unless it is ``expected`` (the bucket's own)."""
    by_width = {w: d for d, w in ROW_WORDS.items()}
    width = wire.shape[1] if wire.dim() == 2 else None
    got = by_width.get(width)
    want = torch.float64 if expected == torch.float64 else torch.float32
    if got != want:
        what = f"rows of {width} int32 words ({got} values)" if got is not None \
            else f"a tensor of shape {tuple(wire.shape)}, not a payload"
        raise RuntimeError(
            f"horovod_gravac: bucket {name or '?'} arrived as {what}, but this rank's bucket sends "
            f"{want} values ({ROW_WORDS[want]} words a row). The ranks disagree on the bucket's "
            f"dtype: every rank must build the model with the same parameter dtypes.")
    return got


def header_rows(n: int) -> int:
    """Rows of a statistics header in front of a rank's allgather block: the payload's
    row count, then ``n`` float64 statistics as two int32 words each."""
    return 1 + 2 * n


def pack(payload: SparsePayload, stats: Optional[torch.Tensor] = None, numel: int = 0) -> torch.Tensor:
    """The (k, w) int32 wire buffer (w: :func:`row_words` of the values' dtype); with
    ``stats`` (float64) a header in front of it (see the module docstring; ``numel``: the
    bucket's size, the header's slack index)."""
    k = payload.values.numel()
    dtype = torch.float64 if payload.values.dtype == torch.float64 else torch.float32
    w = row_words(dtype)
    head = 0 if stats is None else header_rows(stats.numel())
    out = torch.empty((head + k, w), dtype=torch.int32, device=payload.values.device)
    out[head:, :w - 1] = payload.values.to(dtype).view(torch.int32).view(k, w - 1)
    out[head:, w - 1] = payload.indices
    if stats is not None:
        if w == 3:
            out[:head, 1] = 0   # (column 0 is written in full below)
        out[:head, w - 1] = numel
        out[0, 0] = k
        out[1:head, 0] = stats.to(device=out.device, dtype=torch.float64).view(torch.int32)
    return out


def unpack_sum(gathered: torch.Tensor, numel: int, dtype: torch.dtype = torch.float32,
               name: str = "") -> torch.Tensor:
    """Dense sum, in ``dtype`` (the bucket's values: float32 or float64, checked against the
    rows' width), of every rank's rows of a gathered (sum_k, w) buffer (header rows, whose
    index is ``numel``, land in a slack slot that is dropped).

    Every rank computes this sum itself, so it must come out bit for bit the same on
    each: colliding indices are added in the gathered (rank) order.  On the CPU
    ``index_add_`` does that; on CUDA it adds with atomics in whatever order threads
    arrive, and with three or more ranks the rounding could differ between ranks (their
    parameters would drift apart), so there it runs under PyTorch's deterministic mode."""
    dtype = rows_dtype(gathered, dtype, name)
    w = row_words(dtype)
    out = torch.zeros(numel + 1, dtype=dtype, device=gathered.device)
    if gathered.numel():
        values = gathered[:, 0].view(dtype) if w == 2 else gathered[:, :2].contiguous().view(dtype).view(-1)
        with _deterministic_if(_adds_with_atomics(out)):
            out.index_add_(0, gathered[:, w - 1].long(), values)
    return out[:numel]


def _adds_with_atomics(t: torch.Tensor) -> bool:
    """Whether ``index_add_`` on ``t`` may add colliding entries in a varying order
    (tests patch this to run the deterministic branch on the CPU)."""
    return t.device.type != "cpu"


@contextmanager
def _deterministic_if(needed: bool):
    """PyTorch's deterministic algorithms for the calls inside, restored afterwards.
    ``warn_only``: an op elsewhere in the process that has no deterministic version
    warns instead of failing while the switch is on."""
    if not needed or torch.are_deterministic_algorithms_enabled():
        yield
        return
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False, warn_only=warn_only)


def words_as_float64(words: torch.Tensor) -> torch.Tensor:
    """int32 words (pairs along the last dimension) as float64, on the CPU.  Always a fresh
    copy: viewing as a wider dtype needs an even storage offset, and a slice of a column
    copied from the GPU is contiguous at an odd offset (found on an H200)."""
    return words.cpu().clone(memory_format=torch.contiguous_format).view(torch.float64)


def read_header_stats(gathered: torch.Tensor, world: int, n: int) -> torch.Tensor:
    """The rank-averaged float64 statistics from the headers of a gathered buffer (of
    either width: the header's words are in its first column)."""
    head, pos, rows = header_rows(n), 0, []
    for r in range(world):
        block = gathered[pos:pos + head, 0].cpu()
        if block.numel() != head:
            raise RuntimeError(f"horovod_gravac: malformed statistics header of rank {r} "
                               f"(gathered {gathered.shape[0]} rows)")
        rows.append(words_as_float64(block[1:]))
        pos += head + int(block[0])
    if pos != gathered.shape[0]:
        raise RuntimeError(f"horovod_gravac: statistics headers cover {pos} of {gathered.shape[0]} "
                           f"gathered rows; ranks disagree on the wire format")
    return torch.stack(rows).sum(0).div_(world)


def slot_rows(k_cap: int, n_stats: int) -> int:
    """Rows of one rank's slot in the join-safe sparse format: a statistics header (always,
    so the payload's row count travels), then up to ``k_cap`` payload rows."""
    return header_rows(n_stats) + k_cap


def pack_slot(payload: SparsePayload, stats: Optional[torch.Tensor], numel: int, world: int,
              rank: int, k_cap: int, n_stats: int) -> torch.Tensor:
    """Join-safe sparse wire: a ``(world * slot_rows, w)`` int32 buffer (w as :func:`pack`'s),
    zero except this rank's slot, so an allreduce (sum) of it is an allgather that Horovod's
    ``join`` allows: a joined rank adds zeros, which read as an empty payload.  Payloads
    longer than ``k_cap`` must be cut by the caller (what is not sent stays in the residual)."""
    rows = slot_rows(k_cap, n_stats)
    block = pack(payload, stats if stats is not None else torch.zeros(n_stats, dtype=torch.float64), numel)
    w = block.shape[1]
    out = torch.zeros((world * rows, w), dtype=torch.int32, device=payload.values.device)
    out[rank * rows: rank * rows + block.shape[0]] = block
    free = out[rank * rows + block.shape[0]: (rank + 1) * rows]
    free[:, w - 1] = numel   # unused rows land in the slack slot too
    return out


def read_slot_stats(summed: torch.Tensor, world: int, k_cap: int, n_stats: int) -> torch.Tensor:
    """The statistics of every slot of a summed join-safe buffer, averaged over ``world``
    (a joined rank's slot is zeros: it counts as zero, as in Horovod's joined average)."""
    rows, head = slot_rows(k_cap, n_stats), header_rows(n_stats)
    return words_as_float64(summed.view(world, rows, summed.shape[1])[:, 1:head, 0]).sum(0).div_(world)


def with_stats(flat: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """A copy of ``flat`` with ``stats`` appended, for an allreduce: in float32, or in
    float64 when ``flat`` is float64 (a dense bucket of float64 parameters)."""
    dtype = torch.float64 if flat.dtype == torch.float64 else torch.float32
    return torch.cat([flat.reshape(-1).to(dtype), stats.to(dtype).to(flat.device)])


def split_stats(reduced: torch.Tensor, n: int):
    """``(tensor, float64 statistics)`` from the result of allreducing ``with_stats``."""
    return reduced[:-n], reduced[-n:].double().cpu()
