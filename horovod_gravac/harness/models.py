"""The paper's workloads (Table 1) as CIFAR-style models, plus tiny models for the default run.

Every model has a size knob so that tests can build toy versions that run in
milliseconds; the defaults are the paper's sizes.

- :class:`ResNet` / :func:`resnet101`: CIFAR-style ResNet (3x3 stem, stride 1, no
  max-pool), Bottleneck blocks ``[3, 4, 23, 3]``, 10- or 100-class head.
  ``width`` is the stem's channel count (64 in the paper's model).
- :class:`VGG` / :func:`vgg16`: CIFAR VGG16 with batch norm, global pooling and a
  linear 100-class head. ``width`` scales all channel counts (1.0 = 64 ... 512).
- :class:`LSTMLanguageModel` / :func:`lstm_lm`: 2-layer LSTM language model
  (paper: 1500 embedding and hidden units, trained with BPTT 35), dropout, optional
  tied input/output embeddings.
- :class:`TinyCNN` and :func:`tiny_lstm`: the small models of the embedded default
  run (8x8 digits, a small text corpus).
- :class:`HashedNGram`: a fastText-style classifier over hashed sparse features (the
  summed embeddings of an example's feature ids, then a linear layer), e.g. next-character
  prediction from hashed character contexts. Only the embedding rows of the features in
  a batch get a gradient, so its gradients are very sparse (see ``train.py``'s
  ``ngram-pydoc-chars`` preset).

:func:`build_model` maps the training script's ``--model`` names to these.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["Bottleneck", "ResNet", "resnet101", "VGG", "vgg16", "LSTMLanguageModel", "lstm_lm",
           "TinyCNN", "tiny_lstm", "CNN1d", "RowLSTM", "HashedNGram", "build_model", "count_parameters", "MODEL_NAMES"]

MODEL_NAMES = ("resnet101", "vgg16", "lstm", "tinycnn", "tinylstm", "ngram", "cnn1d", "rowlstm")


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------- ResNet
class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride), 1x1 expand by 4; projection shortcut when shapes change."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != out:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, out, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR-style ResNet: 3x3 stride-1 stem without max-pool, four stages, global average pool.

    Args:
        blocks: Bottleneck blocks per stage (ResNet101: ``[3, 4, 23, 3]``).
        num_classes: size of the head (10 for CIFAR-10, 100 for CIFAR-100).
        width: channels of the stem and first stage (64 in the standard model); the
            stages use ``width, 2*width, 4*width, 8*width`` planes (x4 after expansion).
        in_channels: image channels (3 for CIFAR).
        head_hidden: ``None``: one linear layer after the pool (the standard model); else a
            hidden layer of this many units first, as VGG's classifier: parameters that are
            cheap to compute and dear to send (the adaptivity benchmark's ``shapes-resnet``).
    """

    def __init__(self, blocks: Sequence[int] = (3, 4, 23, 3), num_classes: int = 10,
                 width: int = 64, in_channels: int = 3, head_hidden: Optional[int] = None):
        super().__init__()
        if len(blocks) != 4 or any(b < 1 for b in blocks):
            raise ValueError(f"blocks must be four positive counts, got {list(blocks)}")
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        self.in_planes = width
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = self._stage(width, blocks[0], stride=1)
        self.layer2 = self._stage(2 * width, blocks[1], stride=2)
        self.layer3 = self._stage(4 * width, blocks[2], stride=2)
        self.layer4 = self._stage(8 * width, blocks[3], stride=2)
        features = 8 * width * Bottleneck.expansion
        if head_hidden:
            self.fc = nn.Sequential(nn.Linear(features, head_hidden), nn.ReLU(inplace=True),
                                    nn.Linear(head_hidden, num_classes))
        else:
            self.fc = nn.Linear(features, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        # Zero the last BN of each residual branch: every block starts as the identity,
        # which makes the 101-layer network train stably from lr 0.1.
        for m in self.modules():
            if isinstance(m, Bottleneck):
                nn.init.zeros_(m.bn3.weight)

    def _stage(self, planes: int, n: int, stride: int) -> nn.Sequential:
        layers: List[nn.Module] = []
        for s in [stride] + [1] * (n - 1):
            layers.append(Bottleneck(self.in_planes, planes, s))
            self.in_planes = planes * Bottleneck.expansion
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def resnet101(num_classes: int = 10, width: int = 64, blocks: Sequence[int] = (3, 4, 23, 3),
              in_channels: int = 3, head_hidden: Optional[int] = None) -> ResNet:
    """CIFAR ResNet101 (Bottleneck ``[3, 4, 23, 3]``); ``width``/``blocks`` shrink it for tests."""
    return ResNet(blocks, num_classes=num_classes, width=width, in_channels=in_channels,
                  head_hidden=head_hidden)


# --------------------------------------------------------------------------- VGG
VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


class VGG(nn.Module):
    """CIFAR VGG with batch norm: 3x3 conv-BN-ReLU stacks, 2x2 max-pools, global pool, linear head.

    Args:
        cfg: channel counts and ``"M"`` (max-pool) markers; VGG16 by default.
        num_classes: head size (100 for CIFAR-100).
        width: multiplier on every channel count (1.0 = the standard 64..512).
        in_channels: image channels.

    Pools use ``ceil_mode`` so that inputs smaller than 32x32 (toy tests) never shrink
    to zero; on 32x32 inputs the network is the usual one (1x1 after five pools).
    """

    def __init__(self, cfg: Sequence = VGG16_CFG, num_classes: int = 100, width: float = 1.0,
                 in_channels: int = 3):
        super().__init__()
        if width <= 0:
            raise ValueError(f"width must be > 0, got {width}")
        layers: List[nn.Module] = []
        c = in_channels
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2, ceil_mode=True))
            else:
                out = max(1, int(round(v * width)))
                layers += [nn.Conv2d(c, out, 3, padding=1, bias=False), nn.BatchNorm2d(out),
                           nn.ReLU(inplace=True)]
                c = out
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1).flatten(1)
        return self.classifier(x)


