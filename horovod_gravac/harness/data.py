"""Data for the paper's workloads, read from the standard on-disk formats; nothing is downloaded.

Image data sets
    ``cifar10``  -- the python pickles of ``cifar-10-python.tar.gz``: ``data_batch_1`` ..
    ``data_batch_5``, ``test_batch`` and ``batches.meta`` (each batch a pickled dict with
    ``b"data"``: N x 3072 uint8, ``b"labels"``).
    ``cifar100`` -- ``cifar-100-python.tar.gz``: ``train``, ``test``, ``meta`` (labels in
    ``b"fine_labels"``).
    ``digits``   -- scikit-learn's bundled handwritten digits (1797 8x8 images; ships inside
    the scikit-learn package, so the default run needs no download).

Text data sets (word level, PTB conventions: one sentence per line, ``<eos>`` appended)
    ``ptb``      -- ``ptb.train.txt``, ``ptb.valid.txt``, ``ptb.test.txt``.
    ``pydoc``    -- the Python Language Reference topics that CPython's standard library
    ships as ``pydoc_data/topics.py`` (the text behind ``help("assert")``; about 0.46 MB
    of English prose with code examples), tokenised PTB-style into a corpus of about
    75K words. Always present wherever Python is, so the LSTM default needs no download.

Hashed sparse-feature data sets (classification over bags of hashed feature ids)
    ``pydoc-chars`` -- next-character prediction on the same pydoc topics text (the raw
    characters of the same paragraphs and the same train/valid/test split as ``pydoc``):
    each example is one position of the text, its features the hashed 1..5-character
    contexts before it, its label the character at that position (about 368K training,
    46K validation and 50K test positions, 100 classes with Python 3.11's text). See
    :func:`load_pydoc_chars`.

Everything is held in memory as tensors; a training batch is an ``index_select``.

Sharding over Horovod ranks
    Images: :class:`ShardedBatches` permutes the training set with a generator seeded by
    ``(seed, epoch)`` (the same permutation on every rank), drops the tail so that all
    ranks get the same number of full batches, and gives rank ``r`` every ``size``-th
    sample starting at ``r``. Every rank therefore runs the same number of steps per
    epoch and the collectives stay matched.
    Text: :func:`batchify_for_rank` cuts the token stream into ``size * batch_size``
    contiguous streams and gives each rank ``batch_size`` of them (all ranks: the same
    number of rows). :class:`BPTTStream` walks the rows in consecutive windows of
    ``bptt`` tokens, so the LSTM's hidden state can be carried (detached) from one
    window to the next and reset at each epoch; evaluation uses its own batch size.
"""
from __future__ import annotations

import os
import pickle
import re
from collections import Counter
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .images import ImageData, random_crop_flip

__all__ = ["DatasetNotFound", "ImageData", "TextCorpus", "load_cifar", "load_digits_data",
           "load_ptb", "load_pydoc_corpus", "load_image_dataset", "load_text_dataset",
           "ShardedBatches", "batchify", "batchify_for_rank", "BPTTStream", "shard_indices",
           "IMAGE_DATASETS", "TEXT_DATASETS", "write_ptb_files", "tokenize_ptb_style",
           "FeatureData", "FEATURE_DATASETS", "hash_context_features", "pydoc_paragraphs",
           "load_pydoc_chars", "load_feature_dataset"]

IMAGE_DATASETS = ("cifar10", "cifar100", "digits", "shapes", "waves")
TEXT_DATASETS = ("ptb", "pydoc", "stdlib-chars")
FEATURE_DATASETS = ("pydoc-chars",)

CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch", "batches.meta")
CIFAR100_FILES = ("train", "test", "meta")
PTB_FILES = ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")

# Channel statistics of the CIFAR training sets (0..1 scale), used to normalise.
CIFAR_MEAN = {"cifar10": (0.4914, 0.4822, 0.4465), "cifar100": (0.5071, 0.4865, 0.4409)}
CIFAR_STD = {"cifar10": (0.2470, 0.2435, 0.2616), "cifar100": (0.2673, 0.2564, 0.2762)}


class DatasetNotFound(FileNotFoundError):
    """A data set is not where the user said; the message says which files go where."""


# =========================================================================== images
def _missing(dataset: str, path: str, expected: Sequence[str], where: str) -> DatasetNotFound:
    return DatasetNotFound(
        f"{dataset}: data not found under {path!r}. Expected the files {', '.join(expected)} "
        f"in that directory (or in its subdirectory {where!r}). Nothing is downloaded: get the "
        f"standard archive, unpack it, and pass the directory with --data.")


