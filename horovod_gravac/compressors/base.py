"""Sparse compressors as Horovod ``Compressor`` classes.

Horovod's built-in compressors (``hvd.Compression.fp16``) are stateless classes
with static ``compress``/``decompress``.  A sparsifier needs a compression factor
(CF), so ours are *instances*: ``TopKCompressor(cf=100)``.  They keep the same
two-method contract:

    payload, ctx = compressor.compress(tensor)
    tensor2 = compressor.decompress(payload, ctx)

``payload`` is a :class:`SparsePayload` (values + int32 flat indices), ``ctx`` a
:class:`SparseContext` (shape, dtype, numel).  Compressors hold no per-tensor
state: error-feedback residuals live in the optimizer (see ``error_feedback.py``),
because Horovod's compressor interface never sees which parameter a tensor is.

Multi-level compression (GraVAC, paper section IV-C) is
``compress_further(payload, ctx, factor)``: a payload already at CF ``a`` is
compressed by a further ``factor``, reaching CF ``a * factor`` while touching only
the ``numel / a`` kept entries instead of the whole tensor.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional, Tuple

import torch

from .. import native
from ..cf import check_cf, kept_count  # noqa: F401  (part of this module's API)

try:  # Horovod is a hard dependency at run time; keep the pure parts importable without it.
    from horovod.torch.compression import Compressor as _HorovodCompressor
except Exception:  # pragma: no cover - exercised only where Horovod is missing
    class _HorovodCompressor:  # type: ignore[no-redef]
        """Stand-in with Horovod's interface, used only when Horovod is not installed."""

# Gradients may arrive in these dtypes; values travel as float32 on the wire.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class SparsePayload(NamedTuple):
    """What a sparsifier sends: ``values[i]`` belongs at flat position ``indices[i]``."""

    values: torch.Tensor   # 1-D, float32
    indices: torch.Tensor  # 1-D, int32, unique, into the flattened tensor

    def type(self, *args, **kwargs):
        # Horovod's allreduce asks its input for .type(): only reached when one of our
        # compressors was handed to hvd.DistributedOptimizer, which can only allreduce
        # dense tensors of one shape on every rank.
        raise TypeError("a horovod_gravac compressor cannot run inside hvd.DistributedOptimizer "
                        "(its payloads are sparse and differ between ranks). Use "
                        "horovod_gravac.DistributedOptimizer(optimizer, named_parameters, "
                        "compression=<the same compressor>) instead.")


class SparseContext(NamedTuple):
    """What ``decompress`` needs to rebuild the dense tensor."""

    shape: torch.Size
    dtype: torch.dtype
    numel: int


def check_tensor(tensor: torch.Tensor) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in FLOAT_DTYPES:
        raise ValueError(
            f"tensor must be a floating-point gradient ({', '.join(str(d) for d in FLOAT_DTYPES)}), "
            f"got dtype {tensor.dtype}")


class GradientCompressor(_HorovodCompressor):
    """What ``horovod_gravac.DistributedOptimizer`` asks of every compressor (the defaults
    suit a stateless sparsifier; subclasses override what differs):

    Attributes:
        low_rank: True for a low-rank compressor (PowerSGD): the optimizer sends it with
            PowerSGD's two-phase exchange instead of a sparse payload.
        shared_indices: True when every rank picks the same indices (Random-k with a
            shared seed); the optimizer then sums values with a dense allreduce and
            sends no indices at all.
        step_seeded: True when the draws depend on the step: the optimizer calls
            :meth:`set_step` before each bucket and keeps the step index the same on every
            rank (and in checkpoints).
        last_quality: after ``compress``, kept / k of a threshold estimate (None: exact k).
    """

    low_rank = False
    shared_indices = False
    step_seeded = False
    last_quality: Optional[float] = None

    def set_step(self, step: int, stream: int = 0) -> None:
        """Draw from ``(seed, step, stream)`` from now on (``stream``: the bucket)."""


