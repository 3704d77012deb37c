"""``horovod_gravac.DistributedOptimizer``: a drop-in for ``hvd.DistributedOptimizer``.

What it keeps from Horovod's optimizer: communication starts from backward hooks
(per bucket, as soon as every gradient of the bucket is accumulated),
``synchronize()`` / ``skip_synchronize()``, ``backward_passes_per_step``, the
``zero_grad`` race check, and the class of the wrapped optimizer
(``isinstance(opt, torch.optim.SGD)`` still holds).

What it adds, per bucket and step (see ``controllers.py`` for who decides):

1. g_ef = g + residual                        (error feedback, ``error_feedback.py``)
2. g_min = C(g_ef, theta_min)                 (first level)
3. g_c   = C(g_min, theta_s)                  (multi-level: the candidate from g_min)
4. send dense g_ef, g_min or g_c as decided   (``comm.py``: allreduce or one allgather)
5. residual = g_ef - sent

Adaptive controllers (GraVAC, Accordion) also need the step's squared norms
averaged over ranks.  They ride inside the last bucket's collective (``comm.py``
describes how; no collective of their own); that bucket holds its collective back until
every other bucket is compressed, which is when the norms are complete (it holds the
model's first layers, so backward normally reaches it last anyway).  After the step,
rank 0 turns the averaged norms and its step time into the next decision and
broadcasts both (``hvd.broadcast_object``); every other rank feeds its controller
the same observation and adopts rank 0's decision, so every rank calls the same
collectives in the next step.  Static controllers skip all of this.  The broadcast
runs on a helper thread while the next step's forward and backward passes run; the
first bucket of the next step waits for it, so the decision sequence is exactly what
a synchronous exchange gives (``overlap_consensus=False`` does it synchronously).

Collective names start with ``gravac.`` for the first optimizer a process builds and
``gravac<n>.`` for the n-th after it, so several optimizers (a GAN's two, say) can
have collectives in flight at once.  Every rank must build its optimizers in the
same order, as with any Horovod collective; the start-up check says so if not.

Non-finite gradients: a rank whose bucket holds a NaN/Inf contributes zeros for
that bucket in that step and leaves its residual untouched; every rank receives
the same aggregate, so parameters stay identical.  The event is counted in
``stats["nonfinite_buckets"]`` and the step's gains are not fed to the controller.
"""
from __future__ import annotations

import concurrent.futures
import copy
import itertools
import math
import time
import zlib
import warnings
from contextlib import contextmanager
from typing import Callable, Dict, List, Optional, Tuple

import torch

from . import comm
from .compressors.base import FLOAT_DTYPES, SparseCompressor, check_cf
from .compressors.powersgd import orthonormalize
from .compressors.topk import TopKCompressor
from .controllers import DENSE, Controller, Decision, Dense, StepObservation
from .error_feedback import ErrorFeedback


class _Bucket:
    """Parameters whose gradients are flattened, compressed and sent together."""

    def __init__(self, index: int, named: List[Tuple[str, torch.nn.Parameter]]):
        self.index = index
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.offsets, start = [], 0
        for p in self.params:
            self.offsets.append((start, start + p.numel()))
            start += p.numel()
        self.numel = start
        self.device = self.params[0].device
        self.accumulated: Optional[torch.Tensor] = None   # Accordion's gradient sum
        self.reset()

    def reset(self):
        self.ready = 0
        self.handle = None
        self.kind = None        # "dense" | "sparse" | "shared" | "lowrank"; None: not launched
        self.start = None       # the held-back collective of the stats-carrying bucket
        self.payload = None     # the SparsePayload sent (shared-index path)
        self.launched_finite = True   # False: this rank sent zeros (NaN/Inf gradient)
        self.lowrank = None     # PowerSGD state between its two collectives


def _make_buckets(named: List[Tuple[str, torch.nn.Parameter]], cap_bytes: int) -> List[_Bucket]:
    # Reverse registration order approximates the order gradients become ready.
    buckets, current, size = [], [], 0
    for name, p in reversed(named):
        if current and (size + p.numel() * 4 > cap_bytes or p.device != current[0][1].device):
            buckets.append(_Bucket(len(buckets), current))
            current, size = [], 0
        current.append((name, p))
        size += p.numel() * 4
    if current:
        buckets.append(_Bucket(len(buckets), current))
    return buckets


