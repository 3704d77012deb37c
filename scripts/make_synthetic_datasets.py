"""Write random data in the paper's dataset formats, to smoke-test the harness where the real
data is absent (a fresh GPU machine, a cluster before the data is staged).

    python scripts/make_synthetic_datasets.py OUT            # OUT/cifar10, OUT/cifar100, OUT/ptb

The files have the layout and encoding of the real archives (CIFAR python pickles with bytes
keys, PTB text files of one sentence per line), so ``--data OUT/cifar10`` etc. goes through
the same loaders (``horovod_gravac.harness.data``).  The content is noise: the loss does not
fall below chance.  Use it for "does it run, on this device, with these ranks", never for
accuracy.
"""
from __future__ import annotations

import argparse
import os
import pickle

import numpy as np


def write(out: str, images: int = 256, sentences: int = 3000, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)

    def batch(n: int, classes: int, key: bytes) -> dict:
        return {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), key: rng.integers(0, classes, n).tolist()}

    def dump(obj: dict, *path: str) -> None:
        os.makedirs(os.path.join(out, *path[:-1]), exist_ok=True)
        with open(os.path.join(out, *path), "wb") as f:
            pickle.dump(obj, f)

    for i in range(1, 6):
        dump(batch(images, 10, b"labels"), "cifar10", f"data_batch_{i}")
    dump(batch(images, 10, b"labels"), "cifar10", "test_batch")
    dump({b"label_names": [f"class{i}".encode() for i in range(10)]}, "cifar10", "batches.meta")
    dump(batch(5 * images, 100, b"fine_labels"), "cifar100", "train")
    dump(batch(images, 100, b"fine_labels"), "cifar100", "test")
    dump({b"fine_label_names": [f"class{i}".encode() for i in range(100)]}, "cifar100", "meta")
    words = [f"w{i}" for i in range(2000)] + ["<unk>"]
    os.makedirs(os.path.join(out, "ptb"), exist_ok=True)
    for split, n in (("train", sentences), ("valid", sentences // 10), ("test", sentences // 10)):
        with open(os.path.join(out, "ptb", f"ptb.{split}.txt"), "w") as f:
            for _ in range(n):
                f.write(" " + " ".join(rng.choice(words, 20)) + " \n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--images", type=int, default=256, help="CIFAR images per batch file (CIFAR-100 train: 5x)")
    ap.add_argument("--sentences", type=int, default=3000, help="PTB training sentences of 20 words")
    args = ap.parse_args(argv)
    write(args.out, args.images, args.sentences)
    print(f"wrote {args.out}/cifar10, {args.out}/cifar100, {args.out}/ptb (random content)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
