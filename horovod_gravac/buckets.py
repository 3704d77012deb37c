"""Buckets: the parameters whose gradients are flattened, compressed and sent together.

How a model's parameters are grouped (``bucket_cap_mb``, Horovod's ``groups``) and what a
bucket holds during a step.  Pure bookkeeping with no Horovod import, so the bucketing can be
used and tested without it (``tests/unit/test_buckets.py``); :mod:`horovod_gravac.optimizer`
drives the buckets through a step.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Iterator, List, NamedTuple, Optional, Tuple

import torch
from torch._utils import _unflatten_dense_tensors

if TYPE_CHECKING:
    from .transfers import Transfer


class Bucket:
    """Parameters whose gradients are flattened, compressed and sent together."""

    def __init__(self, index: int, named: List[Tuple[str, torch.nn.Parameter]]):
        self.index = index
        self._set_params(named)
        self.reset()

    def _set_params(self, named):
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.offsets, start = [], 0
        for p in self.params:
            self.offsets.append((start, start + p.numel()))
            start += p.numel()
        self.numel = start
        self.device = self.params[0].device if self.params else torch.device("cpu")
        # the parameters' one dtype (None: mixed or empty); dense sends of fp16 and float64
        # buckets travel in it, as Horovod's do (encoder.BucketEncoder._dense)
        dtypes = {p.dtype for p in self.params}
        self.dtype = dtypes.pop() if len(dtypes) == 1 else None
        # g_ef, residuals and sent values: float64 for float64 parameters (the bucketing never
        # mixes them with others), float32 for the rest
        self.value_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        self.expected = len(self.params)   # hooks that must fire before it launches

    def remove(self, p) -> Tuple[int, int]:
        """Take ``p`` out (its gradient turned out sparse); returns its old slice."""
        i = next(i for i, q in enumerate(self.params) if q is p)
        old = self.offsets[i]
        named = [(n, q) for n, q in zip(self.names, self.params) if q is not p]
        self._set_params(named)
        return old

    def reset(self):
        self.ready = 0
        self.transfer: Optional[Transfer] = None   # this step's collective(s); None: not launched
        self.update_residual = False    # the residual was formed this step
        self.parked: List[Tuple[int, int, torch.Tensor]] = []   # frozen params' residual slices

    def gradients(self) -> List[Optional[torch.Tensor]]:
        """This step's gradient of each parameter (what error feedback takes in); None for a
        frozen one (``requires_grad`` False: it takes no part, its residual waits).  A
        backend whose gradients arrive elsewhere (DDP's flat bucket) overrides it."""
        grads = []
        for p in self.params:
            if not p.requires_grad:
                grads.append(None)
                continue
            if p.grad is None:   # unused this step here, maybe used on another rank
                p.grad = torch.zeros_like(p)
            grads.append(p.grad.to_dense() if p.grad.is_sparse else p.grad)
        return grads

    def hooks_to_wait_for(self, hooked: set) -> int:
        """Hooks that fire for the bucket this step: its parameters that need a gradient
        and have a hook (a parameter unfrozen since the last step has none yet)."""
        return sum(1 for p in self.params if p.requires_grad and id(p) in hooked)

    def write_grads(self, aggregated: torch.Tensor) -> None:
        """The combined gradient (flat float32, or float64) into each parameter's ``grad``: one
        multi-tensor copy for the bucket (``torch._foreach_copy_``), since one ``copy_``
        per parameter would be a GPU kernel launch per tensor on every step."""
        dense_grads, parts = [], []
        for p, part in zip(self.params, views_like(aggregated, self.params, self.offsets)):
            if not p.requires_grad:
                continue   # frozen: its gradient (None, or the user's) is left alone
            if p.grad.is_sparse:   # sparse_as_dense: back to sparse, as Horovod does
                p.grad.zero_().add_(part.to(p.grad.dtype).to_sparse())
            else:
                dense_grads.append(p.grad)
                parts.append(part)
        if dense_grads:
            _copy_all(dense_grads, parts)

    @property
    def handle(self):
        """The collective in flight (None: none, or held back until the step's statistics are complete)."""
        return None if self.transfer is None else self.transfer.handle


class BucketLayout(NamedTuple):
    """One bucket as ``optimizer.bucket_layout`` shows it (read-only)."""

    index: int                                  # in collective names and saved states
    names: Tuple[str, ...]                      # its parameters, in the order of its flat buffer
    numel: int                                  # entries of its flat buffer
    dtype: Optional[torch.dtype]                # its parameters' one dtype (None: mixed)
    value_dtype: torch.dtype                    # of its g_ef, residual and sent values
    parameter_dtypes: Tuple[torch.dtype, ...]


class BucketSet:
    """An optimizer's buckets in launch order: parameter groups added later launch first, and
    the last bucket (the carrier) also carries the step's statistics for the controller."""

    def __init__(self, named: List[Tuple[str, torch.nn.Parameter]], cap_bytes: int, groups=None):
        self.cap_bytes = cap_bytes
        self.buckets = make_buckets(named, cap_bytes) if groups is None \
            else grouped_buckets(named, groups, cap_bytes)
        self.carrier: Optional[Bucket] = self.buckets[-1] if self.buckets else None
        self.of: Dict[torch.nn.Parameter, Bucket] = {p: b for b in self.buckets for p in b.params}

    def __iter__(self) -> Iterator[Bucket]:
        return iter(self.buckets)

    def __len__(self) -> int:
        return len(self.buckets)

    def add(self, named: List[Tuple[str, torch.nn.Parameter]]) -> List[Bucket]:
        """Buckets for a new parameter group; they launch first, the carrier stays last."""
        first = 1 + max((b.index for b in self.buckets), default=-1)
        new = make_buckets(named, self.cap_bytes, first_index=first)
        self.buckets = new + self.buckets
        self.of.update((p, b) for b in new for p in b.params)
        return new

    def detach(self, p) -> Tuple[Bucket, str, int, int]:
        """Take ``p`` out of its bucket (its gradient turned out sparse): the bucket, ``p``'s
        name and its old slice ``[start, end)``.  An emptied bucket goes (and the carrier
        moves to the new last one)."""
        bucket = self.of.pop(p)
        name = bucket.names[[i for i, q in enumerate(bucket.params) if q is p][0]]
        start, end = bucket.remove(p)
        if not bucket.params:
            self.buckets.remove(bucket)
            if self.carrier is bucket:
                self.carrier = self.buckets[-1] if self.buckets else None
        return bucket, name, start, end

    def layout(self) -> Tuple[BucketLayout, ...]:
        return tuple(BucketLayout(b.index, tuple(b.names), b.numel, b.dtype, b.value_dtype,
                                  tuple(p.dtype for p in b.params)) for b in self.buckets)


def _copy_all(dsts, srcs) -> None:
    if hasattr(torch, "_foreach_copy_"):   # torch >= 2.1
        torch._foreach_copy_(dsts, srcs)
    else:
        for d, s in zip(dsts, srcs):
            d.copy_(s)


def views_like(flat: torch.Tensor, like, offsets) -> List[torch.Tensor]:
    """``flat[start:end]`` viewed in the shape of each tensor of ``like`` (a 1-D slice for a
    None), for each ``(start, end)`` of ``offsets``, which are a bucket's: consecutive, each
    as long as its tensor.  A bucket's offsets tile its buffer, so one C++ call
    (``torch._utils._unflatten_dense_tensors``, as DDP's buckets use) makes every view: a
    slice and a view per parameter from Python is two dispatched operations each, host time
    on every step, twice the model's tensor count."""
    # (offsets that start at 0 and end at the buffer's end tile it: they are a bucket's)
    if offsets and offsets[0][0] == 0 and offsets[-1][1] == flat.numel() and len(like) == len(offsets) \
            and not any(t is None for t in like):
        views = list(_unflatten_dense_tensors(flat, like))
        for i, (v, t) in enumerate(zip(views, like)):
            if v.shape != t.shape:   # an empty tensor comes back 1-D (torch 2.0)
                views[i] = v.view(t.shape)
        return views
    return [flat[s:e] if t is None else flat[s:e].view(t.shape) for t, (s, e) in zip(like, offsets)]


def _float64(p) -> bool:
    return p.dtype == torch.float64


def make_buckets(named: List[Tuple[str, torch.nn.Parameter]], cap_bytes: int,
                  first_index: int = 0) -> List[Bucket]:
    """Buckets of at most ``cap_bytes`` (4 bytes an entry) of consecutive parameters, in
    reverse order; a change of device, or between float64 and other parameters, starts a
    new one (a bucket's values travel in one dtype: float64 ones must not be rounded)."""
    # Reverse registration order approximates the order gradients become ready.
    buckets, current, size = [], [], 0
    for name, p in reversed(named):
        if current and (size + p.numel() * 4 > cap_bytes or p.device != current[0][1].device
                        or _float64(p) != _float64(current[0][1])):
            buckets.append(Bucket(first_index + len(buckets), current))
            current, size = [], 0
        current.append((name, p))
        size += p.numel() * 4
    if current:
        buckets.append(Bucket(first_index + len(buckets), current))
    return buckets


def grouped_buckets(named, groups, cap_bytes) -> List[Bucket]:
    """Horovod's ``groups``: an int splits the parameters into that many buckets of
    consecutive parameters; a list of lists makes each inner list one bucket (the
    parameters in no list are bucketed by ``bucket_cap_mb``).  A group holding float64
    and other parameters becomes two buckets, its float64 ones and the rest."""
    if isinstance(groups, int):
        n = min(groups, len(named))
        base, extra = divmod(len(named), n) if n else (0, 0)
        chunks, pos = [], 0
        for i in range(n):
            size = base + (1 if i < extra else 0)
            chunks.append(named[pos:pos + size])
            pos += size
        members = [part for c in reversed(chunks) for part in _by_float64(list(reversed(c)))]
        return [Bucket(i, m) for i, m in enumerate(members)]
    position = {id(p): i for i, (_, p) in enumerate(named)}
    buckets, grouped = [], set()
    for group in reversed(groups):
        members = [named[position[id(p)]] for p in group if id(p) in position]
        grouped.update(id(p) for p in group)
        for part in _by_float64(members):
            buckets.append(Bucket(len(buckets), part))
    rest = [(n, p) for n, p in named if id(p) not in grouped]
    return buckets + make_buckets(rest, cap_bytes, first_index=len(buckets))


def _by_float64(members) -> List[list]:
    """``members`` (name, parameter) as one list, or two when it mixes float64 parameters
    with others (the others first, each in its order); none when empty."""
    f64 = [m for m in members if _float64(m[1])]
    rest = [m for m in members if not _float64(m[1])]
    return [part for part in (rest, f64) if part]