class _GravacDistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compressor, controller: Controller,
                 backward_passes_per_step: int = 1, bucket_cap_mb: float = 25.0,
                 check_consistency: bool = True, momentum_correction: Optional[float] = None,
                 local_clip_norm: Optional[float] = None, timeout_s: Optional[float] = None,
                 overlap_consensus: bool = True):
        super(self.__class__, self).__init__(params)
        if not isinstance(controller, Controller):
            raise ValueError(f"controller must be a horovod_gravac controller "
                             f"(Dense, StaticCF, GraVAC, Accordion), got {controller!r}")
        if isinstance(backward_passes_per_step, bool) or not isinstance(backward_passes_per_step, int) \
                or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {backward_passes_per_step!r}")
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) \
                or not 0 < bucket_cap_mb < float("inf"):
            raise ValueError(f"bucket_cap_mb must be a finite number > 0, got {bucket_cap_mb!r}")
        self._timeout = comm.resolve_timeout(timeout_s)   # seconds per collective (inf: none)
        if not isinstance(overlap_consensus, bool):
            raise ValueError(f"overlap_consensus must be True or False, got {overlap_consensus!r}")
        self.overlap_consensus = overlap_consensus
        self._consensus_thread: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._pending = None   # (future, stats dict) of a consensus exchange still running
        self._controller = controller
        self.backward_passes_per_step = backward_passes_per_step
        self._compressor_factory = _compressor_factory(compressor)
        self._compressors: Dict[float, SparseCompressor] = {}

        named = _named_parameters(self.param_groups, named_parameters)
        for name, p in named:
            if p.requires_grad and p.dtype not in FLOAT_DTYPES:
                raise ValueError(f"parameter {name!r} has dtype {p.dtype}; only floating-point "
                                 f"parameters can be trained with gradient compression")
        trainable = [(n, p) for n, p in named if p.requires_grad]
        self._buckets = _make_buckets(trainable, int(bucket_cap_mb * 2 ** 20))
        # The bucket whose collective also carries the step's statistics (adaptive controllers).
        self._carrier = self._buckets[-1] if self._buckets else None
        self._prefix = _collective_prefix()
        self._bucket_of = {p: b for b in self._buckets for p in b.params}
        self._delay = {p: backward_passes_per_step for _, p in trainable}
        self._memory = ErrorFeedback(momentum_correction)
        if local_clip_norm is not None and not (isinstance(local_clip_norm, (int, float))
                                                and local_clip_norm > 0):
            raise ValueError(f"local_clip_norm must be > 0 or None, got {local_clip_norm!r}")
        self.local_clip_norm = local_clip_norm
        self._lowrank_q: Dict[tuple, torch.Tensor] = {}   # PowerSGD warm start per (param, rank)
        sample_compressor = self._compressor_factory(10.0)   # for type checks and the start-up check
        if getattr(sample_compressor, "low_rank", False) and controller.needs_consensus \
                and not controller.needs_accumulation:
            raise ValueError("controller GraVAC needs a sparsifying compressor (multi-level "
                             "compression); use PowerSGD with Dense, StaticCF or Accordion")
        self._world = comm.size()
        if hasattr(controller, "set_world_size"):
            controller.set_world_size(self._world)
        if check_consistency and self._world > 1:
            self._check_consistency(trainable, sample_compressor)

        self._synchronized = False
        self._should_synchronize = True
        self._step_index = 0
        self._step_start: Optional[float] = None
        self._reset_step_counters()
        self._stats: Dict[str, float] = {}
        self._hooks = [p.register_post_accumulate_grad_hook(self._make_hook(p)) for _, p in trainable]

    # -- start-up ----------------------------------------------------------------------
    def _check_consistency(self, trainable, sample_compressor):
        """Fail on every rank, with the difference named, if ranks disagree on set-up."""
        mine = {"collective_prefix": self._prefix, "controller": self.controller.config(),
                "momentum_correction": self._memory.momentum, "local_clip_norm": self.local_clip_norm,
                "compressor": repr(sample_compressor),
                "backward_passes_per_step": self.backward_passes_per_step,
                "parameters": [(n, tuple(p.shape), str(p.dtype)) for n, p in trainable],
                # The bucket layout (from bucket_cap_mb): every rank must cut the same buckets,
                # or the collectives of a bucket index carry different tensors.
                "bucket_cap_mb": {"bucket_sizes": [b.numel for b in self._buckets],
                                  "bucket_params": [b.names for b in self._buckets]}}
        everyone = comm.allgather_object(mine, name="gravac.consistency", timeout=self._timeout)
        for r, theirs in enumerate(everyone):
            for key in mine:
                if theirs[key] != everyone[0][key]:
                    hint = {"collective_prefix": " Every rank must build its DistributedOptimizers "
                                                     "in the same order.",
                            "bucket_cap_mb": " The bucket layout differs: every rank must pass the "
                                             "same bucket_cap_mb."}.get(key, "")
                    raise ValueError(
                        f"horovod_gravac: rank {r} differs from rank 0 in '{key}': "
                        f"{_short(theirs[key])} vs {_short(everyone[0][key])}. All ranks must "
                        f"use the same model, compressor and controller settings.{hint}")

    # -- compressors ---------------------------------------------------------------------
    def _compressor(self, cf: float) -> SparseCompressor:
        comp = self._compressors.get(cf)
        if comp is None:
            comp = self._compressors[cf] = self._compressor_factory(cf)
        return comp

    # -- hooks ---------------------------------------------------------------------------
    def _make_hook(self, p):
        def hook(param):
            if self._delay[p] <= 0:
                raise AssertionError(
                    "Gradients were computed more than backward_passes_per_step times before "
                    "call to step(). Increase backward_passes_per_step to accumulate gradients locally.")
            if self._step_start is None:
                self._step_start = time.perf_counter()
            self._delay[p] -= 1
            if self._delay[p] == 0:
                bucket = self._bucket_of[p]
                bucket.ready += 1
                if bucket.ready == len(bucket.params):
                    self._launch(bucket)
        return hook

    def _reset_step_counters(self):
        self._norms = torch.zeros(3, dtype=torch.float64)   # ||g_ef||^2, ||g_min||^2, ||g_c||^2
        self._grad_sq = 0.0
        self._compress_time = 0.0
        self._bytes_sent = 0
        self._floats_sent = 0
        self._nonfinite = 0
        self._quality: List[float] = []
        self._launched = 0                 # buckets launched this step
        self._control_bytes = 0            # statistics carried for the controller
        self._step_stats: Optional[List[float]] = None   # rank-averaged, from the carrier bucket
        self._at_boundary = False          # Accordion: this step ends an interval

    def _launch(self, bucket: _Bucket) -> None:
        """Error feedback, compression and the start of this bucket's collective."""
        t0 = time.perf_counter()
        self._await_consensus()   # the previous step's exchange decides this step
        decision = self.controller.decision
        for p in bucket.params:
            if p.grad is None:   # unused this step here, maybe used on another rank
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in bucket.params]
        grad_sq = _squared_norm(grads)   # one host sync per bucket; doubles as the NaN/Inf check
        finite = grad_sq == grad_sq and grad_sq != float("inf")
        if finite and self.local_clip_norm is not None:
            # DGC's local clipping: each rank clips to clip_norm / sqrt(N), per bucket
            # (the whole-model norm is not known while buckets are still arriving).
            limit = self.local_clip_norm / self._world ** 0.5
            if grad_sq > limit * limit:
                scale = limit / grad_sq ** 0.5
                for g in grads:
                    g.mul_(scale)
                grad_sq = limit * limit
        if finite:
            self._grad_sq += grad_sq
            if self.controller.needs_accumulation:
                if bucket.accumulated is None:
                    bucket.accumulated = torch.zeros(bucket.numel, dtype=torch.float32, device=bucket.device)
                for g, (s, e) in zip(grads, bucket.offsets):
                    bucket.accumulated[s:e].add_(g.reshape(-1))
            g_ef = self._memory.add(bucket.index, grads, bucket.offsets, bucket.numel, bucket.device)
        else:
            # Contribute zeros through the very same collective; leave the residual alone.
            self._nonfinite += 1
            bucket.launched_finite = False
            g_ef = torch.zeros(bucket.numel, dtype=torch.float32, device=bucket.device)
        self._compress_and_start(bucket, g_ef, decision, update_residual=finite)
        self._launched += 1
        carrier = self._carrier
        if self._launched == len(self._buckets) and carrier.start is not None:
            carrier.handle, carrier.start = carrier.start(self._local_stats()), None
        self._compress_time += time.perf_counter() - t0

    def _hold_or_start(self, bucket, start: Callable) -> None:
        """Start the bucket's collective: ``start(stats)`` returns its handle (``stats``:
        None, or the float64 statistics to carry).  With an adaptive controller the
        carrier bucket's collective also carries the step's statistics, complete only
        once every bucket is compressed, so it waits for that."""
        if self._carries_stats(bucket):
            bucket.start = start
        else:
            bucket.handle = start(None)

    def _carries_stats(self, bucket) -> bool:
        return bucket is self._carrier and self._controller.needs_consensus

    def _local_stats(self) -> torch.Tensor:
        """This rank's statistics of the step, sent with the carrier bucket: squared norms
        of g_ef, g_min and g_c, of the raw gradient, Accordion's interval sum (at an
        interval's end, else 0) and whether any bucket was NaN/Inf."""
        ctrl = self._controller
        interval = getattr(ctrl, "interval", None)
        self._at_boundary = interval is not None and (ctrl.step + 1) % interval == 0
        acc_sq = 0.0
        if self._at_boundary:   # Accordion: the interval's gradient sum, then start a new sum
            acc_sq = sum(float(b.accumulated.double().pow(2).sum()) for b in self._buckets
                         if b.accumulated is not None)
            for b in self._buckets:
                if b.accumulated is not None:
                    b.accumulated.zero_()
        n = self._norms
        return torch.tensor([float(n[0]), float(n[1]), float(n[2]), self._grad_sq, acc_sq,
                             float(self._nonfinite > 0)], dtype=torch.float64)

    def _allreduce_start(self, tensor, name):
        """``start`` of an in-place average, or of a copy with the statistics appended."""
        def start(stats):
            if stats is None:
                return comm.allreduce_mean_async(tensor, name)
            self._control_bytes += 4 * _N_STATS
            return comm.allreduce_mean_async(comm.with_stats(tensor, stats), name)
        return start

    def _compress_and_start(self, bucket, g_ef, decision: Decision, update_residual: bool) -> None:
        name = self._bucket_name(bucket)
        if decision.candidate_cf == DENSE:   # nothing to compress or measure: plain allreduce
            self._start_dense(bucket, g_ef, name)
            return
        # theta_min == 1 keeps everything: the candidate then comes from g_ef directly.
        comp_min = self._compressor(decision.theta_min if decision.theta_min > DENSE else decision.candidate_cf)
        if getattr(comp_min, "low_rank", False):
            self._start_lowrank(bucket, g_ef, comp_min, name, update_residual)
            return
        self._set_step(comp_min, bucket)
        payload_min, ctx = comp_min.compress(g_ef)
        payload_c = payload_min
        if decision.theta_min == DENSE:
            payload_min = None
        elif decision.candidate_cf > decision.theta_min:   # multi-level: from g_min, not g_ef
            payload_c = comp_min.compress_further(payload_min, ctx, decision.candidate_cf / decision.theta_min)
        if self.controller.needs_consensus and update_residual:
            ef_sq = g_ef.dot(g_ef)
            min_sq = ef_sq if payload_min is None else payload_min.values.dot(payload_min.values)
            c_sq = min_sq if payload_c is payload_min else payload_c.values.dot(payload_c.values)
            self._norms += torch.stack([ef_sq, min_sq, c_sq]).double().cpu()
        quality = getattr(comp_min, "last_quality", None)
        if quality is not None:
            self._quality.append(float(quality))
        if decision.send_cf == DENSE:
            self._start_dense(bucket, g_ef, name)
            return
        payload = payload_c if decision.send_cf == decision.candidate_cf else payload_min
        if update_residual:
            self._memory.sent_sparse(bucket.index, payload.indices)
        self._start_sparse(bucket, payload, comp_min.shared_indices, name)

    def _bucket_name(self, bucket) -> str:
        return f"{self._prefix}.bucket.{bucket.index}"

    def _set_step(self, comp, bucket):
        if hasattr(comp, "set_step"):   # shared-seed compressors draw per (step, bucket)
            comp.set_step(self._step_index, bucket.index)

    def _start_dense(self, bucket, flat, name):
        bucket.kind = "dense"
        self._hold_or_start(bucket, self._allreduce_start(flat, name))
        self._bytes_sent += flat.numel() * 4
        self._floats_sent += flat.numel()

    def _start_lowrank(self, bucket, g_ef, comp, name, update_residual):
        """PowerSGD phase 1: P = M Q for every matrix (vectors travel as they are),
        all in one allreduce.  Phase 2 (Q) runs in ``synchronize``."""
        parts, plan = [], []
        for pname, p, (s, e) in zip(bucket.names, bucket.params, bucket.offsets):
            if comp.compressible(p):
                n, m = p.shape[0], p.numel() // p.shape[0]
                r = comp.rank_for(n, m)
                key = (pname, r)
                q = self._lowrank_q.get(key)
                if q is None:
                    q = comp.initial_q(m, r, zlib.crc32(pname.encode()), g_ef.device)
                parts.append((g_ef[s:e].view(n, m) @ q).reshape(-1))
                plan.append((s, e, n, m, r, key))
            else:
                parts.append(g_ef[s:e])
                plan.append((s, e, None, None, None, None))
        buf = torch.cat(parts)
        bucket.kind = "lowrank"
        bucket.lowrank = {"plan": plan, "g_ef": g_ef, "update_residual": update_residual, "name": name}
        self._hold_or_start(bucket, self._allreduce_start(buf, name + ".P"))
        self._bytes_sent += 4 * buf.numel()
        self._floats_sent += buf.numel()

    def _lowrank_phase2(self, bucket):
        """Orthonormalize the averaged P, Q = M^T P, and start the Q allreduce."""
        state = bucket.lowrank
        out = self._wait_bucket(bucket, state["name"] + ".P")
        aggregated = torch.zeros(bucket.numel, dtype=torch.float32, device=bucket.device)
        q_parts, ps, ofs = [], [], 0
        for s, e, n, m, r, key in state["plan"]:
            if n is None:
                aggregated[s:e] = out[ofs:ofs + e - s]
                ofs += e - s
                ps.append(None)
                continue
            p = orthonormalize(out[ofs:ofs + n * r].view(n, r))
            ofs += n * r
            q_parts.append((state["g_ef"][s:e].view(n, m).t() @ p).reshape(-1))
            ps.append(p)
        state["aggregated"], state["p"] = aggregated, ps
        if q_parts:
            qbuf = torch.cat(q_parts)
            self._bytes_sent += 4 * qbuf.numel()
            self._floats_sent += qbuf.numel()
            bucket.handle = comm.allreduce_mean_async(qbuf, state["name"] + ".Q")
        else:
            bucket.handle = None

    def _lowrank_finish(self, bucket) -> torch.Tensor:
        state = bucket.lowrank
        q_all = comm.wait(bucket.handle, state["name"] + ".Q", self._timeout) if bucket.handle is not None else None
        aggregated, g_ef, ofs = state["aggregated"], state["g_ef"], 0
        for (s, e, n, m, r, key), p in zip(state["plan"], state["p"]):
            if n is None:
                if state["update_residual"]:
                    g_ef[s:e].zero_()           # sent exactly
                continue
            q = q_all[ofs:ofs + m * r].view(m, r)
            ofs += m * r
            approx = (p @ q.t()).reshape(-1)
            aggregated[s:e] = approx
            if state["update_residual"]:
                g_ef[s:e].sub_(approx)          # error feedback: what the rank-r sum missed
                self._lowrank_q[key] = q.clone()   # warm start (identical on every rank)
        bucket.lowrank = None
        return aggregated

    def _start_sparse(self, bucket, payload, shared_indices, name):
        k = payload.values.numel()
        if shared_indices:
            bucket.kind, bucket.payload = "shared", payload
            self._hold_or_start(bucket, self._allreduce_start(payload.values.clone(), name))
            self._bytes_sent += 4 * k
            self._floats_sent += k
        else:
            bucket.kind = "sparse"
            def start(stats):
                if stats is not None:
                    self._control_bytes += 8 * comm.header_rows(_N_STATS)
                return comm.allgather_async(comm.pack(payload, stats, bucket.numel), name)
            self._hold_or_start(bucket, start)
            self._bytes_sent += 8 * k
            self._floats_sent += 2 * k

    # -- synchronize -------------------------------------------------------------------------
    def synchronize(self):
        """Finish every bucket's communication and write averaged gradients to ``p.grad``."""
        if self._step_start is None:
            self._step_start = time.perf_counter()
        for bucket in self._buckets:   # buckets whose hooks did not all fire (unused params)
            if bucket.kind is None:
                self._launch(bucket)
        t_comm = time.perf_counter()
        for bucket in self._buckets:
            if bucket.kind == "lowrank":
                self._lowrank_phase2(bucket)
        for bucket in self._buckets:
            if bucket.kind == "lowrank":
                aggregated = self._lowrank_finish(bucket)
            elif bucket.kind == "sparse":
                out = self._wait_bucket(bucket)
                aggregated = comm.unpack_sum(out, bucket.numel).div_(self._world)
            elif bucket.kind == "shared":
                out = self._wait_bucket(bucket)
                aggregated = torch.zeros(bucket.numel, dtype=torch.float32, device=bucket.device)
                aggregated.index_copy_(0, bucket.payload.indices.long(), out)
            else:
                aggregated = self._wait_bucket(bucket)
            for p, (s, e) in zip(bucket.params, bucket.offsets):
                p.grad.copy_(aggregated[s:e].view_as(p.grad))
            if bucket.kind == "dense" and bucket.launched_finite and bucket.index in self._memory.residuals:
                self._memory.sent_dense(bucket.index)
            bucket.reset()
        comm_time = time.perf_counter() - t_comm
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step
        self._finish_step(comm_time)
        self._synchronized = True

    def _wait_bucket(self, bucket, name: Optional[str] = None) -> torch.Tensor:
        """The bucket's collective result; the carrier's statistics go to ``_step_stats``."""
        out = comm.wait(bucket.handle, name or self._bucket_name(bucket), self._timeout)
        if self._carries_stats(bucket):
            if bucket.kind == "sparse":
                stats = comm.read_header_stats(out, self._world, _N_STATS)
            else:
                out, stats = comm.split_stats(out, _N_STATS)
            self._step_stats = stats.tolist()
        return out

    def _finish_step(self, comm_time: float):
        self._await_consensus()   # normally done by the first bucket; not if there is none
        now = time.perf_counter()
        step_time = now - self._step_start
        decision = self.controller.decision
        ctrl = self.controller
        stats = {"step": self._step_index, "cf": decision.send_cf, "level": decision.level,
                 "theta_min": decision.theta_min, "candidate_cf": decision.candidate_cf,
                 "bytes_sent": self._bytes_sent, "control_bytes": self._control_bytes,
                 "floats_sent": self._floats_sent,
                 "dense_floats": sum(b.numel for b in self._buckets),
                 "step_time": step_time, "compress_time": self._compress_time, "comm_time": comm_time,
                 "nonfinite_buckets": self._nonfinite,
                 "quality": sum(self._quality) / len(self._quality) if self._quality else None}
        if ctrl.needs_consensus:
            # No bucket at all (nothing trainable): every rank's statistics are zero.
            step_stats = self._step_stats if self._step_stats is not None else [0.0] * _N_STATS
            stats.update(dict.fromkeys(_CONSENSUS_STATS))   # filled in by the exchange
            if self.overlap_consensus:
                if self._consensus_thread is None:
                    self._consensus_thread = concurrent.futures.ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix="gravac-consensus")
                # Overlapped with the next forward/backward: poll gently (each poll takes the GIL).
                self._pending = (self._consensus_thread.submit(
                    self._exchange, step_stats, step_time, self._at_boundary, _CONSENSUS_POLL_S), stats)
            else:
                stats.update(self._exchange(step_stats, step_time, self._at_boundary))
        else:
            ctrl.observe(StepObservation(0.0, 0.0, 0.0, step_time))
        self._stats = stats
        self._step_index += 1
        self._step_start = time.perf_counter()
        self._reset_step_counters()

    # -- consensus -----------------------------------------------------------------------------
    def _exchange(self, step_stats: List[float], step_time: float, at_boundary: bool,
                  min_sleep: float = comm.POLL_MIN_SLEEP_S) -> dict:
        """Decide the next step on rank 0 and give every rank its decision and observation.

        ``step_stats`` are already averaged over ranks (they came with the carrier
        bucket).  Rank 0 observes them with its own step time, decides, and broadcasts
        (decision, step time); every other rank observes the very same numbers, so all
        controllers keep identical state, and adopts rank 0's decision.  Runs on the
        consensus thread (or inline); nothing else touches the controller until
        ``_await_consensus`` has collected the result."""
        ctrl = self._controller   # not the property: that would wait for this very exchange
        name = f"{self._prefix}.decision"

        def observe(seconds):
            return ctrl.observe(StepObservation(
                ef_sq=step_stats[0], min_sq=step_stats[1], candidate_sq=step_stats[2],
                step_time=seconds, samples=float(self._world), grad_sq=step_stats[3],
                accumulated_sq=step_stats[4] if at_boundary else None,
                # Not finite: a rank saw NaN/Inf, or a float32-carried statistic overflowed.
                finite=step_stats[5] == 0.0 and all(map(math.isfinite, step_stats))))

        if comm.rank() == 0:
            agreed = observe(step_time)
            comm.broadcast_object((agreed, step_time), name=name, timeout=self._timeout, min_sleep=min_sleep)
        else:
            agreed, step_time = comm.broadcast_object(None, name=name, timeout=self._timeout,
                                                      min_sleep=min_sleep)
            mine = observe(step_time)
            if agreed != mine:
                warnings.warn(f"horovod_gravac: rank {comm.rank()} decided {mine} but rank 0 "
                              f"decided {agreed}; following rank 0")
        ctrl.adopt(agreed)
        return {"gain_min": getattr(ctrl, "gain_min", None),
                "gain_candidate": getattr(ctrl, "gain_candidate", None),
                "system_throughput": ctrl.last.get("system_throughput"),
                "compression_throughput": ctrl.last.get("compression_throughput"),
                "next_cf": agreed.send_cf}

    def _await_consensus(self) -> None:
        """Wait for the exchange still in flight (if any); complete its step's stats.
        Its errors (e.g. ``CollectiveTimeoutError``) are raised here, once."""
        if self._pending is None:
            return
        future, stats = self._pending
        self._pending = None
        stats.update(future.result())

    def _drop_consensus(self) -> None:
        """Let an exchange in flight finish and ignore its outcome (elastic recovery: its
        collectives may have failed with the world they ran in)."""
        if self._pending is not None:
            future, _ = self._pending
            self._pending = None
            concurrent.futures.wait([future])

    @property
    def controller(self) -> Controller:
        """The controller (Dense, StaticCF, GraVAC, Accordion).  Reading it waits for a
        consensus exchange in flight, so its state is never half-updated."""
        self._await_consensus()
        return self._controller

    @property
    def stats(self) -> Dict[str, float]:
        """What the last step did (see docs/API_CONTRACT.md).  Reading it waits for that
        step's consensus exchange if it is still running, so the gains and ``next_cf``
        are always filled in."""
        self._await_consensus()
        return self._stats

    def reset_timer(self) -> None:
        """Start timing the next step now. Call after pauses that are not training
        (evaluation, checkpointing) so they do not count as iteration time."""
        self._step_start = time.perf_counter()

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
        return super(self.__class__, self).step(closure)

    def zero_grad(self, set_to_none: bool = True):
        if any(b.handle is not None or b.start is not None for b in self._buckets):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited "
                                 "as it can cause a race condition.")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)

    # -- state -------------------------------------------------------------------------------
    def gravac_state_dict(self) -> dict:
        """Controller state and residuals (per parameter name, so bucketing may change),
        with ``meta`` (what the state was written for: controller settings, compressor,
        world size, rank, parameter layout) and a CRC-32 of each residual
        (``horovod_gravac/checkpoint.py``)."""
        from . import checkpoint
        self._await_consensus()
        residuals = {}
        for b in self._buckets:
            buf = self._memory.residuals.get(b.index)
            if buf is not None:
                for name, (s, e) in zip(b.names, b.offsets):
                    residuals[name] = buf[s:e].clone()
        return {"controller": self.controller.state_dict(), "residuals": residuals,
                "step": self._step_index,
                "lowrank_q": {f"{n}|{r}": q.clone() for (n, r), q in self._lowrank_q.items()},
                "residual_crc32": checkpoint.residual_checksums(residuals),
                "meta": checkpoint.optimizer_meta(self, comm.rank())}

    def load_gravac_state_dict(self, state: dict) -> None:
        """Load a state from ``gravac_state_dict``.  Raises ``ValueError`` naming the
        difference when it was written for another controller, compressor, model layout,
        rank or world size, or when a residual fails its checksum (nothing is loaded
        then); ``horovod_gravac.checkpoint.retarget`` re-targets a state on purpose."""
        from . import checkpoint
        self._await_consensus()   # a late exchange must not overwrite the loaded controller
        if not isinstance(state, dict) or "residuals" not in state or "step" not in state:
            raise checkpoint.CheckpointError(
                f"horovod_gravac: not a GraVAC optimizer state (keys: "
                f"{sorted(state) if isinstance(state, dict) else type(state).__name__})")
        checkpoint.check_compatible(state.get("meta"), checkpoint.optimizer_meta(self, comm.rank()))
        checkpoint.verify_residuals(state)
        if state["controller"] is not None:   # None: retarget(controller=True), keep ours
            fresh = copy.deepcopy(self.controller.state_dict())
            try:
                self.controller.load_state_dict(state["controller"])
            except (KeyError, TypeError, ValueError) as exc:
                self.controller.load_state_dict(fresh)
                raise checkpoint.CheckpointError(
                    f"horovod_gravac: the checkpoint's controller state does not fit "
                    f"{self.controller!r} ({type(exc).__name__}: {exc}); it was written for another "
                    f"controller. horovod_gravac.checkpoint.retarget(state, controller=True) keeps "
                    f"this optimizer's own controller instead") from exc
        self._step_index = int(state["step"])
        self._lowrank_q = {(k.rsplit("|", 1)[0], int(k.rsplit("|", 1)[1])): q.clone()
                           for k, q in state.get("lowrank_q", {}).items()}
        for b in self._buckets:
            if any(n in state["residuals"] for n in b.names):
                buf = self._memory.buffer(b.index, b.numel, b.device)
                for name, (s, e) in zip(b.names, b.offsets):
                    if name in state["residuals"]:
                        buf[s:e].copy_(state["residuals"][name])
            elif not state["residuals"] and b.index in self._memory.residuals:
                self._memory.residuals[b.index].zero_()   # a re-targeted state: from zero

    def state_dict(self):
        state = super(self.__class__, self).state_dict()
        state["gravac"] = self.gravac_state_dict()
        return state

    def load_state_dict(self, state_dict):
        from . import checkpoint
        state_dict = dict(state_dict)
        gravac = state_dict.pop("gravac", None)
        if gravac is not None:   # check before anything is loaded
            if isinstance(gravac, dict) and "meta" in gravac:
                checkpoint.check_compatible(gravac["meta"], checkpoint.optimizer_meta(self, comm.rank()))
                checkpoint.verify_residuals(gravac)
        super(self.__class__, self).load_state_dict(state_dict)
        if gravac is not None:
            self.load_gravac_state_dict(gravac)
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step

    def residual_bytes(self) -> int:
        return self._memory.nbytes()


