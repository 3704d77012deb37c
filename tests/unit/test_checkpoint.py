"""A checkpoint must not load silently into the wrong optimizer.

One process, Horovod initialised with one rank (no collectives cross processes); the
multi-rank resume itself is tested in tests/integration/test_parallel.py."""
import re

import pytest
import torch

import horovod_gravac as hg
from horovod_gravac import checkpoint
from horovod_gravac.checkpoint import CheckpointError


@pytest.fixture(scope="module")
def hvd1():
    import horovod.torch as hvd
    hvd.init()
    return hvd


def _model(out=3, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, out))


def _opt(model, controller, compressor=hg.TopKCompressor, **kw):
    return hg.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), controller=controller,
                                   compressor=compressor, **kw)


def _train(model, opt, steps=5):
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return opt


def _trained_state(controller, **kw):
    model = _model()
    opt = _train(model, _opt(model, controller, **kw))
    state = opt.state_dict()
    assert state["gravac"]["residuals"] or isinstance(controller, hg.Dense)
    return state


def _gravac():
    return hg.GraVAC(theta_min=2, theta_max=64, epsilon=0.3, window=2)


def test_state_records_what_it_was_written_for(hvd1):
    state = _trained_state(_gravac())
    meta = state["gravac"]["meta"]
    assert meta["controller"]["type"] == "GraVAC" and meta["controller"]["theta_min"] == 2
    assert meta["compressor"] == "TopKCompressor(cf=10)"
    assert meta["world_size"] == 1 and meta["rank"] == 0
    assert meta["parameters"] == [("0.weight", (8, 6), "torch.float32"), ("0.bias", (8,), "torch.float32"),
                                  ("2.weight", (3, 8), "torch.float32"), ("2.bias", (3,), "torch.float32")]
    assert set(state["gravac"]["residual_crc32"]) == set(state["gravac"]["residuals"])
    # hvd.broadcast_optimizer_state reads only these two
    assert isinstance(state["state"], dict) and isinstance(state["param_groups"], list)


def test_same_setup_loads(hvd1):
    state = _trained_state(_gravac())
    model = _model()
    opt = _opt(model, _gravac())
    opt.load_state_dict(state)
    got = opt.gravac_state_dict()
    assert got["controller"] == state["gravac"]["controller"] and got["step"] == state["gravac"]["step"]
    assert all(torch.equal(got["residuals"][k], v) for k, v in state["gravac"]["residuals"].items())


@pytest.mark.parametrize("written,loaded,names", [
    (_gravac, lambda: hg.StaticCF(50), ["controller", "GraVAC(", "StaticCF(cf=50"]),
    (_gravac, lambda: hg.GraVAC(theta_min=50, theta_max=60, epsilon=0.3, window=2),
     ["controller", "theta_min=2", "theta_min=50"]),
    (lambda: hg.StaticCF(50), _gravac, ["controller", "StaticCF(cf=50"]),
    (lambda: hg.StaticCF(50), lambda: hg.Accordion(), ["controller", "Accordion("]),
    (lambda: hg.Accordion(low_cf=2, high_cf=8, interval=2), lambda: hg.StaticCF(4), ["controller"]),
], ids=["gravac-into-static", "gravac-into-other-range", "static-into-gravac", "static-into-accordion",
        "accordion-into-static"])
def test_wrong_controller_is_a_value_error_naming_it(hvd1, written, loaded, names):
    state = _trained_state(written())
    model = _model()
    opt = _opt(model, loaded())
    before = opt.controller.state_dict()
    with pytest.raises(ValueError) as info:
        opt.load_state_dict(state)
    msg = str(info.value)
    assert all(n in msg for n in names), msg
    assert "retarget" in msg and "controller=True" in msg, msg
    assert opt.controller.state_dict() == before, "a refused checkpoint changed the controller"


def test_retarget_controller_keeps_this_optimizers_controller(hvd1):
    state = _trained_state(_gravac())
    opt = _opt(_model(), hg.StaticCF(50))
    opt.load_state_dict(checkpoint.retarget(state, controller=True))
    assert opt.controller.decision.send_cf == 50 and opt.step_index == state["gravac"]["step"]


def test_old_state_without_meta_into_wrong_controller_is_not_a_bare_key_error(hvd1):
    state = _trained_state(hg.StaticCF(4))
    del state["gravac"]["meta"]   # as written before the metadata existed
    opt = _opt(_model(), _gravac())
    with pytest.raises(ValueError, match="controller"):
        opt.load_state_dict(state)


