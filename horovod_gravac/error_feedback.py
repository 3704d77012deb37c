"""Error feedback: what was not sent this step is added to the next step's gradient.

One residual buffer per bucket, allocated on first use, in the bucket's
``value_dtype`` (float64 for float64 parameters, else float32).  It doubles as the
buffer in which the error-fed gradient is formed (``g_ef = residual + g``, in
place), so error feedback costs exactly one copy of the parameters:

    g_ef = memory.add(key, grads, ...)    # residual <- residual + g (in place)
    ... compress / send ...
    memory.sent_sparse(key, indices)      # residual <- g_ef with sent entries zeroed
    memory.sent_dense(key)                # residual <- 0

Invariant (tested): sent + new residual == gradient + old residual.

DGC's momentum correction (Lin et al., ICLR 2018), off unless ``momentum`` is set:
a velocity ``u = m*u + g`` per bucket is accumulated into the residual instead of
``g`` (``v = v + u``), and both ``u`` and ``v`` are cleared where entries were sent
(momentum factor masking).  Use it with a momentum-free optimizer: the correction
*is* the momentum.

Both save themselves by parameter name (``state_dict(buckets)``), so a checkpoint
survives another bucketing; so does :class:`IntervalSum`, Accordion's running sum of
the raw gradients over the current interval.

With a loss scaler, a step can be skipped by every rank after its residuals were formed;
both then keep a copy of what a step changes (``undoable=True``) and :meth:`~ErrorFeedback.undo`
puts it back.  PowerSGD's rule for what a low-rank send leaves in the residual is
``lowrank.PowerSGDState``'s.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

import torch

from .buckets import views_like


def finite_tensor(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all()) if t.numel() else True


def add_into_slices(buf: torch.Tensor, grads: Iterable[Optional[torch.Tensor]], offsets,
                    alpha: float = 1.0) -> None:
    """``buf[start:end] += alpha * g`` for each present gradient, in one multi-tensor call
    (``torch._foreach_add_``, as torch.optim's foreach optimizers use): a bucket of a deep
    model holds hundreds of parameters, and one ``add_`` per parameter is one kernel launch
    each on a GPU.  The same arithmetic as the per-slice ``add_``."""
    grads = list(grads)
    pairs = [(part, g) for g, part in zip(grads, views_like(buf, grads, offsets)) if g is not None]
    if pairs:
        views, flats = zip(*pairs)
        torch._foreach_add_(list(views), list(flats), alpha=alpha)


def save_by_name(buffers: Dict[int, torch.Tensor], buckets) -> Dict[str, torch.Tensor]:
    """Per-bucket flat buffers as ``{parameter name: copy of its slice}`` (``buckets``:
    objects with ``index``, ``names`` and ``offsets``)."""
    out = {}
    for b in buckets:
        buf = buffers.get(b.index)
        if buf is not None:
            for name, (s, e) in zip(b.names, b.offsets):
                out[name] = buf[s:e].clone()
    return out


def load_by_name(buffers: Dict[int, torch.Tensor], saved: Dict[str, torch.Tensor], buckets) -> None:
    """The inverse of :func:`save_by_name`: the saved slices are copied in (a bucket without
    a buffer gets a zero one first, in the bucket's ``value_dtype``); an empty ``saved`` (a
    re-targeted state) zeroes the buffers that exist.  A float32 slice saved for a float64
    bucket (a checkpoint written before float64 buckets kept float64 residuals) is widened,
    which is exact."""
    for b in buckets:
        if any(n in saved for n in b.names):
            buf = buffers.get(b.index)
            dtype = getattr(b, "value_dtype", torch.float32)
            if buf is None or buf.numel() != b.numel or buf.device != torch.device(b.device) \
                    or buf.dtype != dtype:
                buf = buffers[b.index] = torch.zeros(b.numel, dtype=dtype, device=b.device)
            for name, (s, e) in zip(b.names, b.offsets):
                if name in saved:
                    buf[s:e].copy_(saved[name])
        elif not saved and b.index in buffers:
            buffers[b.index].zero_()


def check_momentum(momentum) -> None:
    if momentum is not None and not (isinstance(momentum, (int, float)) and 0.0 <= momentum < 1.0):
        raise ValueError(f"momentum_correction must be in [0, 1) or None, got {momentum!r}")


class ErrorFeedback:
    """Residuals (and momentum-correction velocities) per bucket.  ``undoable``: each
    :meth:`add` first keeps a copy of what it changes, for :meth:`undo` (a loss scaler's
    skipped steps; one more copy of the buffers)."""

    def __init__(self, momentum: Optional[float] = None, undoable: bool = False):
        check_momentum(momentum)
        self.momentum = momentum
        self.undoable = undoable
        self.residuals: Dict[int, torch.Tensor] = {}
        self.velocities: Dict[int, torch.Tensor] = {}
        self._snapshots: Dict[int, tuple] = {}   # see _snapshot()

    def buffer(self, key: int, numel: int, device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        buf = self.residuals.get(key)
        if buf is None or buf.numel() != numel or buf.device != torch.device(device) or buf.dtype != dtype:
            buf = torch.zeros(numel, dtype=dtype, device=device)
            self.residuals[key] = buf
        return buf

    def add(self, key: int, grads: Iterable[Optional[torch.Tensor]], offsets, numel: int, device,
            scale: float = 1.0, dtype: torch.dtype = torch.float32) -> Optional[torch.Tensor]:
        """residual += concatenated gradients (missing gradients count as zero); returns the
        residual buffer, which now holds g_ef.

        ``scale``: the gradients carry a loss scale (mixed precision) and the residual
        does not; the residual (and velocity) is scaled to match first, and
        :meth:`unscale` takes it back after sending (exact for powers of two).
        ``dtype``: the residual's (and velocity's), the bucket's ``value_dtype``.
        When ``undoable`` and residual * scale + g overflowed, the change is undone at once
        and None returned."""
        if not self.undoable:
            return self._add(key, grads, offsets, numel, device, scale, dtype)
        self._snapshot(key)
        g_ef = self._add(key, grads, offsets, numel, device, scale, dtype)
        if finite_tensor(g_ef):
            return g_ef
        self.undo(key)
        return None

    def _add(self, key, grads, offsets, numel, device, scale, dtype) -> torch.Tensor:
        buf = self.buffer(key, numel, device, dtype)
        if scale != 1.0:
            buf.mul_(scale)
            if key in self.velocities:
                self.velocities[key].mul_(scale)
        if self.momentum is None:
            add_into_slices(buf, grads, offsets)
            return buf
        u = self.velocities.get(key)
        if u is None or u.numel() != numel or u.dtype != dtype:
            u = self.velocities[key] = torch.zeros(numel, dtype=dtype, device=device)
        u.mul_(self.momentum)
        add_into_slices(u, grads, offsets)
        return buf.add_(u)

    def sent_sparse(self, key: int, indices: torch.Tensor) -> None:
        """The entries at ``indices`` were sent with their exact values."""
        self.residuals[key].index_fill_(0, indices.long(), 0.0)
        if key in self.velocities:
            self.velocities[key].index_fill_(0, indices.long(), 0.0)

    def sent_dense(self, key: int) -> None:
        self.residuals[key].zero_()
        if key in self.velocities:
            self.velocities[key].zero_()

    def unscale(self, key: int, scale: float) -> None:
        """Undo :meth:`add`'s ``scale`` once the step's residual is final."""
        if scale != 1.0:
            self.residuals[key].div_(scale)
            if key in self.velocities:
                self.velocities[key].div_(scale)

    def _snapshot(self, key: int) -> None:
        """Remember this key's residual (and velocity) so :meth:`undo` can undo a step
        that is later skipped (a loss-scaler overflow on some rank)."""
        if key not in self.residuals:
            self._snapshots[key] = (None, None)
            return
        old = self._snapshots.get(key)
        res, vel = self.residuals[key], self.velocities.get(key)
        res_copy = old[0] if old and old[0] is not None and old[0].shape == res.shape else torch.empty_like(res)
        res_copy.copy_(res)
        vel_copy = None
        if vel is not None:
            vel_copy = old[1] if old and old[1] is not None and old[1].shape == vel.shape else torch.empty_like(vel)
            vel_copy.copy_(vel)
        self._snapshots[key] = (res_copy, vel_copy)

    def undo(self, key: int) -> None:
        """Back to ``key``'s buffers before the last :meth:`add` (zero if it had no residual then)."""
        res_copy, vel_copy = self._snapshots.get(key, (None, None))
        if key in self.residuals:
            if res_copy is None:
                self.residuals[key].zero_()
            else:
                self.residuals[key].copy_(res_copy)
        if key in self.velocities:
            if vel_copy is None:
                self.velocities[key].zero_()
            else:
                self.velocities[key].copy_(vel_copy)

    def reset(self) -> None:
        for buf in list(self.residuals.values()) + list(self.velocities.values()):
            buf.zero_()

    def forget(self, key: int) -> None:
        """Bucket ``key`` is gone (its parameters were re-bucketed; the new buckets load their
        slices by name first): drop its residual, velocity and snapshot."""
        for table in (self.residuals, self.velocities, self._snapshots):
            table.pop(key, None)

    def drop(self, key: int, start: int, end: int) -> None:
        """Entries ``[start, end)`` of bucket ``key`` left it (a gradient that turned out
        sparse): keep the other entries' residual; the velocity starts again."""
        old = self.residuals.get(key)
        if old is not None:
            self.residuals[key] = torch.cat([old[:start], old[end:]])
            self.velocities.pop(key, None)

    def state_dict(self, buckets) -> dict:
        """Residuals and momentum-correction velocities, by parameter name."""
        return {"residuals": save_by_name(self.residuals, buckets),
                "velocities": save_by_name(self.velocities, buckets)}

    def load_state_dict(self, state: dict, buckets) -> None:
        """Load :meth:`state_dict`'s output.  A state without ``velocities`` (written
        before they were saved) leaves the velocities as they are."""
        load_by_name(self.residuals, state["residuals"], buckets)
        if "velocities" in state:
            load_by_name(self.velocities, state["velocities"], buckets)

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size()
                   for b in list(self.residuals.values()) + list(self.velocities.values()))


