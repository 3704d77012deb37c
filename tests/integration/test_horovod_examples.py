"""Copies of Horovod's PyTorch examples (tests/integration/examples/*.py, same structure, tiny models)
run with ``--impl hvd`` (hvd.DistributedOptimizer) and ``--impl hg`` (horovod_gravac's,
called with the same arguments) under horovodrun.

Every run must exit 0 within its timeout.  On 2 ranks, horovod_gravac's Dense controller
must give Horovod's parameters bitwise (same ``PARAMS_SHA``).  On 3 ranks Horovod's
ring may sum in another order from one run to the next, so the parameters are
compared within a tolerance there.  The package under test is chosen as in
test_horovod_compat.py (``$HOROVOD_GRAVAC_TEST_ROOT``).
"""
import json
import re
from pathlib import Path

import pytest
import torch

from test_horovod_compat import launch
from launcher import bracketed_runs

pytestmark = pytest.mark.parallel

EXAMPLES = Path(__file__).parent / "examples"
IMPLS = {"hvd": ["--impl", "hvd"],
         "hg-dense": ["--impl", "hg", "--controller", "dense"],
         "hg-static": ["--impl", "hg", "--controller", "static"],
         "hg-gravac": ["--impl", "hg", "--controller", "gravac"]}
_runs = {}


def run_examples(script, np_, runs, timeout):
    """Every run of ``runs`` ({key: argument list}) of ``script`` in one horovodrun launch
    (examples/_runs.py: each rank runs the script's ``__main__`` once per run, in order).  A
    launch costs several seconds of start-up on 2 cores; a tiny example's run, about one.
    Returns {key: (sha, rank 0's output of that run)}; a run that failed, or did not start
    because an earlier one failed, raises when its key is asked for."""
    keys = list(runs)
    argv = [EXAMPLES / script, json.dumps([list(map(str, runs[k])) for k in keys])]
    rc, out = launch(np_, EXAMPLES / "_runs.py", argv, timeout)
    results = {}
    for i, (key, seg) in enumerate(zip(keys, bracketed_runs(out, len(keys)))):
        what = f"{script} -np {np_} {key} ({' '.join(map(str, runs[key]))})"
        if seg is None:
            started = "it failed" if f"RUN_BEGIN {i}\n" in out else "it did not start (an earlier run failed)"
            results[key] = AssertionError(f"{what}: {started}; rc={rc} (None: timeout)\n{out[-5000:]}")
            continue
        shas = re.findall(r"PARAMS_SHA ([0-9a-f]{64})", seg)
        results[key] = (shas[0], seg) if len(shas) == 1 else \
            AssertionError(f"{what}: no PARAMS_SHA line\n{seg[-3000:]}")
    if rc != 0 and all(not isinstance(r, Exception) for r in results.values()):
        results = {k: AssertionError(f"{script} -np {np_}: rc={rc} (None: timeout)\n{out[-5000:]}") for k in keys}
    return results


def result(results, key):
    value = results[key]
    if isinstance(value, Exception):
        raise value
    return value


def cached(key, fn):
    if key not in _runs:
        try:
            _runs[key] = ("ok", fn())
        except BaseException as exc:   # a failed reference run fails every test that needs it
            _runs[key] = ("error", exc)
    status, value = _runs[key]
    if status == "error":
        raise value
    return value


# ---------------------------------------------------------------------------------------------
MNIST_EXTRA = ["--gradient-predivide-factor", "2.0"]


@pytest.mark.parametrize("impl", list(IMPLS))
def test_mnist_like(impl):
    runs = cached("mnist", lambda: run_examples("mnist_like.py", 2, {k: [*v, *MNIST_EXTRA] for k, v in IMPLS.items()},
                                                timeout=360))
    sha, _ = result(runs, impl)
    if impl == "hg-dense":
        ref, _ = result(runs, "hvd")
        assert sha == ref, "mnist_like: hg Dense parameters differ from hvd.DistributedOptimizer's"


def ranks_max_diff(out):
    found = re.findall(r"RANKS_MAX_DIFF (\S+)", out)
    assert len(found) == 1, f"no RANKS_MAX_DIFF line\n{out[-3000:]}"
    return float(found[0])


# the example as it is (weight decay 5e-5) under each implementation, and hvd and hg Dense without
IMAGENET = {**{impl: (impl, None) for impl in IMPLS}, ("hvd", 0): ("hvd", 0), ("hg-dense", 0): ("hg-dense", 0)}