def vgg16(num_classes: int = 100, width: float = 1.0, in_channels: int = 3) -> VGG:
    """CIFAR VGG16-BN with a ``num_classes`` head (paper: CIFAR-100)."""
    return VGG(VGG16_CFG, num_classes=num_classes, width=width, in_channels=in_channels)


# --------------------------------------------------------------------------- LSTM
Hidden = Tuple[torch.Tensor, torch.Tensor]


class LSTMLanguageModel(nn.Module):
    """Word-level LSTM language model: embedding -> dropout -> LSTM x L -> dropout -> decoder.

    Inputs are ``(seq_len, batch)`` token ids (time-major, the layout of the BPTT
    streams in :mod:`horovod_gravac.harness.data`); the output is ``(seq_len, batch, vocab)``
    logits and the new hidden state. Call :meth:`init_hidden` with the batch size
    actually used (training and evaluation batch sizes differ) and detach the state
    between consecutive BPTT windows (:func:`detach_hidden`).

    Args:
        vocab_size: number of token ids.
        emb_size: embedding width (paper: 1500).
        hidden_size: LSTM units per layer (paper: 1500).
        num_layers: stacked LSTM layers (paper: 2).
        dropout: dropout on embeddings, between layers and before the decoder.
        tie_weights: share the embedding and decoder matrices (needs emb == hidden).
    """

    def __init__(self, vocab_size: int, emb_size: int = 1500, hidden_size: int = 1500,
                 num_layers: int = 2, dropout: float = 0.65, tie_weights: bool = False):
        super().__init__()
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        if tie_weights and emb_size != hidden_size:
            raise ValueError(f"tie_weights needs emb_size == hidden_size, got {emb_size} and {hidden_size}")
        self.vocab_size, self.emb_size, self.hidden_size = vocab_size, emb_size, hidden_size
        self.num_layers = num_layers
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, emb_size)
        self.rnn = nn.LSTM(emb_size, hidden_size, num_layers, dropout=dropout if num_layers > 1 else 0.0)
        self.decoder = nn.Linear(hidden_size, vocab_size)
        init = 0.1
        nn.init.uniform_(self.encoder.weight, -init, init)
        nn.init.zeros_(self.decoder.bias)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        else:
            nn.init.uniform_(self.decoder.weight, -init, init)
        self.tie_weights = tie_weights

    def init_hidden(self, batch_size: int) -> Hidden:
        w = next(self.parameters())
        shape = (self.num_layers, batch_size, self.hidden_size)
        return w.new_zeros(shape), w.new_zeros(shape)

    def forward(self, tokens: torch.Tensor, hidden: Optional[Hidden] = None):
        if hidden is None:
            hidden = self.init_hidden(tokens.size(1))
        emb = self.drop(self.encoder(tokens))
        out, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(out)), hidden


def detach_hidden(hidden: Hidden) -> Hidden:
    """Cut the graph between BPTT windows while keeping the state's values."""
    return tuple(h.detach() for h in hidden)  # type: ignore[return-value]


def lstm_lm(vocab_size: int, size: int = 1500, num_layers: int = 2, dropout: float = 0.65,
            tie_weights: bool = False) -> LSTMLanguageModel:
    """The paper's 2-layer LSTM LM with ``size`` embedding and hidden units (1500)."""
    return LSTMLanguageModel(vocab_size, size, size, num_layers, dropout, tie_weights)


