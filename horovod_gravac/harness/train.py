"""Training harness for the paper's workloads, launched under ``horovodrun``.

    horovodrun -np 2 -H localhost:2 --gloo python -m horovod_gravac.harness.train \\
        --preset digits --controller gravac --epsilon 0.9 --out runs/digits-gravac

    horovodrun -np 32 -hostfile hosts python -m horovod_gravac.harness.train \\
        --preset resnet101-cifar10 --data /data/cifar-10-batches-py \\
        --controller gravac --compressor dgc --out runs/r101-gravac

Every rank trains on its shard of the data (see :mod:`horovod_gravac.harness.data`);
gradients go through :class:`horovod_gravac.DistributedOptimizer` with the chosen
controller (dense, static CF, GraVAC, Accordion) and compressor. Rank 0 prints a
progress line (loss, CF, throughput) and writes the run directory ``--out``
(``config.json``, ``steps.jsonl``, ``eval.jsonl``, ``summary.json``; the format and its
reader are in :mod:`horovod_gravac.harness.runlog`).

An iteration's time (``iter_time``) runs from fetching the batch to having the step's
``opt.stats``: for GraVAC and Accordion that includes the wait for rank 0's decision
broadcast, which ends when the slowest rank has finished the step (a static CF's ranks
wait for each other in the next step's collective instead, also inside an iteration).
The loader fraction is the time spent producing batches (index into in-memory
tensors, normalise, augment) divided by the whole iteration time.
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F

from .. import controllers as C
from ..cf import check_cf
from ..exchange import LINK_ENV, parse_rate
from ..link_emulation import EMULATE_ENV
from . import data as gdata
from .models import MODEL_NAMES, build_model, count_parameters, detach_hidden
from .runlog import RunWriter

CONTROLLERS = ("dense", "static", "gravac", "accordion")
# --compressor name -> class name in horovod_gravac.compressors (imported when a run
# needs it: the compressors import Horovod, the parser and presets do not need it).
COMPRESSORS = {"topk": "TopKCompressor", "randomk": "RandomKCompressor", "dgc": "DGCCompressor",
               "redsync": "RedSyncCompressor", "sidco": "SIDCoCompressor",
               "powersgd": "PowerSGDCompressor"}
DATASETS = gdata.IMAGE_DATASETS + gdata.TEXT_DATASETS + gdata.FEATURE_DATASETS
DEFAULT_DATASET = {"resnet101": "cifar10", "vgg16": "cifar100", "lstm": "ptb",
                   "tinycnn": "digits", "tinylstm": "pydoc", "ngram": "pydoc-chars"}

# The paper's hyperparameters (section IV-A). Explicit flags override a preset.
PRESETS: Dict[str, Dict[str, Any]] = {
    "resnet101-cifar10": dict(model="resnet101", dataset="cifar10", batch_size=32, lr=0.1, momentum=0.9,
                              weight_decay=1e-4, lr_milestones="9000,14000", lr_gamma=0.1,
                              steps=20000, eval_every=500, compressor="dgc", theta_min=10.0,
                              theta_max=1000.0, window=500, omega=0.01, epsilon=0.7,
                              policy="exponential"),
    "vgg16-cifar100": dict(model="vgg16", dataset="cifar100", batch_size=32, lr=0.1, momentum=0.9,
                           weight_decay=5e-4, lr_milestones="", steps=20000, eval_every=500,
                           compressor="dgc", theta_min=10.0, theta_max=1000.0, window=500, omega=0.01,
                           epsilon=0.7, policy="exponential"),
    "lstm-ptb": dict(model="lstm", dataset="ptb", batch_size=20, bptt=35, lr=0.1, momentum=0.9,
                     weight_decay=1e-4, lr_milestones="", steps=20000, eval_every=500, width=1500,
                     dropout=0.5, eval_batch_size=10, compressor="dgc", theta_min=10.0,
                     theta_max=1000.0, window=500, omega=0.01, epsilon=0.7, policy="exponential"),
    # The embedded default (horovod_gravac.harness.demo): 2 ranks on two CPU cores, a few minutes.
    "digits": dict(model="tinycnn", dataset="digits", batch_size=32, lr=0.05, momentum=0.9,
                   weight_decay=1e-4, lr_milestones="", steps=1000, eval_every=100, width=16,
                   compressor="topk", cf=100.0, theta_min=10.0, theta_max=1000.0, window=100,
                   omega=0.01, epsilon=0.9, policy="exponential"),
    # Workloads for benchmarks/adaptivity.py: a VGG-like 1D CNN and a 2-layer LSTM, both on
    # the digits (read as a 64-pixel sequence and as 8 rows), ~0.9M and ~0.8M parameters, so
    # at 100 Mbit/s communication is most of a Top-k 10x step on two CPU cores.  lr x0.1 at
    # step 400 settles the final accuracy (360 test digits: one image is 0.28 pp).
    "cnn1d-digits": dict(model="cnn1d", dataset="digits", batch_size=32, lr=0.05, momentum=0.9,
                         weight_decay=1e-4, lr_milestones="400", steps=600, eval_every=25, width=64,
                         compressor="topk", theta_min=10.0, theta_max=1000.0, window=40,
                         omega=0.01, epsilon=0.7, policy="exponential"),
    "rowlstm-digits": dict(model="rowlstm", dataset="digits", batch_size=32, lr=0.1, momentum=0.9,
                           weight_decay=0.0, lr_milestones="400", steps=600, eval_every=25, width=256,
                           compressor="topk", theta_min=10.0, theta_max=1000.0, window=40,
                           omega=0.01, epsilon=0.7, policy="exponential"),
    "tinylstm-pydoc": dict(model="tinylstm", dataset="pydoc", batch_size=20, bptt=35, lr=1.0,
                           momentum=0.0, weight_decay=0.0, lr_milestones="", steps=400, eval_every=100,
                           width=64, dropout=0.2, eval_batch_size=10, clip_norm=0.5,
                           compressor="topk", theta_min=10.0, theta_max=1000.0, window=100,
                           omega=0.01, epsilon=0.9, policy="exponential"),
    # Workloads for benchmarks/adaptivity.py with tens of thousands of training examples and
    # thousands of test examples, made offline (horovod_gravac.harness.synthetic):
    # * ten procedurally drawn shapes in 16x16 colour images (50k/10k), a bottleneck ResNet with
    #   one block per stage and a 2048-unit classifier layer (1.58M parameters, 1.07M of them in
    #   the classifier; buckets of 0.5 MB);
    # * next-character prediction on the Python standard library's sources (2.2M training
    #   characters, 0.42M test), a 2-layer LSTM of 256 units with tied weights (1.08M parameters).
    "shapes-resnet": dict(model="resnet101", dataset="shapes", batch_size=32, lr=0.05, momentum=0.9,
                          weight_decay=1e-4, lr_milestones="900", steps=1200, eval_every=100, width=16,
                          blocks="1,1,1,1", head_hidden=2048, bucket_cap_mb=0.5, compressor="topk", theta_min=10.0,
                          theta_max=1000.0, window=100, omega=0.01, epsilon=0.7, policy="exponential"),
    # * ten classes of noisy 1D signals (50k/10k), read by the VGG-like 1D CNN of cnn1d-digits
    #   (1.4M parameters, one dense bucket), lr x0.1 after 900 of 1200 steps.
    "cnn1d-waves": dict(model="cnn1d", dataset="waves", batch_size=32, lr=0.05, momentum=0.9,
                        weight_decay=1e-4, lr_milestones="900", steps=1200, eval_every=50, width=64,
                        compressor="topk", theta_min=10.0, theta_max=1000.0, window=100,
                        omega=0.01, epsilon=0.7, policy="exponential"),
    "stdlib-charlstm": dict(model="tinylstm", dataset="stdlib-chars", batch_size=20, bptt=35, lr=0.2,
                            momentum=0.9, weight_decay=0.0, lr_milestones="900", steps=1200, eval_every=100,
                            width=256, dropout=0.0, eval_batch_size=100, clip_norm=1.0, compressor="topk",
                            theta_min=10.0, theta_max=1000.0, window=100, omega=0.01, epsilon=0.7,
                            policy="exponential"),
    # A workload with sparse gradients, 2 ranks on two CPU cores in about a minute per run:
    # next-character prediction on the pydoc text with a fastText-style model (hashed
    # 1..5-character contexts, 2^18 buckets x 16, summed, linear over 100 characters;
    # 4.2M parameters, of which a batch of 256 touches well under 1 %). Top-k with error
    # feedback keeps a gain of 1.0 up to CF 160 and ~0.9 at 1000, so GraVAC at epsilon 0.9
    # climbs the whole ladder, ending within 0.01 pp of dense with ~24x fewer bytes on three
    # seeds (tests/integration/test_workload_eps09.py checks one). Metric: next-character
    # accuracy on the test paragraphs (~50K positions). lr 1.0 with a x0.1 drop at step
    # 800 was chosen with dense SGD on the valid paragraphs (0.1, 0.3, 0.5, 1.0 tried).
    "ngram-pydoc-chars": dict(model="ngram", dataset="pydoc-chars", batch_size=256, lr=1.0, momentum=0.9,
                              weight_decay=0.0, lr_milestones="800", lr_gamma=0.1, steps=1000,
                              eval_every=100, width=16,
                              eval_batch_size=4096, compressor="topk", cf=100.0, theta_min=10.0,
                              theta_max=1000.0, window=100, omega=0.01, epsilon=0.9, policy="exponential"),
}

# Used when neither a flag nor the preset gives a value.
DEFAULTS: Dict[str, Any] = dict(
    model="tinycnn", dataset=None, data=None, controller="gravac", compressor="topk", cf=100.0,
    theta_min=10.0, theta_max=1000.0, epsilon=0.7, omega=0.01, window=500, policy="exponential",
    ewma_alpha=None, variant=C.DEFAULT_VARIANT, hold_windows=1, split_rungs="off", low_cf=10.0, high_cf=1000.0, accordion_threshold=0.5, accordion_interval=100, powersgd_rank=1, bucket_cap_mb=25.0,
    topk_zeros="send", steps=200, eval_every=50, batch_size=32, eval_batch_size=None, lr=0.1, momentum=0.9,
    weight_decay=1e-4, lr_milestones="", lr_gamma=0.1, warmup_steps=0, clip_norm=None,
    momentum_correction=False, local_clip_norm=None,
    bptt=35, width=None, blocks=None, head_hidden=None, num_buckets=None, dropout=None, tie_weights=None, seed=42, out=None,
    threads=None, device="auto", log_every=None, max_eval_batches=None, emulate_link=None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gravac-train", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Train a model with GraVAC (or a baseline) over Horovod. Launch under horovodrun.")
    a = p.add_argument
    # Every option defaults to None so that a preset can fill it; DEFAULTS fills the rest.
    a("--preset", choices=sorted(PRESETS), help="the paper's hyperparameters for a workload (section IV-A)")
    a("--model", choices=MODEL_NAMES, help=f"default {DEFAULTS['model']}")
    a("--dataset", choices=DATASETS, help="default: cifar10/cifar100/ptb/digits/pydoc/pydoc-chars by model")
    a("--data", help="directory with the on-disk data set (CIFAR python pickles, ptb.*.txt)")
    g = p.add_argument_group("compression")
    g.add_argument("--controller", choices=CONTROLLERS, help="default gravac")
    g.add_argument("--compressor", choices=sorted(COMPRESSORS), help="default topk")
    g.add_argument("--cf", type=float, help="static controller: compression factor (default 100)")
    g.add_argument("--cf-schedule", help="static controller: CFs by step instead of --cf, as CF@STEP,... "
                                         "(\"40@0,10@300\": 40x for steps 0-299, then 10x; CF 1 is dense)")
    g.add_argument("--theta-min", type=float, help="GraVAC: lowest CF (default 10)")
    g.add_argument("--theta-max", type=float, help="GraVAC: highest CF (default 1000)")
    g.add_argument("--epsilon", type=float, help="GraVAC: gain threshold (default 0.7, or the "
                                                 "preset's; 0.9 with --variant delivered)")
    g.add_argument("--omega", type=float, help="GraVAC: tolerance for equal gains/throughputs (0.01)")
    g.add_argument("--window", type=int, help="GraVAC: steps per candidate evaluation (500)")
    g.add_argument("--ewma-alpha", type=float, help="GraVAC: gain smoothing factor (default: the "
                                                    "paper's N/100 for N ranks)")
    g.add_argument("--policy", choices=("exponential", "geometric"), help="GraVAC scaling policy")
    g.add_argument("--variant", choices=C.VARIANTS,
                   help="GraVAC rules: Algorithm 1 as published (paper), the ladder, the gain "
                        "measured over a window on what error feedback delivered (delivered), or "
                        "the delivered gain with a step-time model that climbs in one move "
                        "(predictive); default: the library's")
    g.add_argument("--hold-windows", type=int, help="GraVAC delivered: windows a theta_min passes "
                                                    "before the rung above is tried (default 1)")
    g.add_argument("--split-rungs", choices=("on", "off"),
                   help="GraVAC ladder: measure the CFs between a rung that fails epsilon and theta_min "
                        "(default off)")
    g.add_argument("--low-cf", type=float, help="Accordion: CF in critical regimes (10)")
    g.add_argument("--high-cf", type=float, help="Accordion: CF otherwise (1000)")
    g.add_argument("--accordion-threshold", type=float, help="Accordion: relative norm change (0.5)")
    g.add_argument("--accordion-interval", type=int, help="Accordion: steps between checks (100)")
    g.add_argument("--powersgd-rank", type=int, help="PowerSGD compressor: rank (1)")
    g.add_argument("--bucket-cap-mb", type=float, help="gradient buckets of at most this many MB (25)")
    g.add_argument("--topk-zeros", choices=("send", "skip"),
                   help="Top-k compressor: a bucket with fewer nonzeros than k is topped up with zeros "
                        "(send, the paper's Top-k; default) or sends its nonzeros alone (skip: "
                        "TopKCompressor(send_zeros=False))")
    g.add_argument("--emulate-link", metavar="RATE",
                   help="make every collective also cost its bytes at RATE (e.g. 100mbit), emulated in "
                        "user space: ranks on one machine exchange at memory speed, so the CF changes no "
                        "step time there (horovod_gravac.link_emulation; default: the real link alone)")
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=int, help="training iterations (default 200)")
    t.add_argument("--eval-every", type=int, help="evaluate every N steps and at the end (50)")
    t.add_argument("--batch-size", type=int, help="per-rank batch size (32; LSTM: sequences)")
    t.add_argument("--eval-batch-size", type=int, help="evaluation batch size per rank (LSTM streams: 10)")
    t.add_argument("--lr", type=float, help="learning rate (0.1)")
    t.add_argument("--momentum", type=float, help="SGD momentum (0.9)")
    t.add_argument("--weight-decay", type=float, help="SGD weight decay (1e-4)")
    t.add_argument("--lr-milestones", help="comma-separated iterations where lr is multiplied by --lr-gamma")
    t.add_argument("--lr-gamma", type=float, help="lr factor at each milestone (0.1)")
    t.add_argument("--warmup-steps", type=int, help="linear lr warm-up over the first N steps (0)")
    t.add_argument("--clip-norm", type=float, help="clip the averaged gradient's global norm (LSTM)")
    t.add_argument("--momentum-correction", action="store_true", default=None,
                   help="DGC momentum correction (velocity in the residual; SGD itself momentum-free)")
    t.add_argument("--local-clip-norm", type=float, help="DGC local gradient clipping (per rank, per bucket)")
    t.add_argument("--bptt", type=int, help="LSTM: tokens per BPTT window (35)")
    t.add_argument("--width", type=float, help="model size knob: ResNet stem channels, VGG channel "
                                               "multiplier, LSTM units, TinyCNN channels, "
                                               "ngram embedding size")
    t.add_argument("--blocks", help="ResNet: blocks per stage, e.g. 3,4,23,3 (toy: 1,1,1,1)")
    t.add_argument("--head-hidden", type=int, help="ResNet: a hidden layer of this many units in the "
                   "classifier (default: none)")
    t.add_argument("--num-buckets", type=int, help="ngram: hash buckets of the context features "
                                                   "(embedding rows; 262144)")
    t.add_argument("--dropout", type=float, help="LSTM dropout")
    t.add_argument("--tie-weights", action="store_true", default=None, help="LSTM: tie embedding/decoder")
    t.add_argument("--seed", type=int, help="model init, data order, augmentation (42)")
    t.add_argument("--threads", type=int, help="torch threads per rank (default: cores / local ranks)")
    t.add_argument("--device", choices=("auto", "cpu", "cuda"),
                   help="auto: the rank's GPU (local rank) when CUDA is available, else the CPU")
    t.add_argument("--max-eval-batches", type=int, help="cap evaluation batches per rank (smoke tests)")
    o = p.add_argument_group("output")
    o.add_argument("--out", help="run directory (default runs/<model>-<controller>-<time>)")
    o.add_argument("--log-every", type=int, help="progress line every N steps (default steps/20)")
    return p


def resolve_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Parse flags; fill unset ones from the preset, then from DEFAULTS; validate."""
    parser = build_parser()
    args = parser.parse_args(argv)
    preset = PRESETS.get(args.preset, {}) if args.preset else {}
    variant = args.variant or preset.get("variant") or C.DEFAULT_VARIANT
    if args.epsilon is None and variant in ("delivered", "predictive"):
        # The presets' epsilon is the paper's, for the paper's per-step gain; the delivered
        # gain is another quantity, with its own default.
        args.epsilon = C.DEFAULT_EPSILON[variant]
    library_policy = args.policy is None and variant == "predictive"
    for key, default in DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, preset.get(key, default))
    if library_policy:   # the presets' policy is the paper's; "predictive" has its own
        args.policy = None
    if args.dataset is None:
        args.dataset = DEFAULT_DATASET[args.model]
    text_model = args.model in ("lstm", "tinylstm")
    if text_model != (args.dataset in gdata.TEXT_DATASETS) \
            or (args.model == "ngram") != (args.dataset in gdata.FEATURE_DATASETS):
        parser.error(f"--model {args.model} does not go with --dataset {args.dataset}")
    if args.eval_batch_size is None:
        args.eval_batch_size = 10 if text_model else 256
    try:
        args.lr_milestones = [int(m) for m in str(args.lr_milestones or "").replace(" ", "").split(",") if m]
        args.blocks = [int(b) for b in str(args.blocks).split(",")] if args.blocks else None
    except ValueError as e:
        parser.error(str(e))
    for name in ("steps", "eval_every", "batch_size", "eval_batch_size", "bptt", "window"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.num_buckets is not None:
        if args.model != "ngram":
            parser.error("--num-buckets applies to --model ngram only")
        if args.num_buckets < 1:
            parser.error("--num-buckets must be >= 1")
    if args.emulate_link is not None:
        try:
            parse_rate(args.emulate_link)
        except ValueError as e:
            parser.error(f"--emulate-link: {e}")
    if args.out is None:
        args.out = os.path.join("runs", f"{args.model}-{args.controller}-{time.strftime('%Y%m%d-%H%M%S')}")
    return args


# --------------------------------------------------------------------------- construction
def compressor_class(name: str):
    """The compressor class for a ``--compressor`` name, imported only when asked for."""
    from .. import compressors
    return getattr(compressors, COMPRESSORS[name])


def make_compressor(args) -> Callable:
    """A class or a callable ``cf -> compressor`` for the optimizer."""
    cls = compressor_class(args.compressor)
    extra = {}
    if args.compressor == "randomk":
        extra["seed"] = 1234 + args.seed        # the same on every rank: shared indices
    if args.compressor == "powersgd":
        if args.controller == "accordion":
            # Paper Table 4: rank --powersgd-rank (4) in critical regimes (low CF), rank 1 otherwise.
            low, rank = float(args.low_cf), int(args.powersgd_rank)

            def accordion_powersgd(cf):
                return cls(cf=cf, rank=rank if float(cf) == low else 1)
            return accordion_powersgd
        extra["rank"] = args.powersgd_rank
    if args.compressor == "topk" and args.topk_zeros == "skip":
        extra["send_zeros"] = False
    return functools.partial(cls, **extra) if extra else cls


class ScheduledCF(C.StaticCF):
    """A static CF that changes at given steps: which phase of a run tolerates which CF
    (``--cf-schedule``).  ``plan``: (CF, first step) pairs, the first at step 0."""

    def __init__(self, plan: List[Tuple[float, int]]):
        if not plan or plan[0][1] != 0 or any(b[1] <= a[1] for a, b in zip(plan, plan[1:])):
            raise ValueError(f"a CF schedule starts at step 0 and its steps increase, got {plan!r}")
        super().__init__(plan[0][0])
        self.plan = [(check_cf(cf, "cf"), int(at)) for cf, at in plan]

    def observe(self, obs) -> C.Decision:
        self.step += 1
        cf = [cf for cf, at in self.plan if at <= self.step][-1]   # for the step numbered self.step (0-based)
        self.cf, self.decision = cf, C.Decision(cf, cf, cf)
        return self.decision

    def config(self) -> dict:
        return {"type": "ScheduledCF", "plan": [list(p) for p in self.plan]}


def parse_cf_schedule(text: str) -> List[Tuple[float, int]]:
    """``"40@0,10@300"`` -> [(40.0, 0), (10.0, 300)]."""
    try:
        return [(float(cf), int(at)) for cf, at in (item.split("@") for item in text.replace(" ", "").split(","))]
    except ValueError:
        raise ValueError(f"--cf-schedule takes CF@STEP,..., e.g. 40@0,10@300; got {text!r}") from None


def make_controller(args):
    if args.controller == "dense":
        return C.Dense()
    if args.controller == "static":
        if getattr(args, "cf_schedule", None):
            return ScheduledCF(parse_cf_schedule(args.cf_schedule))
        return C.StaticCF(args.cf)
    if args.controller == "gravac":
        return C.GraVAC(theta_min=args.theta_min, theta_max=args.theta_max, epsilon=args.epsilon,
                        omega=args.omega, window=args.window, policy=args.policy,
                        ewma_alpha=args.ewma_alpha, batch_size=args.batch_size, variant=args.variant,
                        hold_windows=args.hold_windows, split_rungs=args.split_rungs == "on")
    if args.controller == "accordion":
        return C.Accordion(low_cf=args.low_cf, high_cf=args.high_cf, threshold=args.accordion_threshold,
                           interval=args.accordion_interval)
    raise ValueError(args.controller)


def make_optimizer(args, model: torch.nn.Module):
    """The one place the distributed optimizer is created."""
    from ..optimizer import DistributedOptimizer
    # DGC's momentum correction: the velocity lives in the residual, so the wrapped SGD
    # must be momentum-free.
    momentum_correction = args.momentum if args.momentum_correction else None
    momentum = 0.0 if args.momentum_correction else args.momentum
    base = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=momentum,
                           weight_decay=args.weight_decay)
    # Dense SGD compresses nothing: it needs no compressor.
    compressor = None if args.controller == "dense" else make_compressor(args)
    if args.emulate_link:   # the link the ranks pay for, and the one the exchange choice models
        os.environ[EMULATE_ENV] = os.environ[LINK_ENV] = str(args.emulate_link)
    opt = DistributedOptimizer(base, named_parameters=model.named_parameters(),
                               compressor=compressor, controller=make_controller(args),
                               backward_passes_per_step=1, momentum_correction=momentum_correction,
                               local_clip_norm=args.local_clip_norm, bucket_cap_mb=args.bucket_cap_mb)
    return opt, base