class SparseCompressor(GradientCompressor):
    """Base class: a sparsifier at a fixed compression factor.

    Subclasses implement :meth:`select` (which flat entries to keep).  Everything
    else (validation, flattening, context, decompression, multi-level) is here.

    Attributes (besides :class:`GradientCompressor`'s):
        cf: the target compression factor (``numel / kept``).
        exact_multilevel: True when ``compress_further`` gives exactly what direct
            compression at the product CF gives (Top-k).
    """

    exact_multilevel = False

    def __init__(self, cf: float = 100.0):
        self.cf = check_cf(cf)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cf={self.cf:g})"

    # -- the part subclasses provide --------------------------------------------
    def select(self, flat: torch.Tensor, k: int) -> torch.Tensor:
        """Return the int64 or int32 flat indices to keep (about ``k`` of them, unique)."""
        raise NotImplementedError

    def select_payload(self, flat: torch.Tensor, k: int) -> SparsePayload:
        """The payload keeping what :meth:`select` picks.  Subclasses whose selection
        already holds the values (Top-k's native pass) override this to skip the gather."""
        return self._payload(flat, self.select(flat, k))

    # -- Horovod's Compressor contract -------------------------------------------
    def compress(self, tensor: torch.Tensor) -> Tuple[SparsePayload, SparseContext]:
        check_tensor(tensor)
        flat = tensor.detach().reshape(-1)
        ctx = SparseContext(tensor.shape, tensor.dtype, flat.numel())
        if ctx.numel == 0:
            empty = torch.empty(0, dtype=torch.int32, device=flat.device)
            return SparsePayload(empty.float(), empty), ctx
        return self.select_payload(flat, kept_count(ctx.numel, self.cf)), ctx

    def decompress(self, payload: SparsePayload, ctx: SparseContext,
                   out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The dense tensor: kept entries in place, zeros elsewhere.

        ``out`` (optional): a contiguous tensor of ``ctx.numel`` entries and dtype
        ``ctx.dtype`` to write into, e.g. a buffer reused every step.  Without it a
        fresh tensor is allocated; for large tensors the operating system then maps
        and zero-fills new pages on first touch, which costs more than the work here
        (about 0.7 of a ``t.abs().max()`` pass at 25M entries).  The optimizer always
        writes into buffers it already owns.
        """
        if out is not None and (not isinstance(out, torch.Tensor) or out.numel() != ctx.numel
                                or out.dtype != ctx.dtype or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous {ctx.dtype} tensor of {ctx.numel} entries, got "
                             f"{getattr(out, 'dtype', type(out).__name__)} of "
                             f"{getattr(out, 'numel', lambda: '?')()} entries")
        values, indices = payload.values, payload.indices
        if _native_scatter(values, indices, ctx, out):
            # One native pass: zero, then write (torch's index_put_ costs ~10 ns per entry).
            flat = torch.empty(ctx.numel, dtype=torch.float32) if out is None else out.view(-1)
            native.scatter(flat.numpy(), indices.numpy(), values.numpy())
            return flat.view(ctx.shape)
        if out is None:
            flat = torch.zeros(ctx.numel, dtype=ctx.dtype, device=values.device)
        else:
            flat = out.view(-1).zero_()
        # index_put_ takes the int32 indices as they are (index_copy_ would need an int64 copy).
        flat.index_put_((indices,), values.to(ctx.dtype))
        return flat.view(ctx.shape)

    # -- multi-level compression ------------------------------------------------
    def compress_further(self, payload: SparsePayload, ctx: SparseContext,
                         factor: float) -> SparsePayload:
        """Compress a payload that is at ``self.cf`` by ``factor`` more (CF ``cf * factor``).

        Only the kept values are examined.  The kept count is computed from the
        original ``numel`` so that the result has exactly the entry count that direct
        compression at ``cf * factor`` would have.
        """
        factor = check_cf(factor, "factor")
        k = kept_count(ctx.numel, self.cf * factor)
        if k >= payload.values.numel():
            return payload
        sub = self.select_payload(payload.values, k)   # its indices are positions in the payload
        return SparsePayload(sub.values, payload.indices.index_select(0, sub.indices))

    # -- helpers ----------------------------------------------------------------
    @staticmethod
    def _payload(flat: torch.Tensor, indices: torch.Tensor) -> SparsePayload:
        values = flat.index_select(0, indices.long() if indices.dtype != torch.int64 else indices)
        return SparsePayload(values.to(torch.float32), indices.to(torch.int32))

    @staticmethod
    def wire_bytes(payload: SparsePayload, shared_indices: bool = False) -> int:
        """Bytes this payload costs on the wire: 4 per value, plus 4 per index unless shared."""
        n = payload.values.numel()
        return 4 * n if shared_indices else 8 * n


def _native_scatter(values: torch.Tensor, indices: torch.Tensor, ctx: "SparseContext",
                    out: Optional[torch.Tensor]) -> bool:
    """Whether ``decompress`` can write with the native scatter: float32 on the CPU, int32
    indices, everything contiguous, the kernels switched on."""
    return (ctx.dtype == torch.float32 and values.dtype == torch.float32 and indices.dtype == torch.int32
            and values.device.type == "cpu" and indices.device.type == "cpu"
            and (out is None or out.device.type == "cpu")
            and values.is_contiguous() and indices.is_contiguous() and values.dim() == 1 and indices.dim() == 1
            and values.numel() == indices.numel() and native.available()
            and not values.requires_grad)
