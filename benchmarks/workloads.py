#!/usr/bin/env python3
"""A family of training workloads drawn from a seed: work an adaptive rule was not tuned on.

``draw(seed)`` picks a model family, its width and depth, a data set, the batch size, the
optimizer (SGD with momentum, Adam or AdamW), the learning rate and its schedule, and the
number of steps, all as a pure function of the seed::

    python -m benchmarks.workloads show 0 1 2 1000      # what seeds 0, 1, 2 and 1000 draw
    python -m benchmarks.workloads show --range 0-29    # a table of the development draws

Families (``FAMILIES``):

* ``cnn1d``        a VGG-like 1D CNN on the ``waves`` signals (one large dense bucket);
* ``cnn2d``        a 2D CNN on the ``shapes`` images, with small buckets (several per step);
* ``mlp``          a multilayer perceptron on the flattened ``waves`` or ``shapes``;
* ``rnn``          a character LSTM or GRU language model on the standard library's sources;
* ``transformer``  a small causal transformer on the same characters;
* ``embedding``    a fastText-style next-character classifier: an embedding table of hashed
                   character contexts of CPython's pydoc text (``pydoc-chars``), summed, then
                   a linear layer; a batch touches few of its rows.

Every data set is made offline (``horovod_gravac.harness.synthetic``) or read from files that
ship with Python: nothing is downloaded.  Image draws report accuracy on 10,000 test
examples; language models report perplexity on the first ``LM_EVAL_TOKENS`` test tokens.
A draw's target is dense SGD's final accuracy minus 0.5 pp, or its perplexity plus 2 %
(``benchmarks/generalization.py``).

Sizes are chosen so that a dense run of a draw takes one to a few minutes on two CPU cores,
and so that most draws are communication-bound at 100 Mbit/s (0.4-3M parameters against a
few tens of milliseconds of compute a step); a few are compute-bound, by design.

Inside a rank (launched by ``benchmarks/generalization.py``, under Horovod or
``torch.distributed``)::

    python -m benchmarks.workloads train --seed 7 --controller gravac --out runs/7/gravac
    python -m benchmarks.workloads train --seed 7 --controller topk:100 --ddp --out runs/7/ddp-topk100

``--controller`` takes ``dense``, ``topk:<CF>``, ``accordion`` (Top-k 10x/1000x),
``gravac`` (``GraVAC()`` with its defaults, the window scaled to the run) or
``gravac:<key>=<value>,...`` (settings of ``GraVAC``, e.g. ``gravac:variant=paper``); with ``--ddp`` also DDP's own hooks ``ddp-fp16`` and
``ddp-powersgd:<rank>``.  The run directory has the harness's format
(``horovod_gravac.harness.runlog``).
"""
from __future__ import annotations

import argparse
import functools
import gc
import math
import os
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

FAMILIES = ("cnn1d", "cnn2d", "mlp", "rnn", "transformer", "embedding")
SCHEDULES = ("constant", "step", "cosine", "warmup-cosine")
#: Test tokens a language model is evaluated on (the start of the test text).
LM_EVAL_TOKENS = 32768
#: Evaluations per run.
EVALS_PER_RUN = 16


