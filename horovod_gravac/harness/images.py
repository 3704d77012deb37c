"""``ImageData``, the in-memory image data set every image loader returns, and its training
augmentation.  Its own module so that the loaders of files (:mod:`.data`) and the data sets
drawn on the spot (:mod:`.synthetic`) both build it without importing each other."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

__all__ = ["ImageData", "random_crop_flip"]


@dataclass
class ImageData:
    """An in-memory image classification data set.

    ``train_x``/``test_x`` are ``N x C x H x W``, either uint8 (CIFAR, normalised per
    batch with ``mean``/``std``) or float32 already normalised (digits).
    """

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int
    mean: Optional[torch.Tensor] = None   # C, for uint8 storage
    std: Optional[torch.Tensor] = None
    augment: bool = False                 # random crop (pad 4) + horizontal flip on training batches
    class_names: Optional[List[str]] = None

    def to(self, device) -> "ImageData":
        """Move the stored images (and statistics) to ``device``, e.g. the rank's GPU."""
        for name in ("train_x", "train_y", "test_x", "test_y", "mean", "std"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.to(device))
        return self

    @property
    def in_channels(self) -> int:
        return int(self.train_x.shape[1])

    @property
    def image_size(self) -> int:
        return int(self.train_x.shape[-1])

    def prepare(self, x: torch.Tensor, train: bool, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """Turn a stored batch into the network's float input (augment if training, normalise).

        Augmentation runs on the stored pixels, before normalisation, so padding is black
        (0), as in the usual CIFAR pipeline (pad the image, crop, flip, then normalise).
        """
        if train and self.augment:
            x = random_crop_flip(x, pad=4, generator=generator)
        if x.dtype == torch.uint8:
            x = x.float().div_(255.0)
            x = (x - self.mean.view(1, -1, 1, 1)) / self.std.view(1, -1, 1, 1)
        return x


def random_crop_flip(x: torch.Tensor, pad: int = 4, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Standard CIFAR augmentation for a whole batch at once: zero-pad, random crop, random h-flip.

    One ``gather`` over the padded images (the crop offset and the flip are folded
    into the gather indices) instead of per-pixel advanced indexing.
    """
    b, c, h, w = x.shape
    hp, wp = h + 2 * pad, w + 2 * pad
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad)).reshape(b, c, hp * wp)
    # Random draws on the CPU generator (reproducible anywhere); indices built on x's device.
    oy = torch.randint(0, 2 * pad + 1, (b, 1), generator=generator).to(x.device)
    ox = torch.randint(0, 2 * pad + 1, (b, 1), generator=generator).to(x.device)
    flip = (torch.rand(b, 1, generator=generator) < 0.5).to(x.device)
    ar = torch.arange(w, device=x.device)
    cols = torch.where(flip, ar.flip(0), ar) + ox                                    # b x w
    rows = torch.arange(h, device=x.device) + oy                                      # b x h
    lin = (rows[:, :, None] * wp + cols[:, None, :]).reshape(b, 1, h * w).expand(b, c, h * w)
    return padded.gather(2, lin).reshape(b, c, h, w)