def _imagenet_runs(tmp_root):
    """Each case's fresh run (2 epochs), then its resume from checkpoint-2 (a third epoch), all
    in one launch: {case: ((sha, ranks' max parameter difference) fresh, (the same) resumed)},
    or the error of a case whose runs failed."""
    runs, ckpts = {}, {}
    for case, (impl, wd) in IMAGENET.items():
        tag = impl if wd is None else f"{impl}-wd{wd}"
        ckpts[case] = ckpt = tmp_root / tag / "checkpoint-{epoch}.pth.tar"
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        fmt = ["--checkpoint-format", str(ckpt)] + ([] if wd is None else ["--wd", str(wd)])
        runs[(case, "fresh")] = [*IMPLS[impl], "--epochs", "2", *fmt]
        runs[(case, "resume")] = [*IMPLS[impl], "--epochs", "3", *fmt]   # the launch runs it after "fresh"
    got = run_examples("imagenet_resnet50_like.py", 2, runs, timeout=600)
    out = {}
    for case in IMAGENET:
        try:
            first, out1 = result(got, (case, "fresh"))
            assert "resume_from_epoch 0" in out1, out1[-2000:]
            assert Path(str(ckpts[case]).format(epoch=2)).exists(), "rank 0 did not save checkpoint-2"
            resumed, out2 = result(got, (case, "resume"))
            assert "resume_from_epoch 2" in out2, f"the second run did not resume:\n{out2[-2000:]}"
            out[case] = (first, ranks_max_diff(out1)), (resumed, ranks_max_diff(out2))
        except AssertionError as exc:
            out[case] = exc
    return out


@pytest.fixture(scope="module")
def imagenet_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("imagenet_like")


@pytest.mark.parametrize("impl", list(IMPLS))
def test_imagenet_resnet50_like_fresh_then_resume(impl, imagenet_tmp):
    """The example as it is (weight decay 5e-5).  Every rank must hold the same model after
    the fresh run and after the resume.  Horovod's own optimizer fails the second: in
    ``broadcast_optimizer_state`` the ranks that did not load the checkpoint create their
    optimizer state with a step that applies weight decay to their parameters alone (see
    ``horovod_gravac.optimizer._state_init_step``).  That is shown, not asserted, for hvd."""
    (first, diff1), (resumed, diff2) = result(cached("imagenet", lambda: _imagenet_runs(imagenet_tmp)), impl)
    assert first != resumed, "the resumed run did not train"
    if impl == "hvd":
        print(f"hvd.DistributedOptimizer: ranks apart by {diff1} after the fresh run, {diff2} after the resume")
        return
    assert diff1 == 0.0, f"imagenet_like fresh run with {impl}: ranks' parameters differ by {diff1}"
    assert diff2 == 0.0, f"imagenet_like resumed run with {impl}: ranks' parameters differ by {diff2}"


def test_imagenet_resnet50_like_dense_equals_hvd_without_weight_decay(imagenet_tmp):
    """Without weight decay Horovod's state-creating step leaves the parameters alone, so
    there hg Dense must give hvd's parameters bitwise, fresh and resumed."""
    runs = cached("imagenet", lambda: _imagenet_runs(imagenet_tmp))
    ref = result(runs, ("hvd", 0))
    got = result(runs, ("hg-dense", 0))
    assert ref[0][1] == ref[1][1] == 0.0, f"hvd's ranks differ without weight decay: {ref}"
    assert got[0][0] == ref[0][0], "imagenet_like fresh run, wd 0: hg Dense parameters differ from hvd's"
    assert got[1][0] == ref[1][0], "imagenet_like resumed run, wd 0: hg Dense parameters differ from hvd's"


@pytest.fixture(scope="module")
def synth_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("synthetic_like")


@pytest.mark.parametrize("np_", [2, 3])
@pytest.mark.parametrize("impl", list(IMPLS))
def test_synthetic_benchmark_like(impl, np_, synth_tmp):
    # fp16 on the wire on 2 ranks (bitwise comparable); fp32 on 3 (compared with a tolerance)
    def run_all():
        extra = ["--fp16-allreduce"] if np_ == 2 else []
        return run_examples("synthetic_benchmark_like.py", np_,
                            {k: [*v, *extra, "--save-params", str(synth_tmp / f"{k}-{np_}.pt")]
                             for k, v in IMPLS.items()}, timeout=360)
    runs = cached(("synthetic", np_), run_all)
    sha, out = result(runs, impl)
    assert re.search(r"Total img/sec on %d CPU" % np_, out), out[-2000:]
    if impl == "hg-dense":
        ref, _ = result(runs, "hvd")
        if np_ == 2:
            assert sha == ref, "synthetic_like -np 2 --fp16-allreduce: hg Dense differs from hvd's"
        else:
            a = torch.load(synth_tmp / f"hvd-{np_}.pt")
            b = torch.load(synth_tmp / f"hg-dense-{np_}.pt")
            diff = (a - b).abs().max().item()
            assert diff <= 1e-5, f"synthetic_like -np 3: hg Dense differs from hvd's by {diff:.3e}"