@dataclass(frozen=True)
class Workload:
    """One draw.  ``arch`` holds the family's own sizes (see :func:`build_model`)."""

    seed: int
    family: str
    data: str                   # waves | shapes | stdlib-chars | pydoc-chars
    arch: Dict[str, object]
    batch_size: int             # per rank: examples, or sequences of ``seq_len`` tokens
    seq_len: Optional[int]
    optimizer: str              # sgd | adam | adamw
    lr: float
    momentum: float
    weight_decay: float
    schedule: str
    steps: int
    clip_norm: Optional[float] = None
    bucket_cap_mb: float = 25.0
    metric: str = "accuracy"    # accuracy | perplexity

    @property
    def eval_every(self) -> int:
        return max(1, self.steps // EVALS_PER_RUN)

    @property
    def window(self) -> int:
        """GraVAC's window and Accordion's interval for this run: a twelfth of the steps, as
        README.md advises."""
        return max(10, self.steps // 12)

    def lr_at(self, step: int) -> float:
        """The learning rate of step ``step`` (from 0)."""
        frac = step / self.steps
        if self.schedule == "step":
            return self.lr * (0.1 if frac >= 0.75 else 1.0)
        if self.schedule == "cosine":
            return self.lr * 0.5 * (1 + math.cos(math.pi * frac))
        if self.schedule == "warmup-cosine":
            warm = max(1, self.steps // 20)
            if step < warm:
                return self.lr * (step + 1) / warm
            return self.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / (self.steps - warm)))
        return self.lr

    def describe(self) -> str:
        arch = ",".join(f"{k}={v}" for k, v in self.arch.items())
        opt = f"{self.optimizer} lr {self.lr:.3g}" + (f" m {self.momentum}" if self.optimizer == "sgd" else "") \
            + (f" wd {self.weight_decay:g}" if self.weight_decay else "")
        seq = f"x{self.seq_len}" if self.seq_len else ""
        return (f"{self.family}({arch}) on {self.data}, batch {self.batch_size}{seq}, {opt}, "
                f"{self.schedule}, {self.steps} steps")


def _log_uniform(rng: random.Random, center: float, spread: float = 2.0) -> float:
    """``center`` times a factor drawn log-uniformly from [1/spread, spread]."""
    return center * spread ** rng.uniform(-1.0, 1.0)


def draw(seed: int) -> Workload:
    """The workload of ``seed`` (a pure function of it)."""
    rng = random.Random(f"horovod_gravac-workload-{seed}")
    family = rng.choice(FAMILIES)
    steps = rng.choice((400, 600, 800))
    schedule = rng.choice(SCHEDULES)
    clip, cap, seq_len, metric = None, 25.0, None, "accuracy"
    if family == "transformer":   # SGD trains transformers poorly: adaptive optimizers only
        optimizer = rng.choice(("adam", "adamw"))
    else:
        optimizer = rng.choice(("sgd", "sgd", "adam", "adamw"))
    if family == "cnn1d":
        data = "waves"
        arch = {"width": rng.choice((32, 48, 64)), "hidden": rng.choice((256, 512, 1024))}
        batch = rng.choice((32, 64, 128))
        lr_sgd, lr_adam = 0.05, 1e-3
    elif family == "cnn2d":
        data = "shapes"
        arch = {"width": rng.choice((16, 32, 48)), "hidden": rng.choice((256, 512))}
        batch = rng.choice((32, 64, 128))
        cap = rng.choice((0.5, 1.0))   # several buckets a step
        lr_sgd, lr_adam = 0.05, 1e-3
    elif family == "mlp":
        data = rng.choice(("waves", "shapes"))
        arch = {"width": rng.choice((512, 768, 1024)), "depth": rng.choice((2, 3, 4))}
        batch = rng.choice((64, 128, 256))
        lr_sgd, lr_adam = 0.05, 5e-4
    elif family == "rnn":
        data, metric, clip = "stdlib-chars", "perplexity", 1.0
        arch = {"cell": rng.choice(("lstm", "gru")), "hidden": rng.choice((192, 256, 320)),
                "layers": rng.choice((1, 2)), "emb": 64}
        batch, seq_len = rng.choice((32, 64)), rng.choice((16, 32, 64))
        lr_sgd, lr_adam = 0.5, 2e-3
    elif family == "transformer":
        data, metric, clip = "stdlib-chars", "perplexity", 1.0
        arch = {"d_model": rng.choice((128, 192)), "layers": rng.choice((2, 3)), "heads": 4}
        batch, seq_len = rng.choice((32, 64)), rng.choice((16, 32, 64))
        lr_sgd, lr_adam = 0.1, 1e-3
    else:   # embedding: a hashed n-gram table, most of whose rows a batch does not touch
        data = "pydoc-chars"
        buckets, dim = rng.choice(((1 << 16, 16), (1 << 17, 16), (1 << 16, 32)))
        arch = {"buckets": buckets, "dim": dim}
        batch = rng.choice((64, 128, 256))
        lr_sgd, lr_adam = 1.0, 1e-2
    if seq_len and batch * seq_len >= 2048:
        steps = 400   # the compute-bound draws: a dense run stays within a few minutes
    if optimizer == "sgd":
        lr, momentum = _log_uniform(rng, lr_sgd), 0.9
        weight_decay = rng.choice((0.0, 1e-4, 5e-4))
    else:
        lr, momentum = _log_uniform(rng, lr_adam), 0.0
        weight_decay = rng.choice((0.01, 0.05)) if optimizer == "adamw" else 0.0
    return Workload(seed=seed, family=family, data=data, arch=arch, batch_size=batch, seq_len=seq_len,
                    optimizer=optimizer, lr=round(lr, 6), momentum=momentum, weight_decay=weight_decay,
                    schedule=schedule, steps=steps, clip_norm=clip, bucket_cap_mb=cap, metric=metric)


# --------------------------------------------------------------------------- models
def build_model(w: Workload, num_classes: int = 10, in_shape: Tuple[int, ...] = (), vocab: int = 0):
    """The model of ``w`` (a ``torch.nn.Module``)."""
    from horovod_gravac.harness.models import CNN1d
    a = w.arch
    if w.family == "cnn1d":
        return CNN1d(num_classes, width=int(a["width"]), in_channels=in_shape[0],
                     length=int(math.prod(in_shape[1:])), hidden=int(a["hidden"]))
    if w.family == "cnn2d":
        return CNN2d(num_classes, int(a["width"]), in_shape[0], int(a["hidden"]))
    if w.family == "mlp":
        return MLP(int(math.prod(in_shape)), int(a["width"]), int(a["depth"]), num_classes)
    if w.family == "rnn":
        return RNNLM(vocab, str(a["cell"]), int(a["emb"]), int(a["hidden"]), int(a["layers"]))
    if w.family == "transformer":
        return TransformerLM(vocab, int(a["d_model"]), int(a["layers"]), int(a["heads"]), int(w.seq_len))
    from horovod_gravac.harness.models import HashedNGram
    return HashedNGram(int(a["buckets"]), num_classes, dim=int(a["dim"]))



class MLP(nn.Module):
    """``depth`` hidden layers of ``width`` ReLU units."""

    def __init__(self, in_dim: int, width: int, depth: int, num_classes: int):
        super().__init__()
        layers, d = [], in_dim
        for _ in range(depth):
            layers += [nn.Linear(d, width), nn.ReLU(inplace=True)]
            d = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(d, num_classes)

    def forward(self, x):
        return self.head(self.body(x.flatten(1)))

class CNN2d(nn.Module):
    """Three stages of two conv-BN-ReLU (``width``, 2x, 4x channels) with max-pools, then a
    hidden linear layer."""

    def __init__(self, num_classes: int, width: int, in_channels: int, hidden: int):
        super().__init__()
        layers, c_in = [], in_channels
        for c_out in (width, 2 * width, 4 * width):
            layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
                       nn.Conv2d(c_out, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True),
                       nn.MaxPool2d(2)]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.fc1 = nn.Linear(c_in * 2 * 2, hidden)   # 16x16 images after three pools
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(self.features(x).flatten(1))))