def test_other_compressor_or_layout_is_refused(hvd1):
    state = _trained_state(hg.StaticCF(4))
    with pytest.raises(ValueError, match=re.escape("compressor: TopKCompressor(cf=10) in the checkpoint")):
        _opt(_model(), hg.StaticCF(4), compressor=hg.RandomKCompressor).load_state_dict(state)
    with pytest.raises(ValueError, match=r"parameters: '2.weight' has shape \(3, 8\) in the checkpoint, \(4, 8\)"):
        _opt(_model(out=4), hg.StaticCF(4)).load_gravac_state_dict(state["gravac"])
    model = _model().double()
    with pytest.raises(ValueError, match="dtype torch.float32 in the checkpoint, torch.float64"):
        _opt(model, hg.StaticCF(4)).load_gravac_state_dict(state["gravac"])


def test_another_ranks_file_is_refused_and_retarget_drops_its_residuals(hvd1):
    state = _trained_state(hg.StaticCF(4))
    state["gravac"]["meta"]["rank"] = 1       # as if rank 1 wrote it
    opt_model = _model()
    opt2 = _train(opt_model, _opt(opt_model, hg.StaticCF(4)), 2)   # non-zero residuals of its own
    with pytest.raises(ValueError) as info:
        opt2.load_state_dict(state)
    msg = str(info.value)
    assert "rank: written by rank 1" in msg and "loaded on rank 0" in msg, msg
    assert "horovod_gravac.checkpoint.retarget(state, rank=hvd.rank(), world_size=hvd.size())" in msg
    fixed = checkpoint.retarget(state, rank=0, world_size=1)
    assert state["gravac"]["residuals"], "retarget must not modify its argument"
    opt2.load_state_dict(fixed)
    assert all(float(r.abs().max()) == 0.0 for r in opt2.residuals().values())
    assert opt2.step_index == state["gravac"]["step"]
    _train(opt_model, opt2, 1)


def test_other_world_size_is_refused(hvd1):
    state = _trained_state(hg.StaticCF(4))
    state["gravac"]["meta"]["world_size"] = 4
    with pytest.raises(ValueError, match="world size: written by world size 4, loaded on world size 1"):
        _opt(_model(), hg.StaticCF(4)).load_state_dict(state)
    _opt(_model(), hg.StaticCF(4)).load_state_dict(checkpoint.retarget(state, world_size=1))


def test_flipped_bytes_in_a_residual_are_detected(hvd1):
    state = _trained_state(hg.StaticCF(4))
    name = "2.weight"
    res = state["gravac"]["residuals"][name]
    res.view(torch.int32).view(-1)[3] ^= 1 << 7   # one bit of one entry
    opt = _opt(_model(), hg.StaticCF(4))
    with pytest.raises(ValueError, match=re.escape(f"residual of parameter {name!r} is corrupted")):
        opt.load_state_dict(state)
    with pytest.raises(ValueError, match="corrupted"):
        opt.load_gravac_state_dict(state["gravac"])


