"""``horovod_gravac.DistributedOptimizer``: a drop-in for ``hvd.DistributedOptimizer``.

It takes every argument of Horovod's optimizer, in Horovod's positional order
(``compression``, ``op``, ``gradient_predivide_factor``, ``groups``,
``sparse_as_dense``, ``process_set``...), and keeps its contract: communication
starts from backward hooks, ``synchronize()`` / ``skip_synchronize()``,
``set_backward_passes_per_step``, the ``zero_grad`` race check, the class of the
wrapped optimizer (``isinstance(opt, torch.optim.SGD)`` still holds), and
``hvd.broadcast_optimizer_state`` initialising state without a distributed step.

What it adds, per bucket of gradients and step (``encoder.py`` does steps 1-3 and 5;
see ``controllers/`` for who decides):

1. g_ef = g + residual                        (error feedback, ``error_feedback.py``)
2. g_min = C(g_ef, theta_min)                 (first level)
3. g_c   = C(g_min, theta_s)                  (multi-level: the candidate from g_min)
4. send dense g_ef, g_min or g_c as decided   (``transfers.py``: allreduce or one allgather)
5. residual = g_ef - sent                     (once the step's collectives are done)

Every collective goes through one backend object (``backend.CollectiveBackend``; here
``horovod_backend.HorovodBackend`` on the optimizer's process set).  Adaptive controllers
(GraVAC, Accordion) also need the step's squared norms averaged over ranks.  They ride
inside the last bucket's collective (``wire.py`` describes how); that bucket holds its
collective back until every other bucket is compressed.  At a controller's checks
(GraVAC's window checks), rank 0's controller state then travels in one broadcast inside
``step()`` (``consensus.py``); between checks no collective is added.  Every
collective of this package is submitted from the training thread, in the same
order on every rank, so users' own (even unnamed) collectives never interleave
differently on different ranks.

Collective names start with ``gravac.`` for the first optimizer a process builds and
``gravac<n>.`` for the n-th after it, so several optimizers (a GAN's two, say) can
have collectives in flight at once.  Every rank must build its optimizers in the
same order, as with any Horovod collective; the start-up check says so if not.

Non-finite gradients (``nonfinite=``):

* ``"propagate"`` (default, as Horovod): a bucket holding NaN/Inf on any rank
  arrives non-finite on every rank, so ``torch.amp.GradScaler`` sees the overflow
  everywhere, every rank skips the step and the scale backs off.  The rank's
  residual for that bucket is left untouched and the step's gains are not fed to
  the controller.
* ``"zero"``: that rank contributes zeros for the bucket instead; the other ranks'
  gradients still make a (smaller) update.

With ``grad_scaler=`` (the ``GradScaler`` of the training loop) residuals are kept
in unscaled units, so results do not depend on the loss scale, and a step that is
non-finite anywhere leaves residuals, the interval sum and the controller exactly as
before it (at the cost of one more copy of the residuals).
"""
from __future__ import annotations

import dataclasses
import itertools
import time
import warnings
from contextlib import contextmanager
from typing import Dict, List, Optional, Tuple

import torch

import horovod.torch as hvd

from . import checkpoint
from .accounting import StepRecord
from .buckets import Bucket, BucketLayout, BucketSet
from .compressors.base import GradientCompressor
from .comm import resolve_timeout
from .consensus import (ARGUMENT_ERROR, check_agreement, make_exchange, observe_step,
                        raise_argument_errors, sync_first_step)
from .controllers import Controller, Dense, StaticCF
from .encoder import BucketEncoder, EncoderSettings
from .error_feedback import ErrorFeedback, IntervalSum, finite_tensor, save_by_name
from .exchange import CommModel, check_link, check_mode
from .horovod_backend import HorovodBackend
from .link_emulation import emulated, emulated_rate
from .lowrank import PowerSGDState
from .options import (OptimizerOptions, check_passes, is_gravac_compressor, is_wire_compression,
                      misplaced_compression_error)
from .pipeline import BucketPipeline
from .selection.payload import FLOAT_DTYPES
from .sparse import SparseGradients
from .transfers import Link

# Horovod's ``broadcast_optimizer_state`` calls the *base* optimizer's ``step()`` (to
# create momentum buffers etc. without any communication) only for optimizers whose
# ``__module__`` is that of its own wrapper; for any other class it calls ``step()``,
# which here would run a whole distributed step on zero gradients.  Our wrapper
# classes claim that module so Horovod treats them like its own; the base step it
# reaches is ``_state_init_step`` below.
_HOROVOD_OPTIMIZER_MODULE = hvd.DistributedOptimizer.__module__


def _unhooked_step(cls):
    """``cls.step`` without the wrapper torch puts around every optimizer class's ``step``
    (``Optimizer.profile_hook_step``), which runs the step pre/post hooks.  The
    wrapper's own ``step`` carries that wrapper too, so calling the hooked inner step would
    run every hook twice a step (``hvd.DistributedOptimizer`` does: an EMA kept by a post
    hook would move twice)."""
    step = cls.step
    return step.__wrapped__ if getattr(step, "hooked", False) else step


