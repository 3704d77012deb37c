"""Which exchange carries a compressed bucket, chosen by a modelled cost (plain Python: no
torch, no Horovod, so controllers and benchmarks can use it as it is).

A bucket compressed to ``k`` of its ``n`` entries can cross ``P`` ranks in several ways
(``transfers.py``); the bytes each rank sends per step, for 4-byte values and int32 indices
(``r`` = 8 bytes a row; 12 for float64 values, whose dense value is 8 bytes):

==================== ===================================== ==========================
kind                 bytes a rank sends (ring algorithms)   collectives, hops
==================== ===================================== ==========================
``"dense"``          2 (P-1)/P * 4 n                        1 allreduce, 2 (P-1)
``"sparse"``         (P-1) * r k  (an allgather)            1 allgather, P-1
``"pair"`` (P = 2)   r k                                     1 reducescatter, 1
``"sparse_allreduce"`` (P-1)/P * r k + (P-1) * r ceil(k/P)  1 alltoall + 1 allgather, 2 (P-1)
==================== ===================================== ==========================

so the allgather outgrows the dense allreduce once P exceeds about CF / 2 (for 8-byte rows),
while the sparse allreduce stays near 2 r k (P-1)/P whatever P.  :func:`exchange_cost`
turns bytes into seconds with a :class:`LinkModel` (the alpha-beta model, a fixed cost per
collective, and the CPU time a rank spends per sparse entry: routing, summing, unpacking);
:func:`choose` picks the cheapest kind that may carry the payload.

The choice must be the same on every rank (each kind is a different collective), so it is
computed from what every rank knows alike: the world size, the bucket's size and dtype, the
CF of the decision, the compressor's kind and the link model (the ``exchange=`` option or
``$HOROVOD_GRAVAC_LINK``).  Nothing measured by one rank alone enters it.

Modes (``DistributedOptimizer(..., exchange=...)``, ``GravacState(..., exchange=...)``):

* ``"auto"`` (default): the cheapest kind by the model, dense included: a compressed
  decision whose payload would cost more than the dense allreduce is sent dense (its
  residual is then cleared, as for any dense send);
* ``"allgather"``: the paper's path: the pair exchange between two ranks when payload sizes
  are fixed, else one allgather;
* ``"sparse_allreduce"``: the sparse allreduce for every sparse payload (tests, benchmarks).

``join_safe=True`` (every collective an allreduce) and shared-index payloads (Random-k with
a shared seed) keep their own transfers; under ``"auto"`` they too are compared with dense.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, replace
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

#: The ``exchange=`` modes.
MODES = ("auto", "allgather", "sparse_allreduce")
#: The variable that gives the link model (a rate such as ``"100mbit"``, ``"10gbit"``).
LINK_ENV = "HOROVOD_GRAVAC_LINK"

_RATE_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}


def parse_rate(rate) -> float:
    """``"100mbit"`` -> 1e8 bits per second (a number is taken as bits per second)."""
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        bits = float(rate)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(rate))
        unit = (m.group(2).lower() or "bit") if m else ""
        if not m or unit not in _RATE_UNITS:
            raise ValueError(f"cannot read the link rate {rate!r} (examples: 100mbit, 10gbit)")
        bits = float(m.group(1)) * _RATE_UNITS[unit]
    if not 0 < bits < math.inf:
        raise ValueError(f"the link rate must be a positive number, got {rate!r}")
    return bits


@dataclass(frozen=True)
class LinkModel:
    """One rank's link, as the cost model sees it.

    ``bandwidth``: bytes per second a rank sends (and, at the same time, receives);
    ``latency``: seconds per message hop; ``overhead``: seconds per collective (Horovod's
    negotiation, a cycle of its background loop); ``entry_s``: CPU seconds per sparse entry a
    rank routes, sums or unpacks; ``scan_s``: CPU seconds per bucket entry a sparse exchange
    clears or scans (the dense aggregate, the selection mask).  The defaults: a 1 Gbit/s
    link, and this package's CPU paths as measured on a 2-core machine.  1 Gbit/s because
    the two ways of being wrong cost differently: on a faster link a compressed send that the
    model preferred costs a few milliseconds of CPU more than the dense allreduce would have,
    while on a slower one a dense send costs CF times the bytes.  Give the real rate
    (``link=``, ``$HOROVOD_GRAVAC_LINK``) for the choice to weigh CPU against wire time
    there."""

    bandwidth: float = 1.25e8
    latency: float = 25e-6
    overhead: float = 1e-3
    entry_s: float = 15e-9
    scan_s: float = 1.5e-9

    @classmethod
    def from_rate(cls, rate, **kwargs) -> "LinkModel":
        """A link of ``rate`` (``"100mbit"``, ``"10gbit"`` or bits per second)."""
        return cls(bandwidth=parse_rate(rate) / 8.0, **kwargs)

    @classmethod
    def from_env(cls) -> "LinkModel":
        """``$HOROVOD_GRAVAC_LINK`` (a rate) if set, else the defaults."""
        rate = os.environ.get(LINK_ENV)
        return cls.from_rate(rate) if rate else cls()

    def scaled(self, **kwargs) -> "LinkModel":
        return replace(self, **kwargs)


def check_link(link) -> LinkModel:
    """``None`` (``$HOROVOD_GRAVAC_LINK`` or the defaults), a rate, or a :class:`LinkModel`."""
    if link is None:
        return LinkModel.from_env()
    if isinstance(link, LinkModel):
        return link
    try:
        return LinkModel.from_rate(link)
    except ValueError as exc:
        raise ValueError(f"link must be a LinkModel or a rate such as '100mbit' or '10gbit': {exc}") from None


def check_mode(mode) -> str:
    if mode not in MODES:
        raise ValueError(f"exchange must be one of {MODES}, got {mode!r}")
    return mode


@dataclass(frozen=True)
class Cost:
    """One bucket's exchange: ``kind`` (``transfers.py``'s), modelled ``seconds`` and the
    ``wire_bytes`` one rank sends by the ring algorithms of the table above."""

    kind: str
    seconds: float
    wire_bytes: float


def row_bytes(value_bytes: int) -> int:
    """Bytes of one sparse row: the value's (4 or 8) and an int32 index."""
    return value_bytes + 4