class IntervalSum:
    """Running sums over the current accumulation interval, one buffer per bucket (in its
    ``value_dtype``, as the residuals): ``sums`` of the raw (unscaled) gradients G
    (``gradients``: Accordion) and ``sent`` of what this rank sent D (``delivered``: the
    compressed error-fed gradient, GraVAC "delivered" and "predictive").  Read, and restarted,
    at the interval's end.  ``undoable``: each addition first keeps a copy of the sum, for
    :meth:`undo` (a loss scaler's skipped steps).

    With ``delivered``, what the interval owed is not summed step by step: it is what the
    interval sent plus what error feedback still holds at its end, G = D + r_end (the
    residual's invariant, sent + new residual == gradient + old residual, summed over the
    interval; so G starts at the residual the interval inherited).  Each bucket's sums are
    taken at the interval's last step, as soon as the bucket is encoded (:meth:`record` with
    ``g_ef``), while its error-fed gradient and what it sent are at hand: that saves a full
    buffer per bucket and a pass over it every step.  A frozen parameter's residual, set aside
    for the step, is not owed."""

    def __init__(self, gradients: bool = False, delivered: bool = False, undoable: bool = False):
        self.delivered, self.undoable = delivered, undoable
        self.gradients = gradients and not delivered   # (delivered: G is formed at the end)
        self.sums: Dict[int, torch.Tensor] = {}
        self.sent: Dict[int, torch.Tensor] = {}
        self._backups: Dict[Tuple[str, int], torch.Tensor] = {}   # see _buffer(backup=True)
        self._taken: Dict[int, torch.Tensor] = {}   # delivered: bucket -> its window sums, this step

    def record(self, bucket, grads, sent, scale: float, g_ef: Optional[torch.Tensor] = None) -> None:
        """One bucket's step, as far as the sums track it: G += its raw gradients ``grads``
        (None: the bucket was non-finite here, nothing is added), D += ``sent``, what this
        rank sent of it (a dense vector or a sparse payload).  ``scale``: the loss scale.
        ``g_ef``: at the interval's last step (``delivered``), the error-fed gradient the
        bucket sent from (times ``scale``): the bucket's window sums are taken now."""
        if grads is None:
            return
        key, numel, device, dtype = bucket.index, bucket.numel, bucket.device, bucket.value_dtype
        if self.gradients:
            self.add(key, grads, bucket.offsets, numel, device, scale, self.undoable, dtype)
        if self.delivered and sent is not None:
            if isinstance(sent, torch.Tensor):
                self.add_sent(key, numel, device, scale, self.undoable, dense=sent, dtype=dtype)
            else:
                self.add_sent(key, numel, device, scale, self.undoable, values=sent.values,
                              indices=sent.indices, dtype=dtype)
        if self.delivered and g_ef is not None:
            # what is left owing: g_ef less the entries sent, as the transfer commits it (a
            # dense send takes all of it; a sparse one clears the entries it carried)
            left = None if isinstance(sent, torch.Tensor) else g_ef
            cleared = sent.indices if left is not None and sent is not None else None
            self._taken[key] = self._window_sums(key, left, cleared, scale)

    def _window_sums(self, key: int, left: Optional[torch.Tensor], cleared: Optional[torch.Tensor] = None,
                     scale: float = 1.0) -> torch.Tensor:
        """(||G||^2, <D, G>, ||D||^2) of bucket ``key``, G = D + ``left`` / ``scale`` with the
        entries at ``cleared`` taken as zero (``left`` None: G = D; delivered, ``left`` is what
        error feedback still holds; Accordion, which records no D, passes its summed G), as a
        float64 tensor on the bucket's device; one host sync, for the chunks' share of
        ``cleared``.  Summed in float64 over chunks of ``WINDOW_CHUNK`` entries, so a check's
        transient memory is two chunks, not two float64 copies of the bucket."""
        d_all = self.sent.get(key)
        ref = left if left is not None else d_all
        if ref is None:
            return torch.zeros(3, dtype=torch.float64)
        n = ref.numel()
        edges = range(0, n, WINDOW_CHUNK)
        if cleared is not None and cleared.numel():   # each chunk's share of the cleared entries
            cleared = cleared.long().sort().values
            cuts = torch.searchsorted(cleared, torch.tensor(list(edges) + [n], device=cleared.device)).tolist()
        else:
            cleared = None
        sums = torch.zeros(3, dtype=torch.float64, device=ref.device)
        for i, start in enumerate(edges):
            end = min(n, start + WINDOW_CHUNK)
            d = None if d_all is None else d_all[start:end].double()
            g = d
            if left is not None:
                g = left[start:end].to(torch.float64, copy=True)   # (a float64 bucket: not g_ef itself)
                if cleared is not None and cuts[i + 1] > cuts[i]:
                    g.index_fill_(0, cleared[cuts[i]:cuts[i + 1]] - start, 0.0)
                if scale != 1.0:
                    g.div_(scale)
                if d is not None:
                    g.add_(d)
            sums[0] += g.dot(g)
            if d is not None:
                sums[1] += d.dot(g)
                sums[2] += d.dot(d)
        return sums

    def _buffer(self, table: Dict[int, torch.Tensor], tag: str, key: int, numel: int, device,
                backup: bool, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        acc = table.get(key)
        if acc is None:
            acc = table[key] = torch.zeros(numel, dtype=dtype, device=device)
        if backup:
            saved = self._backups.get((tag, key))
            if saved is None:
                saved = self._backups[(tag, key)] = torch.empty_like(acc)
            saved.copy_(acc)
        return acc

    def add(self, key: int, grads, offsets, numel: int, device, scale: float, backup: bool,
            dtype: torch.dtype = torch.float32) -> None:
        """G += g / scale.  ``backup``: remember the sum before, for :meth:`rollback`
        (a step that every rank skips: a loss-scaler overflow)."""
        acc = self._buffer(self.sums, "sums", key, numel, device, backup, dtype)
        add_into_slices(acc, grads, offsets, alpha=1.0 / scale)

    def add_sent(self, key: int, numel: int, device, scale: float, backup: bool,
                 dense: Optional[torch.Tensor] = None, values=None, indices=None,
                 dtype: torch.dtype = torch.float32) -> None:
        """D += sent / scale: a dense vector, or sparse ``values`` at ``indices``."""
        acc = self._buffer(self.sent, "sent", key, numel, device, backup, dtype)
        if dense is not None:
            acc.add_(dense, alpha=1.0 / scale)
        elif values is not None and values.numel():
            acc.index_add_(0, indices.long(), values.to(acc.dtype), alpha=1.0 / scale)

    def undo(self, key: int) -> None:
        """Back to bucket ``key``'s sums before this step's additions (``undoable``)."""
        for tag, table in (("sums", self.sums), ("sent", self.sent)):
            if (tag, key) in self._backups and key in table:
                table[key].copy_(self._backups[(tag, key)])

    def take_window(self, buckets, residuals: Optional[Dict[int, torch.Tensor]] = None) -> Tuple[float, float, float]:
        """(||G||^2, <D, G>, ||D||^2) over the interval, in float64 and bucket order (D
        is zero where nothing was recorded as sent); then a new interval.  ``delivered``: the
        sums :meth:`record` took at this step; a bucket it did not take (non-finite here)
        owes what ``residuals`` holds for it."""
        parts: Dict[torch.device, list] = {}
        for b in buckets:
            taken = self._taken.get(b.index)
            if taken is None:   # Accordion: G as summed; delivered: D + the residual as it stands
                left = self.sums.get(b.index) if self.gradients else \
                    None if residuals is None else residuals.get(b.index)
                taken = self._window_sums(b.index, left if left is not None and left.numel() == b.numel else None)
            parts.setdefault(taken.device, []).append(taken)
        self.reset()
        total = torch.zeros(3, dtype=torch.float64)
        for on_device in parts.values():   # one copy back per device
            total += torch.stack(on_device).sum(0).cpu()
        g_sq, dot, d_sq = total.tolist()
        return g_sq, dot, d_sq

    def drop(self, key: int) -> None:
        """The bucket's layout changed: its sums start again."""
        for tag, table in (("sums", self.sums), ("sent", self.sent)):
            table.pop(key, None)
            self._backups.pop((tag, key), None)

    def reset(self) -> None:
        for buf in list(self.sums.values()) + list(self.sent.values()):
            buf.zero_()
        self._taken.clear()

    def state_dict(self, buckets) -> Dict[str, torch.Tensor]:
        """By parameter name; D's slices under ``name + SENT_SUFFIX``."""
        out = save_by_name(self.sums, buckets)
        out.update({n + SENT_SUFFIX: t for n, t in save_by_name(self.sent, buckets).items()})
        return out

    def load_state_dict(self, saved: Dict[str, torch.Tensor], buckets) -> None:
        sums = {n: t for n, t in saved.items() if not n.endswith(SENT_SUFFIX)}
        sent = {n[:-len(SENT_SUFFIX)]: t for n, t in saved.items() if n.endswith(SENT_SUFFIX)}
        if self.gradients:   # (delivered: a state that saved G, as before G = D + r_end, owes nothing more)
            load_by_name(self.sums, sums, buckets)
        if sent or not saved:
            load_by_name(self.sent, sent, buckets)
        else:   # a state from before D was saved: D starts from zero with the next interval
            self.sent.clear()


#: Entries per chunk of a window's float64 sums (``IntervalSum``): 16 MiB of float64 per
#: operand, so the largest buckets take a few chunks of a handful of operations each.
WINDOW_CHUNK = 1 << 21


#: Suffix of the interval's sent-sum slices in a saved state (next to G's, by parameter name).
SENT_SUFFIX = "#sent"