def test_load_names_the_file_and_the_problem(tmp_path, hvd1):
    state = _trained_state(hg.StaticCF(4))
    good = tmp_path / "ckpt.rank0.pt"
    torch.save({"optimizer": state}, good)
    assert checkpoint.load(good)["optimizer"]["gravac"]["step"] == state["gravac"]["step"]
    data = good.read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match=rf"{re.escape(repr(str(cut)))} \(\d+ bytes\) is truncated"):
        checkpoint.load(cut)
    with pytest.raises((OSError, RuntimeError)):   # torch itself: no file name, and the cause varies
        torch.load(cut, weights_only=False)
    for n in (100, 1000, len(data) - 30):   # other cut points
        cut.write_bytes(data[:n])
        with pytest.raises(CheckpointError, match="cut.pt"):
            checkpoint.load(cut)
    foreign = tmp_path / "notes.txt"
    foreign.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="notes.txt.*is not a torch checkpoint"):
        checkpoint.load(foreign)
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match="empty.pt' is empty"):
        checkpoint.load(empty)
    with pytest.raises(ValueError, match="missing.pt"):
        checkpoint.load(tmp_path / "missing.pt")
    # a damaged middle (end record intact): still an error naming the file
    bad = bytearray(data)
    for i in range(len(bad) // 3, len(bad) // 3 + 64):
        bad[i] ^= 0xFF
    broken = tmp_path / "broken.pt"
    broken.write_bytes(bytes(bad))
    try:
        checkpoint.load(broken)
    except CheckpointError as exc:
        assert "broken.pt" in str(exc)


# ------------------------------------------------------------------ pure functions
def test_check_compatible_lists_every_difference():
    a = checkpoint.describe({"type": "StaticCF", "cf": 4.0}, "TopKCompressor(cf=10)", 2, 0,
                            [("w", (2, 3), "torch.float32")])
    b = checkpoint.describe({"type": "StaticCF", "cf": 4.0}, "TopKCompressor(cf=10)", 3, 1,
                            [("w", (2, 3), "torch.float32")])
    checkpoint.check_compatible(a, a)
    checkpoint.check_compatible(None, a)   # written before metadata existed
    with pytest.raises(CheckpointError) as info:
        checkpoint.check_compatible(b, a)
    assert "world size: written by world size 3" in str(info.value) and "rank: written by rank 1" in str(info.value)
    with pytest.raises(CheckpointError, match="format"):
        checkpoint.check_compatible(dict(a, format=99), a)


def test_crc32_is_over_the_tensor_bytes():
    t = torch.arange(10, dtype=torch.float32)
    import zlib
    assert checkpoint.crc32(t) == zlib.crc32(t.numpy().tobytes())
    assert checkpoint.crc32(t[::2]) == zlib.crc32(t[::2].contiguous().numpy().tobytes())
    assert checkpoint.crc32(torch.empty(0)) == 0
    assert checkpoint.crc32(torch.ones(3, dtype=torch.bfloat16)) != checkpoint.crc32(torch.zeros(3, dtype=torch.bfloat16))


def _train_from(model, opt, start, steps):
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("setup", ["momentum_correction", "accordion", "delivered"])
def test_velocities_and_interval_sums_are_saved_and_resume_exactly(hvd1, setup):
    """DGC's momentum-correction velocities, Accordion's running interval sum and GraVAC
    "delivered"'s window sums are per-rank state: saved by parameter name, with checksums,
    and a resumed run is bit for bit the uninterrupted one (saved mid-interval)."""
    import copy
    make, kw = {"momentum_correction": (lambda: hg.StaticCF(4), dict(momentum_correction=0.9)),
                "accordion": (lambda: hg.Accordion(low_cf=2, high_cf=16, threshold=0.3, interval=3), {}),
                # one CF (its choices would otherwise follow measured step times, which differ per run)
                "delivered": (lambda: hg.GraVAC(theta_min=2, theta_max=2, epsilon=0.01, window=3,
                                                variant="delivered"), {})}[setup]
    model = _model()
    opt = _opt(model, make(), **kw)
    _train_from(model, opt, 0, 4)
    state, weights = copy.deepcopy(opt.state_dict()), copy.deepcopy(model.state_dict())
    ref = _train_from(model, opt, 4, 5)
    key, crc = {"momentum_correction": ("velocities", "velocity_crc32"),
                "accordion": ("accumulated", "accumulated_crc32"),
                "delivered": ("accumulated", "accumulated_crc32")}[setup]
    saved = state["gravac"][key]
    assert saved and set(saved) == set(state["gravac"][crc]), saved.keys()
    assert any(float(t.abs().max()) > 0 for t in saved.values())
    sent = [n for n in saved if n.endswith("#sent")]
    assert bool(sent) == (setup == "delivered"), sorted(saved)
    assert setup != "delivered" or any(float(saved[n].abs().max()) > 0 for n in sent)
    model2 = _model(seed=5)
    model2.load_state_dict(weights)
    opt2 = _opt(model2, make(), **kw)
    opt2.load_state_dict(state)
    got = opt2.gravac_state_dict()[key]
    assert all(torch.equal(got[k], v) for k, v in saved.items())
    assert torch.equal(_train_from(model2, opt2, 4, 5), ref)


def test_states_without_velocities_or_interval_sums_still_load(hvd1):
    """A state written before velocities and interval sums were saved loads as before."""
    state = _trained_state(hg.StaticCF(4), momentum_correction=0.9)
    for key in ("velocities", "velocity_crc32", "accumulated", "accumulated_crc32"):
        del state["gravac"][key]
    opt = _opt(_model(), hg.StaticCF(4), momentum_correction=0.9)
    opt.load_state_dict(state)
    assert set(opt.gravac_state_dict()["residuals"]) == set(state["gravac"]["residuals"])


def test_flipped_bytes_in_a_velocity_are_detected_and_retarget_drops_velocities(hvd1):
    state = _trained_state(hg.StaticCF(4), momentum_correction=0.9)
    vel = state["gravac"]["velocities"]["2.weight"]
    vel.view(torch.int32).view(-1)[1] ^= 1 << 9
    with pytest.raises(ValueError, match=re.escape("momentum-correction velocity of parameter '2.weight' is corrupted")):
        _opt(_model(), hg.StaticCF(4), momentum_correction=0.9).load_state_dict(state)
    fixed = checkpoint.retarget(state, rank=0, world_size=1)
    assert fixed["gravac"]["velocities"] == {} and fixed["gravac"]["velocity_crc32"] == {}
    opt = _opt(_model(), hg.StaticCF(4), momentum_correction=0.9)
    opt.load_state_dict(fixed)


def _model64():
    return _model().double()


def _train64_from(model, opt, start, steps):
    for step in range(start, start + steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 6, generator=g, dtype=torch.float64), torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("setup", ["topk", "momentum_correction", "accordion", "powersgd"])
def test_float64_residuals_round_trip_bitwise(tmp_path, hvd1, setup):
    """A float64 model's residuals (velocities, interval sums, PowerSGD's warm starts) are
    float64, saved as such through a file, and a resumed run is bit for bit the uninterrupted one."""
    import copy
    make, kw = {"topk": (lambda: hg.StaticCF(4), {}),
                "momentum_correction": (lambda: hg.StaticCF(4), dict(momentum_correction=0.9)),
                "accordion": (lambda: hg.Accordion(low_cf=2, high_cf=16, threshold=0.3, interval=3), {}),
                "powersgd": (lambda: hg.StaticCF(4), dict(compressor=hg.PowerSGDCompressor))}[setup]
    model = _model64()
    opt = _opt(model, make(), **kw)
    _train64_from(model, opt, 0, 4)
    torch.save({"opt": opt.state_dict(), "model": model.state_dict()}, tmp_path / "ckpt.pt")
    weights = copy.deepcopy(model.state_dict())
    ref = _train64_from(model, opt, 4, 5)
    state = checkpoint.load(tmp_path / "ckpt.pt")["opt"]
    gravac = state["gravac"]
    buffers = [t for key in ("residuals", "velocities", "accumulated", "lowrank_q") for t in gravac[key].values()]
    assert gravac["residuals"] and all(t.dtype == torch.float64 for t in buffers)
    assert any(not torch.equal(t.float().double(), t) for t in gravac["residuals"].values())   # float64 digits
    model2 = _model64()
    model2.load_state_dict(weights)
    opt2 = _opt(model2, make(), **kw)
    opt2.load_state_dict(state)
    got = opt2.gravac_state_dict()
    for key in ("residuals", "velocities", "accumulated"):
        assert set(got[key]) == set(gravac[key])
        assert all(got[key][n].dtype == torch.float64 and torch.equal(got[key][n], t) for n, t in gravac[key].items())
    assert torch.equal(_train64_from(model2, opt2, 4, 5), ref)


def test_a_float32_residual_checkpoint_of_a_float64_model_loads_widened(hvd1):
    """A checkpoint written before float64 buckets kept float64 state holds float32 residuals
    (velocities, interval sums, PowerSGD warm starts) for a float64 model.  It loads: each is
    widened to float64, which is exact, and training goes on in float64."""
    for kw in (dict(momentum_correction=0.9), dict(compressor=hg.PowerSGDCompressor)):
        model = _model64()
        opt = _opt(model, hg.StaticCF(4), **kw)
        _train64_from(model, opt, 0, 3)
        state = opt.state_dict()
        gravac = state["gravac"]
        for key, crc_key, _ in checkpoint.PER_RANK:   # what the older version wrote
            gravac[key] = {n: t.float() for n, t in gravac[key].items()}
            gravac[crc_key] = checkpoint.residual_checksums(gravac[key])
        gravac["lowrank_q"] = {n: q.float() for n, q in gravac["lowrank_q"].items()}
        old = {n: t.clone() for n, t in gravac["residuals"].items()}
        opt.close()   # (the model goes on under opt2)
        opt2 = _opt(model, hg.StaticCF(4), **kw)
        opt2.load_state_dict(state)
        got = opt2.gravac_state_dict()["residuals"]
        assert set(got) == set(old)
        assert all(got[n].dtype == torch.float64 and torch.equal(got[n], t.double()) for n, t in old.items())
        flat = _train64_from(model, opt2, 3, 2)
        assert torch.isfinite(flat).all() and all(t.dtype == torch.float64 for t in opt2.residuals().values())
        opt2.close()