def _find_dir(path: str, expected: Sequence[str], subdirs: Sequence[str]) -> Optional[str]:
    for d in [path] + [os.path.join(path, s) for s in subdirs]:
        if all(os.path.isfile(os.path.join(d, f)) for f in expected):
            return d
    return None


def _unpickle(file: str) -> dict:
    with open(file, "rb") as f:
        return pickle.load(f, encoding="bytes")


def _get(d: dict, key: str):
    """CIFAR pickles have bytes keys (python 2 pickles); accept str keys too."""
    if key.encode() in d:
        return d[key.encode()]
    return d[key]


def _cifar_arrays(batch: dict, label_key: str) -> Tuple[torch.Tensor, torch.Tensor]:
    data = np.asarray(_get(batch, "data"), dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != 3072:
        raise ValueError(f"CIFAR batch data must be N x 3072 uint8, got shape {data.shape}")
    labels = np.asarray(_get(batch, label_key), dtype=np.int64)
    x = torch.from_numpy(data.reshape(-1, 3, 32, 32).copy())
    return x, torch.from_numpy(labels)


def load_cifar(path: str, dataset: str = "cifar10") -> ImageData:
    """Read CIFAR-10 or CIFAR-100 python pickles from ``path`` (the unpacked directory or its parent)."""
    if dataset == "cifar10":
        d = _find_dir(path, CIFAR10_FILES, ["cifar-10-batches-py"])
        if d is None:
            raise _missing("cifar10", path, CIFAR10_FILES, "cifar-10-batches-py")
        parts = [_cifar_arrays(_unpickle(os.path.join(d, f"data_batch_{i}")), "labels") for i in range(1, 6)]
        train_x = torch.cat([p[0] for p in parts])
        train_y = torch.cat([p[1] for p in parts])
        test_x, test_y = _cifar_arrays(_unpickle(os.path.join(d, "test_batch")), "labels")
        meta = _unpickle(os.path.join(d, "batches.meta"))
        names = [n.decode() if isinstance(n, bytes) else n for n in _get(meta, "label_names")]
        num_classes = 10
    elif dataset == "cifar100":
        d = _find_dir(path, CIFAR100_FILES, ["cifar-100-python"])
        if d is None:
            raise _missing("cifar100", path, CIFAR100_FILES, "cifar-100-python")
        train_x, train_y = _cifar_arrays(_unpickle(os.path.join(d, "train")), "fine_labels")
        test_x, test_y = _cifar_arrays(_unpickle(os.path.join(d, "test")), "fine_labels")
        meta = _unpickle(os.path.join(d, "meta"))
        names = [n.decode() if isinstance(n, bytes) else n for n in _get(meta, "fine_label_names")]
        num_classes = 100
    else:
        raise ValueError(f"unknown CIFAR data set {dataset!r} (cifar10 or cifar100)")
    for y, what in ((train_y, "train"), (test_y, "test")):
        if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
            raise ValueError(f"{dataset} {what} labels outside [0, {num_classes})")
    return ImageData(dataset, train_x, train_y, test_x, test_y, num_classes,
                     mean=torch.tensor(CIFAR_MEAN[dataset]), std=torch.tensor(CIFAR_STD[dataset]),
                     augment=True, class_names=names)


def load_digits_data(test_fraction: float = 0.2, seed: int = 0) -> ImageData:
    """scikit-learn's 8x8 digits, split once (fixed seed, stratified) into train and test, unit variance."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # pragma: no cover - sklearn is in the 'report' extra
        raise DatasetNotFound("digits: scikit-learn is not installed (it ships the data set); "
                              "pip install scikit-learn, or horovod_gravac[report]") from e
    bunch = load_digits()
    x = torch.tensor(bunch.data, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    y = torch.tensor(bunch.target, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    test_idx, train_idx = [], []
    for c in range(10):  # stratified: the same fraction of every class goes to test
        idx = torch.nonzero(y == c).view(-1)
        idx = idx[torch.randperm(idx.numel(), generator=g)]
        n_test = int(round(test_fraction * idx.numel()))
        test_idx.append(idx[:n_test])
        train_idx.append(idx[n_test:])
    train_idx = torch.cat(train_idx)
    train_idx = train_idx[torch.randperm(train_idx.numel(), generator=g)]
    test_idx = torch.cat(test_idx).sort().values
    # Scale to unit variance without centring: the blank background stays exactly 0
    # (as raw pixels are), so gradients of weights that only see background are 0.
    x = x / x[train_idx].std()
    return ImageData("digits", x[train_idx].contiguous(), y[train_idx].contiguous(),
                     x[test_idx].contiguous(), y[test_idx].contiguous(), 10,
                     class_names=[str(i) for i in range(10)])


def load_image_dataset(name: str, path: Optional[str] = None) -> ImageData:
    if name == "digits":
        return load_digits_data()
    if name == "shapes":
        from .synthetic import shapes_data
        return shapes_data()
    if name == "waves":
        from .synthetic import waves_data
        return waves_data()
    if name in ("cifar10", "cifar100"):
        if not path:
            expected = CIFAR10_FILES if name == "cifar10" else CIFAR100_FILES
            raise DatasetNotFound(
                f"{name}: no --data path given. Unpack the CIFAR python archive and pass its "
                f"directory with --data; it must contain {', '.join(expected)}. Nothing is downloaded.")
        return load_cifar(path, name)
    raise ValueError(f"unknown image data set {name!r}; choose one of {', '.join(IMAGE_DATASETS)}")


def shard_indices(n: int, rank: int, size: int, epoch: int, seed: int, batch_size: int,
                  shuffle: bool = True) -> torch.Tensor:
    """This rank's sample order for one epoch: a shared permutation, tail dropped, strided by rank.

    Every rank gets ``(n // (size * batch_size)) * batch_size`` indices, the shards are
    disjoint, and the result depends only on ``(seed, epoch)``.
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} outside [0, {size})")
    if shuffle:
        g = torch.Generator().manual_seed(int(seed) * 100_003 + int(epoch))
        order = torch.randperm(n, generator=g)
    else:
        order = torch.arange(n)
    per_rank = (n // (size * batch_size)) * batch_size
    if per_rank == 0:
        raise ValueError(f"{n} samples cannot give every one of {size} ranks a full batch of {batch_size}")
    return order[rank:per_rank * size:size]


class ShardedBatches:
    """Endless iterator over this rank's training batches, epoch after epoch.

    ``next(it)`` returns ``(x, y)`` already prepared for the network. ``epoch`` and
    ``batches_per_epoch`` tell where it is.
    """

    def __init__(self, data: ImageData, batch_size: int, rank: int = 0, size: int = 1, seed: int = 0):
        self.data, self.batch_size, self.rank, self.size, self.seed = data, batch_size, rank, size, seed
        self.epoch = -1
        self._order = torch.empty(0, dtype=torch.int64)
        self._pos = 0
        self._gen = torch.Generator().manual_seed(seed * 7919 + rank)  # augmentation: per rank
        self.batches_per_epoch = len(shard_indices(data.train_x.shape[0], rank, size, 0, seed,
                                                   batch_size)) // batch_size

    def __iter__(self) -> "ShardedBatches":
        return self

    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor]:
        if self._pos + self.batch_size > self._order.numel():
            self.epoch += 1
            self._order = shard_indices(self.data.train_x.shape[0], self.rank, self.size, self.epoch,
                                        self.seed, self.batch_size)
            self._pos = 0
        idx = self._order[self._pos:self._pos + self.batch_size].to(self.data.train_x.device)
        self._pos += self.batch_size
        x = self.data.prepare(self.data.train_x.index_select(0, idx), train=True, generator=self._gen)
        return x, self.data.train_y.index_select(0, idx)


def eval_shard(n: int, rank: int, size: int) -> slice:
    """Contiguous slice of an evaluation set for this rank (sizes differ by at most one)."""
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


# =========================================================================== text
@dataclass
class TextCorpus:
    """A tokenised word-level corpus: 1-D int64 token streams and the vocabulary."""

    name: str
    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor
    vocab: List[str]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)


