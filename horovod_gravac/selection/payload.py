"""What a sparsifier sends and what rebuilding the dense tensor needs (pure torch).

``payload, ctx = compressor.compress(tensor)``: ``payload`` is a :class:`SparsePayload`
(float32 values, float64 for a float64 tensor, + int32 flat indices), ``ctx`` a :class:`SparseContext` (shape, dtype,
numel).  These types live here, outside :mod:`horovod_gravac.compressors`, so that the
wire format (``wire.py``) and the selection code import without Horovod.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

# Gradients may arrive in these dtypes; values travel as float64 for float64 gradients,
# as float32 for the others.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class SparsePayload(NamedTuple):
    """What a sparsifier sends: ``values[i]`` belongs at flat position ``indices[i]``."""

    values: torch.Tensor   # 1-D, float32 (float64 for a float64 tensor)
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


def sparse_payload(flat: torch.Tensor, indices: torch.Tensor) -> SparsePayload:
    """The payload keeping ``flat[indices]`` (values gathered, as :func:`payload_dtype` says;
    indices as int32)."""
    values = flat.index_select(0, indices.long() if indices.dtype != torch.int64 else indices)
    return SparsePayload(values.to(payload_dtype(flat.dtype)), indices.to(torch.int32))


def payload_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a payload's values keep for a tensor of ``dtype``: float64 stays float64 (a
    float64 gradient must not be rounded, nor a finite one beyond float32's range made
    inf); half precision is widened to float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