def sparse_allreduce_rows(k: int, world: int) -> Tuple[float, int]:
    """Rows a rank sends in the sparse allreduce's two phases when its ``k`` entries spread
    evenly over the ``world`` regions: ``(P-1)/P k`` in the alltoall, ``(P-1) ceil(k/P)``
    in the ring allgather of the regions' selections."""
    if world <= 1:
        return 0.0, 0
    return k * (world - 1) / world, (world - 1) * math.ceil(k / world)


def exchange_cost(kind: str, numel: int, kept: int, world: int, link: LinkModel,
                  value_bytes: int = 4, dense_bytes: Optional[int] = None) -> Cost:
    """The modelled cost of sending one bucket of ``numel`` entries, ``kept`` of them in a
    sparse payload, by ``kind`` among ``world`` ranks.  ``value_bytes``: 4 (float32 values)
    or 8 (float64); ``dense_bytes``: bytes of a dense entry on the wire (2 with fp16 wire
    compression; default ``value_bytes``)."""
    p, n, k = world, numel, kept
    db = value_bytes if dense_bytes is None else dense_bytes
    r = row_bytes(value_bytes)
    if p <= 1:
        return Cost(kind, 0.0, 0.0)
    if kind == "dense":
        wire = 2.0 * (p - 1) / p * n * db
        cpu = 2.0 * (p - 1) / p * n * link.scan_s   # the reduction's additions
        return Cost(kind, link.overhead + 2 * (p - 1) * link.latency + wire / link.bandwidth + cpu, wire)
    if kind == "sparse":
        wire = (p - 1) * k * r
        cpu = p * k * link.entry_s + n * link.scan_s
        return Cost(kind, link.overhead + (p - 1) * link.latency + wire / link.bandwidth + cpu, wire)
    if kind == "pair":
        wire = float(k * r)
        cpu = 2 * k * link.entry_s + n * link.scan_s
        return Cost(kind, link.overhead + link.latency + wire / link.bandwidth + cpu, wire)
    if kind == "sparse_allreduce":
        first, second = sparse_allreduce_rows(k, p)
        wire = (first + second) * r
        # route k, sum about k received, select, unpack k; clear a region, the aggregate, a mask
        cpu = 4 * k * link.entry_s + (2 + 1.0 / p) * n * link.scan_s
        return Cost(kind, 2 * link.overhead + 2 * (p - 1) * link.latency + wire / link.bandwidth + cpu, wire)
    if kind == "shared":
        wire = 2.0 * (p - 1) / p * k * value_bytes
        cpu = k * link.entry_s + n * link.scan_s
        return Cost(kind, link.overhead + 2 * (p - 1) * link.latency + wire / link.bandwidth + cpu, wire)
    if kind == "slotted":
        wire = 2.0 * (p - 1) * (2 * k + 24) * r   # every rank's slot (2k + 1 rows and a header)
        cpu = p * k * link.entry_s + (p * 2 * k) * link.scan_s + n * link.scan_s
        return Cost(kind, link.overhead + 2 * (p - 1) * link.latency + wire / link.bandwidth + cpu, wire)
    raise ValueError(f"no cost model for exchange kind {kind!r}")


