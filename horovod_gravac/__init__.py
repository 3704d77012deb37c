"""horovod_gravac: GraVAC adaptive gradient compression for Horovod + PyTorch.

Replace ``hvd.DistributedOptimizer(opt, named_parameters=...)`` with
``horovod_gravac.DistributedOptimizer(opt, named_parameters=..., compressor=TopKCompressor,
controller=GraVAC(theta_min=10, theta_max=1000, epsilon=0.7))``.
"""
from .controllers import Accordion, Controller, Decision, Dense, GraVAC, StaticCF, StepObservation
from .policy import Exponential, Geometric

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy: the optimizer and the compressors (Horovod Compressor classes) import Horovod;
    # the controllers, gain, throughput and policies do not, and import without it.
    if name == "DistributedOptimizer":
        from .optimizer import DistributedOptimizer
        return DistributedOptimizer
    import importlib
    compressors = importlib.import_module(".compressors", __name__)
    if hasattr(compressors, name):
        return getattr(compressors, name)
    raise AttributeError(f"module 'horovod_gravac' has no attribute {name!r}")


__all__ = ["DistributedOptimizer", "TopKCompressor", "PowerSGDCompressor", "DGCCompressor",
           "RedSyncCompressor", "SIDCoCompressor", "RandomKCompressor", "SparseCompressor",
           "SparsePayload", "SparseContext", "Dense", "StaticCF", "GraVAC", "Accordion",
           "Controller", "Decision", "StepObservation", "Exponential", "Geometric"]