def _read_words(file: str) -> List[List[str]]:
    with open(file, "r", encoding="utf-8") as f:
        return [line.split() + ["<eos>"] for line in f]


def load_ptb(path: str) -> TextCorpus:
    """Read ``ptb.{train,valid,test}.txt`` (one sentence per line); the vocabulary comes from train.

    Word ids are given in order of first appearance in the training file. Words of the
    validation/test files that never occur in training map to ``<unk>`` (PTB has it in
    its vocabulary); if the corpus has no ``<unk>``, one is added.
    """
    if not path:
        raise DatasetNotFound(f"ptb: no --data path given. Pass the directory that contains "
                              f"{', '.join(PTB_FILES)} with --data. Nothing is downloaded.")
    d = _find_dir(path, PTB_FILES, ["ptb", "data", "simple-examples/data"])
    if d is None:
        raise _missing("ptb", path, PTB_FILES, "simple-examples/data")
    splits = [_read_words(os.path.join(d, f)) for f in PTB_FILES]
    vocab: Dict[str, int] = {}
    for sent in splits[0]:
        for w in sent:
            if w not in vocab:
                vocab[w] = len(vocab)
    if "<unk>" not in vocab:
        vocab["<unk>"] = len(vocab)
    unk = vocab["<unk>"]
    tensors = [torch.tensor([vocab.get(w, unk) for s in sents for w in s], dtype=torch.int64)
               for sents in splits]
    return TextCorpus("ptb", *tensors, vocab=list(vocab))


