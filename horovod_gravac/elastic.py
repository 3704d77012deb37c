"""Horovod elastic training with a ``horovod_gravac.DistributedOptimizer``.

Use this module's :class:`TorchState` where Horovod's documentation uses
``hvd.elastic.TorchState``::

    import horovod.torch as hvd
    import horovod_gravac as hg
    from horovod_gravac.elastic import TorchState

    hvd.init()
    opt = hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                  named_parameters=model.named_parameters(),
                                  controller=hg.GraVAC(theta_min=10, theta_max=1000))
    state = TorchState(model=model, optimizer=opt, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

What happens to GraVAC's state at each elastic event:

- ``save()`` / ``commit()``: every rank keeps, in host memory, a copy of its model,
  its base optimizer state, the controller state, the step index (Random-k's shared
  seed depends on it) and *its own* error-feedback residuals.
- ``restore()`` (after a ``HorovodInternalError``): every rank goes back to its last
  commit, residuals included, and forgets the buckets that were in flight.
- ``reset()`` (after every membership change, before ``sync``): residuals are zeroed
  on every rank (the residuals of a rank that left are gone, and data shards move
  between ranks, so the only state every rank can agree on is "nothing pending"),
  Accordion's interval sums and PowerSGD's warm starts are cleared, the world size is
  re-read, GraVAC's EWMA factor (the paper's N/100) follows the new N, and when N
  changed its throughput table is emptied (throughput measured with another number of
  workers is not comparable).  The CF ladder position (theta_min, candidate) is kept.
- ``sync()`` (at start-up and after a reset): rank 0's model, base optimizer state,
  controller state and step index are broadcast, so every rank (new ones included)
  takes the same next decision.  Residuals are not broadcast: each rank keeps its
  own, which are zero after a reset.

Why not ``hvd.elastic.TorchState`` as is: its optimizer handler syncs with
``hvd.broadcast_optimizer_state``, which hands out the wrapped optimizer's state and
options only, not this optimizer's controller state and step index.  A worker that
just joined would then fetch them in the optimizer's once-per-optimizer sync before its
first bucket, a broadcast the other workers (synced long ago) do not join, and wait out
``timeout_s``.  Horovod's handler also restores by loading
the saved state dict itself, and ``torch.optim.Optimizer.load_state_dict`` keeps the
saved tensors (no copy), so training after a restore would overwrite the snapshot.
The handler here copies.
"""
from __future__ import annotations

import copy

import horovod.torch as hvd
from horovod.torch.elastic.state import StateHandler

from .horovod_backend import HorovodBackend

__all__ = ["TorchState", "GravacOptimizerStateHandler", "is_gravac_optimizer",
           "reset_for_new_world", "sync_optimizer_state"]


def is_gravac_optimizer(obj) -> bool:
    """True for an optimizer returned by ``horovod_gravac.DistributedOptimizer``."""
    return all(callable(getattr(obj, m, None)) for m in ("gravac_state_dict", "drop_in_flight",
                                                         "reset_residuals", "set_world_size"))


def reset_for_new_world(optimizer) -> None:
    """Make the optimizer fit the current Horovod world (call on every rank after
    ``hvd.shutdown(); hvd.init()``).  See the module docstring for what is reset."""
    optimizer.drop_in_flight()
    optimizer.reset_residuals()   # residuals, velocities, interval sums: zero; warm starts: seeded
    if optimizer.set_world_size(hvd.size()) and optimizer.controller.throughput is not None:
        optimizer.controller.throughput.reset()   # measured in the old world


def sync_optimizer_state(optimizer, root_rank: int = 0) -> None:
    """Every rank takes rank 0's base optimizer state, controller state and step index;
    each keeps its own residuals.  One ``broadcast_object`` bounded by the optimizer's
    ``timeout_s``.  Every rank must call it."""
    if root_rank != 0:
        raise ValueError(f"root_rank must be 0 (decisions are always rank 0's), got {root_rank!r}")
    state = optimizer.state_dict()
    gravac = state.pop("gravac")
    shared = {"optimizer": state, "controller": gravac["controller"], "step": gravac["step"]}
    shared = HorovodBackend().broadcast_object(shared, name="gravac.elastic.sync", timeout=optimizer.timeout_s)
    merged = dict(shared["optimizer"])
    merged["gravac"] = {"controller": shared["controller"], "residuals": gravac["residuals"],
                        "step": shared["step"]}
    optimizer.load_state_dict(merged)
    optimizer.set_world_size(hvd.size())
    # Every rank now holds rank 0's controller state and step index: the once-per-optimizer
    # sync before the first bucket must not run again (a joining worker would run it alone).
    optimizer.mark_state_synced()


class GravacOptimizerStateHandler(StateHandler):
    """``hvd.elastic`` state handler for a ``horovod_gravac.DistributedOptimizer``."""

    def __init__(self, optimizer):
        if not is_gravac_optimizer(optimizer):
            raise ValueError(f"optimizer must come from horovod_gravac.DistributedOptimizer, "
                             f"got {type(optimizer).__name__}")
        super().__init__(optimizer)
        self._saved = copy.deepcopy(optimizer.state_dict())

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        # The interrupted step's handles are dead; the next zero_grad() would otherwise refuse
        # to run, and a join-safe observation still pending would overwrite the restored state.
        self.value.drop_in_flight()
        # load_state_dict keeps the given tensors: hand it a copy, keep the snapshot intact.
        saved = copy.deepcopy(self._saved)
        if isinstance(saved.get("gravac"), dict):
            # This process's own snapshot: it may predate a membership change (another rank
            # number or world size), which reset() handles next; skip the checkpoint's
            # identity check (residual checksums are still verified).
            saved["gravac"]["meta"] = None
        self.value.load_state_dict(saved)

    def sync(self):
        sync_optimizer_state(self.value)

    def reset(self):
        reset_for_new_world(self.value)


class TorchState(hvd.elastic.TorchState):
    """``hvd.elastic.TorchState`` that also saves, restores, syncs and resets the
    GraVAC controller, the step index and the error-feedback residuals of every
    ``horovod_gravac.DistributedOptimizer`` among its arguments (other models,
    optimizers and values are handled exactly as Horovod does)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        super().__init__(model=model, optimizer=optimizer, **kwargs)
        for name, handler in list(self._handlers.items()):
            if is_gravac_optimizer(handler.value) and not isinstance(handler, GravacOptimizerStateHandler):
                self._handlers[name] = GravacOptimizerStateHandler(handler.value)

    def reset(self):
        for handler in self._handlers.values():
            if isinstance(handler, GravacOptimizerStateHandler):
                handler.reset()
        super().reset()