def candidates(mode: str, world: int, fixed_count: bool, pair_allowed: bool, join_safe: bool = False,
               shared_indices: bool = False) -> List[str]:
    """The kinds that may carry a sparse payload, in order of preference on a tie."""
    if shared_indices:
        kinds = ["shared"]
    elif join_safe:
        kinds = ["slotted"]
    elif mode == "sparse_allreduce":
        kinds = ["sparse_allreduce"]
    else:
        paper = "pair" if world == 2 and fixed_count and pair_allowed else "sparse"
        kinds = [paper] if mode == "allgather" else [paper, "sparse_allreduce"]
    if mode == "auto":
        kinds.append("dense")
    return kinds


def choose(mode: str, numel: int, kept: int, world: int, link: LinkModel, *, fixed_count: bool = True,
           pair_allowed: bool = True, join_safe: bool = False, shared_indices: bool = False,
           value_bytes: int = 4, dense_bytes: Optional[int] = None) -> Cost:
    """The cheapest admissible kind for one bucket (the first listed on a tie)."""
    best = None
    for kind in candidates(mode, world, fixed_count, pair_allowed, join_safe, shared_indices):
        cost = exchange_cost(kind, numel, kept, world, link, value_bytes, dense_bytes)
        if best is None or cost.seconds < best.seconds:
            best = cost
    return best


def kept_count(numel: int, cf: float) -> int:
    """As ``cf.kept_count`` (repeated here so this module needs nothing else)."""
    if numel == 0:
        return 0
    return max(1, min(numel, int(numel / cf)))


@dataclass(frozen=True)
class BucketShape:
    """What the model needs of one bucket: entries, and bytes of a sparse value and of a
    dense entry on the wire."""

    numel: int
    value_bytes: int = 4
    dense_bytes: int = 4


