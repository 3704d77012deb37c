"""The sparse-gradient workload (``--preset ngram-pydoc-chars``): the hashed
character-context data set, the fastText-style model, the preset, why Top-k loses nothing
on it, and one real 2-rank dense vs GraVAC (epsilon 0.9) comparison asserting the target:
within 0.5 percentage points of dense accuracy with at least 10x fewer bytes."""
import sys

import pytest
import torch
import torch.nn.functional as F

from horovod_gravac.harness import data as gd
from horovod_gravac import controllers as C
from horovod_gravac.harness import train as T
from horovod_gravac.compressors import TopKCompressor
from horovod_gravac.harness.models import HashedNGram, build_model
from horovod_gravac.harness.runlog import load_run
from launcher import ROOT, horovodrun_cmd, run_with_timeout



@pytest.fixture(scope="module")
def chars():
    return gd.load_pydoc_chars()


# --------------------------------------------------------------------------- data
def test_hash_features_are_the_hashed_left_contexts():
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 3, 1, 4, 1, 5])
    x = gd.hash_context_features(ids, orders=3, num_buckets=1 << 20, boundary=99)
    assert x.shape == (13, 3) and x.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < 1 << 20
    assert torch.equal(x, gd.hash_context_features(ids, 3, 1 << 20, 99))        # deterministic
    # Same left context of order o -> same bucket in column o - 1; "3 1 4 1" repeats at 8..11.
    assert torch.equal(x[12], x[4])            # contexts (1), (4 1), (1 4 1) before both 5s
    assert x[2, 0] == x[10, 0] and x[2, 1] == x[10, 1]   # (1), (3 1) before both 4s
    assert x[2, 2] != x[10, 2]                 # (boundary 3 1) vs (6 3 1)
    # Before the stream: boundary symbols; the first row depends on nothing in the stream.
    y = gd.hash_context_features(torch.tensor([7, 7]), 3, 1 << 20, 99)
    assert torch.equal(x[0], y[0])
    assert len({int(v) for v in x[5]}) == 3    # orders land in different buckets
    with pytest.raises(ValueError):
        gd.hash_context_features(ids.view(1, -1), 3, 10, 0)


def test_pydoc_paragraphs_split_like_the_word_corpus():
    corpus = gd.load_pydoc_corpus()
    index = {w: i for i, w in enumerate(corpus.vocab)}
    unk = index["<unk>"]
    for part, stream in zip(gd.pydoc_paragraphs(), (corpus.train, corpus.valid, corpus.test)):
        ids = [index.get(w, unk) for para in part for line in para.splitlines()
               for w in (gd.tokenize_ptb_style(line) + ["<eos>"] if gd.tokenize_ptb_style(line) else [])]
        assert torch.equal(torch.tensor(ids, dtype=torch.int64), stream)


def test_pydoc_chars_examples(chars):
    d = chars
    assert d.name == "pydoc-chars" and d.num_buckets == 1 << 18 and d.features_per_example == 5
    assert 50 <= d.num_classes <= 200 and d.class_names[0] == "<unk>" and len(d.class_names) == d.num_classes
    assert d.train_x.shape[0] > 300_000 and d.test_x.shape[0] > 40_000 and d.valid_x.shape[0] > 40_000
    for x, y in ((d.train_x, d.train_y), (d.valid_x, d.valid_y), (d.test_x, d.test_y)):
        assert x.shape == (y.numel(), 5) and x.dtype == y.dtype == torch.int64
        assert int(x.min()) >= 0 and int(x.max()) < d.num_buckets
        assert int(y.min()) >= 0 and int(y.max()) < d.num_classes
    # Labels are the characters of the test paragraphs, joined by blank lines.
    test_text = "".join(p + "\n\n" for p in gd.pydoc_paragraphs()[2])
    decoded = "".join(d.class_names[i] for i in d.test_y[:2000].tolist())
    assert decoded == "".join(c if c in d.class_names else "<unk>" for c in test_text[:2000])
    # Features are the hashed contexts of the labels before them; every split starts afresh.
    again = gd.hash_context_features(d.test_y, 5, d.num_buckets, boundary=d.num_classes)
    assert torch.equal(again, d.test_x)
    assert torch.equal(d.train_x[0], d.test_x[0]) and torch.equal(d.valid_x[0], d.test_x[0])
    assert torch.equal(d.prepare(d.test_x[:4], train=True), d.test_x[:4])   # ids go in unchanged


