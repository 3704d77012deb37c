"""PyTorch Lightning: horovod_gravac's DDP comm hook under ``DDPStrategy``
(``pip install "horovod_gravac[lightning]"``; ``import horovod_gravac`` does not import this).

::

    import horovod_gravac as hg
    from horovod_gravac.lightning import GravacCallback
    from pytorch_lightning.strategies import DDPStrategy

    state = hg.ddp.GravacState(process_group=None, compressor=hg.TopKCompressor,
                               controller=hg.GraVAC(theta_min=10, theta_max=1000, window=500))
    trainer = pl.Trainer(strategy=DDPStrategy(ddp_comm_state=state, ddp_comm_hook=hg.ddp.gravac_hook),
                         callbacks=[GravacCallback(state)], ...)

The state is built before ``fit()`` creates the process group; it joins the group at the
hook's first call.  :class:`GravacCallback` does three things Lightning does not:

* it registers the hook on the CPU: ``DDPStrategy`` registers ``ddp_comm_hook`` on CUDA
  devices only, so with Gloo on the CPU the hook would silently not run.  Where the strategy
  registered it already, the callback leaves it as it is (and with ``strategy="ddp"`` it
  registers it itself);
* it logs :meth:`GravacState.metrics` (``gravac/cf``, ``gravac/bytes_sent``, ...) with
  ``pl_module.log_dict`` after each step that synchronised gradients, to the Trainer's
  logger (``log_every_n_steps`` applies; the logger writes rank 0's numbers);
* it keeps the hook's state in Lightning's checkpoints: its ``state_dict()`` is
  :class:`horovod_gravac.ddp.AllRanks`' (every rank's residuals, gathered into rank 0's
  checkpoint) and ``Trainer.fit(ckpt_path=...)`` gives each rank its own back, so a resumed
  run continues where the checkpoint was written.

Works with ``pytorch_lightning`` (the extra installs it) and, where only the unified
``lightning`` package is installed, with ``lightning.pytorch``.
"""
from typing import Optional

from torch.nn.parallel import DistributedDataParallel

from .ddp import AllRanks, GravacState, gravac_hook

try:
    import pytorch_lightning as pl
    from pytorch_lightning.utilities import rank_zero_warn
except ImportError:   # the unified package only
    try:
        import lightning.pytorch as pl
        from lightning.pytorch.utilities import rank_zero_warn
    except ImportError as exc:
        raise ImportError("horovod_gravac.lightning needs PyTorch Lightning: "
                          "pip install 'horovod_gravac[lightning]'") from exc

__all__ = ["GravacCallback"]


class GravacCallback(pl.Callback):
    """Registers, logs and checkpoints a :class:`horovod_gravac.ddp.GravacState` in a
    Lightning Trainer (see the module docstring).

    Args:
        state: the hook's state, the one given to ``DDPStrategy(ddp_comm_state=...)``.
        log: log ``state.metrics(prefix)`` after every synchronising step.
        prefix: of the logged names (``"gravac/"``: ``gravac/cf``, ``gravac/bytes_sent``, ...).
        prog_bar: also show them in the progress bar.
        checkpoint: keep the hook's state in the Trainer's checkpoints.
    """

    def __init__(self, state: GravacState, *, log: bool = True, prefix: str = "gravac/", prog_bar: bool = False,
                 checkpoint: bool = True):
        if not isinstance(state, GravacState):
            raise TypeError(f"GravacCallback takes a horovod_gravac.ddp.GravacState, got {state!r}")
        self.state = state
        self.log = log
        self.prefix = prefix
        self.prog_bar = prog_bar
        self.checkpoint = checkpoint
        self._all_ranks = AllRanks(state)
        self._logged: Optional[dict] = None

    def on_fit_start(self, trainer, pl_module) -> None:
        model = trainer.strategy.model
        if not isinstance(model, DistributedDataParallel):
            rank_zero_warn(f"GravacCallback: the Trainer's model is a {type(model).__name__}, not "
                           f"DistributedDataParallel, so the GraVAC hook does not run (use DDPStrategy)")
            return
        registered = getattr(model, "_comm_hooks", None)   # (hook, state) pairs, torch >= 2.1
        if registered is not None:
            if any(state is self.state for _, state in registered):
                return   # DDPStrategy registered it (CUDA)
            if registered:
                raise RuntimeError(f"GravacCallback: DDP has another comm hook already ({registered[0][0]!r}); "
                                   f"give DDPStrategy this callback's state and hg.ddp.gravac_hook")
        model.register_comm_hook(self.state, gravac_hook)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        stats = self.state.stats
        if not self.log or not stats or stats is self._logged or not (trainer.loggers or self.prog_bar):
            return   # no step yet, no synchronising step since the last log (no_sync), or nowhere to log
        self._logged = stats
        pl_module.log_dict(self.state.metrics(self.prefix), on_step=True, on_epoch=False, prog_bar=self.prog_bar,
                           logger=True, batch_size=1)

    def state_dict(self) -> dict:
        """Every rank's hook state (a collective: Lightning calls it on every rank)."""
        return self._all_ranks.state_dict() if self.checkpoint else {}

    def load_state_dict(self, state_dict: dict) -> None:
        if self.checkpoint and state_dict:
            self._all_ranks.load_state_dict(state_dict)
