"""Gradient compressors, each a ``horovod.torch.compression.Compressor`` subclass."""
from ..cf import check_cf, kept_count
from ..selection.payload import SparseContext, SparsePayload
from .base import GradientCompressor, SparseCompressor
from .dgc import DGCCompressor
from .powersgd import PowerSGDCompressor
from .randomk import RandomKCompressor
from .redsync import RedSyncCompressor
from .sidco import SIDCoCompressor
from .topk import TopKCompressor

__all__ = ["GradientCompressor", "SparseCompressor", "SparseContext", "SparsePayload", "check_cf", "kept_count",
           "DGCCompressor", "PowerSGDCompressor", "RandomKCompressor", "RedSyncCompressor",
           "SIDCoCompressor", "TopKCompressor"]