def test_sharded_batches_over_feature_data(chars):
    a = gd.ShardedBatches(chars, 256, rank=0, size=2, seed=42)
    b = gd.ShardedBatches(chars, 256, rank=1, size=2, seed=42)
    (xa, ya), (xb, yb) = next(a), next(b)
    assert xa.shape == xb.shape == (256, 5) and ya.shape == yb.shape == (256,)
    assert not torch.equal(xa, xb)             # disjoint shards of one shared permutation
    assert a.batches_per_epoch == b.batches_per_epoch == chars.train_x.shape[0] // 512


# --------------------------------------------------------------------------- model
def test_hashed_ngram_model_and_sparse_gradient():
    torch.manual_seed(0)
    m = build_model("ngram", num_classes=7, num_buckets=1000, width=4)
    assert isinstance(m, HashedNGram) and m.embedding.weight.shape == (1000, 4) and m.fc.out_features == 7
    ids = torch.randint(1000, (6, 3))
    out = m(ids)
    assert out.shape == (6, 7)
    F.cross_entropy(out, torch.randint(7, (6,))).backward()
    grad = m.embedding.weight.grad
    assert not grad.is_sparse
    rows = torch.nonzero(grad.abs().sum(1)).view(-1)
    assert set(rows.tolist()) <= set(ids.view(-1).tolist())
    # Sum of the bag's embeddings, then the linear layer.
    with torch.no_grad():
        assert torch.allclose(out, m.fc(m.embedding.weight[ids].sum(1)), atol=1e-6)
    with pytest.raises(ValueError):
        build_model("ngram", num_classes=7)
    assert build_model("ngram", num_classes=7, num_buckets=50).embedding.embedding_dim == 16


def test_gain_is_one_up_to_cf_160(chars):
    """Why GraVAC at epsilon 0.9 can climb: with error feedback at CF 160, a batch's
    gradient (plus residual) has fewer nonzeros than Top-k keeps, so nothing is lost."""
    torch.manual_seed(0)
    m = build_model("ngram", num_classes=chars.num_classes, num_buckets=chars.num_buckets, width=16)
    opt = torch.optim.SGD(m.parameters(), lr=1.0, momentum=0.9)
    comp = TopKCompressor(160.0)
    batches = gd.ShardedBatches(chars, 256, rank=0, size=2, seed=42)
    residual = None
    for _ in range(5):
        x, y = next(batches)
        opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        g = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
        g_ef = g if residual is None else g + residual
        payload, _ = comp.compress(g_ef)
        gain = float(payload.values.double().pow(2).sum() / g_ef.double().pow(2).sum())
        assert gain == pytest.approx(1.0, abs=1e-9)
        assert int((g_ef != 0).sum()) <= g_ef.numel() / 160
        residual = g_ef.clone()
        residual[payload.indices.long()] = 0
        opt.step()


# --------------------------------------------------------------------------- preset
def test_preset_settings():
    a = T.resolve_args(["--preset", "ngram-pydoc-chars", "--out", "x"])
    assert (a.model, a.dataset, a.batch_size, a.steps, a.width, a.compressor) == \
        ("ngram", "pydoc-chars", 256, 1000, 16, "topk")
    # GraVAC: the paper's settings, window scaled down for 1000 steps; the default rule set
    # ("predictive") judges another gain and takes its own epsilon and policy from the library.
    paper = T.resolve_args(["--preset", "ngram-pydoc-chars", "--variant", "paper", "--out", "x"])
    assert (paper.epsilon, paper.theta_min, paper.theta_max, paper.policy, paper.omega, paper.window) == \
        (0.9, 10.0, 1000.0, "exponential", 0.01, 100)
    assert (a.epsilon, a.theta_min, a.theta_max, a.policy, a.omega, a.window) == \
        (C.DEFAULT_EPSILON["predictive"], 10.0, 1000.0, None, 0.01, 100)
    assert (a.lr, a.momentum, a.weight_decay, a.lr_milestones, a.lr_gamma) == (1.0, 0.9, 0.0, [800], 0.1)
    assert T.resolve_args(["--model", "ngram", "--out", "x"]).dataset == "pydoc-chars"
    for bad in (["--model", "ngram", "--dataset", "digits"], ["--model", "tinycnn", "--dataset", "pydoc-chars"],
                ["--model", "tinylstm", "--dataset", "pydoc-chars"]):
        with pytest.raises(SystemExit):
            T.resolve_args(bad + ["--out", "x"])


