"""Checkpoint checks for ``horovod_gravac.DistributedOptimizer`` (pure: no Horovod).

``optimizer.state_dict()["gravac"]`` (and ``optimizer.gravac_state_dict()``) carries,
besides the controller state, the step index and this rank's residuals:

- ``meta``: what the state was written for (:func:`describe`): the format version, the
  controller's type and settings (``controller.config()``), the compressor (its repr,
  as in the start-up check), the world size, the rank, and the parameter layout
  (name, shape, dtype of every trainable parameter, in the optimizer's order);
- ``residual_crc32``: a CRC-32 of each residual's bytes (and ``velocity_crc32``,
  ``accumulated_crc32`` for the momentum-correction velocities and Accordion's interval
  sums, which are per-rank buffers too).

``optimizer.load_state_dict`` / ``load_gravac_state_dict`` compare ``meta`` with the
optimizer that loads it (:func:`check_compatible`) and verify every residual's
checksum (:func:`verify_residuals`); any difference raises ``ValueError`` naming it.
States written before velocities and interval sums were saved load as before.

Residuals, velocities, interval sums and PowerSGD's warm starts are saved in their
bucket's dtype: float64 for float64 parameters (they round-trip bit for bit), float32
otherwise.  A state written before float64 parameters kept float64 state holds float32
buffers for them; it loads, each buffer widened to float64 (exact: the loaded values are
the saved ones), and training goes on in float64.

Loading a state that was written for another rank or world size is refused, because the
residuals (the part of the gradient this rank has not sent yet) belong to the rank that
wrote them: loading rank 0's residuals on every rank would send rank 0's leftovers N
times.  To load such a state on purpose, re-target it explicitly::

    from horovod_gravac import checkpoint
    state = checkpoint.load(f"ckpt.rank0.pt")                 # every rank reads rank 0's file
    state["optimizer"] = checkpoint.retarget(state["optimizer"], rank=hvd.rank(),
                                             world_size=hvd.size())
    opt.load_state_dict(state["optimizer"])                     # residuals start from zero

:func:`retarget` drops the residuals, velocities and interval sums (they start from zero, as after
``horovod_gravac.elastic.reset_for_new_world``) and records the new rank and world
size.  ``retarget(..., controller=True)`` also drops the controller state, for a
deliberate change of controller or controller settings: the loading optimizer then
keeps its own, freshly built controller (the step index is kept).

:func:`load` wraps ``torch.load`` so that a missing, truncated or foreign file gives an
error naming the file and the problem.
"""
from __future__ import annotations

import copy
import os
import zlib
from typing import Iterable, List, Optional, Tuple

import torch

#: Version of the ``meta`` record (raise it when its meaning changes).
FORMAT_VERSION = 1

#: The fields of ``meta`` that must match, in the order they are checked.
FIELDS = ("controller", "compressor", "parameters", "world_size", "rank")

_RETARGET_HINT = ("To load it anyway, re-target it explicitly: "
                  "horovod_gravac.checkpoint.retarget(state, rank=hvd.rank(), world_size=hvd.size()) "
                  "(drops the residuals){extra}; see horovod_gravac/checkpoint.py and the README.")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded (unreadable, truncated, foreign or corrupted)."""


def describe(controller_config: dict, compressor: str, world_size: int, rank: int,
             parameters: Iterable[Tuple[str, tuple, str]]) -> dict:
    """The ``meta`` record of a GraVAC state: what it was written for."""
    return {"format": FORMAT_VERSION, "controller": dict(controller_config),
            "compressor": str(compressor), "world_size": int(world_size), "rank": int(rank),
            "parameters": [(str(n), tuple(int(d) for d in shape), str(dtype))
                           for n, shape, dtype in parameters]}


def optimizer_meta(optimizer, rank: int) -> dict:
    """``meta`` for a ``horovod_gravac.DistributedOptimizer`` on ``rank``: its controller's
    settings, its compressor (repr at CF 10, as in the start-up check), its world size and
    its trainable parameters (name, shape, dtype) in the optimizer's order."""
    names = {id(p): n for n, p in optimizer.bucketed_parameters()}
    layout = [(names[id(p)], tuple(p.shape), str(p.dtype))
              for g in optimizer.param_groups for p in g["params"] if id(p) in names]
    return describe(optimizer.controller.config(), repr(optimizer.new_compressor(10.0)),
                    optimizer.world_size, rank, layout)