# Statistics per step and rank that ride with the carrier bucket (``_local_stats``).
_N_STATS = 6
# Shortest pause between polls of the overlapped decision broadcast (seconds).
_CONSENSUS_POLL_S = 5e-4
# Keys of ``stats`` that come from the consensus exchange (None until it completes).
_CONSENSUS_STATS = ("gain_min", "gain_candidate", "system_throughput", "compression_throughput", "next_cf")


_optimizers_built = itertools.count()


def _collective_prefix() -> str:
    """``gravac`` for a process's first optimizer, ``gravac1``, ``gravac2``... after it."""
    n = next(_optimizers_built)
    return "gravac" if n == 0 else f"gravac{n}"


def _squared_norm(grads) -> float:
    """Sum of squared L2 norms in float64 (NaN/Inf if any entry is)."""
    if all(g.dtype in (torch.float32, torch.float64) for g in grads):
        norms = torch._foreach_norm(grads)
    else:   # fp16/bf16: norms in fp32 so large gradients do not overflow
        norms = [g.float().norm() for g in grads]
    return float(torch.stack([n.double() for n in norms]).pow(2).sum())


def _short(x, limit=300):
    s = repr(x)
    return s if len(s) <= limit else s[:limit] + "..."


def _named_parameters(param_groups, named_parameters):
    if named_parameters is None:
        return [(f"param.{i}.{j}", p) for i, g in enumerate(param_groups) for j, p in enumerate(g["params"])]
    named = list(named_parameters)
    if any(not isinstance(x, tuple) or len(x) != 2 for x in named):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually model.named_parameters()")
    names = [n for n, _ in named]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError(f"parameter names in named_parameters must be unique; duplicates: {dups}")
    named_ids = {id(p) for _, p in named}
    missing = [p for g in param_groups for p in g["params"] if id(p) not in named_ids]
    if missing:
        raise ValueError(f"named_parameters was given but {len(missing)} optimizer parameter(s) are not named")
    # Keep the optimizer's order (not the dict order of named_parameters).
    order = {id(p): i for i, p in enumerate(p for g in param_groups for p in g["params"])}
    return sorted(((n, p) for n, p in named if id(p) in order), key=lambda np_: order[id(np_[1])])


