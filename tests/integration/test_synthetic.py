"""The data sets made on the spot (horovod_gravac.harness.synthetic): large enough, the same
on every machine and every call, and usable by the harness's presets."""
import pytest
import torch

from horovod_gravac.harness import synthetic
from horovod_gravac.harness.data import load_image_dataset, load_text_dataset


# generator, examples, dtype, one example's shape, class names; every class is drawn at least
# half as often as an even split gives (n / 10).
GENERATORS = {
    "shapes": (synthetic.make_shapes, 300, torch.uint8, (3, synthetic.SHAPES_SIZE, synthetic.SHAPES_SIZE),
               synthetic.SHAPES),
    "waves": (synthetic.make_waves, 500, torch.float32, (1, 8, 8), synthetic.WAVES),
}


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_data_sets_are_a_pure_function_of_the_seed(name):
    make, n, dtype, shape, classes = GENERATORS[name]
    a_x, a_y = make(n, seed=7)
    b_x, b_y = make(n, seed=7)
    c_x, _ = make(n, seed=8)
    assert torch.equal(a_x, b_x) and torch.equal(a_y, b_y)
    assert not torch.equal(a_x, c_x)
    assert a_x.dtype == dtype and a_x.shape == (n, *shape)
    if dtype.is_floating_point:
        assert bool(torch.isfinite(a_x).all())
    counts = torch.bincount(a_y, minlength=len(classes))
    assert counts.min() >= n // (2 * len(classes)), counts   # every class drawn


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


def test_wave_classes_differ_where_they_should():
    """Without noise, a slow and a fast sine differ in their zero crossings, and the class
    means differ from each other: the labels carry information a model can learn."""
    x, y = synthetic.make_waves(4000, seed=3)
    seq = x.view(len(x), -1)
    centred = seq - seq.mean(dim=1, keepdim=True)
    crossings = (centred[:, 1:] * centred[:, :-1] < 0).sum(1).float()
    slow, fast = crossings[y == 0].mean(), crossings[y == 1].mean()   # sine-slow, sine-fast
    assert fast > slow + 2, (float(slow), float(fast))
    spectra = torch.fft.rfft(centred, dim=1).abs()
    profile = torch.stack([spectra[y == k].mean(0) for k in range(len(synthetic.WAVES))])
    for i in range(len(synthetic.WAVES)):
        for j in range(i + 1, len(synthetic.WAVES)):
            assert (profile[i] - profile[j]).abs().sum() > 1.0, (synthetic.WAVES[i], synthetic.WAVES[j])


def test_waves_data_set_is_large_and_scaled():
    ds = load_image_dataset("waves")
    assert ds.train_x.shape[0] >= 20_000 and ds.test_x.shape[0] >= 5_000 and ds.num_classes == 10
    assert abs(float(ds.train_x.std()) - 1.0) < 1e-3
    x = ds.prepare(ds.train_x[:8], train=True)
    assert torch.equal(x, ds.train_x[:8])   # float storage: used as stored
    assert ds.in_channels == 1 and ds.image_size == 8    # cnn1d reads 64 samples


def test_waves_preset_is_the_one_bucket_1d_cnn():
    from horovod_gravac.harness import train as T
    from horovod_gravac.harness.models import build_model
    args = T.resolve_args(["--preset", "cnn1d-waves"])
    assert (args.model, args.dataset, args.steps, args.window) == ("cnn1d", "waves", 1200, 100)
    ds = load_image_dataset("waves")
    model = build_model(args.model, ds.num_classes, width=args.width, in_channels=ds.in_channels,
                        image_size=ds.image_size)
    assert 1.3e6 < sum(p.numel() for p in model.parameters()) < 1.5e6
    assert model(ds.test_x[:4]).shape == (4, 10)