class RNNLM(nn.Module):
    """Embedding, an LSTM or GRU, and a linear decoder; time-major ``(seq, batch)`` ids, the
    hidden state carried across consecutive windows (``init_hidden``)."""

    def __init__(self, vocab: int, cell: str, emb: int, hidden: int, layers: int):
        super().__init__()
        self.cell, self.hidden, self.layers = cell, hidden, layers
        self.encoder = nn.Embedding(vocab, emb)
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(emb, hidden, layers)
        self.decoder = nn.Linear(hidden, vocab)

    def init_hidden(self, batch: int):
        z = next(self.parameters()).new_zeros(self.layers, batch, self.hidden)
        return (z, z.clone()) if self.cell == "lstm" else z

    def forward(self, tokens, hidden=None):
        out, hidden = self.rnn(self.encoder(tokens), hidden)
        return self.decoder(out), hidden

class TransformerLM(nn.Module):
    """A causal pre-norm transformer over windows of ``context`` tokens (no state between
    windows)."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, context: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(context, 1, d_model))
        nn.init.normal_(self.pos, 0.0, 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.decoder = nn.Linear(d_model, vocab)

    def init_hidden(self, batch: int):
        return None

    def forward(self, tokens, hidden=None):
        n = tokens.size(0)
        mask = torch.triu(torch.full((n, n), float("-inf"), device=tokens.device), diagonal=1)
        h = self.body(self.embed(tokens) + self.pos[:n], mask=mask, is_causal=True)
        return self.decoder(self.norm(h)), None

# --------------------------------------------------------------------------- data
class Data:
    """A rank's training batches and the evaluation of a model, for one workload."""

    def __init__(self, w: Workload, rank: int, size: int):
        from horovod_gravac.harness import data as gdata
        self.w, self.rank, self.size = w, rank, size
        if w.metric == "perplexity":
            corpus = gdata.load_text_dataset("stdlib-chars")
            train, test, self.vocab = corpus.train, corpus.test, corpus.vocab_size
            self.stream = gdata.BPTTStream(gdata.batchify_for_rank(train, w.batch_size, rank, size), w.seq_len)
            # Evaluation: 16 streams of the test text's start, split between the ranks.
            streams = gdata.batchify(test[:LM_EVAL_TOKENS], 16)
            self.eval_streams = streams[:, gdata.eval_shard(16, rank, size)]
            self.hidden = None
            self.num_classes, self.in_shape = 0, ()
        else:
            self.images = (gdata.load_feature_dataset(w.data, num_buckets=int(w.arch["buckets"]))
                           if w.data in gdata.FEATURE_DATASETS else gdata.load_image_dataset(w.data))
            self.batches = gdata.ShardedBatches(self.images, w.batch_size, rank, size, seed=w.seed)
            self.num_classes = self.images.num_classes
            self.in_shape = tuple(self.images.train_x.shape[1:])

    def model(self):
        return build_model(self.w, self.num_classes, self.in_shape, getattr(self, "vocab", 0))

    def loss(self, model):
        """The next training batch's loss under ``model`` (the DDP wrapper or the module)."""
        if self.w.metric == "perplexity":
            x, y, new_epoch = next(self.stream)
            inner = getattr(model, "module", model)
            if new_epoch or self.hidden is None:
                self.hidden = inner.init_hidden(x.size(1))
            elif self.hidden is not None:
                self.hidden = tuple(h.detach() for h in self.hidden) if isinstance(self.hidden, tuple) \
                    else self.hidden.detach()
            out, self.hidden = model(x, self.hidden)
            return F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
        x, y = next(self.batches)
        return F.cross_entropy(model(x), y)

    def evaluate(self, model, allreduce_sum) -> dict:
        """Test accuracy or perplexity over every rank's share (``allreduce_sum(tensor)``)."""
        from horovod_gravac.harness import data as gdata
        model.eval()
        totals = torch.zeros(3, dtype=torch.float64)   # loss sum, count, correct
        with torch.no_grad():
            if self.w.metric == "perplexity":
                hidden = model.init_hidden(self.eval_streams.size(1))
                for x, y in gdata.BPTTStream.windows(self.eval_streams, self.w.seq_len):
                    out, hidden = model(x, hidden)
                    totals[0] += F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1), reduction="sum").item()
                    totals[1] += y.numel()
                    totals[2] += (out.argmax(-1) == y).sum().item()
            else:
                ds = self.images
                part = gdata.eval_shard(ds.test_x.shape[0], self.rank, self.size)
                xs, ys = ds.test_x[part], ds.test_y[part]
                for i in range(0, xs.shape[0], 500):
                    logits = model(ds.prepare(xs[i:i + 500], train=False))
                    y = ys[i:i + 500]
                    totals[0] += F.cross_entropy(logits, y, reduction="sum").item()
                    totals[1] += y.numel()
                    totals[2] += (logits.argmax(1) == y).sum().item()
        model.train()
        totals = allreduce_sum(totals)
        loss = totals[0].item() / max(1.0, totals[1].item())
        out = {"test_loss": loss, "accuracy": totals[2].item() / max(1.0, totals[1].item())}
        if self.w.metric == "perplexity":
            out["perplexity"] = math.exp(min(loss, 50.0))
        return out