def _state_init_step(self, closure=None):
    """The ``step`` that ``super(type(opt), opt).step()`` reaches: Horovod's
    ``broadcast_optimizer_state`` calls it on zero gradients, on a rank whose optimizer has
    no state yet, to create that state.  The wrapped optimizer's step still applies weight
    decay there (SGD's and Adam's L2 term, AdamW's and ASGD's decay), so in the resume
    recipe, where rank 0 loaded a checkpoint and the other ranks start empty, only the
    other ranks' parameters moved, and the ranks trained on apart from then on
    (``hvd.DistributedOptimizer`` does this).  Here the state is created and the parameters
    are put back, so the call creates state and nothing else.  It copies the parameters
    once, which happens only in that call."""
    params = [p for group in self.param_groups for p in group["params"]]
    before = [p.detach().clone() for p in params]
    try:
        return _unhooked_step(self._optimizer_class)(self, closure)   # not a step: no step hooks
    finally:
        with torch.no_grad():
            for p, kept in zip(params, before):
                p.copy_(kept)


#: Whether hooks go on each parameter's gradient accumulator node (what torch 2.0 has, and
#: what Horovod's own optimizer uses) instead of ``register_post_accumulate_grad_hook``
#: (torch >= 2.1).  Tests set it to run the torch 2.0 path on a newer torch.
ACCUMULATOR_NODE_HOOKS = not hasattr(torch.Tensor, "register_post_accumulate_grad_hook")


def _after_grad_accumulated(p, hook):
    """Call ``hook(p)`` each time a backward has accumulated ``p.grad``; returns what keeps
    the hook registered.  On torch 2.0 (Horovod 0.28.1's last supported torch) the hook goes
    on ``p``'s AccumulateGrad node, which fires after it has written ``p.grad``; the node is
    returned with the handle, since autograd holds it weakly and would build a new one,
    without the hook, for the next graph."""
    if not ACCUMULATOR_NODE_HOOKS:
        return p.register_post_accumulate_grad_hook(hook)
    with torch.enable_grad():   # (also called from a hook, where backward has turned it off)
        node = p.expand_as(p).grad_fn.next_functions[0][0]
    return _AccumulatorHook(node, node.register_hook(lambda grad_inputs, grad_outputs: hook(p)))


class _AccumulatorHook:
    """A hook's handle together with the accumulator node it is on; ``remove()`` as a handle's."""

    def __init__(self, node, handle):
        self.node, self.handle = node, handle

    def remove(self) -> None:
        self.handle.remove()
        self.node = None


class _ElasticSupport:
    """What ``horovod_gravac/elastic.py`` needs from the optimizer, as public methods, so
    that nothing there reaches into private state.  Its methods are copied into the
    wrapper class beside ``_GravacDistributedOptimizer``'s (see ``DistributedOptimizer``)."""

    @property
    def timeout_s(self) -> float:
        """Seconds any collective of this optimizer may take (``math.inf``: no limit)."""
        return self._timeout

    def drop_in_flight(self) -> None:
        """Forget a step that was interrupted (buckets launched, collectives never finished):
        their handles died with the old world."""
        if self._exchange is not None:
            self._exchange.drop()
        for bucket in self._buckets:
            bucket.reset()
        self._reset_delays()
        self._record = StepRecord()
        self._step_start = None
        self._synchronized = False

    def reset_residuals(self) -> None:
        """Zero this rank's pending state: residuals, momentum-correction velocities,
        Accordion's interval sums; PowerSGD's warm starts go back to the seeded Q."""
        self._memory.reset()
        self._interval.reset()
        self._powersgd.clear()

    def set_world_size(self, n: int) -> bool:
        """Take ``n`` ranks as the world (after a membership change); GraVAC's EWMA factor
        follows it.  Returns whether it changed."""
        changed = n != self._link.world
        self._link.world = n
        self.controller.set_world_size(n)   # GraVAC: EWMA factor N/100 unless ewma_alpha was given
        self._comm_model.set_world_size(n)
        return changed

    def mark_state_synced(self) -> None:
        """Every rank already holds rank 0's controller state and step index: skip the
        once-per-optimizer sync before the first bucket (a joining worker would run it alone)."""
        self._state_synced = True

    @property
    def world_size(self) -> int:
        """Ranks taking part (the process set's size; it changes in elastic training)."""
        return self._link.world

    @property
    def _parameter_names(self) -> Dict[torch.nn.Parameter, str]:
        """{parameter: name} for every parameter of the optimizer, as Horovod's optimizer
        keeps it (Horovod's own tests read it); unnamed ones are ``param.<group>.<index>``."""
        return {p: self._names.get(id(p), f"param.{i}.{j}")
                for i, group in enumerate(self.param_groups) for j, p in enumerate(group["params"])}

    def bucketed_parameters(self) -> List[Tuple[str, torch.nn.Parameter]]:
        """(name, parameter) of every parameter sent in a bucket (sparse ones are not)."""
        return [(n, p) for b in self._buckets for n, p in zip(b.names, b.params)]

    def new_compressor(self, cf: float) -> GradientCompressor:
        """A fresh compressor of this optimizer's kind and settings at ``cf``."""
        return self._options.compressor_factory(cf)