class LRSchedule:
    """Step-indexed learning rate: linear warm-up, then ``gamma`` at each milestone.

    ``apply(step)`` writes the lr into every param group before that step's update.
    """

    def __init__(self, base_lr: float, milestones: List[int], gamma: float, warmup: int = 0):
        self.base_lr, self.milestones, self.gamma, self.warmup = base_lr, sorted(milestones), gamma, warmup

    def lr_at(self, step: int) -> float:  # step counts from 0
        lr = self.base_lr * self.gamma ** sum(1 for m in self.milestones if step >= m)
        if self.warmup and step < self.warmup:
            lr *= (step + 1) / self.warmup
        return lr

    def apply(self, step: int, *optimizers) -> float:
        lr = self.lr_at(step)
        seen = set()
        for opt in optimizers:
            for group in getattr(opt, "param_groups", []):
                if id(group) not in seen:
                    group["lr"] = lr
                    seen.add(id(group))
        return lr


# --------------------------------------------------------------------------- output
class Progress:
    """Rank 0's progress bar: an in-place line on a terminal, one line per interval otherwise."""

    def __init__(self, total: int, every: Optional[int], enabled: bool, label: str):
        self.total, self.enabled, self.label = total, enabled, label
        self.every = every or max(1, total // 20)
        self.tty = enabled and sys.stdout.isatty()
        self.start = time.perf_counter()

    def update(self, step: int, loss: float, cf: float, throughput: float, extra: str = "") -> None:
        if not self.enabled or (not self.tty and step % self.every and step != self.total):
            return
        frac = step / self.total
        n = int(frac * 20)
        elapsed = time.perf_counter() - self.start
        eta = elapsed / max(frac, 1e-9) - elapsed
        line = (f"[{self.label}] {step:>6}/{self.total} |{'#' * n}{'.' * (20 - n)}| {100 * frac:5.1f}% "
                f"loss {loss:7.4f}  cf {cf:7.1f}x  {throughput:9.1f} samples/s  eta {eta:5.0f}s{extra}")
        if self.tty:
            sys.stdout.write("\r" + line + ("\n" if step == self.total else ""))
        else:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def message(self, text: str) -> None:
        if self.enabled:
            sys.stdout.write(("\n" if self.tty else "") + text + "\n")
            sys.stdout.flush()


# --------------------------------------------------------------------------- evaluation
def average_buffers(model: torch.nn.Module, hvd) -> None:
    """Average BatchNorm running statistics across ranks (they are never synchronised in
    training), so that every rank evaluates the same model."""
    if hvd.size() == 1:
        return
    for name, buf in model.named_buffers():
        if buf.is_floating_point():
            buf.copy_(hvd.allreduce(buf, op=hvd.Average, name=f"eval.buf.{name}"))


def evaluate_images(model, ds: gdata.ImageData, hvd, batch_size: int, max_batches=None) -> dict:
    average_buffers(model, hvd)
    model.eval()
    part = gdata.eval_shard(ds.test_x.shape[0], hvd.rank(), hvd.size())
    xs, ys = ds.test_x[part], ds.test_y[part]
    totals = torch.zeros(4, dtype=torch.float64)  # loss sum, top-1, top-5, count
    with torch.no_grad():
        for b, i in enumerate(range(0, xs.shape[0], batch_size)):
            if max_batches is not None and b >= max_batches:
                break
            x = ds.prepare(xs[i:i + batch_size], train=False)
            y = ys[i:i + batch_size]
            logits = model(x)
            totals[0] += F.cross_entropy(logits, y, reduction="sum").item()
            top = logits.topk(min(5, logits.shape[1]), dim=1).indices
            totals[1] += (top[:, 0] == y).sum().item()
            totals[2] += (top == y[:, None]).any(dim=1).sum().item()
            totals[3] += y.numel()
    model.train()
    totals = hvd.allreduce(totals, op=hvd.Sum, name="eval.images")
    n = max(1.0, totals[3].item())
    return {"test_loss": totals[0].item() / n, "accuracy": totals[1].item() / n,
            "top5": totals[2].item() / n, "samples": int(totals[3].item())}


def evaluate_lm(model, streams: torch.Tensor, hvd, bptt: int, max_batches=None) -> dict:
    """Perplexity and next-token accuracy over this rank's evaluation streams (hidden state
    sized for the eval batch)."""
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)   # loss sum, tokens, correct predictions
    hidden = model.init_hidden(streams.size(1))
    with torch.no_grad():
        for b, (x, y) in enumerate(gdata.BPTTStream.windows(streams, bptt)):
            if max_batches is not None and b >= max_batches:
                break
            out, hidden = model(x, hidden)
            totals[0] += F.cross_entropy(out.view(-1, out.size(-1)), y.reshape(-1), reduction="sum").item()
            totals[1] += y.numel()
            totals[2] += (out.argmax(-1) == y).sum().item()
    model.train()
    totals = hvd.allreduce(totals, op=hvd.Sum, name="eval.lm")
    loss = totals[0].item() / max(1.0, totals[1].item())
    return {"test_loss": loss, "perplexity": math.exp(min(loss, 50.0)), "tokens": int(totals[1].item()),
            "accuracy": 100.0 * totals[2].item() / max(1.0, totals[1].item())}


