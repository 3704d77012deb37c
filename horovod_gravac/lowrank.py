"""PowerSGD's exchange of one bucket, and the state it keeps between steps.

:class:`PowerSGDState` is this package's counterpart of PyTorch's
``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState``: the one object
that holds what PowerSGD carries from step to step, its error feedback and its warm starts.
:class:`LowRankTransfer` runs one step of it for one bucket (see ``transfers.py`` for the
life of a transfer) and hands what it sent back to the state.
"""
from __future__ import annotations

import zlib
from typing import Dict, List, Optional, Tuple

import torch

from .backend import ReduceOp
from .compressors.powersgd import orthonormalize
from .error_feedback import ErrorFeedback
from .transfers import Transfer

#: One slice of a bucket and what PowerSGD sent for it: ``(start, end, P Q^T)``, or
#: ``(start, end, None)`` for a vector, which travels exactly.
SentSlice = Tuple[int, int, Optional[torch.Tensor]]


class PowerSGDState:
    """What PowerSGD keeps between steps, on each rank:

    * error feedback: each bucket's residual keeps what the rank-r sum missed,
      residual = g_ef - P Q^T (a vector is sent exactly and leaves nothing).  The residual
      buffers are the optimizer's :class:`ErrorFeedback`'s, which forms g_ef in them (and
      keeps them through dense steps, checkpoints and loss-scaler rollbacks); the rule for
      what a low-rank send leaves in them is this state's (:meth:`commit`).
    * warm starts: the last Q per (parameter name, rank), identical on every rank, which
      starts the next step's power iteration (so one iteration a step suffices).  Before
      the first step, and after :meth:`clear`, each starts from the compressor's seeded Q.

    Saved with the optimizer's state (``state_dict``: the warm starts; the residuals are
    saved with the other compressors' residuals)."""

    def __init__(self, memory: ErrorFeedback):
        self.memory = memory
        self.q: Dict[Tuple[str, int], torch.Tensor] = {}

    def warm_start(self, name: str, rank: int, compressor, m: int, device, dtype: torch.dtype) -> torch.Tensor:
        """The m x ``rank`` Q that starts parameter ``name``'s power iteration, in ``dtype``
        (a float32 Q saved for float64 parameters widens exactly)."""
        q = self.q.get((name, rank))
        if q is None:
            q = compressor.initial_q(m, rank, zlib.crc32(name.encode()), device)
        return q.to(dtype)

    def advance(self, name: str, rank: int, q: torch.Tensor) -> None:
        """The next step of parameter ``name`` starts from ``q`` (identical on every rank)."""
        self.q[(name, rank)] = q.clone()

    def commit(self, key: int, sent: List[SentSlice]) -> None:
        """Error feedback for bucket ``key``, whose residual holds this step's g_ef: keep
        what the low-rank sum missed."""
        residual = self.memory.residuals[key]
        for start, end, approximation in sent:
            if approximation is None:
                residual[start:end].zero_()          # sent exactly
            else:
                residual[start:end].sub_(approximation)

    def clear(self) -> None:
        """Back to the seeded initial Q (elastic reset)."""
        self.q.clear()

    def state_dict(self) -> dict:
        return {f"{n}|{r}": q.clone() for (n, r), q in self.q.items()}

    def load_state_dict(self, state: dict) -> None:
        self.q = {(k.rsplit("|", 1)[0], int(k.rsplit("|", 1)[1])): q.clone() for k, q in state.items()}


class LowRankTransfer(Transfer):
    """PowerSGD: phase 1 allreduces P = M Q of every matrix (vectors travel as they are)
    in one collective; ``advance`` orthonormalizes the mean P and starts phase 2, Q = M^T P;
    ``finish`` rebuilds P Q^T.  With ``update`` (the residual is formed this step) the warm
    starts move on at ``finish`` and ``commit`` hands what was sent to the state's error
    feedback.  All of it in ``g_ef``'s dtype (float64 for float64 parameters)."""

    kind = "lowrank"

    def __init__(self, link, name, bucket, g_ef: torch.Tensor, comp, state: PowerSGDState,
                 update: bool, with_stats: bool):
        super().__init__(link, name, bucket.numel, bucket.device, with_stats)
        self.g_ef, self.state, self.update = g_ef, state, update
        parts, self.plan = [], []
        for pname, p, (s, e) in zip(bucket.names, bucket.params, bucket.offsets):
            if comp.compressible(p):
                n, m = p.shape[0], p.numel() // p.shape[0]
                r = comp.rank_for(n, m)
                q = state.warm_start(pname, r, comp, m, g_ef.device, g_ef.dtype)
                parts.append((g_ef[s:e].view(n, m) @ q).reshape(-1))
                self.plan.append((s, e, n, m, r, pname))
            else:
                parts.append(g_ef[s:e])
                self.plan.append((s, e, None, None, None, None))
        self.p_buf = torch.cat(parts)
        self.bytes_sent = self.p_buf.element_size() * self.p_buf.numel()
        self.wire_elements = self.p_buf.numel()   # (phase 2 adds Q's)
        self.floats_sent = self.p_buf.numel()
        self.aggregated: Optional[torch.Tensor] = None
        self.p: List[Optional[torch.Tensor]] = []
        self.sent: List[SentSlice] = []

    def _submit(self, stats):
        return self._allreduce(self.p_buf, self.name + ".P", stats, mean=True)

    def advance(self) -> None:
        out = self._split_stats(self._wait(self.name + ".P"), mean=True)
        aggregated = torch.zeros(self.numel, dtype=self.g_ef.dtype, device=self.device)
        q_parts, ofs = [], 0
        for s, e, n, m, r, _ in self.plan:
            if n is None:
                aggregated[s:e] = out[ofs:ofs + e - s]
                ofs += e - s
                self.p.append(None)
                continue
            p = orthonormalize(out[ofs:ofs + n * r].view(n, r))
            ofs += n * r
            q_parts.append((self.g_ef[s:e].view(n, m).t() @ p).reshape(-1))
            self.p.append(p)
        self.aggregated = aggregated
        self.handle = None
        if q_parts:
            qbuf = torch.cat(q_parts)
            self.bytes_sent += qbuf.element_size() * qbuf.numel()
            self.wire_elements += qbuf.numel()
            self.floats_sent += qbuf.numel()
            self.handle = self.link.backend.allreduce_async(qbuf, self.name + ".Q", ReduceOp.AVERAGE)

    def finish(self) -> torch.Tensor:
        q_all = self._wait(self.name + ".Q") if self.handle is not None else None
        aggregated, ofs = self.aggregated, 0
        for (s, e, n, m, r, pname), p in zip(self.plan, self.p):
            if n is None:
                self.sent.append((s, e, None))
                continue
            q = q_all[ofs:ofs + m * r].view(m, r)
            ofs += m * r
            approx = (p @ q.t()).reshape(-1)
            aggregated[s:e] = approx
            self.sent.append((s, e, approx))
            if self.update:
                self.state.advance(pname, r, q)   # warm start (identical on every rank)
        if not self.link.average:
            aggregated.mul_(self.link.world)
        return aggregated

    def commit(self, memory, key):
        self.state.commit(key, self.sent)