class _Inspection:
    """The optimizer's seams beyond Horovod's API: read-only views of its state (for
    checkpoints, tools and tests) and ``close()``.  Copied into the wrapper class as
    ``_ElasticSupport``'s methods are."""

    @property
    def bucket_layout(self) -> Tuple[BucketLayout, ...]:
        """The buckets in launch order (the last one carries the step's statistics): index,
        parameter names, entries and dtypes of each."""
        return self._buckets.layout()

    def residuals(self) -> Dict[str, torch.Tensor]:
        """A copy of this rank's error-feedback residual of each parameter, by name (only of
        buckets that have formed one; in the bucket's ``value_dtype``)."""
        return save_by_name(self._memory.residuals, self._buckets)

    def residual_bytes(self) -> int:
        return self._memory.nbytes()

    @property
    def step_index(self) -> int:
        """Steps taken (the same on every rank; shared-seed draws and checkpoints use it)."""
        return self._step_index

    @property
    def last_step_record(self) -> Optional[StepRecord]:
        """What the last finished step recorded on this rank (None before the first): its
        squared norms before averaging (``norms``, ``grad_sq``) and the rank-averaged
        statistics its carrier bucket brought (``step_stats``).  Read it, don't change it."""
        return self._last_record

    @property
    def collective_prefix(self) -> str:
        """What this optimizer's collective names start with (``gravac``, ``gravac1``, ...)."""
        return self._prefix

    @property
    def backend(self):
        """The backend every collective of this optimizer goes through (``HorovodBackend``)."""
        return self._link.backend

    @property
    def comm_model(self) -> CommModel:
        """The modelled communication of a step at this world size, for each CF and for dense
        (``exchange.CommModel``: ``step_seconds(cf)``, ``kinds(cf)``, ``table(cfs)``,
        ``fastest(cfs)``; ``measured``: this rank's median wait per step for each exchange and
        CF it sent).  What a controller needs to rank CFs with dense among them; a controller
        that defines ``set_comm_model(model)`` is handed this object when the optimizer is
        built."""
        self._comm_model.set_buckets(self._encoder.bucket_shapes(self._buckets))
        return self._comm_model

    def in_flight_handles(self) -> list:
        """The backend's handles of this step's collectives that were started and not yet
        finished (a step interrupted between backward and ``step()``)."""
        return [b.handle for b in self._buckets if b.handle is not None] + self._sparse.handles()

    def close(self) -> None:
        """Remove this optimizer's hooks, so backward passes no longer start its collectives
        (e.g. when the model goes on under another optimizer).  A step in flight is
        forgotten, not waited for."""
        self._hooks.close()
        self.drop_in_flight()


class _GradientHooks:
    """The optimizer's hooks after gradient accumulation, one per parameter."""

    def __init__(self):
        self.handles: List[object] = []
        self.hooked: set = set()   # ids of the parameters that have one
        self.closed = False

    def add(self, params, make_hook) -> None:
        """A hook on every parameter of ``params`` that requires a gradient and has none yet."""
        if self.closed:
            return
        for p in params:
            if p.requires_grad and id(p) not in self.hooked:
                self.hooked.add(id(p))
                self.handles.append(_after_grad_accumulated(p, make_hook(p)))

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.closed = True


