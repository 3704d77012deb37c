"""Data sets made on the spot, offline and the same on every machine: large enough (tens of
thousands of examples, thousands of test examples) that one test example moves accuracy by a
hundredth of a point, not by a quarter as the 360 digits of the 8x8 set do.

* ``shapes``: 16x16 colour images of ten shapes (disc, ring, square, frame, triangle, cross,
  X, diamond, horizontal bar, vertical bar) at random positions and sizes, each in a random
  colour on a random colour gradient, with clutter (a smaller shape of another class) and
  pixel noise.  50,000 training and 10,000 test images, drawn from fixed seeds.
* ``stdlib-chars``: characters of the Python standard library's own sources (which ship with
  every Python), for next-character prediction: the modules listed in ``STDLIB_MODULES``,
  split by module into training and test text.
* ``waves``: noisy 1D signals of 64 samples in ten classes (sine, square and sawtooth waves,
  each slow or fast; rising and falling chirps; bursts of pulses; an amplitude-modulated
  tone), with random amplitude, phase, offset, trend, a weak distractor tone and Gaussian
  noise.  Slow waves have 2-4.5 cycles, fast ones 5-8, and the noise blurs that border, so
  the task keeps rewarding training: no model separates every signal.  50,000 training and
  10,000 test signals, drawn from fixed seeds in well under a second.
"""
from __future__ import annotations

import math
import os
import sysconfig
from typing import List, Tuple

import torch

from .images import ImageData

SHAPES = ("disc", "ring", "square", "frame", "triangle", "cross", "x", "diamond", "hbar", "vbar")
SHAPES_SIZE = 16
SHAPES_TRAIN, SHAPES_TEST = 50_000, 10_000


