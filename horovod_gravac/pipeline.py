"""``BucketPipeline``: an optimizer's buckets through one step, whatever drives it.

The optimizer (``optimizer.py``) calls :meth:`BucketPipeline.launch` from its gradient hooks
as each bucket's gradients are ready, then :meth:`~BucketPipeline.finish` and
:meth:`~BucketPipeline.settle` in ``synchronize()``:

    launch(bucket)  encode it (``encoder.py``), add what it measured to the interval sums,
                    start its collective; the carrier's (the last bucket's) waits until
                    every other bucket is encoded, then starts with the step's statistics
    finish()        every bucket's collectives done, the combined gradients in ``p.grad``
    settle()        residual = g_ef - sent (or, for a step every rank skips, as before it)

No collective library is imported here: the transfers go through the link's backend.
"""
from __future__ import annotations

from typing import List

import torch

from .accounting import StepRecord
from .buckets import Bucket, BucketSet
from .consensus import ends_interval
from .controllers import Controller
from .encoder import BucketEncoder
from .error_feedback import ErrorFeedback, IntervalSum
from .wire import StepStats


class BucketPipeline:
    def __init__(self, buckets: BucketSet, encoder: BucketEncoder, memory: ErrorFeedback,
                 interval: IntervalSum, controller: Controller):
        self.buckets, self.encoder = buckets, encoder
        self.memory, self.interval, self.controller = memory, interval, controller

    def launch(self, bucket: Bucket, record: StepRecord, scale: float, step_index: int) -> None:
        """Encode ``bucket`` and start its collective, unless it carries the step's
        statistics: those are complete only once every bucket is encoded, so the last
        bucket to launch starts the carrier's."""
        # The carrier can change mid-step (a gradient turned out sparse): decided here.
        carrier = self.buckets.carrier
        with_stats = bucket is carrier and self.controller.needs_consensus
        encoded = self.encoder.encode(bucket, self.controller.decision, record, scale=scale,
                                      step_index=step_index, with_stats=with_stats)
        bucket.transfer = encoded.transfer
        # at an interval's last step the bucket's window sums are taken now, from its g_ef
        closing = self.interval.delivered and bucket.update_residual and ends_interval(self.controller)
        g_ef = self.memory.residuals.get(bucket.index) if closing else None
        self.interval.record(bucket, encoded.grads, encoded.sent, scale, g_ef=g_ef)
        encoded.transfer.sent_recorded = encoded.grads is not None and encoded.sent is not None
        if not with_stats:
            bucket.transfer.start()
        record.launched += 1
        if record.launched == len(self.buckets) and carrier is not None and carrier.transfer is not None \
                and not carrier.transfer.started:
            carrier.transfer.start(self.local_stats(record, scale).to_tensor())

    def local_stats(self, record: StepRecord, scale: float) -> StepStats:
        """This rank's statistics of the step, for the carrier; at an accumulation
        interval's end (``record.at_boundary``) with the interval's sums, which start again."""
        record.at_boundary = ends_interval(self.controller)
        window = self.interval.take_window(self.buckets, self.memory.residuals) if record.at_boundary \
            else (0.0, 0.0, 0.0)
        return record.local_stats(scale, *window)

    def finish(self, record: StepRecord) -> List[torch.Tensor]:
        """Wait for every bucket's collectives and write the combined gradients to the
        parameters' ``grad``; returns each bucket's combined flat gradient."""
        for bucket in self.buckets:   # every first phase is in flight before any later one waits
            bucket.transfer.advance()
        aggregates = []
        for bucket in self.buckets:
            aggregated = bucket.transfer.finish()   # flat float32 (float64: a float64 bucket)
            record.add_transfer(bucket.transfer)
            aggregates.append(aggregated)
            bucket.write_grads(aggregated)
        return aggregates

    def settle(self, record: StepRecord, scale: float, skipped: bool) -> None:
        """residual = g_ef - sent in every bucket that formed one this step; for a step every
        rank skips (a loss scaler's overflow), the residuals and interval sums from before it.
        Then every bucket is ready for the next step."""
        for bucket in self.buckets:
            if not skipped:
                self.encoder.commit_residual(bucket, scale)
                self._undeliver(bucket, scale)
            elif bucket.update_residual:
                self.memory.undo(bucket.index)
                self.interval.undo(bucket.index)
        for bucket in self.buckets:
            bucket.reset()

    def _undeliver(self, bucket: Bucket, scale: float) -> None:
        """The interval's sum of what was sent (GraVAC "delivered", "predictive") took this
        rank's whole payload at launch; a sparse allreduce delivered only what its global
        selection kept, and the rest stays in the residual: taken back out of the sum here
        (at a window's end that lands in the next window)."""
        dropped = getattr(bucket.transfer, "dropped", None)
        if dropped is None or not self.interval.delivered or not getattr(bucket.transfer, "sent_recorded", False):
            return
        values, indices = dropped()
        if values.numel():
            self.interval.add_sent(bucket.index, bucket.numel, bucket.device, scale, False, values=-values,
                                   indices=indices, dtype=bucket.value_dtype)
