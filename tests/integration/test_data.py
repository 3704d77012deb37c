"""Data loaders on tiny files written here in the real on-disk formats; sharding; BPTT streams."""
import os
import pickle

import numpy as np
import pytest
import torch

from horovod_gravac.harness import data as D
from horovod_gravac.harness.models import LSTMLanguageModel, detach_hidden


# --------------------------------------------------------------------------- helpers
def write_cifar10(root, per_batch=4, n_test=6, seed=0):
    """The layout of cifar-10-python.tar.gz: python-2 pickles (bytes keys), N x 3072 uint8, row-major CHW."""
    rng = np.random.RandomState(seed)
    os.makedirs(root, exist_ok=True)
    batches = []
    for i in range(1, 6):
        x = rng.randint(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        y = rng.randint(0, 10, size=per_batch).tolist()
        batches.append((x, y))
        with open(os.path.join(root, f"data_batch_{i}"), "wb") as f:
            pickle.dump({b"batch_label": f"training batch {i} of 5".encode(), b"labels": y, b"data": x,
                         b"filenames": [b"f.png"] * per_batch}, f, protocol=2)
    xt = rng.randint(0, 256, size=(n_test, 3072), dtype=np.uint8)
    yt = rng.randint(0, 10, size=n_test).tolist()
    with open(os.path.join(root, "test_batch"), "wb") as f:
        pickle.dump({b"labels": yt, b"data": xt}, f, protocol=2)
    with open(os.path.join(root, "batches.meta"), "wb") as f:
        pickle.dump({b"label_names": [n.encode() for n in ["airplane", "automobile", "bird", "cat", "deer",
                                                           "dog", "frog", "horse", "ship", "truck"]],
                     b"num_cases_per_batch": per_batch, b"num_vis": 3072}, f, protocol=2)
    return batches, (xt, yt)


def write_cifar100(root, n_train=12, n_test=5, seed=1):
    rng = np.random.RandomState(seed)
    os.makedirs(root, exist_ok=True)
    out = {}
    for name, n in (("train", n_train), ("test", n_test)):
        x = rng.randint(0, 256, size=(n, 3072), dtype=np.uint8)
        fine = rng.randint(0, 100, size=n).tolist()
        out[name] = (x, fine)
        with open(os.path.join(root, name), "wb") as f:
            pickle.dump({b"data": x, b"fine_labels": fine, b"coarse_labels": [c // 5 for c in fine]}, f, protocol=2)
    with open(os.path.join(root, "meta"), "wb") as f:
        pickle.dump({b"fine_label_names": [f"class{i}".encode() for i in range(100)],
                     b"coarse_label_names": [f"super{i}".encode() for i in range(20)]}, f, protocol=2)
    return out


PTB_TRAIN = [" the cat sat on the mat ", " a dog ran N miles ", " the dog sat "]
PTB_VALID = [" the cat ran ", " zebra sat "]
PTB_TEST = [" a mat <unk> "]


def write_ptb(root, train=PTB_TRAIN, valid=PTB_VALID, test=PTB_TEST):
    os.makedirs(root, exist_ok=True)
    for name, lines in (("ptb.train.txt", train), ("ptb.valid.txt", valid), ("ptb.test.txt", test)):
        with open(os.path.join(root, name), "w") as f:
            f.write("\n".join(lines) + "\n")


# --------------------------------------------------------------------------- CIFAR
def test_cifar10_reads_real_layout(tmp_path):
    batches, (xt, yt) = write_cifar10(str(tmp_path))
    ds = D.load_cifar(str(tmp_path), "cifar10")
    assert ds.train_x.shape == (20, 3, 32, 32) and ds.train_x.dtype == torch.uint8
    assert ds.test_x.shape == (6, 3, 32, 32)
    assert ds.train_y.tolist() == sum((y for _, y in batches), [])
    assert ds.test_y.tolist() == yt
    assert ds.num_classes == 10 and ds.class_names[0] == "airplane"
    # Row-major CHW: pixel (c, h, w) of image i is data[i, c*1024 + h*32 + w].
    x0 = batches[0][0]
    for c, h, w in [(0, 0, 0), (1, 5, 7), (2, 31, 31)]:
        assert int(ds.train_x[0, c, h, w]) == int(x0[0, c * 1024 + h * 32 + w])
    assert int(ds.train_x[4, 2, 3, 1]) == int(batches[1][0][0, 2 * 1024 + 3 * 32 + 1])  # 2nd batch follows


def test_cifar10_finds_the_unpacked_subdirectory(tmp_path):
    write_cifar10(str(tmp_path / "cifar-10-batches-py"))
    assert D.load_image_dataset("cifar10", str(tmp_path)).train_x.shape[0] == 20


def test_cifar100_fine_labels(tmp_path):
    out = write_cifar100(str(tmp_path))
    ds = D.load_cifar(str(tmp_path), "cifar100")
    assert ds.num_classes == 100
    assert ds.train_y.tolist() == out["train"][1]
    assert ds.test_x.shape == (5, 3, 32, 32)
    x = ds.prepare(ds.train_x[:3], train=False)
    assert x.dtype == torch.float32 and x.shape == (3, 3, 32, 32)
    manual = (out["train"][0][:3].reshape(3, 3, 32, 32) / 255.0 - np.array(D.CIFAR_MEAN["cifar100"])[None, :, None, None]) \
        / np.array(D.CIFAR_STD["cifar100"])[None, :, None, None]
    assert np.allclose(x.numpy(), manual, atol=1e-5)


@pytest.mark.parametrize("name,expected", [("cifar10", "data_batch_1"), ("cifar100", "meta")])
def test_missing_cifar_names_files_and_place(tmp_path, name, expected):
    with pytest.raises(D.DatasetNotFound) as e:
        D.load_image_dataset(name, str(tmp_path / "nowhere"))
    msg = str(e.value)
    assert expected in msg and "nowhere" in msg and "--data" in msg
    with pytest.raises(D.DatasetNotFound, match="--data"):
        D.load_image_dataset(name, None)


def test_cifar_augmentation_keeps_shape_and_content():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).view(2, 3, 8, 8)
    out = D.random_crop_flip(x, pad=0, generator=torch.Generator().manual_seed(0))
    for i in range(2):   # pad 0: each image is itself or its mirror
        assert torch.equal(out[i], x[i]) or torch.equal(out[i], x[i].flip(2))
    out = D.random_crop_flip(x, pad=4, generator=torch.Generator().manual_seed(0))
    assert out.shape == x.shape


# --------------------------------------------------------------------------- digits
def test_digits_split_is_stratified_and_deterministic():
    a, b = D.load_digits_data(), D.load_digits_data()
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert a.train_x.shape[1:] == (1, 8, 8) and a.train_x.shape[0] + a.test_x.shape[0] == 1797
    counts = torch.bincount(a.test_y, minlength=10)
    assert counts.min() >= 30   # every class is in the test set
    assert float(a.train_x.min()) == 0.0   # background stays exactly zero


# --------------------------------------------------------------------------- PTB
def test_ptb_vocab_eos_and_unk(tmp_path):
    write_ptb(str(tmp_path))
    c = D.load_ptb(str(tmp_path))
    words = [c.vocab[i] for i in c.train.tolist()]
    assert words == "the cat sat on the mat <eos> a dog ran N miles <eos> the dog sat <eos>".split()
    assert [c.vocab[i] for i in c.valid.tolist()] == "the cat ran <eos> <unk> sat <eos>".split()  # zebra unseen
    assert [c.vocab[i] for i in c.test.tolist()] == "a mat <unk> <eos>".split()
    assert len(set(c.vocab)) == len(c.vocab) == c.vocab_size


def test_ptb_subdirectory_and_missing_message(tmp_path):
    write_ptb(str(tmp_path / "simple-examples" / "data"))
    assert D.load_text_dataset("ptb", str(tmp_path)).train.numel() == 17
    with pytest.raises(D.DatasetNotFound) as e:
        D.load_ptb(str(tmp_path / "empty"))
    assert "ptb.train.txt" in str(e.value) and "ptb.test.txt" in str(e.value)


def test_pydoc_corpus_is_real_and_round_trips_through_ptb_files(tmp_path):
    c = D.load_pydoc_corpus()
    assert c.train.numel() > 80_000 and c.valid.numel() > 5_000 and c.test.numel() > 5_000
    assert "<eos>" in c.vocab and "<unk>" in c.vocab and "the" in c.vocab
    D.write_ptb_files(c, str(tmp_path))
    back = D.load_ptb(str(tmp_path))
    for a, b in ((c.train, back.train), (c.test, back.test)):
        assert [c.vocab[i] for i in a[:2000].tolist()] == [back.vocab[i] for i in b[:2000].tolist()]
        assert a.numel() == b.numel()


def test_tokenizer():
    assert D.tokenize_ptb_style("x = 3.5 + Y_1 ** 2") == ["x", "=", "N", "+", "y_1", "*", "*", "N"]
    assert D.tokenize_ptb_style("*********") == []


# --------------------------------------------------------------------------- sharding
@pytest.mark.parametrize("n,size,bs", [(100, 2, 8), (1797, 3, 32), (64, 4, 16)])
def test_shards_disjoint_equal_and_deterministic(n, size, bs):
    shards = [D.shard_indices(n, r, size, epoch=0, seed=5, batch_size=bs) for r in range(size)]
    lengths = {len(s) for s in shards}
    assert len(lengths) == 1 and lengths.pop() % bs == 0        # equal, whole batches
    allidx = torch.cat(shards)
    assert allidx.unique().numel() == allidx.numel()             # disjoint
    assert int(allidx.max()) < n
    again = D.shard_indices(n, 1 % size, size, epoch=0, seed=5, batch_size=bs)
    assert torch.equal(again, shards[1 % size])                  # deterministic
    other = D.shard_indices(n, 0, size, epoch=1, seed=5, batch_size=bs)
    assert not torch.equal(other, shards[0])                     # reshuffled per epoch


def test_sharded_batches_same_count_on_every_rank():
    ds = D.load_digits_data()
    its = [D.ShardedBatches(ds, 32, rank=r, size=2, seed=0) for r in range(2)]
    assert its[0].batches_per_epoch == its[1].batches_per_epoch == 1438 // 64
    seen = [[], []]
    for r, it in enumerate(its):
        for _ in range(it.batches_per_epoch):
            x, y = next(it)
            assert x.shape == (32, 1, 8, 8)
            seen[r].append(y)
        assert it.epoch == 0
        next(it)
        assert it.epoch == 1


def test_batchify_for_rank_gives_contiguous_disjoint_streams():
    data = torch.arange(103)
    parts = [D.batchify_for_rank(data, 3, r, 2) for r in range(2)]
    assert parts[0].shape == parts[1].shape == (17, 3)          # 103 // 6 rows each
    cols = torch.cat(parts, dim=1)                               # the 6 streams in order
    assert torch.equal(cols.t().reshape(-1), torch.arange(102))
    for p in parts:   # each column is a contiguous run of the corpus
        assert torch.all(p[1:] - p[:-1] == 1)


def test_bptt_stream_windows_are_consecutive_and_epochs_flagged():
    streams = D.batchify(torch.arange(40), 2)    # 20 x 2
    s = D.BPTTStream(streams, bptt=6)
    assert s.windows_per_epoch == 4              # 19 targets: 6 + 6 + 6 + 1
    xs, flags = [], []
    for _ in range(5):
        x, y, new = next(s)
        assert torch.equal(y[:-1], x[1:])        # targets are inputs shifted by one
        xs.append(x)
        flags.append(new)
    assert flags == [True, False, False, False, True] and s.epoch == 1
    assert torch.equal(torch.cat(xs[:4]), streams[:-1])


def test_hidden_state_carried_across_windows_equals_one_long_sequence():
    """Carrying the (detached) hidden state over consecutive windows computes exactly what one
    forward pass over the whole stream computes; resetting it would not."""
    torch.manual_seed(0)
    model = LSTMLanguageModel(30, 8, 8, num_layers=2, dropout=0.0).eval()
    streams = D.batchify(torch.randint(0, 30, (2 * 41,)), 2)     # 41 x 2
    with torch.no_grad():
        full, _ = model(streams[:-1], model.init_hidden(2))
        pieces, hidden = [], None
        for x, _ in D.BPTTStream.windows(streams, 7):
            hidden = model.init_hidden(2) if hidden is None else detach_hidden(hidden)
            out, hidden = model(x, hidden)
            pieces.append(out)
        carried = torch.cat(pieces)
        assert torch.allclose(carried, full, atol=1e-5)
        reset = torch.cat([model(x, model.init_hidden(2))[0] for x, _ in D.BPTTStream.windows(streams, 7)])
        assert not torch.allclose(reset, full, atol=1e-3)


def test_eval_shard_covers_everything_once():
    n, size = 359, 3
    parts = [D.eval_shard(n, r, size) for r in range(size)]
    idx = sum((list(range(n))[p] for p in parts), [])
    assert idx == list(range(n))


def test_synthetic_datasets_go_through_the_real_loaders(tmp_path):
    """scripts/make_synthetic_datasets.py (the GPU check's harness smoke data) writes files the
    loaders read as CIFAR-10, CIFAR-100 and PTB."""
    import importlib.util
    from conftest import ROOT
    spec = importlib.util.spec_from_file_location("mksyn", ROOT / "scripts" / "make_synthetic_datasets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.write(str(tmp_path), images=8, sentences=30)
    c10 = D.load_cifar(str(tmp_path / "cifar10"), "cifar10")
    assert c10.train_x.shape == (40, 3, 32, 32) and c10.test_x.shape == (8, 3, 32, 32) and c10.num_classes == 10
    c100 = D.load_cifar(str(tmp_path / "cifar100"), "cifar100")
    assert c100.train_x.shape == (40, 3, 32, 32) and int(c100.train_y.max()) < 100
    ptb = D.load_ptb(str(tmp_path / "ptb"))
    assert ptb.train.numel() == 30 * 21 and "<unk>" in ptb.vocab   # 20 words and <eos> a sentence