def make_base_optimizer(w: Workload, params):
    if w.optimizer == "sgd":
        return torch.optim.SGD(params, lr=w.lr, momentum=w.momentum, weight_decay=w.weight_decay)
    if w.optimizer == "adam":
        return torch.optim.Adam(params, lr=w.lr)
    return torch.optim.AdamW(params, lr=w.lr, weight_decay=w.weight_decay)


# --------------------------------------------------------------------------- controllers
def make_controller(spec: str, w: Workload):
    """A controller of this package from a ``--controller`` spec (None: dense)."""
    import horovod_gravac as hg
    if spec == "dense":
        return hg.Dense()
    if spec.startswith("topk:"):
        return hg.StaticCF(float(spec.split(":")[1]))
    if spec.startswith("schedule:"):   # schedule:100@0,10@300 - a CF that changes at given steps
        from horovod_gravac.harness.train import ScheduledCF, parse_cf_schedule
        return ScheduledCF(parse_cf_schedule(spec.split(":", 1)[1]))
    if spec == "accordion":
        return hg.Accordion(low_cf=10, high_cf=1000, interval=w.window)
    if spec == "gravac" or spec.startswith("gravac:"):
        # gravac[:key=value,...]: GraVAC() with the window scaled to the run, and those settings
        kwargs = {"window": w.window}
        for item in filter(None, spec.partition(":")[2].split(",")):
            key, _, value = item.partition("=")
            kwargs[key] = value if key in ("variant", "policy") else float(value) \
                if "." in value or "e" in value else int(value)
        return hg.GraVAC(**kwargs)
    raise ValueError(f"unknown --controller {spec!r}")


