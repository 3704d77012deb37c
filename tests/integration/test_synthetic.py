"""The data sets made on the spot (horovod_gravac.harness.synthetic): large enough, the same
on every machine and every call, and usable by the harness's presets."""
import torch

from horovod_gravac.harness import synthetic
from horovod_gravac.harness.data import load_image_dataset, load_text_dataset


def test_shapes_are_a_pure_function_of_the_seed():
    a_x, a_y = synthetic.make_shapes(300, seed=7)
    b_x, b_y = synthetic.make_shapes(300, seed=7)
    c_x, _ = synthetic.make_shapes(300, seed=8)
    assert torch.equal(a_x, b_x) and torch.equal(a_y, b_y)
    assert not torch.equal(a_x, c_x)
    assert a_x.dtype == torch.uint8 and a_x.shape == (300, 3, synthetic.SHAPES_SIZE, synthetic.SHAPES_SIZE)
    counts = torch.bincount(a_y, minlength=len(synthetic.SHAPES))
    assert counts.min() >= 15, counts   # every class drawn (about 30 each)


def test_each_shape_is_drawn_where_its_mask_says():
    """A lone shape on a plain background: its mask covers pixels, and differs between classes."""
    size = synthetic.SHAPES_SIZE
    kinds = torch.arange(len(synthetic.SHAPES))
    n = kinds.numel()
    masks = synthetic._shape_masks(kinds, torch.full((n,), size / 2), torch.full((n,), size / 2),
                                   torch.full((n,), size / 3), torch.full((n,), 1.2), size)
    assert masks.shape == (n, size, size) and float(masks.min()) >= 0 and float(masks.max()) <= 1
    area = masks.sum(dim=(1, 2))
    assert bool((area > 4).all()), area
    flat = masks.view(n, -1)
    for i in range(n):
        for j in range(i + 1, n):
            assert (flat[i] - flat[j]).abs().sum() > 2, (synthetic.SHAPES[i], synthetic.SHAPES[j])


def test_shapes_data_set_is_large_and_cached(tmp_path, monkeypatch):
    assert synthetic.SHAPES_TRAIN >= 20_000 and synthetic.SHAPES_TEST >= 5_000
    monkeypatch.setattr(synthetic, "SHAPES_TRAIN", 400)
    monkeypatch.setattr(synthetic, "SHAPES_TEST", 100)
    monkeypatch.setenv("HOROVOD_GRAVAC_CACHE", str(tmp_path))
    ds = load_image_dataset("shapes")
    assert ds.train_x.shape[0] == 400 and ds.test_x.shape[0] == 100 and ds.num_classes == 10
    assert list(tmp_path.iterdir()), "nothing cached"
    again = load_image_dataset("shapes")
    assert torch.equal(again.train_x, ds.train_x)
    x = ds.prepare(ds.train_x[:8], train=True)
    assert x.dtype == torch.float32 and abs(float(x.mean())) < 1.0


def test_stdlib_characters_are_enough_text():
    corpus = load_text_dataset("stdlib-chars")
    assert corpus.vocab_size == len(synthetic.CHARS)
    # at least 20k training and 5k test sequences of 35 characters (the preset's BPTT)
    assert corpus.train.numel() // 35 >= 20_000 and corpus.test.numel() // 35 >= 5_000
    assert int(corpus.train.max()) < corpus.vocab_size
    assert float((corpus.train == 0).float().mean()) < 1e-3   # almost every character is kept
    text = "".join(synthetic.CHARS[i] for i in corpus.train[:200].tolist())
    assert "import" in text or "def " in text or '"""' in text