def gravac_state(controller, step: int, memory, interval, powersgd, buckets, meta: dict,
                 coherence=None) -> dict:
    """``optimizer.gravac_state_dict()``: the controller's state, the step index and this
    rank's buffers (by parameter name) with their checksums and ``meta``; ``coherence``: the
    encoder's ``CoherenceSampler``, whose samples of the last gradient a resumed run needs to
    read the coherence of its first step as the uninterrupted run does."""
    residuals = memory.state_dict(buckets)
    accumulated = interval.state_dict(buckets)
    return {"controller": controller.state_dict(), "residuals": residuals["residuals"],
            "coherence_samples": coherence.state_dict() if coherence is not None else {},
            "velocities": residuals["velocities"], "accumulated": accumulated,
            "step": step,
            "lowrank_q": powersgd.state_dict(),
            "residual_crc32": residual_checksums(residuals["residuals"]),
            "velocity_crc32": residual_checksums(residuals["velocities"]),
            "accumulated_crc32": residual_checksums(accumulated),
            "meta": meta}


def load_controller_state(state: dict, meta: dict, controller) -> int:
    """Check ``state`` against ``meta`` (the loading optimizer's), load the controller's
    part (left as it was if that fails) and return the step index to resume at."""
    if not isinstance(state, dict) or "residuals" not in state or "step" not in state:
        raise CheckpointError(
            f"horovod_gravac: not a GraVAC optimizer state (keys: "
            f"{sorted(state) if isinstance(state, dict) else type(state).__name__})")
    check_compatible(state.get("meta"), meta)
    verify_residuals(state)
    if state["controller"] is not None:   # None: retarget(controller=True), keep ours
        fresh = copy.deepcopy(controller.state_dict())
        try:
            controller.load_state_dict(state["controller"])
        except (KeyError, TypeError, ValueError) as exc:
            controller.load_state_dict(fresh)
            raise CheckpointError(
                f"horovod_gravac: the checkpoint's controller state does not fit "
                f"{controller!r} ({type(exc).__name__}: {exc}); it was written for another "
                f"controller. horovod_gravac.checkpoint.retarget(state, controller=True) keeps "
                f"this optimizer's own controller instead") from exc
    return int(state["step"])


def load_rank_buffers(state: dict, memory, interval, powersgd, buckets, coherence=None) -> None:
    """This rank's buffers from ``state``; each part loads its own, and states written
    before velocities and interval sums were saved leave those as they are."""
    powersgd.load_state_dict(state.get("lowrank_q", {}))
    if coherence is not None:
        coherence.load_state_dict(state.get("coherence_samples", {}))
    memory.load_state_dict(state, buckets)
    if "accumulated" in state:
        interval.load_state_dict(state["accumulated"], buckets)


def crc32(tensor: torch.Tensor) -> int:
    """CRC-32 of a tensor's bytes (in memory order, on the host)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return 0
    return zlib.crc32(t.view(torch.uint8).numpy())


def residual_checksums(residuals: dict) -> dict:
    return {name: crc32(t) for name, t in residuals.items()}


#: The per-rank buffers of a state, by parameter name: (key, checksum key, what one is).
PER_RANK = (("residuals", "residual_crc32", "residual"),
            ("velocities", "velocity_crc32", "momentum-correction velocity"),
            ("accumulated", "accumulated_crc32", "Accordion interval sum"))


def verify_residuals(state: dict) -> None:
    """Raise ``CheckpointError`` (a ``ValueError``) when a residual's (velocity's, interval
    sum's) bytes do not match the checksum written with it, or one has no checksum."""
    for key, crc_key, what in PER_RANK:
        sums = state.get(crc_key)
        if sums is None:
            continue   # written before these checksums existed (see check_compatible)
        buffers = state.get(key, {})
        missing = sorted(set(buffers) ^ set(sums))
        if missing:
            raise CheckpointError(f"horovod_gravac: checkpoint {key} and their checksums do not "
                                  f"match up: {_short(missing)} (a hand-edited state?)")
        for name, t in buffers.items():
            got = crc32(t)
            if got != sums[name]:
                raise CheckpointError(
                    f"horovod_gravac: checkpoint {what} of parameter {name!r} is corrupted: CRC-32 "
                    f"{got:#010x}, written as {sums[name]:#010x}. The file was damaged after it was "
                    f"written; use another checkpoint (or retarget(...) to drop the residuals).")