# --------------------------------------------------------------------------- one rank
def train(args) -> int:
    """One rank of a run (under Horovod, or ``torch.distributed`` with ``--ddp``)."""
    from horovod_gravac.harness.runlog import RunWriter
    w = draw(args.seed)
    steps = args.steps or w.steps
    torch.set_num_threads(1)
    if args.ddp:
        import torch.distributed as dist
        rank, size = int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])
        dist.init_process_group("gloo", rank=rank, world_size=size)

        def allreduce_sum(t):
            t = t.clone()
            dist.all_reduce(t)
            return t
    else:
        import horovod.torch as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()

        def allreduce_sum(t):
            return hvd.allreduce(t, op=hvd.Sum, name="workload.eval")
    torch.manual_seed(w.seed)
    data = Data(w, rank, size)
    model = data.model()
    log = RunWriter(args.out, rank == 0)
    state = None
    if args.ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP
        state, hook, cap = _ddp_hook(args.controller, w, model, steps)
        net = DDP(model, bucket_cap_mb=cap)
        if hook is not None:
            net.register_comm_hook(state, hook)
        opt = make_base_optimizer(w, model.parameters())
        stats_of = lambda: dict(getattr(state, "stats", None) or {})   # noqa: E731
        base = opt
    else:
        import horovod_gravac as hg
        base = make_base_optimizer(w, model.parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        opt = hg.DistributedOptimizer(base, named_parameters=model.named_parameters(),
                                      compressor=hg.TopKCompressor, controller=make_controller(args.controller, w),
                                      bucket_cap_mb=w.bucket_cap_mb)
        net = model
        stats_of = lambda: dict(opt.stats)   # noqa: E731
    log.config({"workload": asdict(w), "controller": args.controller, "ddp": bool(args.ddp),
                "world_size": size, "steps": steps, "window": w.window,
                "parameters": sum(p.numel() for p in model.parameters())})
    evals: List[dict] = []
    t_prev = None
    for step in range(steps):
        t0 = time.perf_counter()
        for group in base.param_groups:
            group["lr"] = w.lr_at(step)
        loss = data.loss(net)
        opt.zero_grad()
        loss.backward()
        diag = diagnose(model, allreduce_sum, size) if args.diagnose else {}
        if w.clip_norm is not None:
            if args.ddp:
                torch.nn.utils.clip_grad_norm_(model.parameters(), w.clip_norm)
                opt.step()
            else:
                opt.synchronize()
                torch.nn.utils.clip_grad_norm_(model.parameters(), w.clip_norm)
                with opt.skip_synchronize():
                    opt.step()
        else:
            opt.step()
        now = time.perf_counter()
        stats = stats_of()
        record = {k: v for k, v in stats.items() if isinstance(v, (int, float, type(None)))}
        record.update({"step": step + 1, "loss": loss.item(), "iter_time": now - t0,
                       "step_time": now - t_prev if t_prev is not None else None,
                       "cf": float(stats.get("cf") or 1.0), **diag})
        log.step(record)
        t_prev = now
        if (step + 1) % w.eval_every == 0 or step + 1 == steps:
            result = data.evaluate(model, allreduce_sum)
            result["step"] = step + 1
            evals.append(result)
            log.eval(result)
            t_prev = None   # the next step's period would hold the evaluation
            if not args.ddp:
                opt.reset_timer()
    summary = {"final": evals[-1] if evals else {}, "steps": steps}
    controller = state.controller if args.ddp and state is not None and hasattr(state, "controller") \
        else getattr(opt, "controller", None)
    if controller is not None and getattr(controller, "history", None):
        summary["controller_history"] = list(controller.history)
    same = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = allreduce_sum(same.double()) / size
    summary["ranks_identical"] = bool(torch.equal(gathered.to(same.dtype), same))
    log.summary(summary)
    log.close()
    if args.ddp:
        import torch.distributed as dist
        del net, opt, state
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
    return 0


#: Coordinates of the raw gradient sampled by ``--diagnose`` (evenly strided).
DIAGNOSE_SAMPLE = 65536
_previous_sample: Dict[str, torch.Tensor] = {}


def diagnose(model, allreduce_sum, size: int) -> dict:
    """Statistics of this step's raw gradients (``--diagnose``): ``diag_cross``, the cosine
    between two ranks' gradients (batches drawn independently at the same point: it estimates
    |G|^2 / (|G|^2 + noise) of one rank's batch), and ``diag_lag``, the cosine of a rank's
    gradients at consecutive steps, both on an evenly strided sample of the coordinates and
    averaged over the ranks; ``diag_grad_sq``, the mean squared norm of a rank's gradient."""
    grads = [p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]
    flat = torch.cat(grads).double()
    stride = max(1, -(-flat.numel() // DIAGNOSE_SAMPLE))
    sample = flat[::stride]
    prev = _previous_sample.get("g")
    lag = sample.dot(prev) / (sample.norm() * prev.norm()) if prev is not None and prev.norm() > 0 else 0.0
    _previous_sample["g"] = sample
    summed = allreduce_sum(torch.cat([sample, torch.stack([sample.dot(sample), flat.dot(flat),
                                                           torch.as_tensor(float(lag), dtype=torch.float64)])]))
    total, own_sq, grad_sq, lag_sum = summed[:-3], summed[-3].item(), summed[-2].item(), summed[-1].item()
    cross = (total.dot(total).item() - own_sq) / (size - 1) / own_sq if size > 1 and own_sq > 0 else float("nan")
    return {"diag_cross": cross, "diag_lag": lag_sum / size, "diag_grad_sq": grad_sq / size}


def _ddp_hook(spec: str, w: Workload, model, steps: int):
    """``(state, hook, bucket_cap_mb)`` for a ``--controller`` spec under DDP."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    model_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2 ** 20
    if spec == "dense":
        return None, None, w.bucket_cap_mb
    if spec == "ddp-fp16":
        return None, default_hooks.fp16_compress_hook, w.bucket_cap_mb
    if spec.startswith("ddp-powersgd:"):
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=int(spec.split(":")[1]),
                                            start_powerSGD_iter=max(2, steps // 10), min_compression_rate=2,
                                            random_seed=0)
        # One bucket: with several, torch's PowerSGD hook hangs under Gloo (benchmarks/ddp_hooks.py).
        return state, powerSGD_hook.powerSGD_hook, 2 * model_mb + 1
    import horovod_gravac as hg
    state = hg.ddp.GravacState(None, compressor=hg.TopKCompressor, controller=make_controller(spec, w))
    return state, hg.ddp.gravac_hook, w.bucket_cap_mb


# --------------------------------------------------------------------------- CLI
def _seeds(values: List[str], span: Optional[str]) -> List[int]:
    seeds = [int(v) for v in values]
    if span:
        lo, hi = (int(x) for x in span.split("-"))
        seeds += list(range(lo, hi + 1))
    return seeds


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show", help="print draws")
    s.add_argument("seeds", nargs="*")
    s.add_argument("--range", help="LO-HI, inclusive")
    t = sub.add_parser("train", help="one rank of a run (launched by benchmarks/generalization.py)")
    t.add_argument("--seed", type=int, required=True)
    t.add_argument("--controller", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--ddp", action="store_true")
    t.add_argument("--steps", type=int, help="override the draw's steps (timing runs, smoke tests)")
    t.add_argument("--diagnose", action="store_true",
                   help="record the raw gradient's cross-rank and step-to-step statistics each step "
                        "(an extra allreduce of a sample: do not time such runs)")
    args = p.parse_args(argv)
    if args.cmd == "show":
        for seed in _seeds(args.seeds, args.range):
            print(f"{seed:5d}  {draw(seed).describe()}")
        return 0
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
