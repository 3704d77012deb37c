"""``BucketEncoder``: one bucket's gradient in, one transfer (not yet started) out.

Per bucket and step (the numbered steps of ``optimizer.py``'s docstring): local
clipping, error feedback, the NaN/Inf policy, multi-level compression
(g_min = C(g_ef, theta_min), g_c = C(g_min, theta_s)) and this rank's squared norms
for the controller; once the step's collectives are done, residual = g_ef - sent.
Its caller (``pipeline.BucketPipeline``) decides when a bucket launches and starts the
transfer; the encoder never submits a collective itself.  What the encoder measured and sent comes back with
the transfer (:class:`Encoded`), for the objects that keep sums of it (``IntervalSum``).

A bucket's g_ef, residual and sent values are in its ``value_dtype``: float64 for
float64 parameters (a float64 gradient is neither rounded to float32 nor, when it is
finite beyond float32's range, turned into inf), float32 for every other dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Union

import torch

from .accounting import StepRecord
from .cf import kept_count
from .coherence import CoherenceSampler
from .compressors.base import GradientCompressor
from .controllers import DENSE, Controller, Decision
from .error_feedback import ErrorFeedback, finite_tensor
from .exchange import BucketShape, CommModel, Cost, LinkModel, choose, exchange_cost
from .lowrank import LowRankTransfer, PowerSGDState
from .regions import RegionPartition
from .selection.payload import SparsePayload
from .transfers import (DenseAllreduce, Link, PairExchange, SharedIndexAllreduce, SlottedSparse,
                        SparseAllgather, SparseAllreduce, Transfer)

_FP32_MAX = torch.finfo(torch.float32).max


@dataclass(frozen=True)
class EncoderSettings:
    """How every bucket of an optimizer is encoded and sent.

    ``nonfinite``: ``"propagate"`` or ``"zero"`` (see ``optimizer.py``); ``local_clip_norm``:
    DGC's local clipping; ``join_safe``: every collective an allreduce; ``pair_exchange``: the
    ranks are known to compress alike (the start-up check compared their compressors), so two
    ranks may swap fixed-size payloads with ``PairExchange``; ``wire``: the user's wire
    compression of dense sends (``compress``/``decompress``, Horovod's ``compression``);
    ``fp16_wire``: the one for dense sends of buckets of fp16 parameters (None: as ``wire``);
    ``exchange``: how sparse payloads cross the ranks (``exchange.MODES``: ``"auto"``, the
    cheapest by ``link``'s model, dense included; ``"allgather"``, the paper's path;
    ``"sparse_allreduce"``); ``link``: the :class:`exchange.LinkModel` (None:
    ``$HOROVOD_GRAVAC_LINK`` or its defaults)."""

    wire: object
    nonfinite: str = "propagate"
    local_clip_norm: Optional[float] = None
    join_safe: bool = False
    pair_exchange: bool = False
    fp16_wire: object = None
    exchange: str = "auto"
    link: Optional[LinkModel] = None


@dataclass
class Encoded:
    """One bucket's step, encoded: the transfer that will send it and what it measured.
    ``grads``: the gradients error feedback took in (None: the bucket was non-finite here
    and nothing was measured); ``sent``: what this rank sends of the error-fed gradient, a
    dense vector or a sparse payload, before any poisoning or wire compression (None for
    a low-rank send or an unmeasured one)."""

    transfer: Transfer
    grads: Optional[List[Optional[torch.Tensor]]] = None
    sent: Union[torch.Tensor, SparsePayload, None] = None


class BucketEncoder:
    def __init__(self, link: Link, settings: EncoderSettings, *, controller: Controller, memory: ErrorFeedback,
                 powersgd: PowerSGDState, compressor_factory: Callable[[float], GradientCompressor], prefix: str):
        """``memory``: the residuals (it forms g_ef); ``powersgd``: PowerSGD's state, for a
        low-rank compressor; ``prefix``: of the collectives' names."""
        self.link, self.settings, self.prefix = link, settings, prefix
        self.controller, self.memory, self.powersgd = controller, memory, powersgd
        self.compressor_factory = compressor_factory
        self._compressors: Dict[float, GradientCompressor] = {}   # one per CF, kept (their state)
        self.coherence = CoherenceSampler()   # sampled when the controller reads the coherence
        self.link_model = settings.link if settings.link is not None else LinkModel.from_env()
        self.partition = RegionPartition()    # the sparse allreduce's regions, per bucket
        self._generators: Dict[object, torch.Generator] = {}   # the owners' top-k samples, per device
        self._choices: Dict[tuple, Cost] = {}

    def compressor(self, cf: float) -> GradientCompressor:
        comp = self._compressors.get(cf)
        if comp is None:
            comp = self._compressors[cf] = self.compressor_factory(cf)
        return comp

    def bucket_name(self, bucket) -> str:
        return f"{self.prefix}.bucket.{bucket.index}"

    # -- which exchange (exchange.py) ------------------------------------------------------
    def _bytes(self, bucket) -> tuple:
        """(bytes of a sparse value, bytes of a dense entry on the wire) of ``bucket``."""
        value = 8 if getattr(bucket, "value_dtype", None) == torch.float64 else 4
        fp16 = getattr(bucket, "dtype", None) == torch.float16
        wire = self.settings.fp16_wire if fp16 and self.settings.fp16_wire is not None else self.settings.wire
        half = getattr(wire, "dtype", None) in (torch.float16, torch.bfloat16) or \
            getattr(wire, "__name__", "") in ("FP16Compressor", "BF16Compressor")
        return value, 2 if half else value

    def exchange_for(self, comp: GradientCompressor, bucket, cf: float) -> Cost:
        """The exchange that sends ``bucket`` compressed at ``cf`` (the same on every rank: a
        function of what every rank knows alike, see ``exchange.py``)."""
        world = self.link.world
        value, dense = self._bytes(bucket)
        key = (bucket.numel, value, dense, cf, world, comp.fixed_count, comp.shared_indices)
        cost = self._choices.get(key)
        if cost is None:
            cost = self._choices[key] = choose(
                self.settings.exchange, bucket.numel, kept_count(bucket.numel, cf), world, self.link_model,
                fixed_count=comp.fixed_count, pair_allowed=self.settings.pair_exchange,
                join_safe=self.settings.join_safe, shared_indices=comp.shared_indices,
                value_bytes=value, dense_bytes=dense)
        return cost

    def bucket_shapes(self, buckets) -> List[BucketShape]:
        return [BucketShape(b.numel, *self._bytes(b)) for b in buckets]

    def comm_model(self, reference: GradientCompressor, buckets, waits=None) -> CommModel:
        """The :class:`exchange.CommModel` of these buckets at this world size (``waits``: the
        rank's measured waits to show beside it)."""
        return CommModel(self.settings.exchange, self.link_model, self.link.world, self.bucket_shapes(buckets),
                         fixed_count=reference.fixed_count, pair_allowed=self.settings.pair_exchange,
                         join_safe=self.settings.join_safe, shared_indices=reference.shared_indices,
                         low_rank=reference.low_rank, waits=waits)

    def dense_cost(self, bucket) -> Cost:
        """The modelled dense allreduce of ``bucket`` (asked every step: kept, as ``exchange_for``'s
        choices are, per size, dtypes and world size)."""
        value, dense = self._bytes(bucket)
        key = ("dense", bucket.numel, value, dense, self.link.world)
        cost = self._choices.get(key)
        if cost is None:
            cost = self._choices[key] = exchange_cost("dense", bucket.numel, bucket.numel, self.link.world,
                                                      self.link_model, value, dense)
        return cost

    def _generator(self, device) -> torch.Generator:
        gen = self._generators.get(device)
        if gen is None:
            gen = self._generators[device] = torch.Generator(device=device)
            gen.manual_seed(0x5A11)
        return gen

    def encode(self, bucket, decision: Decision, record: StepRecord, *, scale: float, step_index: int,
               with_stats: bool) -> Encoded:
        """Error feedback and compression of ``bucket``'s gradient; the transfer that
        sends it (``with_stats``: it also carries the step's statistics)."""
        grads = bucket.gradients()
        grad_sq = _squared_norm([g for g in grads if g is not None], bucket.value_dtype)   # NaN/Inf if not sendable
        finite = math.isfinite(grad_sq)
        clip = self.settings.local_clip_norm
        if finite and clip is not None:
            # DGC's local clipping: each rank clips to clip_norm / sqrt(N), per bucket
            # (the whole-model norm is not known while buckets are still arriving).
            limit = clip / self.link.world ** 0.5 * scale
            if grad_sq > limit * limit:
                factor = limit / grad_sq ** 0.5
                for g in grads:
                    if g is not None:
                        g.mul_(factor)
                grad_sq = limit * limit
        g_ef = None
        # The coherence reads the raw gradient as g_ef less the residual before it (momentum
        # correction adds a velocity instead, whose steps are not independent: not measured).
        lag = finite and self.controller.needs_coherence and self.memory.momentum is None
        if lag:
            residual_before = self.coherence.before(self.memory.residuals.get(bucket.index), bucket.numel)
        if finite:   # (None: residual * scale + g overflowed, and the memory undid it)
            g_ef = self.memory.add(bucket.index, grads, bucket.offsets, bucket.numel, bucket.device, scale,
                                   dtype=bucket.value_dtype)
            finite = g_ef is not None
        if finite:
            if lag:
                record.add_lag(self.coherence.measure(self.coherence.key(bucket.names), g_ef, residual_before, scale))
            record.grad_sq += grad_sq
            _park_frozen(bucket, g_ef)
            bucket.update_residual = True
            transfer, sent = self._compress(bucket, g_ef, decision, record, step_index, with_stats, measure=True)
            return Encoded(transfer, grads, sent)
        record.nonfinite += 1
        return Encoded(self._nonfinite(bucket, grads, decision, record, step_index, with_stats))

    def _nonfinite(self, bucket, grads, decision, record, step_index, with_stats) -> Transfer:
        """This rank's bucket holds NaN/Inf (or a value its float32 wire cannot hold).  ``propagate``:
        send it so every rank receives a non-finite bucket (as plain Horovod does);
        ``zero``: contribute zeros through the very same collective (in the bucket's
        ``value_dtype``, as every rank's)."""
        zeros = torch.zeros(bucket.numel, dtype=bucket.value_dtype, device=bucket.device)
        if self.settings.nonfinite == "zero":
            return self._compress(bucket, zeros, decision, record, step_index, with_stats, measure=False)[0]
        if decision.candidate_cf == DENSE or decision.send_cf == DENSE:
            flat = zeros
            for g, (s, e) in zip(grads, bucket.offsets):
                if g is not None:
                    flat[s:e].copy_(g.reshape(-1))
            if finite_tensor(flat):   # the overflow was in residual * scale + g: signal it
                flat[0] = float("nan")
            return self._dense(bucket, flat, with_stats)
        return self._compress(bucket, zeros, decision, record, step_index, with_stats, measure=False,
                              poison=True)[0]

    def _dense(self, bucket, flat, with_stats: bool) -> Transfer:
        """A dense allreduce of ``flat`` (in the bucket's ``value_dtype``: float64 buckets travel
        in float64, as Horovod's).  A bucket of fp16 parameters travels in fp16 (``fp16_wire``)."""
        # fp16 parameters travel in fp16, as with Horovod's own optimizer (the carrier bucket,
        # with_stats, stays float32 on every rank alike)
        settings = self.settings
        fp16 = bucket.dtype == torch.float16 and settings.fp16_wire is not None
        wire = settings.fp16_wire if fp16 else settings.wire
        return DenseAllreduce(self.link, self.bucket_name(bucket), flat, with_stats, wire)

    def _compress(self, bucket, g_ef, decision: Decision, record: StepRecord, step_index: int,
                  with_stats: bool, measure: bool, poison: bool = False):
        """The transfer, and what this rank sends (None unless ``measure``)."""
        name = self.bucket_name(bucket)
        record.exchange = self.settings.exchange
        dense_cost = self.dense_cost(bucket)
        record.dense_model_s += dense_cost.seconds
        if decision.candidate_cf == DENSE:   # nothing to compress or measure: plain allreduce
            record.model_s += dense_cost.seconds
            return self._dense(bucket, g_ef, with_stats), g_ef if measure else None
        # theta_min == 1 keeps everything: the candidate then comes from g_ef directly.
        comp_min = self.compressor(decision.theta_min if decision.theta_min > DENSE else decision.candidate_cf)
        if comp_min.low_rank:
            record.model_s = float("nan")
            if poison:
                g_ef = torch.full_like(g_ef, float("nan"))
            return LowRankTransfer(self.link, name, bucket, g_ef, comp_min, self.powersgd,
                                   bucket.update_residual, with_stats), None
        # The exchange of the CF sent; dense when the model says a dense allreduce costs less
        # than any sparse send at this world size (exchange.py).
        choice = dense_cost if decision.send_cf == DENSE else self.exchange_for(comp_min, bucket, decision.send_cf)
        record.model_s += choice.seconds
        send_dense = choice.kind == "dense"
        if send_dense and not (self.controller.needs_consensus and measure):   # nothing to measure
            if poison:
                g_ef[0] = float("nan")
            return self._dense(bucket, g_ef, with_stats), g_ef if measure else None
        comp_min.set_step(step_index, bucket.index)   # shared-seed draws: per (step, bucket)
        fallbacks = getattr(comp_min, "fallbacks", 0)
        payload_min, ctx = comp_min.compress(g_ef)
        quality = comp_min.last_quality   # of this compress (compress_further sets its own)
        payload_c = payload_min
        if decision.theta_min == DENSE:
            payload_min = None
        elif decision.candidate_cf > decision.theta_min:   # multi-level: from g_min, not g_ef
            payload_c = comp_min.compress_further(payload_min, ctx, decision.candidate_cf / decision.theta_min)
        if measure:   # ties the threshold could not split: the exact k largest were sent
            record.exact_fallbacks += getattr(comp_min, "fallbacks", 0) - fallbacks
        if self.controller.needs_consensus and measure:
            ef_sq = _sq(g_ef)
            min_sq = ef_sq if payload_min is None else _sq(payload_min.values)
            c_sq = min_sq if payload_c is payload_min else _sq(payload_c.values)
            record.add_norms(torch.stack([ef_sq, min_sq, c_sq]))   # read once, by the carrier
        if quality is not None and measure:
            record.quality.append(float(quality))
        if send_dense:
            if poison:   # (never measured)
                g_ef[0] = float("nan")
            return self._dense(bucket, g_ef, with_stats), g_ef if measure else None
        payload = payload_c if decision.send_cf == decision.candidate_cf else payload_min
        sent = payload if measure else None
        if poison:   # every rank's sum must come out non-finite
            payload = _poisoned(payload, comp_min.shared_indices, bucket.device, bucket.value_dtype)
        return self._sparse(choice.kind, name, bucket, payload, decision, step_index, with_stats), sent

    def _sparse(self, kind: str, name, bucket, payload, decision: Decision, step_index: int, with_stats: bool):
        """The sparse transfer of ``kind`` (``exchange_for``'s choice)."""
        args = (self.link, name, payload, bucket.numel, bucket.device, with_stats)
        if kind == "shared":
            # The step index rides along (checked on arrival) unless join_safe's exchange aligns it.
            return SharedIndexAllreduce(*args, None if self.settings.join_safe else step_index)
        if kind == "slotted":
            return SlottedSparse(*args, decision.send_cf)
        if kind == "pair":
            return PairExchange(*args)
        if kind == "sparse_allreduce":
            return SparseAllreduce(*args, decision.send_cf, self.partition, self._generator(bucket.device))
        return SparseAllgather(*args)

    def commit_residual(self, bucket, scale: float) -> None:
        """residual = g_ef - sent, once the step's collectives are done (a bucket whose
        residual was formed this step)."""
        key = bucket.index
        if not bucket.update_residual or key not in self.memory.residuals:
            return
        bucket.transfer.commit(self.memory, key)
        self.memory.unscale(key, scale)
        buf = self.memory.residuals[key]
        for s, e, saved in bucket.parked:
            buf[s:e].copy_(saved)


def _park_frozen(bucket, g_ef) -> None:
    """A frozen parameter's residual is neither sent nor lost: set aside for the step."""
    for p, (s, e) in zip(bucket.params, bucket.offsets):
        if not p.requires_grad:
            bucket.parked.append((s, e, g_ef[s:e].clone()))
            g_ef[s:e].zero_()


def _squared_norm(grads, value_dtype: torch.dtype = torch.float32) -> float:
    """Sum of squared L2 norms, as a float64 number; NaN/Inf if any entry is NaN/Inf or does
    not fit ``value_dtype`` (the bucket's wire and residual: a float64 entry beyond float32's
    range fits a float64 bucket only).  The fast float32 norms (accumulated in double on the
    CPU) are recomputed in float64 only when they overflow: a float32 sum of squares past
    3.4e38 (CUDA) must not pass for a NaN/Inf gradient."""
    if not grads:
        return 0.0
    # One stack, then one conversion: a .double() per parameter is a kernel launch each.
    total = float(torch.stack(torch._foreach_norm(grads)).double().pow(2).sum())
    if not math.isfinite(total):
        if not all(finite_tensor(g) for g in grads):
            return math.inf
        total = float(sum(torch.linalg.vector_norm(g, dtype=torch.float64) ** 2 for g in grads))
    if value_dtype == torch.float64:
        return total
    for g in grads:   # float64 gradients may hold finite values float32 cannot
        if g.dtype == torch.float64 and g.numel() and float(g.abs().max()) > _FP32_MAX:
            return math.inf
    return total


def _sq(t: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm as a float64 tensor on ``t``'s device.  On the CPU: the fast float32
    norm, recomputed in float64 only if it overflowed (a finite 1e20 entry squares past
    float32's range).  On accelerators: in float64 at once, since checking for the overflow
    reads the norm back, a host sync per bucket that holds back the backward's launches
    (three norms a bucket for an adaptive controller; one float64 pass costs the GPU less)."""
    if _reads_back_freely(t):
        n = torch.linalg.vector_norm(t)
        if not math.isfinite(float(n)):
            n = torch.linalg.vector_norm(t, dtype=torch.float64)
        return n.double() ** 2
    return torch.linalg.vector_norm(t, dtype=torch.float64) ** 2


def _reads_back_freely(t: torch.Tensor) -> bool:
    """Whether reading a value of ``t`` into Python costs no synchronisation: the CPU.
    (Tests patch it to run the accelerators' path on CPU tensors.)"""
    return t.device.type == "cpu"


def _poisoned(payload: SparsePayload, shared_indices: bool, device,
              dtype: torch.dtype = torch.float32) -> SparsePayload:
    """A payload that makes every rank's aggregate non-finite (same size on shared-index
    paths, where every rank's k must match; at least one entry otherwise), its values in
    ``dtype`` (the bucket's, as every rank's)."""
    if payload.values.numel():
        return SparsePayload(torch.full_like(payload.values, float("nan")), payload.indices)
    if shared_indices:
        return payload
    return SparsePayload(torch.full((1,), float("nan"), dtype=dtype, device=device),
                         torch.zeros(1, dtype=torch.int32, device=device))