def _sdf(kind: int, dx: torch.Tensor, dy: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Signed distance (negative inside, in units of the half-size r) of shape ``kind`` at
    offsets (dx, dy) from its centre; ``t``: the stroke's half-width, also in units of r."""
    name = SHAPES[kind]
    if name in ("disc", "ring"):
        d = torch.sqrt(dx * dx + dy * dy) - 1.0
        return d if name == "disc" else (d + t).abs() - t
    if name in ("square", "frame"):
        d = torch.maximum(dx.abs(), dy.abs()) - 1.0
        return d if name == "square" else (d + t).abs() - t
    if name == "triangle":   # apex up, base at the bottom
        return torch.maximum(dy - 0.8, (dx.abs() - 0.5 * (dy + 1.0)) * 0.9)
    if name == "cross":
        return torch.minimum(torch.maximum(dx.abs() - t, dy.abs() - 1.0),
                             torch.maximum(dy.abs() - t, dx.abs() - 1.0))
    if name == "x":
        return torch.maximum(torch.minimum((dx - dy).abs(), (dx + dy).abs()) / math.sqrt(2) - t,
                             torch.maximum(dx.abs(), dy.abs()) - 1.0)
    if name == "diamond":
        return dx.abs() + dy.abs() - 1.0
    if name == "hbar":
        return torch.maximum(dy.abs() - 1.6 * t, dx.abs() - 1.0)
    return torch.maximum(dx.abs() - 1.6 * t, dy.abs() - 1.0)   # vbar


def _shape_masks(kind: torch.Tensor, cx, cy, r, thick, size: int) -> torch.Tensor:
    """Soft masks (N, size, size) in [0, 1] of shape ``kind`` (indices into ``SHAPES``) centred
    at (cx, cy) with half-size r and stroke half-width ``thick`` (all tensors of N),
    antialiased over a pixel."""
    coords = torch.arange(size, dtype=torch.float32) + 0.5
    out = torch.empty(kind.numel(), size, size)
    for k in range(len(SHAPES)):
        idx = torch.nonzero(kind == k).view(-1)
        if not idx.numel():
            continue
        rr = r[idx].view(-1, 1, 1)
        dx = (coords.view(1, 1, size) - cx[idx].view(-1, 1, 1)) / rr
        dy = (coords.view(1, size, 1) - cy[idx].view(-1, 1, 1)) / rr
        d = _sdf(k, dx, dy, (thick[idx]).view(-1, 1, 1) / rr)
        out[idx] = torch.clamp(0.5 - d * rr, 0.0, 1.0)   # distance in pixels -> coverage
    return out


def make_shapes(n: int, seed: int, size: int = SHAPES_SIZE) -> Tuple[torch.Tensor, torch.Tensor]:
    """``n`` images (uint8, N x 3 x size x size) and labels, a pure function of ``seed``."""
    g = torch.Generator().manual_seed(seed)
    u = lambda *shape: torch.rand(*shape, generator=g)   # noqa: E731
    labels = torch.randint(0, len(SHAPES), (n,), generator=g)
    # background: a random colour with a random linear gradient
    base = u(n, 3, 1, 1)
    grad_dir = u(n, 1) * 2 * math.pi
    coords = (torch.arange(size, dtype=torch.float32) + 0.5) / size - 0.5
    ramp = (torch.cos(grad_dir).view(-1, 1, 1) * coords.view(1, 1, size)
            + torch.sin(grad_dir).view(-1, 1, 1) * coords.view(1, size, 1))
    img = (base + (u(n, 3, 1, 1) - 0.5) * 0.8 * ramp.unsqueeze(1)).clamp(0, 1)
    # clutter: a smaller shape of another class, drawn first
    clutter_kind = (labels + 1 + torch.randint(0, len(SHAPES) - 1, (n,), generator=g)) % len(SHAPES)
    px = size / 24.0   # sizes below are in pixels of a 24-pixel image
    cr = (2.0 + 2.0 * u(n)) * px
    cmask = _shape_masks(clutter_kind, 2 * px + u(n) * (size - 4 * px), 2 * px + u(n) * (size - 4 * px), cr,
                         (0.7 + 0.4 * u(n)) * px, size)
    has_clutter = (u(n) < 0.7).float().view(-1, 1, 1, 1)
    img = img * (1 - has_clutter * cmask.unsqueeze(1)) + has_clutter * cmask.unsqueeze(1) * u(n, 3, 1, 1)
    # the labelled shape
    r = (4.0 + 5.0 * u(n)) * px
    cx = r + 0.5 + u(n) * (size - 2 * r - 1)
    cy = r + 0.5 + u(n) * (size - 2 * r - 1)
    mask = _shape_masks(labels, cx, cy, r, (0.9 + 0.9 * u(n)) * px, size).unsqueeze(1)
    colour = u(n, 3, 1, 1)
    # keep the shape visible against its background: push its colour away from the background's
    colour = torch.where((colour - base).abs() < 0.25, (colour + 0.5) % 1.0, colour)
    img = img * (1 - mask) + mask * colour
    img = (img + 0.08 * torch.randn(img.shape, generator=g)).clamp(0, 1)
    return (img * 255).round().to(torch.uint8), labels


#: Bump when ``make_shapes`` changes, so that a cached copy of the old images is not used.
SHAPES_VERSION = 2


def _cached_shapes() -> Tuple[torch.Tensor, ...]:
    """The training and test images and labels, generated once per machine (about half a
    minute on one core) and kept in ``$HOROVOD_GRAVAC_CACHE`` (default
    ``~/.cache/horovod_gravac``); ranks that start together may each generate and write
    them, which is harmless: the file is written whole and renamed into place."""
    root = os.environ.get("HOROVOD_GRAVAC_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "horovod_gravac"))
    path = os.path.join(root, f"shapes-v{SHAPES_VERSION}-{SHAPES_TRAIN}-{SHAPES_TEST}.pt")
    try:
        return torch.load(path)
    except (OSError, RuntimeError, EOFError):
        pass
    data = make_shapes(SHAPES_TRAIN, seed=1) + make_shapes(SHAPES_TEST, seed=2)
    try:
        os.makedirs(root, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        torch.save(data, tmp)
        os.replace(tmp, path)
    except OSError:   # no writable cache: generate again next time
        pass
    return data


def shapes_data():
    """The ``shapes`` data set as the harness's ``ImageData`` (channel statistics from the
    training images)."""
    train_x, train_y, test_x, test_y = _cached_shapes()
    f = train_x[:5000].float().div_(255)
    mean, std = f.mean(dim=(0, 2, 3)), f.std(dim=(0, 2, 3))
    return ImageData("shapes", train_x, train_y, test_x, test_y, len(SHAPES), mean=mean, std=std,
                     augment=False, class_names=list(SHAPES))


# ----------------------------------------------------------------------------- 1D signals
WAVES = ("sine-slow", "sine-fast", "square-slow", "square-fast", "saw-slow", "saw-fast",
         "chirp-up", "chirp-down", "pulses", "am-tone")
WAVES_LENGTH = 64
WAVES_TRAIN, WAVES_TEST = 50_000, 10_000
#: The noise's standard deviation is drawn per signal from this range (amplitudes are 0.5-1.5).
WAVES_NOISE = (0.1, 0.5)


def make_waves(n: int, seed: int, length: int = WAVES_LENGTH) -> Tuple[torch.Tensor, torch.Tensor]:
    """``n`` signals (float32, N x 1 x 8 x 8: a 64-sample sequence stored as an 8x8 image,
    which is how the harness's ``cnn1d`` reads digits) and labels; a pure function of ``seed``."""
    g = torch.Generator().manual_seed(seed)

    def u(*shape):
        return torch.rand(*shape, generator=g)

    y = torch.randint(0, len(WAVES), (n,), generator=g)
    t = torch.arange(length, dtype=torch.float32).div(length).expand(n, length)
    phase = 2 * math.pi * u(n, 1)
    # Even classes are slow (2-4.5 cycles), odd ones fast (5-8).
    freq = torch.where((y % 2 == 0).view(-1, 1), 2 + 2.5 * u(n, 1), 5 + 3 * u(n, 1))
    angle = 2 * math.pi * freq * t + phase
    sine = torch.sin(angle)
    square = torch.sign(sine)
    saw = 2 * torch.remainder(angle / (2 * math.pi), 1.0) - 1
    f0, f1 = 1.5 + u(n, 1), 6 + 2 * u(n, 1)
    chirp_up = torch.sin(2 * math.pi * (f0 * t + 0.5 * (f1 - f0) * t * t) + phase)
    chirp_down = torch.sin(2 * math.pi * (f1 * t - 0.5 * (f1 - f0) * t * t) + phase)
    centres, width = u(n, 3), 0.02 + 0.03 * u(n, 1)
    pulses = 2 * torch.exp(-0.5 * ((t.unsqueeze(1) - centres.unsqueeze(2)) / width.unsqueeze(2)) ** 2).sum(1) - 0.5
    am_tone = (torch.sin(2 * math.pi * (6 + 4 * u(n, 1)) * t + phase)
               * torch.sin(math.pi * (0.5 + u(n, 1)) * t + 2 * math.pi * u(n, 1)))
    kinds = torch.stack([sine, sine, square, square, saw, saw, chirp_up, chirp_down, pulses, am_tone], 1)
    x = kinds[torch.arange(n), y] * (0.5 + u(n, 1))                    # amplitude 0.5-1.5
    x = x + (u(n, 1) - 0.5) + (u(n, 1) - 0.5) * (t - 0.5)              # offset and trend
    x = x + 0.3 * torch.sin(2 * math.pi * (1 + 9 * u(n, 1)) * t + 2 * math.pi * u(n, 1))   # distractor
    sigma = WAVES_NOISE[0] + (WAVES_NOISE[1] - WAVES_NOISE[0]) * u(n, 1)
    x = x + sigma * torch.randn(n, length, generator=g)
    return x.view(n, 1, 8, length // 8).contiguous(), y


def waves_data():
    """The ``waves`` data set as the harness's ``ImageData`` (float, scaled by the training
    signals' standard deviation)."""
    train_x, train_y = make_waves(WAVES_TRAIN, seed=1)
    test_x, test_y = make_waves(WAVES_TEST, seed=2)
    scale = train_x.std()
    return ImageData("waves", train_x / scale, train_y, test_x / scale, test_y, len(WAVES),
                     augment=False, class_names=list(WAVES))


# ----------------------------------------------------------------------------- text
#: Standard-library modules whose sources make the character corpus: large, stable, plain
#: Python; split by module so test text is never seen in training.  About 2.3M characters.
STDLIB_TRAIN = ("argparse", "ast", "collections/__init__", "configparser", "dataclasses", "datetime",
                "decimal", "_pydecimal", "difflib", "email/message", "enum", "fractions", "functools",
                "inspect", "ipaddress", "logging/__init__", "mailbox", "pathlib", "pickle", "pydoc",
                "shutil", "smtplib", "socket", "statistics", "subprocess", "tarfile", "textwrap",
                "threading", "typing", "zipfile")
STDLIB_TEST = ("calendar", "csv", "gettext", "imaplib", "optparse", "random", "string", "tempfile",
               "turtle", "uuid")
#: The characters kept (printable ASCII, newline); anything else maps to index 0.
CHARS = "\0\n" + "".join(chr(c) for c in range(32, 127))


def _read_modules(names) -> str:
    root = sysconfig.get_paths()["stdlib"]
    parts: List[str] = []
    for name in names:
        path = os.path.join(root, name + ".py")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
        except OSError:   # a module a Python build leaves out: the corpus is a little smaller
            continue
    return "\n".join(parts)


def encode_chars(text: str) -> torch.Tensor:
    table = {c: i for i, c in enumerate(CHARS)}
    return torch.tensor([table.get(c, 0) for c in text.replace("\t", "    ")], dtype=torch.int64)


def stdlib_chars() -> Tuple[torch.Tensor, torch.Tensor]:
    """(training ids, test ids) of the standard-library character corpus."""
    return encode_chars(_read_modules(STDLIB_TRAIN)), encode_chars(_read_modules(STDLIB_TEST))
