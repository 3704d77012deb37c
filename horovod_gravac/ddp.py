"""GraVAC, Accordion and static compression as a PyTorch DDP communication hook.

Two lines change in a DDP script (the shape of ``torch``'s ``powerSGD_hook``)::

    import horovod_gravac as hg
    state = hg.ddp.GravacState(process_group=None, compressor=hg.TopKCompressor,
                               controller=hg.GraVAC(theta_min=10, theta_max=1000, window=500))
    ddp_model.register_comm_hook(state, hg.ddp.gravac_hook)

No Horovod is needed: the hook runs on ``torch.distributed`` (``ddp_backend.DDPBackend``)
and shares everything else with ``horovod_gravac.DistributedOptimizer``: the encoder (error
feedback, multi-level compression, the NaN/Inf policy), the transfers, the statistics that
ride with the last bucket and rank 0's decisions at the controller's checks
(``consensus.py``).  Every compressor and controller works here: ``Dense()``,
``StaticCF(cf)``, every ``GraVAC`` variant and ``Accordion``, with Top-k, DGC, RedSync,
Random-k, SIDCo and PowerSGD.

How a step runs.  DDP calls the hook once per bucket, in bucket order, as gradients
become ready; ``bucket.is_last()`` marks the step's last.  Each call encodes its bucket and
starts its collective at once (so communication overlaps the rest of the backward).  The
last bucket carries the step's statistics (rank-averaged norms for the controller); its
call waits for every bucket's collective, writes each averaged bucket into DDP's buffer,
updates the residuals, feeds the controller (rank 0's state travels at its checks) and
completes every bucket's future.  DDP waits for the futures only after the last hook, so
nothing waits early.

* ``Dense()`` gives DDP's default allreduce bit for bit (the gradient times ``1 / N``,
  summed); with ``compression="fp16"`` (``"bf16"``), ``fp16_compress_hook``'s
  (``bf16_compress_hook``'s) result.
* DDP rebuilds its buckets once after the first iteration (in the order gradients became
  ready).  The residuals follow their parameters into the new buckets (by name).
* ``no_sync()`` accumulation, ``find_unused_parameters``, ``static_graph`` and
  ``gradient_as_bucket_view`` work as with DDP's own hooks (the hook sees the bucket DDP
  built; unused parameters' entries are zeros there).
* ``grad_scaler=`` (a ``torch.amp.GradScaler``): residuals in unscaled units and a step
  that overflowed anywhere leaves every state as it was, as for the Horovod optimizer.
  A NaN/Inf on any rank reaches every rank (``nonfinite="propagate"``), so the scaler
  skips the step on all of them.

``state.stats`` after each step reads like ``DistributedOptimizer.stats`` (the keys are in
docs/architecture.md, "What a step reports"); ``state.state_dict()`` / ``state.load_state_dict()`` save and check
the controller, the step index and this rank's residuals (``checkpoint.py``).
"""
import itertools
import math
import time
from typing import Dict, Iterable, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import checkpoint
from .accounting import StepRecord
from .buckets import Bucket
from .comm import resolve_timeout
from .consensus import check_agreement, make_exchange, observe_step, sync_first_step
from .controllers import Controller, Dense
from .ddp_backend import DDPBackend
from .encoder import BucketEncoder, EncoderSettings
from .error_feedback import ErrorFeedback, IntervalSum, finite_tensor
from .exchange import CommModel, Waits, check_link, check_mode
from .link_emulation import emulated
from .lowrank import PowerSGDState
from .options import NONFINITE_POLICIES, compressor_factory, reference_compressor
from .pipeline import BucketPipeline
from .transfers import Link

__all__ = ["GravacState", "gravac_hook", "AllRanks", "WIRES"]


class _Wire:
    """The wire compression of dense sends: none, or a cast to a half-width dtype (what
    ``fp16_compress_hook`` / ``bf16_compress_hook`` send)."""

    def __init__(self, name: str, dtype: Optional[torch.dtype]):
        self.__name__, self.dtype = name, dtype

    def compress(self, tensor):
        if self.dtype is None or not tensor.is_floating_point():
            return tensor, None
        return tensor.to(self.dtype), tensor.dtype

    def decompress(self, tensor, ctx):
        return tensor if ctx is None else tensor.to(ctx)

    def __repr__(self):
        return self.__name__