# --------------------------------------------------------------------------- training
def _clip_and_step(opt, model, clip_norm: Optional[float]) -> None:
    """``opt.step()``, optionally clipping the *averaged* gradient first (Horovod's
    synchronize / skip_synchronize pattern)."""
    if clip_norm is None:
        opt.step()
        return
    opt.synchronize()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    with opt.skip_synchronize():
        opt.step()


def train(args) -> dict:
    import horovod.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // max(1, hvd.local_size())))
    torch.manual_seed(args.seed)
    is_root = rank == 0
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available in this torch build / on this machine")
    if args.device != "cpu" and torch.cuda.is_available():
        torch.cuda.set_device(hvd.local_rank())
        device = torch.device("cuda", hvd.local_rank())
    else:
        device = torch.device("cpu")
    log = RunWriter(args.out, is_root)
    text = args.dataset in gdata.TEXT_DATASETS

    # Data: in memory, sharded by rank.
    t0 = time.perf_counter()
    if text:
        corpus = gdata.load_text_dataset(args.dataset, args.data)
        train_stream = gdata.BPTTStream(
            gdata.batchify_for_rank(corpus.train, args.batch_size, rank, size).to(device), args.bptt)
        eval_streams = gdata.batchify_for_rank(corpus.test, args.eval_batch_size, rank, size).to(device)
        model = build_model(args.model, vocab_size=corpus.vocab_size, width=args.width,
                            dropout=args.dropout, tie_weights=args.tie_weights)
        data_info = {"vocab_size": corpus.vocab_size, "train_tokens": corpus.train.numel(),
                     "test_tokens": corpus.test.numel(),
                     "windows_per_epoch": train_stream.windows_per_epoch}
    elif args.dataset in gdata.FEATURE_DATASETS:   # hashed sparse features: batches as for images
        ds = gdata.load_feature_dataset(args.dataset, args.data, num_buckets=args.num_buckets).to(device)
        batches = gdata.ShardedBatches(ds, args.batch_size, rank, size, seed=args.seed)
        model = build_model(args.model, num_classes=ds.num_classes, width=args.width,
                            num_buckets=ds.num_buckets)
        data_info = {"num_classes": ds.num_classes, "num_buckets": ds.num_buckets,
                     "features_per_example": ds.features_per_example,
                     "train_samples": ds.train_x.shape[0], "test_samples": ds.test_x.shape[0],
                     "batches_per_epoch": batches.batches_per_epoch}
    else:
        ds = gdata.load_image_dataset(args.dataset, args.data).to(device)
        batches = gdata.ShardedBatches(ds, args.batch_size, rank, size, seed=args.seed)
        model = build_model(args.model, num_classes=ds.num_classes, width=args.width,
                            in_channels=ds.in_channels, image_size=ds.image_size, blocks=args.blocks,
                            head_hidden=args.head_hidden)
        data_info = {"num_classes": ds.num_classes, "train_samples": ds.train_x.shape[0],
                     "test_samples": ds.test_x.shape[0], "batches_per_epoch": batches.batches_per_epoch}
    load_time = time.perf_counter() - t0
    model.to(device)

    opt, base_opt = make_optimizer(args, model)
    # Same initial model everywhere; the optimizer state (momentum) starts empty on every rank.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    schedule = LRSchedule(args.lr, args.lr_milestones, args.lr_gamma, args.warmup_steps)

    config = {k: v for k, v in vars(args).items()}
    config.update({"world_size": size, "parameters": count_parameters(model), "data": data_info,
                   "data_load_seconds": load_time, "torch_threads": torch.get_num_threads(),
                   "device_used": str(device),
                   "task": "language_model" if text else "classification",
                   "controller_config": opt.controller.config()})
    log.config(config)
    label = f"{args.model}/{args.controller}"
    progress = Progress(args.steps, args.log_every, is_root, label)
    progress.message(f"[{label}] {size} ranks, {config['parameters']:,} parameters, "
                     f"data {args.dataset} loaded in {load_time:.2f}s, out {args.out}")

    totals = {"floats_sent": 0.0, "dense_floats": 0.0, "bytes_sent": 0.0, "data_time": 0.0,
              "iter_time": 0.0, "compute_comm_time": 0.0}
    cf_steps: Dict[str, int] = {}
    evals: List[dict] = []
    hidden = None
    model.train()
    wall0 = time.perf_counter()
    eval_time = 0.0
    loss_value = float("nan")

    def record_step(step, loss_value, lr, epoch, t_data, t_iter, stats):
        totals["floats_sent"] += float(stats.get("floats_sent") or 0.0)
        totals["dense_floats"] += float(stats.get("dense_floats") or 0.0)
        totals["bytes_sent"] += float(stats.get("bytes_sent") or 0.0)
        totals["data_time"] += t_data
        totals["iter_time"] += t_iter
        cf = float(stats.get("cf", 1.0) or 1.0)
        cf_steps[f"{cf:g}"] = cf_steps.get(f"{cf:g}", 0) + 1
        record = dict(stats)
        record.update({"step": step + 1, "loss": loss_value, "lr": lr, "epoch": epoch,
                       "data_time": t_data, "iter_time": t_iter})
        log.step(record)
        throughput = size * args.batch_size / t_iter if t_iter > 0 else 0.0
        progress.update(step + 1, loss_value, cf, throughput)

    # A step's opt.stats are read during the next step, after its backward pass.  Until
    # ranks agreed only at window checks (commit 1e4bb89), that read waited for the step's
    # decision broadcast, which could then overlap the next forward pass; now opt.stats is
    # complete when step() returns and the read costs nothing.  Any time it takes falls
    # inside some iteration's timer, as a static CF's wait for the slower rank falls inside
    # its next collective.
    pending = None   # (step, loss, lr, epoch, t_data, t_iter) of the step not yet recorded
    for step in range(args.steps):
        it0 = time.perf_counter()
        # -- data ------------------------------------------------------------------
        if text:
            x, y, new_epoch = next(train_stream)
            epoch = train_stream.epoch
            hidden = model.init_hidden(x.size(1)) if new_epoch or hidden is None else detach_hidden(hidden)
        else:
            x, y = next(batches)
            epoch = batches.epoch
        t_data = time.perf_counter() - it0
        # -- forward / backward / communicate / update -----------------------------
        lr = schedule.apply(step, opt, base_opt)
        if text:
            out, hidden = model(x, hidden)
            loss = F.cross_entropy(out.view(-1, out.size(-1)), y.reshape(-1))
        else:
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        if pending is not None:   # the previous step's statistics (see above)
            record_step(*pending, dict(opt.stats))
            pending = None
        _clip_and_step(opt, model, args.clip_norm)
        evaluate_now = (step + 1) % args.eval_every == 0 or step + 1 == args.steps
        # Before an evaluation (or the end), read now: the wait is still training time.
        stats = dict(opt.stats) if evaluate_now else None
        t_iter = time.perf_counter() - it0
        loss_value = loss.item()
        if stats is None:
            pending = (step, loss_value, lr, epoch, t_data, t_iter)
        else:
            record_step(step, loss_value, lr, epoch, t_data, t_iter, stats)

        # -- evaluation ------------------------------------------------------------
        if evaluate_now:
            e0 = time.perf_counter()
            if text:
                result = evaluate_lm(model, eval_streams, hvd, args.bptt, args.max_eval_batches)
            else:
                result = evaluate_images(model, ds, hvd, args.eval_batch_size, args.max_eval_batches)
            eval_time += time.perf_counter() - e0
            opt.reset_timer()   # evaluation is not iteration time
            result.update({"step": step + 1, "epoch": epoch, "wall_time": time.perf_counter() - wall0,
                           "floats_sent": totals["floats_sent"], "dense_floats": totals["dense_floats"]})
            evals.append(result)
            log.eval(result)
            metric = (f"test ppl {result['perplexity']:.2f}" if text else
                      f"test acc {100 * result['accuracy']:.2f}% top5 {100 * result['top5']:.2f}%")
            progress.message(f"[{label}] step {step + 1}: {metric}")

    wall = time.perf_counter() - wall0
    if not math.isfinite(loss_value):
        progress.message(f"[{label}] warning: the training loss is {loss_value}")
    summary = build_summary(args, evals, totals, cf_steps, wall, eval_time, load_time, size, text)
    controller = opt.controller
    # Only the adaptive controllers keep these: GraVAC a compression-throughput table and
    # a history of its windows, Accordion a history of its checks.
    table = controller.throughput.compression if isinstance(controller, C.GraVAC) else None
    if table:
        summary["compression_throughput_table"] = {f"{k:g}": v for k, v in table.items()}
    if isinstance(controller, (C.GraVAC, C.Accordion)) and controller.history:
        summary["controller_history"] = list(controller.history)
    log.summary(summary)
    log.close()
    if is_root:
        final = summary["final"]
        metric = (f"ppl {final.get('perplexity', float('nan')):.2f}" if text
                  else f"acc {100 * final.get('accuracy', float('nan')):.2f}%")
        ratio = summary["floats_sent_vs_dense"]
        progress.message(
            f"[{label}] done: {metric}, floats sent {ratio if ratio is None else f'{ratio:.4f}'} of dense, "
            f"{wall:.1f}s (loader {100 * summary['loader_fraction']:.2f}% of step time)")
    return summary


