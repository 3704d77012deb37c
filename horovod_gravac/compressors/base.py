"""Sparse compressors as Horovod ``Compressor`` classes.

Horovod's built-in compressors (``hvd.Compression.fp16``) are stateless classes
with static ``compress``/``decompress``.  A sparsifier needs a compression factor
(CF), so ours are *instances*: ``TopKCompressor(cf=100)``.  They keep the same
two-method contract:

    payload, ctx = compressor.compress(tensor)
    tensor2 = compressor.decompress(payload, ctx)

``payload`` is a :class:`SparsePayload` (values + int32 flat indices), ``ctx`` a
:class:`SparseContext` (shape, dtype, numel).  Which entries to keep is decided by the
compressor's selector (``compressor.selector``, from :mod:`horovod_gravac.selection`: pure
torch/NumPy, no Horovod); the classes here add Horovod's ``Compressor`` contract on top.
Compressors hold no per-tensor state: error-feedback residuals live in the optimizer (see
``error_feedback.py``), because Horovod's compressor interface never sees which parameter a
tensor is.

Multi-level compression (GraVAC, paper section IV-C) is
``compress_further(payload, ctx, factor)``: a payload already at CF ``a`` is
compressed by a further ``factor``, reaching CF ``a * factor`` while touching only
the ``numel / a`` kept entries instead of the whole tensor.
"""
from __future__ import annotations

import abc
import inspect
from typing import Optional, Tuple

import torch

from .. import native
from ..cf import check_cf, kept_count
from ..selection.base import Selector
from ..selection.payload import SparseContext, SparsePayload, check_tensor, payload_dtype

try:  # Horovod is a hard dependency at run time; keep the pure parts importable without it.
    from horovod.torch.compression import Compressor as _HorovodCompressor
except Exception:  # pragma: no cover - exercised only where Horovod is missing
    class _HorovodCompressor:  # type: ignore[no-redef]
        """Stand-in with Horovod's interface, used only when Horovod is not installed."""


class GradientCompressor(abc.ABC):
    """What ``horovod_gravac.DistributedOptimizer`` asks of every compressor, besides Horovod's
    ``Compressor`` contract (``compress``/``decompress``).

    An interface, not a base class: :class:`SparseCompressor` and ``PowerSGDCompressor`` are
    Horovod ``Compressor`` subclasses registered as implementing it (a common base class would
    put every compressor one class deeper under Horovod's).  A compressor of another kind
    implements the members below and registers: ``GradientCompressor.register(MyCompressor)``.

    Attributes:
        cf: the target compression factor (``numel / kept``).
        low_rank: True for a low-rank compressor (PowerSGD): the optimizer sends it with
            PowerSGD's two-phase exchange instead of a sparse payload.
        shared_indices, step_seeded, fixed_count, last_quality: see
            :class:`horovod_gravac.selection.base.Selector`.

    Methods: ``set_step(step, stream)`` (draws keyed by step and bucket), and
    ``compress_further(payload, ctx, factor)`` (multi-level compression).
    """


class SparseCompressor(_HorovodCompressor):
    """Base class: a sparsifier at a fixed compression factor, as a Horovod ``Compressor``.

    A subclass names its selector class (``selector_class``); the constructor takes that
    selector's arguments and builds ``self.selector``.  The selection (``cf``, ``select``,
    ``select_payload``, ``set_step``, the selector's settings and records such as ``seed`` or
    ``fallbacks``) is the selector's, read through the compressor; validation, flattening,
    the context, decompression and multi-level compression are here.
    """

    #: The :class:`~horovod_gravac.selection.base.Selector` subclass this compressor runs.
    selector_class: type = Selector
    low_rank = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "selector_class" in cls.__dict__:   # help() and inspect show the selector's arguments
            cls.__signature__ = inspect.signature(cls.selector_class)

    def __init__(self, *args, **kwargs):
        self.selector = self.selector_class(*args, **kwargs)

    def __getattr__(self, name: str):
        # Only names the compressor lacks: the selector's settings and records.
        if name.startswith("__") or name == "selector":   # (copy and pickle probe before __init__)
            raise AttributeError(name)
        return getattr(self.selector, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.selector.repr_args()})"

    # -- what the optimizer reads every bucket (explicit: no lookup through __getattr__) ----------
    @property
    def cf(self) -> float:
        return self.selector.cf

    @cf.setter
    def cf(self, value: float) -> None:
        self.selector.cf = value

    @property
    def shared_indices(self) -> bool:
        return self.selector.shared_indices

    @property
    def step_seeded(self) -> bool:
        return self.selector.step_seeded

    @property
    def fixed_count(self) -> bool:
        return self.selector.fixed_count

    @property
    def last_quality(self) -> Optional[float]:
        return self.selector.last_quality

    def set_step(self, step: int, stream: int = 0) -> None:
        self.selector.set_step(step, stream)

    # -- Horovod's Compressor contract -------------------------------------------
    def compress(self, tensor: torch.Tensor) -> Tuple[SparsePayload, SparseContext]:
        check_tensor(tensor)
        flat = tensor.detach().reshape(-1)
        ctx = SparseContext(tensor.shape, tensor.dtype, flat.numel())
        if ctx.numel == 0:
            empty = torch.empty(0, dtype=torch.int32, device=flat.device)
            return SparsePayload(empty.to(payload_dtype(flat.dtype)), empty), ctx
        return self.selector.select_payload(flat, kept_count(ctx.numel, self.cf)), ctx

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
        sub = self.selector.select_further(payload.values, k)   # its indices are positions in the payload
        return SparsePayload(sub.values, payload.indices.index_select(0, sub.indices))

    # -- helpers ----------------------------------------------------------------
    @staticmethod
    def wire_bytes(payload: SparsePayload, shared_indices: bool = False) -> int:
        """Bytes this payload costs on the wire: 4 per value (8 for float64), plus 4 per index
        unless shared."""
        n, size = payload.values.numel(), payload.values.element_size()
        return size * n if shared_indices else (size + 4) * n


GradientCompressor.register(SparseCompressor)


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