#: ``compression=`` values: the dense sends' wire.
WIRES = {"none": _Wire("none", None), "fp16": _Wire("fp16", torch.float16), "bf16": _Wire("bf16", torch.bfloat16)}


class _DDPBucket(Bucket):
    """A DDP bucket seen through the encoder's :class:`buckets.Bucket`: its gradients are
    the views of DDP's flat buffer, and the averaged result goes back into that buffer."""

    grad_bucket = None   # this step's dist.GradBucket

    def gradients(self):
        return list(self.grad_bucket.gradients())

    def write_grads(self, aggregated: torch.Tensor) -> None:
        self.grad_bucket.buffer().copy_(aggregated)


class _StepBuckets:
    """The buckets of the step so far, in DDP's order: what ``BucketPipeline`` iterates.
    The carrier (the last bucket, which carries the step's statistics) is known only when
    DDP hands it over (``is_last()``)."""

    def __init__(self):
        self.buckets: List[_DDPBucket] = []
        self.carrier: Optional[_DDPBucket] = None

    def __iter__(self):
        return iter(self.buckets)

    def __len__(self):
        return len(self.buckets)


_states_built = itertools.count()


class GravacState:
    """The state of :func:`gravac_hook` (one per DDP model; every rank builds it alike).

    Args:
        process_group: the group to reduce in (``None``: the default group), as for
            DDP's own hooks.  It is resolved at the hook's first call (or the first
            ``state_dict()`` / ``load_state_dict()``), so the state can be built before
            ``torch.distributed.init_process_group`` (as Lightning's ``DDPStrategy(
            ddp_comm_state=...)`` needs, and as PyTorch's ``PowerSGDState`` allows).
        compressor: a compressor class such as ``hg.TopKCompressor`` (default), an
            instance whose settings are reused at every CF, or a callable ``cf -> compressor``.
        controller: ``hg.Dense()`` (default), ``hg.StaticCF(cf)``, ``hg.GraVAC(...)`` or
            ``hg.Accordion(...)``.
        compression: the wire of dense sends: ``"none"`` (default), ``"fp16"`` or
            ``"bf16"`` (as DDP's ``fp16_compress_hook`` / ``bf16_compress_hook``).
        named_parameters: ``model.named_parameters()`` (optional): names for checkpoints
            and errors; without it parameters are named ``param.<n>`` in the order the hook
            first sees them (the same on every rank and run).
        momentum_correction, local_clip_norm, nonfinite, grad_scaler, timeout_s: as
            ``horovod_gravac.DistributedOptimizer``'s.
        check_consistency: compare the ranks' settings at the first step (one object
            allgather), failing on every rank with the difference named.
        exchange, link: how compressed buckets cross the ranks, as
            ``horovod_gravac.DistributedOptimizer``'s (``"auto"``: by modelled cost, dense
            included; ``"allgather"``: the paper's path; ``"sparse_allreduce"``).

    The arguments are checked here; what needs the group (its backend, the world size,
    the ranks' agreement on the settings) at the first step.
    """

    def __init__(self, process_group=None, compressor=None, controller: Optional[Controller] = None, *,
                 compression: str = "none", named_parameters=None, momentum_correction: Optional[float] = None,
                 local_clip_norm: Optional[float] = None, nonfinite: str = "propagate", grad_scaler=None,
                 timeout_s: Optional[float] = None, check_consistency: bool = True,
                 exchange: str = "auto", link=None):
        controller = Dense() if controller is None else controller
        if not isinstance(controller, Controller):
            raise ValueError(f"controller must be a horovod_gravac controller "
                             f"(Dense, StaticCF, GraVAC, Accordion), got {controller!r}")
        if compression not in WIRES:
            raise ValueError(f"compression must be one of {sorted(WIRES)}, got {compression!r}")
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        if local_clip_norm is not None and not (isinstance(local_clip_norm, (int, float))
                                                and not isinstance(local_clip_norm, bool) and local_clip_norm > 0):
            raise ValueError(f"local_clip_norm must be > 0 or None, got {local_clip_norm!r}")
        if grad_scaler is not None and not (callable(getattr(grad_scaler, "get_scale", None))
                                            and callable(getattr(grad_scaler, "is_enabled", None))):
            raise ValueError(f"grad_scaler must be a torch.amp.GradScaler, got {grad_scaler!r}")
        self.timeout = resolve_timeout(timeout_s)
        self.exchange_mode, self.link_model = check_mode(exchange), check_link(link)
        self.factory = compressor_factory(compressor)
        self.reference = reference_compressor(self.factory, controller)
        self.controller = controller
        self.compression = compression
        self.grad_scaler = grad_scaler
        self.check_consistency = check_consistency
        self.settings = {"momentum_correction": momentum_correction, "local_clip_norm": local_clip_norm,
                         "nonfinite": nonfinite}
        self.process_group = process_group
        n = next(_states_built)
        self.prefix = "ddp" if n == 0 else f"ddp{n}"
        self._names: Dict[int, str] = {id(p): name for name, p in (named_parameters or [])}
        self._seen = 0
        undoable = grad_scaler is not None
        self.memory = ErrorFeedback(momentum_correction, undoable)
        self.interval = IntervalSum(controller.needs_accumulation, controller.tracks_delivery, undoable)
        self.powersgd = PowerSGDState(self.memory)
        self.shared_seed = self.reference.step_seeded
        self.step_buckets = _StepBuckets()
        # The group, its backend and world size, and what sends through them: resolved by
        # _connect() at the first hook call (or the first state_dict / load_state_dict), so
        # the state can be built before torch.distributed is initialized, as PyTorch's
        # PowerSGDState(process_group=None) can (Lightning initializes it inside fit()).
        self.backend: Optional[DDPBackend] = None
        self.link: Optional[Link] = None
        self.encoder: Optional[BucketEncoder] = None
        self.pipeline: Optional[BucketPipeline] = None
        self.exchange = None
        self.layout: Dict[int, _DDPBucket] = {}   # DDP's bucket index -> our bucket
        self.step_index = 0
        self._started = False      # the first step's checks and state sync ran
        self._record: Optional[StepRecord] = None
        self._futures: List[torch.futures.Future] = []
        self._scale = 1.0
        self._last_step_end: Optional[float] = None
        self._step_start = 0.0
        self._pending_load: Optional[dict] = None   # a state loaded before the layout was known
        self._carried: Optional[tuple] = None       # state by name of buckets DDP re-made this step
        self.stats: Dict[str, object] = {}
        self.last_collectives: Tuple[tuple, ...] = ()
        self._waits = Waits()   # this rank's waits for its transfers (comm_model.measured)
        self._layout_changed = False   # a bucket was added since the controller was last handed the comm_model

    # -- the group --------------------------------------------------------------------------
    def _connect(self) -> None:
        """Resolve the process group (``None``: the default group as it is now), its
        backend and world size, and build the encoder, the pipeline and the controller's
        exchange on them.  Once; the settings are compared across ranks at the first step."""
        if self.backend is not None:
            return
        # raises if torch.distributed is not initialized; emulated: $HOROVOD_GRAVAC_EMULATE_LINK
        backend = emulated(DDPBackend(self.process_group, self.timeout))
        link = Link(backend, True, 1.0, backend.size(), self.timeout)
        s = self.settings
        settings = EncoderSettings(WIRES[self.compression], s["nonfinite"], s["local_clip_norm"], join_safe=False,
                                   pair_exchange=bool(self.check_consistency), fp16_wire=WIRES["fp16"],
                                   exchange=self.exchange_mode, link=self.link_model)
        self.encoder = BucketEncoder(link, settings, controller=self.controller, memory=self.memory,
                                     powersgd=self.powersgd, compressor_factory=self.factory, prefix=self.prefix)
        self.pipeline = BucketPipeline(self.step_buckets, self.encoder, self.memory, self.interval, self.controller)
        self.controller.set_world_size(link.world)
        self.exchange = make_exchange(self.controller, self.prefix, self.timeout, backend, False, self.shared_seed)
        self.backend, self.link = backend, link

    # -- one bucket -------------------------------------------------------------------------
    def _hook(self, grad_bucket) -> torch.futures.Future:
        if self.backend is None:
            self._connect()   # outside the try: nothing of a step to abandon yet
        try:
            return self._run(grad_bucket)
        except BaseException:
            self._abandon_step()
            raise

    def _run(self, grad_bucket) -> torch.futures.Future:
        if self._record is None:
            self._begin_step()
        bucket = self._bucket_for(grad_bucket)
        bucket.grad_bucket = grad_bucket
        last = grad_bucket.is_last()
        steps = self.step_buckets
        steps.buckets.append(bucket)
        if last:
            steps.carrier = bucket
        t0 = time.perf_counter()
        self.pipeline.launch(bucket, self._record, self._scale, self.step_index)
        self._record.compress_time += time.perf_counter() - t0
        future = torch.futures.Future()
        self._futures.append(future)
        if last:
            self._finish_step()
        return future

    def _begin_step(self) -> None:
        self._record = StepRecord()
        self._record.open = True
        self._step_start = time.perf_counter() if self._last_step_end is None else self._last_step_end
        if not self._started:
            if self.check_consistency and self.link.world > 1:
                check_agreement(self.backend, self._settings_of_rank(), f"{self.prefix}.consistency", self.timeout)
            self.step_index = sync_first_step(self.exchange, self.controller, self.step_index,
                                              f"{self.prefix}.state", self.link, False, self.shared_seed)
            self._started = True
        scaler = self.grad_scaler
        self._scale = float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0

    def _finish_step(self) -> None:
        record, steps = self._record, self.step_buckets
        t_comm = time.perf_counter()
        aggregates = self.pipeline.finish(record)
        skipped = self.grad_scaler is not None and not all(finite_tensor(a) for a in aggregates)
        self.pipeline.settle(record, self._scale, skipped)
        now = time.perf_counter()
        step_time = now - self._step_start
        ctrl = self.controller
        comm_time = now - t_comm   # waiting for the step's transfers, as the optimizer's
        stats = record.summary(self.step_index, ctrl.decision, sum(b.numel for b in steps), step_time,
                               comm_time, skipped)
        self.last_collectives = tuple(record.collectives)
        if not skipped:
            self._waits.observe(stats["transfers"], stats["cf"], comm_time)
        if self._layout_changed:   # DDP's buckets are known once a step has run (and may be rebuilt)
            self._layout_changed = False
            if callable(getattr(ctrl, "set_comm_model", None)):
                ctrl.set_comm_model(self.comm_model)
        observe_step(self.exchange, ctrl, record.step_stats, step_time, self.link.world, record.at_boundary,
                     skipped, stats, comm_time)
        self.stats = stats
        if not skipped:
            self.step_index += 1
        if self._pending_load is not None:
            self._check_loaded_layout()
        for bucket, future in zip(steps.buckets, self._futures):
            future.set_result(bucket.grad_bucket.buffer())
            bucket.grad_bucket = None
        self._clear_step()
        self._last_step_end = time.perf_counter()

    def _clear_step(self) -> None:
        self._record = None
        self._carried = None
        self._futures = []
        self.step_buckets.buckets = []
        self.step_buckets.carrier = None

    def _abandon_step(self) -> None:
        """A hook raised: forget the step (its collectives, residual updates half done), so
        the next backward starts clean.  The futures already handed to DDP fail."""
        for bucket in self.step_buckets:
            bucket.reset()
            bucket.grad_bucket = None
        error = RuntimeError("horovod_gravac.ddp: an earlier bucket of this step raised")
        for future in self._futures:
            if not future.done():
                future.set_exception(error)
        self._clear_step()
        self._last_step_end = None

    # -- DDP's buckets and ours -------------------------------------------------------------
    def _name(self, p) -> str:
        name = self._names.get(id(p))
        if name is None:
            name = self._names[id(p)] = f"param.{self._seen}"
            self._seen += 1
        return name

    def _bucket_for(self, grad_bucket) -> _DDPBucket:
        """Our bucket for DDP's ``grad_bucket``; when DDP has re-bucketed (after its first
        iteration), the residuals and interval sums of the buckets from here on move to the
        new buckets by parameter name."""
        index = grad_bucket.index()
        params = list(grad_bucket.parameters())
        known = self.layout.get(index)
        if known is not None and len(known.params) == len(params) \
                and all(a is b for a, b in zip(known.params, params)):
            return known
        # Buckets before this one were DDP's as before (it hands them over in order), so
        # only this one and those after it can have changed.
        moved = [b for i, b in self.layout.items() if i >= index]
        if moved:
            self._carried = (self.memory.state_dict(moved), self.interval.state_dict(moved))
            for b in moved:
                self.memory.forget(b.index)
                self.interval.drop(b.index)
                del self.layout[b.index]
        bucket = _DDPBucket(index, [(self._name(p), p) for p in params])
        if bucket.numel != grad_bucket.buffer().numel():
            raise RuntimeError(f"horovod_gravac.ddp: DDP bucket {index} holds {grad_bucket.buffer().numel()} "
                               f"entries for parameters of {bucket.numel}")
        self.layout[index] = bucket
        self._layout_changed = True
        if self._carried is not None:   # this step's re-bucketing: the residuals follow by name
            residuals, sums = self._carried
            self.memory.load_state_dict(residuals, [bucket])
            if sums:
                self.interval.load_state_dict(sums, [bucket])
        if self._pending_load is not None:
            checkpoint.load_rank_buffers(self._pending_load, self.memory, self.interval, self.powersgd, [bucket],
                                         self.encoder.coherence)
        return bucket

    def _buckets(self) -> List[_DDPBucket]:
        return [self.layout[i] for i in sorted(self.layout)]

    # -- checks and state -------------------------------------------------------------------
    def _settings_of_rank(self) -> dict:
        return {"prefix": self.prefix, "controller": self.controller.config(),
                "compressor": repr(self.reference), "compression": self.compression,
                "grad_scaler": self.grad_scaler is not None, **self.settings,
                "exchange": (self.exchange_mode, repr(self.link_model))}

    def _meta(self) -> dict:
        self._connect()
        layout = [(b_name, tuple(p.shape), str(p.dtype))
                  for b in self._buckets() for b_name, p in zip(b.names, b.params)]
        return checkpoint.describe(self.controller.config(), repr(self.factory(10.0)), self.link.world,
                                   self.backend.rank(), sorted(layout))

    def state_dict(self) -> dict:
        """The controller, the step index and this rank's residuals (by parameter name),
        with ``meta`` and checksums, as ``DistributedOptimizer.gravac_state_dict()``."""
        return checkpoint.gravac_state(self.controller, self.step_index, self.memory, self.interval,
                                       self.powersgd, self._buckets(), self._meta(), self.encoder.coherence)

    def load_state_dict(self, state: dict) -> None:
        """Load :meth:`state_dict`'s output; ``ValueError`` (``checkpoint.CheckpointError``)
        naming the difference when it was written for another controller, compressor, rank,
        world size or model.  Before the first step the buckets are not known yet: the
        residuals load as DDP hands each bucket over, and the parameters are compared at the
        end of that step."""
        meta = self._meta()
        if not self.layout:   # the parameters are checked once the first step has shown them
            saved = state.get("meta") if isinstance(state, dict) else None
            meta["parameters"] = saved.get("parameters") if isinstance(saved, dict) else None
        self.step_index = checkpoint.load_controller_state(state, meta, self.controller)
        self._started = False   # every rank takes rank 0's state before the next bucket
        if self.layout:
            checkpoint.load_rank_buffers(state, self.memory, self.interval, self.powersgd, self._buckets(),
                                         self.encoder.coherence)
        else:
            self._pending_load = state

    def _check_loaded_layout(self) -> None:
        state, self._pending_load = self._pending_load, None
        checkpoint.check_compatible(state.get("meta"), self._meta())

    def metrics(self, prefix: str = "gravac/") -> Dict[str, float]:
        """The numbers of :attr:`stats` as floats keyed ``prefix + key`` (strings and
        ``None`` left out, booleans as 0/1): what a logger takes, e.g. Lightning's
        ``self.log_dict(state.metrics())`` or Accelerate's ``accelerator.log(state.metrics(),
        step=...)``.  Empty before the first step."""
        return {prefix + key: float(value) for key, value in self.stats.items() if isinstance(value, (int, float))}

    @property
    def comm_model(self) -> CommModel:
        """As ``DistributedOptimizer.comm_model``: the modelled communication of a step at
        this world size, for each CF and for dense (the buckets DDP has handed over so far)."""
        if self.encoder is None:
            self._connect()
        return self.encoder.comm_model(self.reference, self._buckets(), self._waits)

    @property
    def world_size(self) -> int:
        """The group's size (resolving the group if the hook has not run yet)."""
        self._connect()
        return self.link.world


