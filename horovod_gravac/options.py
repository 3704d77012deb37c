"""``OptimizerOptions``: every option of ``horovod_gravac.DistributedOptimizer``, validated once.

``DistributedOptimizer(...)`` checks its arguments and builds one frozen
:class:`OptimizerOptions` (:meth:`OptimizerOptions.build`); the optimizer and the objects it
makes read their settings from it.  The checks of Horovod's own argument types (``op``,
``compression``, ``process_set``) stay in ``optimizer.py``; everything here runs without
Horovod.
"""
from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import torch

from .cf import check_cf
from .comm import resolve_timeout
from .compressors.base import GradientCompressor
from .compressors.topk import TopKCompressor
from .controllers import Controller, Dense
from .error_feedback import check_momentum

NONFINITE_POLICIES = ("propagate", "zero")


@dataclass(frozen=True)
class OptimizerOptions:
    """The validated options of one optimizer (``DistributedOptimizer``'s docstring says what
    each argument means).  Horovod's arguments keep Horovod's objects: ``compression`` (the
    wire compression of dense sends), ``op`` (``average``: it averages) and ``process_set``."""

    compression: Any
    backward_passes_per_step: int
    op: Any
    average: bool
    gradient_predivide_factor: float
    groups: Any                       # None, a number of buckets, or lists of parameters
    sparse_as_dense: bool
    process_set: Any
    compressor_factory: Callable[[float], GradientCompressor]
    #: The compressor at CF 10: its kind (``step_seeded``...) and the start-up check's repr.
    reference_compressor: GradientCompressor
    controller: Controller
    bucket_cap_bytes: int
    check_consistency: bool
    momentum_correction: Optional[float]
    local_clip_norm: Optional[float]
    timeout: float                    # seconds per collective (``math.inf``: no limit)
    nonfinite: str
    grad_scaler: Any
    join_safe: bool
    defaults: Mapping[str, Any]       # the wrapped optimizer's
    exchange: str = "auto"            # how compressed buckets cross the ranks (exchange.MODES)
    link: Any = None                  # the exchange.LinkModel the cost model assumes

    @classmethod
    def build(cls, *, compression, backward_passes_per_step, op, average: bool, gradient_predivide_factor,
              num_groups, groups, sparse_as_dense, process_set, compressor, controller, bucket_cap_mb,
              check_consistency, momentum_correction, local_clip_norm, timeout_s, nonfinite, grad_scaler,
              join_safe, defaults) -> "OptimizerOptions":
        """Check every argument (``ValueError`` naming the first that does not fit)."""
        check_predivide(gradient_predivide_factor, average)
        groups = check_groups(groups, num_groups)
        if not isinstance(sparse_as_dense, bool):
            raise ValueError(f"sparse_as_dense must be True or False, got {sparse_as_dense!r}")
        check_passes(backward_passes_per_step)
        controller = Dense() if controller is None else controller
        if not isinstance(controller, Controller):
            raise ValueError(f"controller must be a horovod_gravac controller "
                             f"(Dense, StaticCF, GraVAC, Accordion), got {controller!r}")
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) \
                or not 0 < bucket_cap_mb < float("inf"):
            raise ValueError(f"bucket_cap_mb must be a finite number > 0, got {bucket_cap_mb!r}")
        if local_clip_norm is not None and not (isinstance(local_clip_norm, (int, float))
                                                and not isinstance(local_clip_norm, bool) and local_clip_norm > 0):
            raise ValueError(f"local_clip_norm must be > 0 or None, got {local_clip_norm!r}")
        if not isinstance(join_safe, bool):
            raise ValueError(f"join_safe must be True or False, got {join_safe!r}")
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        if grad_scaler is not None and not (callable(getattr(grad_scaler, "get_scale", None))
                                            and callable(getattr(grad_scaler, "is_enabled", None))):
            raise ValueError(f"grad_scaler must be a torch.amp.GradScaler, got {grad_scaler!r}")
        timeout = resolve_timeout(timeout_s)
        factory = compressor_factory(compressor)
        check_momentum(momentum_correction)
        return cls(compression=compression, backward_passes_per_step=backward_passes_per_step, op=op,
                   average=average, gradient_predivide_factor=float(gradient_predivide_factor), groups=groups,
                   sparse_as_dense=sparse_as_dense, process_set=process_set, compressor_factory=factory,
                   reference_compressor=reference_compressor(factory, controller), controller=controller,
                   bucket_cap_bytes=int(bucket_cap_mb * 2 ** 20), check_consistency=check_consistency,
                   momentum_correction=momentum_correction, local_clip_norm=local_clip_norm, timeout=timeout,
                   nonfinite=nonfinite, grad_scaler=grad_scaler, join_safe=join_safe, defaults=dict(defaults))