_TOKEN = re.compile(r"[a-z_][a-z_\d]*(?:'[a-z]+)?|\d+(?:\.\d+)?|[^\sa-z\d_]")


def tokenize_ptb_style(line: str) -> List[str]:
    """Lower-case words (identifiers kept whole), numbers as ``N`` (as in PTB), punctuation split off.

    Lines that are only a repeated punctuation mark (reStructuredText underlines such
    as ``*****`` or ``=====``) give no tokens.
    """
    tokens = ["N" if t[0].isdigit() else t for t in _TOKEN.findall(line.lower())]
    if len(tokens) > 1 and len(set(tokens)) == 1 and not tokens[0][0].isalnum():
        return []
    return tokens


def load_pydoc_corpus(max_vocab: int = 10000, split_every: int = 10) -> TextCorpus:
    """The Python reference topics shipped with CPython (``pydoc_data.topics``) as a PTB-style corpus.

    Topics are taken in sorted order and cut into paragraphs (blank-line separated);
    paragraph ``p`` goes to valid when ``p % split_every == split_every - 2``, to test
    when ``p % split_every == split_every - 1``, otherwise to train. Each non-empty line
    is a sentence ending in ``<eos>``. The ``max_vocab - 1`` most frequent training
    words (ties by first appearance) are kept; everything else becomes ``<unk>``.
    """
    try:
        from pydoc_data.topics import topics
    except ImportError as e:  # pragma: no cover - part of the standard library
        raise DatasetNotFound("pydoc: this Python has no pydoc_data.topics module") from e
    parts: List[List[List[str]]] = [[], [], []]
    p = 0
    for key in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[key]):
            sents = [tokenize_ptb_style(ln) for ln in para.splitlines()]
            sents = [s + ["<eos>"] for s in sents if s]
            if not sents:
                continue
            r = p % split_every
            parts[1 if r == split_every - 2 else 2 if r == split_every - 1 else 0].extend(sents)
            p += 1
    counts = Counter(w for s in parts[0] for w in s)
    first: Dict[str, int] = {}
    for s in parts[0]:
        for w in s:
            first.setdefault(w, len(first))
    words = sorted(counts, key=lambda w: (-counts[w], first[w]))[:max_vocab - 1]
    vocab = {w: i for i, w in enumerate(words)}
    vocab.setdefault("<unk>", len(vocab))
    unk = vocab["<unk>"]
    tensors = [torch.tensor([vocab.get(w, unk) for s in sents for w in s], dtype=torch.int64)
               for sents in parts]
    return TextCorpus("pydoc", *tensors, vocab=list(vocab))