def build_summary(args, evals, totals, cf_steps, wall, eval_time, load_time, size, text) -> dict:
    final = evals[-1] if evals else {}
    if text:
        best = min(evals, key=lambda e: e["perplexity"]) if evals else {}
    else:
        best = max(evals, key=lambda e: e["accuracy"]) if evals else {}
    dense = totals["dense_floats"]
    return {
        "model": args.model, "dataset": args.dataset, "controller": args.controller,
        "compressor": args.compressor, "world_size": size, "steps": args.steps,
        "topk_zeros": args.topk_zeros if args.compressor == "topk" else None,
        "final": final, "best": best,
        "floats_sent": totals["floats_sent"], "dense_floats": dense,
        "floats_sent_vs_dense": totals["floats_sent"] / dense if dense > 0 else None,
        "compression_vs_dense": dense / totals["floats_sent"] if totals["floats_sent"] > 0 else None,
        "bytes_sent": totals["bytes_sent"],
        "wall_seconds": wall, "train_seconds": totals["iter_time"], "eval_seconds": eval_time,
        "data_load_seconds": load_time,
        "loader_seconds": totals["data_time"],
        "loader_fraction": totals["data_time"] / totals["iter_time"] if totals["iter_time"] > 0 else 0.0,
        "mean_step_seconds": totals["iter_time"] / max(1, args.steps),
        "steps_per_cf": cf_steps,
    }


def main(argv: Optional[List[str]] = None) -> int:
    args = resolve_args(argv)
    try:
        train(args)
    except gdata.DatasetNotFound as e:   # say what to put where, without a traceback
        print(f"gravac-train: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
