"""Gradient compressors, each a ``horovod.torch.compression.Compressor`` subclass."""
from .base import SparseCompressor, SparseContext, SparsePayload, check_cf, kept_count
from .powersgd import PowerSGDCompressor
from .randomk import RandomKCompressor
from .topk import TopKCompressor

__all__ = ["SparseCompressor", "SparseContext", "SparsePayload", "check_cf", "kept_count",
           "PowerSGDCompressor", "RandomKCompressor", "TopKCompressor"]