#: ``AllRanks.state_dict()``'s ``format``.
ALL_RANKS_FORMAT = "horovod_gravac.ddp.all_ranks/1"


def _on_host(obj):
    """``obj`` with every tensor copied to the host (what is gathered and saved must not
    follow the live buffers, nor name a device another process lacks)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _on_host(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_on_host(v) for v in obj)
    return obj


class AllRanks:
    """Every rank's :meth:`GravacState.state_dict` in the one checkpoint that rank 0 writes.

    ``GravacState.state_dict()`` holds this rank's residuals only, and frameworks that
    write one checkpoint file from the main process lose the others' (Lightning's
    checkpoints, Accelerate's ``save_state``).  Register this wrapper with them instead::

        accelerator.register_for_checkpointing(hg.ddp.AllRanks(state))

    (``horovod_gravac.lightning.GravacCallback`` does the same for Lightning.)

    ``state_dict()`` is a collective, which every rank of the state's group calls (as
    both frameworks do when they save; called on one rank alone, it raises
    ``CollectiveTimeoutError`` after the state's ``timeout_s``): rank 0 of the group
    gathers every rank's state, moved to the host, and returns ``{"format", "world_size",
    "ranks": {rank: state}}``; the other ranks return the same with their own entry only.
    Rank 0 holds every rank's residuals while it saves: the world size times the model's
    gradient.
    ``load_state_dict()`` gives each rank its own entry (``GravacState.load_state_dict``,
    with its checks); a checkpoint without this rank's entry raises ``ValueError``.
    """

    def __init__(self, state: GravacState):
        if not isinstance(state, GravacState):
            raise TypeError(f"AllRanks wraps a horovod_gravac.ddp.GravacState, got {state!r}")
        self.state = state

    def state_dict(self) -> dict:
        st = self.state
        mine = _on_host(st.state_dict())   # (resolves the group if the hook has not run yet)
        rank, size = st.backend.rank(), st.backend.size()
        if size == 1:
            ranks = {0: mine}
        else:
            # Every rank of the group must call this (Lightning's and Accelerate's saves do;
            # Lightning asks for trainer.save_checkpoint on every rank).  A small bounded
            # allgather first, so that a save made on rank 0 alone fails after the state's
            # timeout, naming the collective, instead of waiting in the gather for ever.
            st.backend.allgather_object(rank, f"{st.prefix}.all_ranks", st.timeout)
            group = st.process_group
            root = 0 if group is None else dist.get_global_rank(group, 0)
            everyone = [None] * size if rank == 0 else None
            dist.gather_object(mine, everyone, dst=root, group=group)
            ranks = dict(enumerate(everyone)) if rank == 0 else {rank: mine}
        return {"format": ALL_RANKS_FORMAT, "world_size": size, "ranks": ranks}

    def load_state_dict(self, state_dict: dict) -> None:
        if not isinstance(state_dict, dict) or state_dict.get("format") != ALL_RANKS_FORMAT:
            found = state_dict.get("format") if isinstance(state_dict, dict) else type(state_dict).__name__
            raise checkpoint.CheckpointError(
                f"horovod_gravac.ddp.AllRanks: not an AllRanks state dict (format {found!r}); a "
                f"GravacState.state_dict() loads with GravacState.load_state_dict()")
        st = self.state
        st._connect()
        rank = st.backend.rank()
        ranks = state_dict.get("ranks") or {}
        if rank not in ranks:
            raise checkpoint.CheckpointError(
                f"horovod_gravac.ddp.AllRanks: the checkpoint holds the hook state of rank(s) "
                f"{sorted(ranks)} of {state_dict.get('world_size')}, not of this rank {rank} (of "
                f"{st.backend.size()}); only rank 0's own checkpoint holds every rank's")
        st.load_state_dict(ranks[rank])


def gravac_hook(state: GravacState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: ``ddp_model.register_comm_hook(state, gravac_hook)``.
    Returns the future of the bucket's averaged flat gradient (``bucket.buffer()``)."""
    return state._hook(bucket)