class _GravacDistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, options: OptimizerOptions):
        super(self.__class__, self).__init__(params)
        # The wrapped optimizer's defaults, not its class's: add_param_group fills a new
        # group's missing values from them (SGD(lr=0.05) must give a new group lr 0.05, not
        # torch's 1e-3; on torch 2.0, where SGD's lr has no default, not an error).
        self.defaults = dict(options.defaults)
        self._options = options
        controller = self._controller = options.controller
        self._timeout = options.timeout   # seconds per collective (inf: none)
        self.backward_passes_per_step = options.backward_passes_per_step
        self.op = options.op
        self.gradient_predivide_factor = options.gradient_predivide_factor
        # join_safe: every collective is an allreduce, which Horovod's join allows
        # (sparse payloads in per-rank slots, sparse gradients densified, consensus by allreduce).
        self._join_safe = options.join_safe
        self.sparse_as_dense = options.sparse_as_dense or self._join_safe
        self.process_set = options.process_set
        self._grad_scaler = options.grad_scaler
        self.local_clip_norm = options.local_clip_norm
        self._included = bool(self.process_set.included())

        named_all = _named_list(named_parameters)
        self._names = {id(p): n for n, p in named_all}
        floats = _floats(_named_parameters(self.param_groups, named_all if named_parameters is not None else None))
        self._buckets = BucketSet(floats, options.bucket_cap_bytes, options.groups)
        self._prefix = _collective_prefix()
        self._delay = {p: self.backward_passes_per_step for _, p in floats}
        undoable = self._grad_scaler is not None   # a loss scaler's skipped steps are undone
        self._memory = ErrorFeedback(options.momentum_correction, undoable)   # residuals (and DGC's velocities)
        # Accordion's running sum of the gradients over the interval, GraVAC "delivered"'s and
        # "predictive"'s of what was sent
        self._interval = IntervalSum(controller.needs_accumulation, controller.tracks_delivery, undoable)
        self._powersgd = PowerSGDState(self._memory)   # PowerSGD's warm starts and error feedback
        self._shared_seed = options.reference_compressor.step_seeded
        backend = emulated(HorovodBackend(self.process_set))   # $HOROVOD_GRAVAC_EMULATE_LINK: link_emulation.py
        self._link = Link(backend, options.average, self.gradient_predivide_factor,
                          backend.size() if self._included else 1, self._timeout)
        self._sparse = SparseGradients(self._link, self._prefix)   # params whose gradients are sparse
        settings = EncoderSettings(options.compression, options.nonfinite, options.local_clip_norm,
                                   self._join_safe, pair_exchange=bool(options.check_consistency),
                                   fp16_wire=hvd.Compression.fp16, exchange=options.exchange, link=options.link)
        self._encoder = BucketEncoder(self._link, settings, controller=controller, memory=self._memory,
                                      powersgd=self._powersgd, compressor_factory=options.compressor_factory,
                                      prefix=self._prefix)
        self._pipeline = BucketPipeline(self._buckets, self._encoder, self._memory, self._interval, controller)
        controller.set_world_size(self.world_size)
        self._comm_model = self._encoder.comm_model(options.reference_compressor, self._buckets)
        if callable(getattr(controller, "set_comm_model", None)):   # (docs/architecture.md, "Which exchange")
            controller.set_comm_model(self.comm_model)
        self._exchange = make_exchange(controller, self._prefix, self._timeout, backend, self._join_safe,
                                       self._shared_seed)
        if options.check_consistency and self._included and self.world_size > 1:
            _check_consistency(self, floats)

        self._synchronized = False
        self._should_synchronize = True
        self._step_index = 0
        self._state_synced = False   # rank 0's controller state is taken before the first bucket
        self._step_start: Optional[float] = None
        self._scale = 1.0            # the loss scale of the step's gradients (grad_scaler)
        self._record = StepRecord()  # what this step has done so far
        self._last_record: Optional[StepRecord] = None
        self._stats: Dict[str, float] = {}
        self._last_collectives: Tuple[tuple, ...] = ()
        self._hooks = _GradientHooks()
        if self._included:
            self._register_hooks()

    def _register_hooks(self) -> None:
        """A hook after gradient accumulation (``_after_grad_accumulated``) on every parameter
        that requires a gradient and has none yet; called again at each step's first hook,
        so a layer unfrozen between steps joins in at once."""
        self._hooks.add([p for b in self._buckets for p in b.params] + list(self._sparse), self._make_hook)

    def add_param_group(self, param_group):
        """As ``torch.optim.Optimizer.add_param_group``; the new parameters get buckets
        and hooks of their own (every rank must add the same groups in the same order)."""
        super(self.__class__, self).add_param_group(param_group)
        if "_buckets" not in self.__dict__:   # called by the base __init__: set up there
            return
        index = len(self.param_groups) - 1
        floats = _floats([(self._names.get(id(p), f"param.{index}.{j}"), p)
                          for j, p in enumerate(self.param_groups[-1]["params"])])
        for b in self._buckets.add(floats):
            for p in b.params:
                self._delay[p] = self.backward_passes_per_step
        if self._included:
            self._register_hooks()

    # -- hooks ---------------------------------------------------------------------------
    def _make_hook(self, p):
        def hook(param):
            delay = self._delay[p]   # (one lookup: a tensor's hash is a Python call, 314 a step)
            if delay <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "call to step(). Increase backward_passes_per_step to accumulate gradients locally.")
            if not self._record.open:
                self._begin_step()
            self._delay[p] = delay = delay - 1
            if delay == 0:
                if p.grad is not None and p.grad.is_sparse and not self.sparse_as_dense:
                    if p not in self._sparse:   # its first sparse gradient: it leaves its bucket
                        self._sparse.add(p, self._detach_sparse(p))
                    self._sparse.launch(p, self._record)
                    return
                bucket = self._buckets.of[p]
                bucket.ready += 1
                if bucket.ready >= bucket.expected and bucket.transfer is None:
                    self._launch(bucket)
        return hook

    def _begin_step(self) -> None:
        """First hook (or ``synchronize``) of a step: take rank 0's state once, and count
        which hooks this step's buckets wait for."""
        self._record.open = True
        if self._step_start is None:
            self._step_start = time.perf_counter()
        if self._join_safe and self._exchange is not None:
            self._step_index = self._exchange.begin_step(self._step_index, self.world_size)
        if not self._state_synced:
            self._state_synced = True
            self._step_index = sync_first_step(self._exchange, self._controller, self._step_index,
                                               f"{self._prefix}.state", self._link, self._join_safe,
                                               self._shared_seed)
        scaler = self._grad_scaler
        self._scale = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0
        # A parameter unfrozen since the last step gets its hook now, and its bucket waits
        # for it: if its gradient was accumulated before this first hook, the hook fires in
        # no backward this step and synchronize() launches the bucket once every gradient is in.
        # (Counting only the hooks that existed launched its bucket early, with zeros for
        # its gradient: the first step after an unfreeze lost that layer's gradient.)
        if self._included:
            self._register_hooks()
        for b in self._buckets:
            b.expected = b.hooks_to_wait_for(self._hooks.hooked)

    def _detach_sparse(self, p) -> str:
        """Take ``p`` out of its bucket (its gradient turned out sparse); returns its name."""
        bucket, name, start, end = self._buckets.detach(p)
        self._memory.drop(bucket.index, start, end)   # the other parameters keep their residuals
        self._interval.drop(bucket.index)
        bucket.expected = bucket.hooks_to_wait_for(self._hooks.hooked)
        if bucket.params and bucket.ready >= bucket.expected and bucket.transfer is None and bucket.ready > 0:
            self._launch(bucket)
        return name

    # -- launching a bucket ----------------------------------------------------------------
    def _launch(self, bucket: Bucket) -> None:
        """Encode the bucket's gradient and start its collective (``pipeline.py``)."""
        if not self._record.open:
            self._begin_step()
        t0 = time.perf_counter()
        self._pipeline.launch(bucket, self._record, self._scale, self._step_index)
        self._record.compress_time += time.perf_counter() - t0

    # -- synchronize -------------------------------------------------------------------------
    def synchronize(self):
        """Finish every bucket's communication and write averaged gradients to ``p.grad``."""
        if not self._included:   # not in this optimizer's process set: nothing to exchange
            self._synchronized = True
            return
        if not self._record.open:
            self._begin_step()
        for bucket in list(self._buckets):   # buckets whose hooks did not all fire (unused params)
            if bucket.transfer is None:
                self._launch(bucket)
        t_comm = time.perf_counter()
        aggregates = self._pipeline.finish(self._record)
        for p in self._sparse:
            if p.requires_grad:
                self._sparse.finish(p, self._record)
                aggregates.append(p.grad._values())
        # With a loss scaler, a step that is non-finite anywhere is skipped by every rank:
        # leave every piece of state as if it had not happened.
        skipped = self._grad_scaler is not None and not all(finite_tensor(a) for a in aggregates)
        self._pipeline.settle(self._record, self._scale, skipped)
        comm_time = time.perf_counter() - t_comm
        self._reset_delays()
        self._finish_step(comm_time, skipped)
        self._synchronized = True

    def _finish_step(self, comm_time: float, skipped: bool = False):
        step_time = time.perf_counter() - self._step_start
        ctrl, record = self._controller, self._record
        stats = record.summary(self._step_index, ctrl.decision, sum(b.numel for b in self._buckets),
                               step_time, comm_time, skipped)
        self._last_collectives = tuple(record.collectives)
        if not skipped:
            self._comm_model.observe(stats["transfers"], stats["cf"], comm_time)
        observe_step(self._exchange, ctrl, record.step_stats, step_time, self.world_size, record.at_boundary,
                     skipped, stats, comm_time)
        self._stats = stats
        if not skipped:
            self._step_index += 1
        self._step_start = time.perf_counter()
        self._last_record, self._record = record, StepRecord()

    @property
    def controller(self) -> Controller:
        """The controller (Dense, StaticCF, GraVAC, Accordion).  Nothing updates it
        between steps, so its state is never half-updated."""
        return self._controller

    @property
    def stats(self) -> Dict[str, float]:
        """What the last step did (docs/architecture.md, "What a step reports"), the gains and ``next_cf``
        included: ``step()`` fills them in before it returns."""
        return self._stats

    @property
    def last_collectives(self) -> List[Tuple[str, int, int]]:
        """What the last step sent, one entry per bucket: (transfer kind, bucket entries,
        entries of this rank's collective tensor: floats of a dense allreduce, (k, 2) rows of
        a sparse exchange).  The kinds are ``transfers.py``'s (``"dense"``, ``"pair"``,
        ``"sparse"``, ...); ``python -m benchmarks.step_cost network`` times bare Horovod calls of
        them."""
        return list(self._last_collectives)

    def reset_timer(self) -> None:
        """Start timing the next step now. Call after pauses that are not training
        (evaluation, checkpointing) so they do not count as iteration time."""
        self._step_start = time.perf_counter()

    def set_backward_passes_per_step(self, passes: int) -> None:
        """As Horovod's: gradients of ``passes`` backward passes are summed locally first."""
        check_passes(passes)
        self.backward_passes_per_step = passes
        self._reset_delays()

    def _reset_delays(self) -> None:
        """Every parameter waits for ``backward_passes_per_step`` gradients again."""
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step

    @contextmanager
    def skip_synchronize(self):
        """``optimizer.synchronize(); with optimizer.skip_synchronize(): optimizer.step()``"""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize().")
            self.synchronize()
        self._synchronized = False
        # the wrapped class's step itself, past _state_init_step and past torch's hook
        # wrapper (this method has its own, so the step hooks run once)
        return _unhooked_step(self._optimizer_class)(self, closure)

    def zero_grad(self, set_to_none: bool = True):
        if any(b.transfer is not None for b in self._buckets) or self._sparse.in_flight():
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited "
                                 "as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)

    # -- state (horovod_gravac/checkpoint.py) -------------------------------------------------
    def gravac_state_dict(self) -> dict:
        """Controller state, step index and this rank's buffers by parameter name, with
        ``meta`` and checksums (``checkpoint.gravac_state``)."""
        return checkpoint.gravac_state(self.controller, self._step_index, self._memory, self._interval,
                                       self._powersgd, self._buckets, checkpoint.optimizer_meta(self, hvd.rank()),
                                       self._encoder.coherence)

    def load_gravac_state_dict(self, state: dict) -> None:
        """Load a state from ``gravac_state_dict``; ``ValueError`` (nothing loaded) if it
        does not fit this optimizer (``checkpoint.load_controller_state``)."""
        meta = checkpoint.optimizer_meta(self, hvd.rank())
        self._step_index = checkpoint.load_controller_state(state, meta, self.controller)
        checkpoint.load_rank_buffers(state, self._memory, self._interval, self._powersgd, self._buckets,
                                     self._encoder.coherence)

    def state_dict(self):
        state = super(self.__class__, self).state_dict()
        state["gravac"] = self.gravac_state_dict()
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        gravac = state_dict.pop("gravac", None)
        if isinstance(gravac, dict) and "meta" in gravac:   # check before anything is loaded
            checkpoint.check_compatible(gravac["meta"], checkpoint.optimizer_meta(self, hvd.rank()))
            checkpoint.verify_residuals(gravac)
        super(self.__class__, self).load_state_dict(state_dict)
        if gravac is not None:
            self.load_gravac_state_dict(gravac)
        self._reset_delays()
        self._synchronized = False
        self._should_synchronize = True