# --------------------------------------------------------------------------- tiny models
class TinyCNN(nn.Module):
    """Small CNN for 8x8 digits (or any small image): two 3x3 convs, a 2x2 pool, two linear layers.

    ``width`` is the first conv's channel count (the second has ``2*width``).
    """

    def __init__(self, num_classes: int = 10, width: int = 16, in_channels: int = 1,
                 image_size: int = 8, hidden: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        side = (image_size + 1) // 2
        self.fc1 = nn.Linear(2 * width * side * side, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, ceil_mode=True)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def tiny_lstm(vocab_size: int, size: int = 64, num_layers: int = 2, dropout: float = 0.2,
              tie_weights: bool = True) -> LSTMLanguageModel:
    """A 2-layer LSTM LM small enough for two CPU cores (tied weights by default)."""
    return LSTMLanguageModel(vocab_size, size, size, num_layers, dropout, tie_weights)


class HashedNGram(nn.Module):
    """fastText-style classifier: ``EmbeddingBag(num_buckets, dim, mode="sum")`` over an
    example's hashed feature ids, then ``Linear(dim, num_classes)``.

    Input: ``batch x F`` int64 ids in ``[0, num_buckets)`` (a fixed number of features
    per example); output: ``batch x num_classes`` logits. The embedding gradient is
    dense in memory (plain ``nn.EmbeddingBag``, so any optimizer and the gradient
    compression see an ordinary tensor) but nonzero only in the rows of the batch's ids.
    """

    def __init__(self, num_buckets: int, num_classes: int, dim: int = 16):
        super().__init__()
        if num_buckets < 1 or num_classes < 2 or dim < 1:
            raise ValueError(f"need num_buckets >= 1, num_classes >= 2, dim >= 1; got "
                             f"{num_buckets}, {num_classes}, {dim}")
        self.embedding = nn.EmbeddingBag(num_buckets, dim, mode="sum")
        nn.init.normal_(self.embedding.weight, 0.0, 0.01)
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embedding(ids))


class CNN1d(nn.Module):
    """A VGG-like 1D CNN that reads an image as a sequence of its pixels (8x8 digits: 64
    steps, one channel): three conv-BN-ReLU pairs with max-pools, then two linear layers.
    As in VGG, most parameters (1.4M of 1.4M at width 64) sit in the first linear layer,
    so a whole-model gradient is one large, dense bucket.
    """

    def __init__(self, num_classes: int = 10, width: int = 64, in_channels: int = 1, length: int = 64,
                 hidden: int = 512):
        super().__init__()
        layers, c_in = [], in_channels
        for c_out in (width, 2 * width, 4 * width):
            layers += [nn.Conv1d(c_in, c_out, 3, padding=1), nn.BatchNorm1d(c_out), nn.ReLU(inplace=True),
                       nn.Conv1d(c_out, c_out, 3, padding=1), nn.BatchNorm1d(c_out), nn.ReLU(inplace=True),
                       nn.MaxPool1d(2)]
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.fc1 = nn.Linear(c_in * (length // 8), hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x.flatten(2) if x.dim() == 4 else x)   # (B, C, H, W) -> (B, C, H*W)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class RowLSTM(nn.Module):
    """A recurrent classifier: a 2-layer LSTM reads an image row by row (8x8 digits: 8
    steps of 8 features) and a linear layer classifies its last hidden state."""

    def __init__(self, num_classes: int = 10, width: int = 256, row_size: int = 8, num_layers: int = 2):
        super().__init__()
        self.lstm = nn.LSTM(row_size, width, num_layers=num_layers, batch_first=True)
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(x.shape[0], -1, x.shape[-1])              # (B, 1, H, W) -> (B, H, W)
        out, _ = self.lstm(rows)
        return self.fc(out[:, -1])


# --------------------------------------------------------------------------- factory
def build_model(name: str, num_classes: int = 10, vocab_size: Optional[int] = None,
                width: Optional[float] = None, in_channels: int = 3, image_size: int = 32,
                dropout: Optional[float] = None, tie_weights: Optional[bool] = None,
                blocks: Optional[Sequence[int]] = None, num_buckets: Optional[int] = None,
                head_hidden: Optional[int] = None) -> nn.Module:
    """Build a model by its ``--model`` name; ``width=None`` gives the paper's size.

    ``width`` means: ResNet stem channels (int), VGG channel multiplier (float), LSTM
    embedding/hidden size (int), TinyCNN first-conv channels (int), HashedNGram
    embedding size (int, default 16; ``num_buckets`` comes from the data set).
    """
    if name == "resnet101":
        return resnet101(num_classes, width=int(width or 64), blocks=blocks or (3, 4, 23, 3),
                         in_channels=in_channels, head_hidden=head_hidden)
    if name == "vgg16":
        return vgg16(num_classes, width=float(width or 1.0), in_channels=in_channels)
    if name in ("lstm", "tinylstm"):
        if not vocab_size:
            raise ValueError(f"model {name!r} needs vocab_size (a text data set)")
        if name == "lstm":
            return lstm_lm(vocab_size, size=int(width or 1500), dropout=0.65 if dropout is None else dropout,
                           tie_weights=bool(tie_weights))
        return tiny_lstm(vocab_size, size=int(width or 64), dropout=0.2 if dropout is None else dropout,
                         tie_weights=True if tie_weights is None else tie_weights)
    if name == "tinycnn":
        return TinyCNN(num_classes, width=int(width or 16), in_channels=in_channels, image_size=image_size)
    if name == "cnn1d":
        return CNN1d(num_classes, width=int(width or 64), in_channels=in_channels,
                     length=image_size * image_size)
    if name == "rowlstm":
        return RowLSTM(num_classes, width=int(width or 256), row_size=image_size)
    if name == "ngram":
        if not num_buckets:
            raise ValueError("model 'ngram' needs num_buckets (a hashed-feature data set)")
        return HashedNGram(int(num_buckets), num_classes, dim=int(width or 16))
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