def check_predivide(factor, average: bool) -> None:
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor < math.inf:
        raise ValueError(f"gradient_predivide_factor must be a finite number > 0, got {factor!r}")
    if factor != 1.0 and not average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")


def check_passes(passes) -> None:
    if isinstance(passes, Controller):
        raise ValueError(f"backward_passes_per_step got a controller ({passes!r}). The 4th positional "
                         f"argument is Horovod's backward_passes_per_step; pass controller=... as a keyword")
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {passes!r}")


def check_groups(groups, num_groups):
    """Horovod's ``groups`` / deprecated ``num_groups``, validated as Horovod does."""
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups must be an integer >= 0, got {num_groups!r}")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if groups is None:
        return None
    if isinstance(groups, bool) or not (isinstance(groups, list) or (isinstance(groups, int) and groups > 0)):
        raise ValueError(f"groups should be a positive integer or a list of lists of torch.Tensor, got {groups!r}")
    if isinstance(groups, list):
        seen = set()
        for group in groups:
            for p in group:
                if not isinstance(p, torch.Tensor):
                    raise ValueError("groups must consist of torch.Tensor.")
                if id(p) in seen:
                    raise ValueError("A parameter can only appear once in groups.")
                seen.add(id(p))
    return groups


def is_gravac_compressor(obj) -> bool:
    """A horovod_gravac compressor (class, instance), as opposed to a Horovod one."""
    if isinstance(obj, type):
        return issubclass(obj, GradientCompressor)
    return isinstance(obj, GradientCompressor)


def is_wire_compression(obj) -> bool:
    """A Horovod-style wire compression (``hvd.Compression.none``/``.fp16``, or any other
    class or instance with ``compress``/``decompress`` that is not a horovod_gravac
    compressor): what ``compression=`` takes, never ``compressor=``."""
    if obj is None or is_gravac_compressor(obj):
        return False
    cls = obj if isinstance(obj, type) else type(obj)
    return callable(getattr(cls, "compress", None)) and callable(getattr(cls, "decompress", None))


def _compression_name(obj) -> str:
    """``hvd.Compression.fp16`` for Horovod's own, else the class's dotted name."""
    # Named by module and class rather than imported: the options stay Horovod-free.
    cls = obj if isinstance(obj, type) else type(obj)
    horovods = {"NoneCompressor": "none", "FP16Compressor": "fp16"}
    if cls.__module__ == "horovod.torch.compression" and cls.__name__ in horovods:
        return f"hvd.Compression.{horovods[cls.__name__]}"
    return f"{cls.__module__}.{cls.__qualname__}" + ("" if isinstance(obj, type) else "()")


def misplaced_compression_error(obj) -> ValueError:
    """The error for a wire compression passed as ``compressor=``: which argument takes which."""
    return ValueError(
        f"compressor={_compression_name(obj)} is a Horovod compression, which sets the wire format "
        f"of dense sends. Horovod's compressions go to compression= "
        f"(hg.DistributedOptimizer(..., compression=hvd.Compression.fp16); in hg.ddp.GravacState, "
        f"compression=\"fp16\"); this package's compressors (hg.TopKCompressor, hg.DGCCompressor, ...) "
        f"go to compressor=.")


def compressor_factory(compressor) -> Callable[[float], GradientCompressor]:
    """Accept a compressor class, an instance (its class and settings are reused per CF),
    or a callable ``cf -> compressor``.  A Horovod compression given here is refused with
    a message naming the argument it belongs to (``compression=``)."""
    if compressor is None:
        compressor = TopKCompressor
    if is_wire_compression(compressor):
        raise misplaced_compression_error(compressor)
    if not isinstance(compressor, type) and hasattr(compressor, "compress"):
        template = compressor

        def from_instance(cf):   # same settings, its own state (e.g. a private generator)
            comp = copy.deepcopy(template)
            comp.cf = check_cf(cf)
            return comp
        return from_instance
    if callable(compressor):
        def factory(cf):
            comp = compressor(cf=check_cf(cf))
            if not isinstance(comp, GradientCompressor):
                raise ValueError(f"compressor factory returned {comp!r}, which is not a horovod_gravac "
                                 f"compressor (a horovod_gravac.compressors.GradientCompressor)")
            return comp
        return factory
    raise ValueError(f"compressor must be a compressor class, instance or factory, got {compressor!r}")


def reference_compressor(factory, controller: Controller) -> GradientCompressor:
    """The compressor at CF 10, for type checks and the start-up check."""
    sample = factory(10.0)
    if sample.low_rank and controller.needs_multilevel:
        raise ValueError("controller GraVAC needs a sparsifying compressor (multi-level "
                         "compression); use PowerSGD with Dense, StaticCF or Accordion")
    return sample