def _check_consistency(opt, named) -> None:
    """The start-up check: fail on every rank, with the difference named, if ranks
    disagree on set-up (``opt``: the optimizer being built; one collective)."""
    options = opt._options
    wire = options.compression
    mine = {"collective_prefix": opt._prefix, "controller": opt._controller.config(),
            "momentum_correction": options.momentum_correction, "local_clip_norm": opt.local_clip_norm,
            "compressor": repr(options.reference_compressor),
            "backward_passes_per_step": opt.backward_passes_per_step,
            "parameters": [(n, tuple(p.shape), str(p.dtype)) for n, p in named],
            # The bucket layout (from bucket_cap_mb and groups): every rank must cut the
            # same buckets, or the collectives of a bucket index carry different tensors.
            "bucket_cap_mb": {"bucket_sizes": [b.numel for b in opt._buckets],
                              "bucket_params": [b.names for b in opt._buckets]},
            "op": int(opt.op), "gradient_predivide_factor": opt.gradient_predivide_factor,
            "compression": getattr(wire, "__name__", type(wire).__name__),
            "sparse_as_dense": opt.sparse_as_dense, "nonfinite": options.nonfinite,
            "grad_scaler": opt._grad_scaler is not None, "join_safe": opt._join_safe,
            "exchange": (options.exchange, repr(options.link))}
    check_agreement(opt.backend, mine, f"{opt._prefix}.consistency", opt._timeout, hints={
        "collective_prefix": " Every rank must build its DistributedOptimizers in the same order.",
        "bucket_cap_mb": " The bucket layout differs: every rank must pass the same bucket_cap_mb (and groups)."})


