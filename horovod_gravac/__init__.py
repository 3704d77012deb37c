"""horovod_gravac: GraVAC adaptive gradient compression for Horovod + PyTorch.

Replace ``hvd.DistributedOptimizer(opt, named_parameters=...)`` with
``horovod_gravac.DistributedOptimizer(opt, named_parameters=..., compressor=TopKCompressor,
controller=GraVAC(theta_min=10, theta_max=1000, window=500))``: the default rule set and its own
epsilon (``epsilon=0.7`` is the paper's rule set's, ``GraVAC(variant="paper")``).
"""
from .controllers import (Accordion, Controller, Decision, DeliveredGraVAC, Dense, GraVAC, LadderGraVAC, PaperGraVAC,
                          PredictiveGraVAC,
                          StaticCF, StepObservation)
from .policy import Exponential, Geometric

__version__ = "0.1.0"


# What ``horovod_gravac.compressors`` exports (its ``__all__``), reachable from here too.
_COMPRESSORS = {"GradientCompressor", "SparseCompressor", "SparseContext", "SparsePayload", "check_cf",
                "kept_count", "DGCCompressor", "PowerSGDCompressor", "RandomKCompressor", "RedSyncCompressor",
                "SIDCoCompressor", "TopKCompressor"}


def __getattr__(name):
    # Lazy: the optimizer and the compressors (Horovod Compressor classes) import Horovod;
    # the controllers, gain, throughput, policies, wire format and selection logic
    # (``horovod_gravac.selection``) do not, and import without it.  Only the names above
    # load the compressors: ``from horovod_gravac import native`` in a pure module must
    # import that submodule, not Horovod.
    if name == "DistributedOptimizer":
        from .optimizer import DistributedOptimizer
        return DistributedOptimizer
    if name == "ddp":   # the DDP comm hook (torch.distributed; no Horovod)
        import importlib
        return importlib.import_module(".ddp", __name__)
    if name == "lightning":   # GravacCallback; needs pytorch-lightning (the "lightning" extra)
        import importlib
        return importlib.import_module(".lightning", __name__)
    if name in _COMPRESSORS:
        import importlib
        return getattr(importlib.import_module(".compressors", __name__), name)
    raise AttributeError(f"module 'horovod_gravac' has no attribute {name!r}")


__all__ = ["DistributedOptimizer", "ddp", "TopKCompressor", "PowerSGDCompressor", "DGCCompressor",
           "RedSyncCompressor", "SIDCoCompressor", "RandomKCompressor", "SparseCompressor",
           "SparsePayload", "SparseContext", "Dense", "StaticCF", "GraVAC", "PaperGraVAC", "LadderGraVAC",
           "DeliveredGraVAC", "PredictiveGraVAC", "Accordion",
           "Controller", "Decision", "StepObservation", "Exponential", "Geometric"]