def check_compatible(saved: Optional[dict], current: dict) -> None:
    """Raise ``CheckpointError`` (a ``ValueError``) naming every field in which the state's
    ``meta`` (``saved``) differs from the loading optimizer's (``current``).

    ``saved`` None (a state written before this check existed) is accepted as is."""
    if saved is None:
        return
    if not isinstance(saved, dict) or saved.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"horovod_gravac: checkpoint metadata has format "
                              f"{_short(saved.get('format') if isinstance(saved, dict) else saved)}, "
                              f"this version reads format {FORMAT_VERSION}")
    fields = [field for field in FIELDS
              if not (field == "controller" and saved.get(field) is None)   # retarget(controller=True)
              and _normalise(field, saved.get(field)) != _normalise(field, current[field])]
    if not fields:
        return
    problems = [_difference(field, saved.get(field), current[field]) for field in fields]
    if "parameters" in fields or "compressor" in fields:
        advice = ("The model or the compressor differs: this checkpoint belongs to another "
                  "training setup and cannot be re-targeted.")
    else:
        extra = ", with controller=True to keep this optimizer's own controller" \
            if "controller" in fields else ""
        advice = _RETARGET_HINT.format(extra=extra)
    raise CheckpointError("horovod_gravac: this checkpoint was written for a different optimizer: "
                          + "; ".join(problems) + ". " + advice)


def retarget(state: dict, rank: Optional[int] = None, world_size: Optional[int] = None,
             controller: bool = False) -> dict:
    """A copy of an optimizer state dict (``opt.state_dict()``) or of its ``"gravac"`` part,
    made loadable on ``rank`` of ``world_size`` ranks: this rank's residuals (velocities,
    interval sums) are dropped (they start from zero) and ``meta`` records the new rank and world size.

    ``controller=True`` also drops the controller state and its recorded settings, so an
    optimizer with another controller (or other controller settings) can load it; it then
    keeps its own controller state.  The step index is kept."""
    outer = dict(state)
    inner_key = "gravac" if "gravac" in outer else None
    gravac = dict(outer[inner_key]) if inner_key else outer
    if "residuals" not in gravac:
        raise CheckpointError("horovod_gravac: retarget() needs an optimizer state dict "
                              "(opt.state_dict()) or its 'gravac' part")
    for key, crc_key, _ in PER_RANK:
        if key in gravac or key == "residuals":
            gravac[key], gravac[crc_key] = {}, {}
    if "coherence_samples" in gravac:   # this rank's last gradient, too
        gravac["coherence_samples"] = {}
    meta = copy.deepcopy(gravac.get("meta")) if gravac.get("meta") is not None else None
    if meta is not None:
        if rank is not None:
            meta["rank"] = int(rank)
        if world_size is not None:
            meta["world_size"] = int(world_size)
        if controller:
            meta["controller"] = None   # matches any controller
    if controller:
        gravac["controller"] = None
    gravac["meta"] = meta
    if inner_key:
        outer[inner_key] = gravac
        return outer
    return gravac