def _compressor_factory(compressor) -> Callable[[float], SparseCompressor]:
    """Accept a compressor class, an instance (its class and settings are reused per CF),
    or a callable ``cf -> compressor``."""
    if compressor is None:
        compressor = TopKCompressor
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
            if not hasattr(comp, "compress") or not hasattr(comp, "compress_further"):
                raise ValueError(f"compressor factory returned {comp!r}, which is not a sparse compressor")
            return comp
        return factory
    raise ValueError(f"compressor must be a compressor class, instance or factory, got {compressor!r}")


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters=None, compressor=None,
                         controller: Optional[Controller] = None, backward_passes_per_step: int = 1,
                         bucket_cap_mb: float = 25.0, check_consistency: bool = True,
                         momentum_correction: Optional[float] = None,
                         local_clip_norm: Optional[float] = None,
                         timeout_s: Optional[float] = None, overlap_consensus: bool = True):
    """Wrap ``optimizer`` so gradients are averaged across Horovod ranks with adaptive
    (GraVAC), static or no compression.

    Args:
        optimizer: any ``torch.optim.Optimizer``.
        named_parameters: ``model.named_parameters()`` (names are used for checkpoints
            and the start-up consistency check).
        compressor: a compressor class such as ``TopKCompressor`` (default), an instance
            whose settings are reused at every CF, or a callable ``cf -> compressor``.
        controller: ``Dense()`` (default), ``StaticCF(cf)``, ``GraVAC(...)`` or ``Accordion(...)``.
        backward_passes_per_step: local gradient accumulation steps, as in Horovod.
        bucket_cap_mb: gradients are flattened into buckets of at most this size; each
            bucket is compressed and communicated with one collective.
        check_consistency: verify at start-up that all ranks agree on the model, the
            compressor and the controller (one collective), failing on every rank if not.
        momentum_correction: DGC's momentum correction with this momentum (e.g. 0.9):
            velocity is accumulated into the residual and masked where sent. Wrap a
            momentum-free optimizer when using it. Off by default.
        local_clip_norm: DGC's local gradient clipping: each rank clips each bucket's
            gradient norm to ``local_clip_norm / sqrt(N)`` before error feedback. Off by default.
        timeout_s: seconds any collective may take before this rank raises
            ``comm.CollectiveTimeoutError`` (a peer died or stalls) instead of hanging.
            ``None``: ``$HOROVOD_GRAVAC_TIMEOUT``, else 600; ``math.inf``: no limit.
        overlap_consensus: run the per-step consensus exchange of adaptive controllers
            (GraVAC, Accordion) on a helper thread, overlapped with the next step's
            forward and backward passes (same decisions; ``False``: synchronously at
            the end of ``step()``).

    After each step, ``optimizer.stats`` describes it (see docs/API_CONTRACT.md).
    """
    controller = Dense() if controller is None else controller
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               dict(_GravacDistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compressor, controller,
               backward_passes_per_step, bucket_cap_mb, check_consistency,
               momentum_correction, local_clip_norm, timeout_s, overlap_consensus)