def _refuse_on_every_rank(exc: ValueError, process_set, check_consistency: bool, timeout_s) -> None:
    """An argument was refused (``exc``) before this rank built its optimizer: take part in the
    start-up check in its place, so that every rank raises the same error at the same point
    (``consensus.raise_argument_errors``) instead of this rank ending the job alone.  Returns
    (the caller raises ``exc`` here) when there is no check to join: one rank, the check
    turned off, no usable process set, or Horovod not initialized."""
    try:
        if not check_consistency or not process_set.included() or process_set.size() < 2:
            return
    except Exception:   # an invalid process_set, or hvd.init() not called: nothing to join
        return
    try:
        timeout = resolve_timeout(timeout_s)
    except ValueError:
        timeout = resolve_timeout(None)
    prefix = _collective_prefix()   # the name this optimizer's check has on the other ranks
    everyone = HorovodBackend(process_set).allgather_object({ARGUMENT_ERROR: str(exc)}, f"{prefix}.consistency",
                                                            timeout)
    try:
        raise_argument_errors(everyone)
    except ValueError as shared:
        if str(shared) != str(exc):   # other ranks refused other arguments, or none
            raise shared from None


_optimizers_built = itertools.count()


def _collective_prefix() -> str:
    """``gravac`` for a process's first optimizer, ``gravac1``, ``gravac2``... after it."""
    n = next(_optimizers_built)
    return "gravac" if n == 0 else f"gravac{n}"


def _floats(named):
    """The floating-point parameters of ``named``; frozen ones too: unfreezing one later
    must not leave it out of the exchange (ranks would diverge)."""
    _check_float(named)
    return [(n, p) for n, p in named if p.dtype in FLOAT_DTYPES]


