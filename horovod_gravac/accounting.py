"""``StepRecord``: what one step of a ``DistributedOptimizer`` did, as it happens.

One record per step: the encoder adds norms, quality and the NaN/Inf count as buckets
are compressed, transfers add their bytes as they finish, and the optimizer turns it
into ``optimizer.stats`` (its keys: docs/architecture.md, "What a step reports") once the step is synchronized.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from .wire import StepStats


class StepRecord:
    def __init__(self):
        self._norm_parts: List[torch.Tensor] = []   # per bucket: ||g_ef||^2, ||g_min||^2, ||g_c||^2
        self._lag_parts: List[torch.Tensor] = []    # per bucket: coherence.py's three sums
        self.grad_sq = 0.0
        self.compress_time = 0.0
        self.bytes_sent = 0
        self.floats_sent = 0
        self.nonfinite = 0                 # buckets that were NaN/Inf here
        self.quality: List[float] = []
        self.exact_fallbacks = 0           # compress calls whose count left the band (threshold.py)
        self.launched = 0                  # buckets launched this step
        self.control_bytes = 0             # statistics carried for the controller
        self.wire_bytes = 0                # what the collectives send by the ring algorithms (transfers.py)
        self.exchange = None               # the exchange= mode (exchange.py)
        self.model_s = 0.0                 # modelled seconds of the step's exchanges, as chosen
        self.dense_model_s = 0.0           # ... and of dense allreduces of every bucket
        self.payload_entries = 0           # sparse-allreduce payload entries of this rank
        self.delivered_entries = 0         # ... of which the global selection kept
        self.kinds: set = set()            # the transfers' kinds (transfers.py), e.g. "pair"
        self.collectives: List[tuple] = []   # (kind, bucket entries, elements on the wire) per transfer
        self.step_stats: Optional[StepStats] = None     # rank-averaged, from the carrier bucket
        self.at_boundary = False           # this step ends an accumulation interval
        self.open = False                  # a hook of this step has run

    def add_norms(self, norms: torch.Tensor) -> None:
        """A bucket's three squared norms (float64), left on its device: reading them back per
        bucket would be a host sync in every bucket hook on a GPU."""
        self._norm_parts.append(norms)

    def add_lag(self, sums: torch.Tensor) -> None:
        """A bucket's coherence sums (float64, on its device; ``coherence.CoherenceSampler``)."""
        self._lag_parts.append(sums)

    @property
    def norms(self) -> torch.Tensor:
        """The step's squared norms so far, summed over buckets, on the CPU (one copy back
        per device the buckets live on)."""
        return _sums_on_host(self._norm_parts)[0]

    def add_transfer(self, transfer) -> None:
        """A finished transfer's counts (and the carried statistics, if it had them)."""
        if transfer.stats is not None:
            self.step_stats = StepStats.from_tensor(transfer.stats)
        self.bytes_sent += transfer.bytes_sent
        self.floats_sent += transfer.floats_sent
        self.control_bytes += transfer.control_bytes
        self.wire_bytes += transfer.wire_bytes
        if transfer.kind == "sparse_allreduce":
            self.payload_entries += transfer.sent_indices.numel()
            self.delivered_entries += transfer.delivered_indices().numel()
        self.kinds.add(transfer.kind)
        self.collectives.append((transfer.kind, transfer.numel, transfer.wire_elements))

    def local_stats(self, scale: float, accumulated_sq: float, window_dot: float = 0.0,
                    window_sent_sq: float = 0.0) -> StepStats:
        """This rank's statistics (unscaled by the loss scale), sent with the carrier."""
        s2 = scale * scale
        # both sums in one copy back and one read
        n, lag = _sums_on_host(self._norm_parts, self._lag_parts).tolist()
        return StepStats(ef_sq=n[0] / s2, min_sq=n[1] / s2, candidate_sq=n[2] / s2,
                         grad_sq=self.grad_sq / s2, accumulated_sq=accumulated_sq,
                         window_dot=window_dot, window_sent_sq=window_sent_sq,
                         nonfinite=float(self.nonfinite > 0),
                         lag_dot=lag[0], lag_now_sq=lag[1], lag_prev_sq=lag[2])

    def summary(self, step: int, decision, dense_floats: int, step_time: float, comm_time: float,
                skipped: bool) -> dict:
        """``optimizer.stats`` of the step (the consensus fields are added by the exchange)."""
        return {"step": step, "cf": decision.send_cf, "level": decision.level,
                "theta_min": decision.theta_min, "candidate_cf": decision.candidate_cf,
                "bytes_sent": self.bytes_sent, "control_bytes": self.control_bytes,
                "floats_sent": self.floats_sent, "dense_floats": dense_floats,
                "step_time": step_time, "compress_time": self.compress_time, "comm_time": comm_time,
                "nonfinite_buckets": self.nonfinite, "exact_fallbacks": self.exact_fallbacks,
                "skipped": skipped, "transfers": "+".join(sorted(self.kinds)),
                "wire_bytes": self.wire_bytes, "exchange": self.exchange,
                "comm_model_s": self.model_s, "dense_model_s": self.dense_model_s,
                "kept_share": self.delivered_entries / self.payload_entries if self.payload_entries else None,
                "quality": sum(self.quality) / len(self.quality) if self.quality else None}


def _sums_on_host(*part_lists: List[torch.Tensor]) -> torch.Tensor:
    """For each list of per-bucket 3-vectors, their sum, as one row of a float64 CPU tensor;
    one copy back per device the parts live on, whatever the number of lists."""
    totals = torch.zeros(len(part_lists), 3, dtype=torch.float64)
    by_device = {}
    for i, parts in enumerate(part_lists):
        for part in parts:
            by_device.setdefault(part.device, [[] for _ in part_lists])[i].append(part)
    for device, groups in by_device.items():
        totals += torch.stack([torch.stack(g).sum(0).double() if g else
                               torch.zeros(3, dtype=torch.float64, device=device) for g in groups]).cpu()
    return totals