def load(path, map_location="cpu", weights_only: bool = False):
    """``torch.load(path)`` with errors that name the file and the problem.

    A missing file, a truncated or damaged file, or a file that is not a torch checkpoint
    raises :class:`CheckpointError` (a ``ValueError``) instead of torch's bare
    ``OSError: [Errno 22] Invalid argument`` or ``UnpicklingError``.  ``weights_only``
    defaults to False because an optimizer state holds plain Python objects (controller
    settings); only load files you trust."""
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise CheckpointError(f"horovod_gravac: cannot read checkpoint {path!r}: {exc.strerror or exc}") from exc
    if size == 0:
        raise CheckpointError(f"horovod_gravac: checkpoint {path!r} is empty (0 bytes); "
                              f"the save was probably interrupted")
    with open(path, "rb") as f:
        magic = f.read(4)
    zip_format = magic == b"PK\x03\x04"
    legacy = magic[:1] == b"\x80"   # a pickle (torch's pre-1.6 format)
    if not zip_format and not legacy:
        raise CheckpointError(f"horovod_gravac: {path!r} ({size} bytes) is not a torch checkpoint "
                              f"(starts with {magic!r}, not a zip archive or pickle)")
    try:
        return torch.load(path, map_location=map_location, weights_only=weights_only)
    except Exception as exc:   # torch raises OSError, RuntimeError, EOFError, UnpicklingError...
        truncated = zip_format and not _has_zip_end(path, size)
        what = ("is truncated (the zip archive has no end record; the save was probably "
                "interrupted or the copy is incomplete)" if truncated else
                f"could not be read: {type(exc).__name__}: {exc}")
        raise CheckpointError(f"horovod_gravac: checkpoint {path!r} ({size} bytes) {what}") from exc


# -- helpers ---------------------------------------------------------------------------
def _has_zip_end(path: str, size: int) -> bool:
    """Whether the file ends with a zip end-of-central-directory record (within the
    last 64 KiB + 22 bytes, where the format puts it)."""
    with open(path, "rb") as f:
        f.seek(max(0, size - 65557))
        return b"PK\x05\x06" in f.read()


# GraVAC settings added after checkpoints were first written, with the value that reproduces
# how a controller behaved before the setting existed: a checkpoint without one compares as if
# it held that value.
_GRAVAC_SETTINGS_ADDED = {"split_rungs": False}


def _normalise(field, value):
    if field == "parameters" and value is not None:
        return [(n, tuple(s), str(d)) for n, s, d in value]
    if field == "controller" and isinstance(value, dict) and value.get("type") == "GraVAC":
        # coherence_max: "predictive" held nothing before it existed (1.0); the other rule sets
        # do not read it, so whatever they stored compares equal.
        value = {**_GRAVAC_SETTINGS_ADDED, "coherence_max": 1.0, **value}
        if value.get("variant") != "predictive":
            value["coherence_max"] = None
        return value
    return value


def _difference(field, saved, current) -> str:
    if field == "controller":
        return (f"controller: the checkpoint's is {_controller_str(saved)}, this optimizer's is "
                f"{_controller_str(current)}")
    if field == "compressor":
        return f"compressor: {saved} in the checkpoint, {current} here"
    if field in ("world_size", "rank"):
        what = {"world_size": "world size", "rank": "rank"}[field]
        note = (" (its residuals are that rank's own)" if field == "rank" else "")
        return f"{what}: written by {what} {saved}{note}, loaded on {what} {current}"
    return f"parameters: {_layout_difference(saved or [], current)}"


def _controller_str(config) -> str:
    if not isinstance(config, dict):
        return repr(config)
    args = ", ".join(f"{k}={v!r}" for k, v in config.items() if k != "type")
    return f"{config.get('type', '?')}({args})"


def _layout_difference(saved: List[tuple], current: List[tuple]) -> str:
    saved = _normalise("parameters", saved)
    current = _normalise("parameters", current)
    s_names, c_names = [p[0] for p in saved], [p[0] for p in current]
    only_saved = [n for n in s_names if n not in set(c_names)]
    only_here = [n for n in c_names if n not in set(s_names)]
    if only_saved or only_here:
        return (f"names differ (only in the checkpoint: {_short(only_saved)}; only here: "
                f"{_short(only_here)})")
    here = {p[0]: p for p in current}
    for p in saved:
        q = here[p[0]]
        if p[1] != q[1]:
            return f"{p[0]!r} has shape {p[1]} in the checkpoint, {q[1]} here"
        if p[2] != q[2]:
            return f"{p[0]!r} has dtype {p[2]} in the checkpoint, {q[2]} here"
    return "the order of the parameters differs"


def _short(x, limit=200) -> str:
    s = repr(x) if not isinstance(x, str) else x
    return s if len(s) <= limit else s[:limit] + "..."