def test_num_buckets_sets_the_hash_range_and_is_checked(capsys):
    """--num-buckets (the emulated-network benchmark uses 2^16): the loader hashes into
    that many embedding rows; it is refused for other models and below 1."""
    a = T.resolve_args(["--preset", "ngram-pydoc-chars", "--num-buckets", "65536", "--out", "x"])
    assert a.num_buckets == 65536
    assert T.resolve_args(["--preset", "ngram-pydoc-chars", "--out", "x"]).num_buckets is None
    d = gd.load_feature_dataset("pydoc-chars", num_buckets=1 << 16)
    assert d.num_buckets == 1 << 16 and int(d.train_x.max()) < 1 << 16 and int(d.train_x.min()) >= 0
    for bad, says in ((["--model", "tinycnn", "--num-buckets", "64"], "ngram only"),
                      (["--model", "ngram", "--num-buckets", "0"], "must be >= 1")):
        with pytest.raises(SystemExit):
            T.resolve_args(bad + ["--out", "x"])
        assert says in capsys.readouterr().err


# --------------------------------------------------------------------------- 2 ranks, the target
def _launch(out_dir, *flags, timeout=420):
    cmd = horovodrun_cmd(2, [sys.executable, "-m", "horovod_gravac.harness.train",
                             "--preset", "ngram-pydoc-chars", "--seed", "42", "--threads", "1",
                             "--out", out_dir, *flags])
    rc, out = run_with_timeout(cmd, timeout, cwd=ROOT)
    if rc is None:
        pytest.fail(f"2-rank run timed out after {timeout}s: {' '.join(flags)}\n{out[-4000:]}")
    assert rc == 0, f"2-rank run failed: {' '.join(flags)}\n{out[-6000:]}"
    run = load_run(str(out_dir))
    assert run.finished, f"{out_dir}: no summary.json"
    return run.summary


@pytest.mark.parallel
@pytest.mark.slow
@pytest.mark.alone
def test_two_rank_gravac_eps09_meets_the_target(tmp_path):
    """Same steps and seed; GraVAC (the default rule set) at eps 0.9 within 0.5 pp of dense,
    with >= 10x fewer bytes.  500 steps with the lr drop at 400, half the preset's run: on
    it the default climbs to 640x within 50 steps and ends 0.03 pp from dense with 74x fewer
    bytes (seed 42), so the bounds keep their margin.  About 50 s on two cores.

    Alone (not even beside the fault tests): every gain is near 1.0 up to high CFs, so each
    climb is decided by measured step times (a few percent apart between neighbouring CFs on
    localhost), and the path depends on the machine being otherwise idle: under the parallel
    pass's load the ladder once stalled at CF 20 for 700 steps (9.9x fewer bytes)."""
    run = ("--steps", "500", "--lr-milestones", "400")
    dense = _launch(tmp_path / "dense", "--controller", "dense", *run)
    gravac = _launch(tmp_path / "gravac", "--controller", "gravac", "--epsilon", "0.9", *run)
    assert dense["steps"] == gravac["steps"] == 500
    diff_pp = 100 * (gravac["final"]["accuracy"] - dense["final"]["accuracy"])
    fewer = dense["bytes_sent"] / gravac["bytes_sent"]
    assert dense["final"]["samples"] == gravac["final"]["samples"] > 40_000   # the whole test split
    assert dense["final"]["accuracy"] > 0.6
    assert abs(diff_pp) <= 0.5, (diff_pp, dense["final"], gravac["final"])
    assert fewer >= 10.0, (fewer, gravac["steps_per_cf"])
    # It got there by climbing, not by luck in one window.
    assert gravac["controller_history"][-1]["theta_min"] >= 40