def _named_list(named_parameters):
    if named_parameters is None:
        return []
    named = list(named_parameters)
    if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually model.named_parameters()")
    names = [n for n, _ in named]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"parameter names in named_parameters must be unique; duplicates: {dups}")
    return named


def _named_parameters(param_groups, named):
    if named is None:
        return [(f"param.{i}.{j}", p) for i, g in enumerate(param_groups) for j, p in enumerate(g["params"])]
    named_ids = {id(p) for _, p in named}
    missing = [p for g in param_groups for p in g["params"] if id(p) not in named_ids]
    if missing:
        raise ValueError(f"named_parameters was given but {len(missing)} optimizer parameter(s) are not named")
    # Keep the optimizer's order (not the dict order of named_parameters).
    order = {id(p): i for i, p in enumerate(p for g in param_groups for p in g["params"])}
    return sorted(((n, p) for n, p in named if id(p) in order), key=lambda np_: order[id(np_[1])])


def _check_float(named) -> None:
    for name, p in named:
        if p.requires_grad and p.dtype not in FLOAT_DTYPES:
            raise ValueError(f"parameter {name!r} has dtype {p.dtype}; only floating-point "
                             f"parameters can be trained with gradient compression")


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None,
                         compression=hvd.Compression.none, backward_passes_per_step: int = 1,
                         op=hvd.Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups=None, sparse_as_dense: bool = False, process_set=hvd.global_process_set,
                         *, compressor=None, controller: Optional[Controller] = None,
                         bucket_cap_mb: float = 25.0, check_consistency: bool = True,
                         momentum_correction: Optional[float] = None,
                         local_clip_norm: Optional[float] = None,
                         timeout_s: Optional[float] = None,
                         nonfinite: str = "propagate", grad_scaler=None, join_safe: bool = False,
                         exchange: str = "auto", link=None):
    """Wrap ``optimizer`` so gradients are combined across Horovod ranks with adaptive
    (GraVAC), static or no compression.  The first ten arguments are
    ``hvd.DistributedOptimizer``'s, in its order and with its meaning; the rest are
    keyword-only.

    Float64 parameters: their buckets are formed, compressed, sent and remembered (error
    feedback) in float64, with every compressor: float64 values and int32 indices (12 bytes
    an entry), float64 residuals, so a finite gradient beyond float32's range is an ordinary
    gradient there.  A bucket never mixes float64 parameters with others: where they are
    neighbours, or in one of ``groups``, they are split into a float64 bucket and one for
    the rest (float32, fp16 and bf16 parameters keep float32 values and residuals).

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()`` (names are used for checkpoints
            and the start-up consistency check).
        compression: Horovod's wire compression of dense allreduces
            (``hvd.Compression.none`` or ``hvd.Compression.fp16``; sparse payloads travel
            as float32 values with int32 indices, float64 values for float64 parameters).
            A horovod_gravac compressor given here is taken as ``compressor`` (and,
            without a controller, as ``StaticCF(its cf)``).
        backward_passes_per_step: local gradient accumulation steps, as in Horovod.
        op: ``hvd.Average`` (default) or ``hvd.Sum``.  ``hvd.Adasum`` is not supported.
        gradient_predivide_factor: with ``op=hvd.Average``, gradients are scaled by
            ``1 / factor`` before the sum and ``factor / size`` after it, as in Horovod.
        num_groups: deprecated alias of ``groups`` (as in Horovod).
        groups: an int splits the parameters into that many buckets; a list of lists of
            parameters makes each list one bucket (one collective each).
        sparse_as_dense: send sparse gradients (``nn.Embedding(sparse=True)``) densely,
            with compression; otherwise they are allgathered as Horovod does, uncompressed.
        process_set: only this Horovod process set's ranks take part (others step locally).
        compressor: a compressor class such as ``TopKCompressor`` (default), an instance
            whose settings are reused at every CF, or a callable ``cf -> compressor``.
            Horovod's compressions (``hvd.Compression.fp16``) go to ``compression``; given
            here they are refused with a ``ValueError`` that says so.
        controller: ``Dense()`` (default), ``StaticCF(cf)``, ``GraVAC(...)`` or ``Accordion(...)``.
        bucket_cap_mb: gradients are flattened into buckets of at most this size; each
            bucket is compressed and communicated with one collective.
        check_consistency: verify at start-up that all ranks agree on the model, the
            compressor and the controller (one collective), failing on every rank if not.
            A rank that refuses an argument (``ValueError``) joins this check with its
            error, so every rank raises the same error there.
            ``False`` also sends two ranks' fixed-size payloads with an allgather instead of
            the pair exchange (``transfers.PairExchange``), since nothing then says that
            both ranks' payloads have one size.
        momentum_correction: DGC's momentum correction with this momentum (e.g. 0.9).
            Wrap a momentum-free optimizer when using it. Off by default.
        local_clip_norm: DGC's local gradient clipping: each rank clips each bucket's
            gradient norm to ``local_clip_norm / sqrt(N)`` before error feedback.
        timeout_s: seconds any collective may take before this rank raises
            ``comm.CollectiveTimeoutError`` (a peer died or stalls) instead of hanging.
            ``None``: ``$HOROVOD_GRAVAC_TIMEOUT``, else 600; ``math.inf``: no limit.
        nonfinite: ``"propagate"`` (default, as Horovod: NaN/Inf on any rank reaches
            every rank, so a loss scaler skips the step everywhere) or ``"zero"`` (that
            rank contributes zeros for the bucket).
        grad_scaler: the loop's ``torch.amp.GradScaler``: residuals are kept unscaled
            (results independent of the loss scale) and a skipped step leaves every
            state as it was.
        join_safe: make every collective an allreduce, so ``hvd.join()`` with uneven data
            works with compression too (Horovod's join supports nothing else): sparse
            payloads travel in per-rank slots of an allreduce (about twice the bytes of
            an allgather), sparse gradients are densified, and adaptive controllers agree
            through one small blocking allreduce at the start of each step.
        exchange: how compressed buckets cross the ranks (``exchange.py``): ``"auto"``
            (default) the cheapest by a cost model at this world size and CF, among the pair
            exchange (two ranks), the allgather, the sparse allreduce (traffic that does not
            grow with the number of ranks) and the dense allreduce; ``"allgather"`` the
            paper's path (the pair exchange between two ranks, else one allgather);
            ``"sparse_allreduce"`` always the sparse allreduce.  ``optimizer.stats``
            (``transfers``) says which was used.
        link: the link the cost model assumes: a rate (``"100mbit"``, ``"10gbit"``) or an
            ``exchange.LinkModel``; ``None``: ``$HOROVOD_GRAVAC_LINK``, else 1 Gbit/s.

    After each step, ``optimizer.stats`` describes it (docs/architecture.md, "What a step reports").
    """
    try:
        if is_wire_compression(compressor):   # the two arguments mixed up (or swapped)
            raise misplaced_compression_error(compressor)
        if is_gravac_compressor(compression):
            if compressor is not None:
                raise ValueError("compression= is a horovod_gravac compressor and compressor= is given "
                                 "too; pass the compressor once (compressor=...)")
            compressor, compression = compression, hvd.Compression.none
            if controller is None:
                cf = getattr(compressor, "cf", None)
                controller = StaticCF(cf) if isinstance(cf, (int, float)) and not isinstance(compressor, type) \
                    else Dense()
        if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
            raise ValueError(f"compression must be a Horovod compressor (hvd.Compression.none or "
                             f"hvd.Compression.fp16), got {compression!r}")
        if op == hvd.Adasum:
            raise ValueError("op=hvd.Adasum is not supported by horovod_gravac.DistributedOptimizer: "
                             "Adasum combines whole updates, which gradient compression does not "
                             "send. Use op=hvd.Average or hvd.Sum, or hvd.DistributedOptimizer for Adasum.")
        if op not in (hvd.Average, hvd.Sum):
            raise ValueError(f"op must be hvd.Average or hvd.Sum, got {op!r}")
        if not hasattr(process_set, "process_set_id") or process_set.process_set_id is None:
            raise ValueError(f"process_set must be an initialized Horovod ProcessSet "
                             f"(hvd.global_process_set or one from hvd.add_process_set), got {process_set!r}")
        options = OptimizerOptions.build(
            compression=compression, backward_passes_per_step=backward_passes_per_step, op=op,
            average=op == hvd.Average, gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
            groups=groups, sparse_as_dense=sparse_as_dense, process_set=process_set, compressor=compressor,
            controller=controller, bucket_cap_mb=bucket_cap_mb, check_consistency=check_consistency,
            momentum_correction=momentum_correction, local_clip_norm=local_clip_norm, timeout_s=timeout_s,
            nonfinite=nonfinite, grad_scaler=grad_scaler, join_safe=join_safe, defaults=optimizer.defaults)
        options = dataclasses.replace(options, exchange=check_mode(exchange), link=check_link(link))
        emulated_rate()   # a rate it cannot read is refused here, with the other arguments
    except ValueError as exc:
        # Every rank runs the same script, so every rank refuses the same arguments; without
        # this the first rank to exit ends the job, and its peers die mid-launch (Horovod's
        # runner stops them, or a Gloo read fails) before printing why.
        _refuse_on_every_rank(exc, process_set, check_consistency, timeout_s)
        raise
    attrs = {k: v for cls in (_ElasticSupport, _Inspection, _GravacDistributedOptimizer)
             for k, v in cls.__dict__.items() if k not in ("__dict__", "__weakref__")}
    attrs["__module__"] = _HOROVOD_OPTIMIZER_MODULE   # see the note at its definition
    attrs["_optimizer_class"] = optimizer.__class__
    # wrapper -> state-creating step -> the user's class: Horovod's super(type(opt), opt).step()
    # lands in the middle one (see _state_init_step)
    state_init = type(optimizer.__class__.__name__, (optimizer.__class__,),
                      {"step": _state_init_step, "__module__": _HOROVOD_OPTIMIZER_MODULE})
    cls = type(optimizer.__class__.__name__, (state_init,), attrs)
    return cls(optimizer.param_groups, named_parameters, options)