class CommModel:
    """The modelled communication of one optimizer's step at its world size: what a
    controller needs to compare CFs, dense included, at the current number of ranks.

    ``optimizer.comm_model`` (and ``GravacState.comm_model`` for the DDP hook) is one of
    these, kept up to date with the world size and the buckets.  Use::

        model.step_seconds(cf)      # modelled seconds of one step's exchanges at CF cf
                                    # (cf = 1: dense allreduce), summed over the buckets
        model.kinds(cf)             # the exchange each bucket takes at cf, in bucket order
        model.table([1, 10, 100])   # {cf: {"seconds", "wire_bytes", "kinds"}}
        model.fastest(cfs)          # the cf of least modelled time (dense included if 1 is in cfs)

    and ``model.measured`` (``{(transfers, cf): seconds}``): the median wait per step this
    rank measured for each exchange and CF it sent (``stats["comm_time"]``, keyed by
    ``stats["transfers"]`` and ``stats["cf"]``), beside the model."""

    def __init__(self, mode: str, link: LinkModel, world: int, buckets: Sequence[BucketShape] = (), *,
                 fixed_count: bool = True, pair_allowed: bool = True, join_safe: bool = False,
                 shared_indices: bool = False, low_rank: bool = False, waits: Optional["Waits"] = None):
        self.mode, self.link, self.world = mode, link, world
        self.buckets: Tuple[BucketShape, ...] = tuple(buckets)
        self.fixed_count, self.pair_allowed, self.join_safe = fixed_count, pair_allowed, join_safe
        self.shared_indices, self.low_rank = shared_indices, low_rank
        self.waits = Waits() if waits is None else waits

    @property
    def measured(self) -> Dict[Tuple[str, float], float]:
        return self.waits.medians

    def set_world_size(self, world: int) -> None:
        self.world = world

    def set_buckets(self, buckets: Iterable[BucketShape]) -> None:
        self.buckets = tuple(buckets)

    def bucket_cost(self, bucket: BucketShape, cf: float, mode: Optional[str] = None) -> Cost:
        """One bucket's exchange at ``cf`` (1: dense)."""
        mode = self.mode if mode is None else mode
        if cf <= 1.0:
            return exchange_cost("dense", bucket.numel, bucket.numel, self.world, self.link,
                                 bucket.value_bytes, bucket.dense_bytes)
        if self.low_rank:   # PowerSGD: not modelled here; its own two allreduces
            return Cost("lowrank", math.nan, math.nan)
        return choose(mode, bucket.numel, kept_count(bucket.numel, cf), self.world, self.link,
                      fixed_count=self.fixed_count, pair_allowed=self.pair_allowed, join_safe=self.join_safe,
                      shared_indices=self.shared_indices, value_bytes=bucket.value_bytes,
                      dense_bytes=bucket.dense_bytes)

    def costs(self, cf: float) -> List[Cost]:
        return [self.bucket_cost(b, cf) for b in self.buckets]

    def step_seconds(self, cf: float) -> float:
        return sum(c.seconds for c in self.costs(cf))

    def wire_bytes(self, cf: float) -> float:
        return sum(c.wire_bytes for c in self.costs(cf))

    def kinds(self, cf: float) -> List[str]:
        return [c.kind for c in self.costs(cf)]

    def table(self, cfs: Iterable[float]) -> Dict[float, dict]:
        out = {}
        for cf in cfs:
            costs = self.costs(float(cf))
            out[float(cf)] = {"seconds": sum(c.seconds for c in costs),
                              "wire_bytes": sum(c.wire_bytes for c in costs), "kinds": [c.kind for c in costs]}
        return out

    def fastest(self, cfs: Iterable[float]) -> float:
        cfs = [float(c) for c in cfs]
        return min(cfs, key=lambda c: (self.step_seconds(c), -c))

    def observe(self, kinds: str, cf: float, seconds: float) -> None:
        self.waits.observe(kinds, cf, seconds)


class Waits:
    """A rank's measured waits for its transfers, by (``stats["transfers"]``, CF): the median
    of the last ``keep`` steps of each."""

    def __init__(self, keep: int = 31):
        self.keep = keep
        self.medians: Dict[Tuple[str, float], float] = {}
        self._samples: Dict[Tuple[str, float], List[float]] = {}

    def observe(self, kinds: str, cf: float, seconds: float) -> None:
        key = (kinds, float(cf))
        samples = self._samples.setdefault(key, [])
        samples.append(float(seconds))
        del samples[:-self.keep]
        ordered = sorted(samples)
        self.medians[key] = ordered[len(ordered) // 2]