def write_ptb_files(corpus: TextCorpus, directory: str) -> None:
    """Write a corpus as ``ptb.{train,valid,test}.txt`` (one sentence per line), e.g. to inspect it."""
    os.makedirs(directory, exist_ok=True)
    eos = corpus.vocab.index("<eos>")
    for name, stream in zip(PTB_FILES, (corpus.train, corpus.valid, corpus.test)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            line: List[str] = []
            for t in stream.tolist():
                if t == eos:
                    f.write(" " + " ".join(line) + " \n")
                    line = []
                else:
                    line.append(corpus.vocab[t])


def load_text_dataset(name: str, path: Optional[str] = None) -> TextCorpus:
    if name == "ptb":
        return load_ptb(path or "")
    if name == "pydoc":
        return load_pydoc_corpus()
    if name == "stdlib-chars":
        from .synthetic import CHARS, stdlib_chars
        train, test = stdlib_chars()
        half = test.numel() // 2   # (valid: the first half of the test modules' text)
        return TextCorpus("stdlib-chars", train, test[:half], test, list(CHARS))
    raise ValueError(f"unknown text data set {name!r}; choose one of {', '.join(TEXT_DATASETS)}")


def batchify(data: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Cut a 1-D token stream into ``batch_size`` contiguous streams: ``rows x batch_size``.

    Column ``j`` is the ``j``-th contiguous piece of the stream; the tail that does
    not fill a full row is dropped.
    """
    rows = data.numel() // batch_size
    if rows < 2:
        raise ValueError(f"a stream of {data.numel()} tokens is too short for batch size {batch_size}")
    return data[:rows * batch_size].view(batch_size, rows).t().contiguous()


def batchify_for_rank(data: torch.Tensor, batch_size: int, rank: int, size: int) -> torch.Tensor:
    """This rank's ``rows x batch_size`` streams out of ``size * batch_size`` contiguous ones.

    All ranks get the same number of rows, hence the same number of BPTT windows.
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} outside [0, {size})")
    full = batchify(data, batch_size * size)
    return full[:, rank * batch_size:(rank + 1) * batch_size].contiguous()


class BPTTStream:
    """Consecutive BPTT windows over ``rows x batch`` streams, epoch after epoch.

    ``next(stream)`` returns ``(inputs, targets, new_epoch)``, each ``seq_len x batch``
    with ``targets`` shifted by one token; ``new_epoch`` is True on the first window of
    an epoch, where the caller resets the LSTM's hidden state. Windows are never
    shuffled: window ``i + 1`` continues exactly where window ``i`` stopped, which is
    what makes carrying the hidden state across windows correct.
    """

    def __init__(self, streams: torch.Tensor, bptt: int):
        if streams.dim() != 2 or streams.size(0) < 2:
            raise ValueError("streams must be rows x batch with at least 2 rows")
        if bptt < 1:
            raise ValueError(f"bptt must be >= 1, got {bptt}")
        self.streams, self.bptt = streams, bptt
        self.epoch = -1
        self._i = streams.size(0)  # forces a new epoch on the first call

    @property
    def windows_per_epoch(self) -> int:
        return (self.streams.size(0) - 1 + self.bptt - 1) // self.bptt

    def __iter__(self) -> "BPTTStream":
        return self

    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor, bool]:
        new_epoch = False
        if self._i >= self.streams.size(0) - 1:
            self.epoch += 1
            self._i = 0
            new_epoch = True
        n = min(self.bptt, self.streams.size(0) - 1 - self._i)
        x = self.streams[self._i:self._i + n]
        y = self.streams[self._i + 1:self._i + 1 + n]
        self._i += n
        return x, y, new_epoch

    @staticmethod
    def windows(streams: torch.Tensor, bptt: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """One pass over the windows (evaluation)."""
        for i in range(0, streams.size(0) - 1, bptt):
            n = min(bptt, streams.size(0) - 1 - i)
            yield streams[i:i + n], streams[i + 1:i + 1 + n]


# =========================================================================== hashed features
@dataclass
class FeatureData:
    """An in-memory classification data set over hashed sparse features.

    ``train_x``/``valid_x``/``test_x`` are ``N x F`` int64 feature ids in
    ``[0, num_buckets)``: row ``i`` is the bag of ``F`` features active in example ``i``
    (an ``EmbeddingBag`` input). Labels are int64 in ``[0, num_classes)``. It has the
    interface :class:`ShardedBatches` and the trainer's evaluation use for images
    (``prepare`` returns the ids unchanged).
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    valid_x: torch.Tensor
    valid_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    num_buckets: int
    class_names: Optional[List[str]] = None

    def to(self, device) -> "FeatureData":
        for name in ("train_x", "train_y", "valid_x", "valid_y", "test_x", "test_y"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    @property
    def features_per_example(self) -> int:
        return int(self.train_x.shape[1])

    def prepare(self, x: torch.Tensor, train: bool, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        return x


_HASH_MOD = (1 << 31) - 1      # a prime: h * _HASH_MUL stays far inside int64
_HASH_MUL = 1_000_003


def hash_context_features(ids: torch.Tensor, orders: int, num_buckets: int, boundary: int) -> torch.Tensor:
    """Hashed left contexts of every position of a 1-D id stream: ``len(ids) x orders``.

    Column ``o - 1`` holds the bucket of the ``o`` ids just before the position (the
    context of order ``o``); positions closer than ``o`` to the start see ``boundary``
    ids before the stream. The hash is a polynomial over the ids modulo a prime,
    mixed with the order, then reduced to ``[0, num_buckets)``: deterministic, the
    same on every machine. Different contexts may share a bucket (the hashing trick).
    """
    if ids.dim() != 1:
        raise ValueError("ids must be a 1-D stream")
    if orders < 1 or num_buckets < 1:
        raise ValueError(f"orders and num_buckets must be >= 1, got {orders} and {num_buckets}")
    n = ids.numel()
    padded = torch.cat([torch.full((orders,), int(boundary), dtype=torch.int64), ids.to(torch.int64)])
    h = torch.zeros(n, dtype=torch.int64)
    out = []
    for o in range(1, orders + 1):
        h = (h * _HASH_MUL + padded[orders - o:orders - o + n] + 1) % _HASH_MOD
        out.append((h * 40503 + o * 1_000_033) % num_buckets)
    return torch.stack(out, 1).contiguous()


def pydoc_paragraphs(split_every: int = 10) -> List[List[str]]:
    """The pydoc topics' paragraphs as ``[train, valid, test]`` lists of raw text.

    The same paragraphs, in the same order and split, as :func:`load_pydoc_corpus`
    (a paragraph that gives no word tokens, e.g. a ``*****`` underline, is skipped and
    not counted). Lines keep their indentation; trailing blanks are dropped.
    """
    try:
        from pydoc_data.topics import topics
    except ImportError as e:  # pragma: no cover - part of the standard library
        raise DatasetNotFound("pydoc: this Python has no pydoc_data.topics module") from e
    parts: List[List[str]] = [[], [], []]
    p = 0
    for key in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[key]):
            if not any(tokenize_ptb_style(ln) for ln in para.splitlines()):
                continue
            r = p % split_every
            text = "\n".join(ln.rstrip() for ln in para.strip("\n").splitlines())
            parts[1 if r == split_every - 2 else 2 if r == split_every - 1 else 0].append(text)
            p += 1
    return parts


def load_pydoc_chars(orders: int = 5, num_buckets: int = 1 << 18, min_count: int = 5,
                     split_every: int = 10) -> FeatureData:
    """Next-character prediction on the pydoc topics text, as hashed context features.

    Each split is one stream: its paragraphs joined by blank lines (``"\\n\\n"`` after
    every paragraph). The classes are the characters seen at least ``min_count``
    times in train (most frequent first), plus class 0 for every other character
    (``"<unk>"``). Example ``t`` of a stream has the label of character ``t`` and the
    features :func:`hash_context_features` of the ``1..orders`` characters before it
    (a stream starts with boundary symbols, so no example sees another split's text).
    This is the input of a fastText-style model (summed embeddings of the hashed
    n-grams, then a linear layer): only the rows of the contexts in a batch get a
    gradient. Nothing is downloaded: the text ships with CPython.
    """
    if orders < 1 or num_buckets < 1 or min_count < 1:
        raise ValueError(f"orders, num_buckets and min_count must be >= 1, got {orders}, "
                         f"{num_buckets}, {min_count}")
    texts = ["".join(par + "\n\n" for par in part) for part in pydoc_paragraphs(split_every)]
    counts = Counter(texts[0])
    chars = sorted((c for c, n in counts.items() if n >= min_count), key=lambda c: (-counts[c], c))
    index = {c: i + 1 for i, c in enumerate(chars)}
    num_classes = len(chars) + 1
    tensors = []
    for text in texts:
        ids = torch.tensor([index.get(c, 0) for c in text], dtype=torch.int64)
        tensors += [hash_context_features(ids, orders, num_buckets, boundary=num_classes), ids]
    return FeatureData("pydoc-chars", *tensors, num_classes=num_classes, num_buckets=num_buckets,
                       class_names=["<unk>"] + chars)


def load_feature_dataset(name: str, path: Optional[str] = None, num_buckets: Optional[int] = None) -> FeatureData:
    """A hashed-feature data set; ``num_buckets`` (None: the loader's default) sets the hash range."""
    if name == "pydoc-chars":
        return load_pydoc_chars() if num_buckets is None else load_pydoc_chars(num_buckets=num_buckets)
    raise ValueError(f"unknown feature data set {name!r}; choose one of {', '.join(FEATURE_DATASETS)}")
