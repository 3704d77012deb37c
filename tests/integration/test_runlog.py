"""The run-directory format (horovod_gravac.harness.runlog): writer and reader agree."""
import json
import math

import pytest

from horovod_gravac.harness import runlog


def test_written_run_reads_back(tmp_path):
    torch = pytest.importorskip("torch")
    out = tmp_path / "run"
    w = runlog.RunWriter(str(out), enabled=True)
    w.config({"model": "tinycnn", "lr": 0.1})
    for i in range(3):
        w.step({"step": i + 1, "loss": torch.tensor(0.5 / (i + 1)), "cf": 10.0})
    w.eval({"step": 3, "accuracy": 0.9, "test_loss": float("nan")})
    assert not runlog.is_finished(str(out))
    w.summary({"final": {"accuracy": 0.9}, "ratio": float("inf")})
    w.close()
    assert runlog.is_finished(str(out))
    run = runlog.load_run(str(out))
    assert run.finished and run.config == {"lr": 0.1, "model": "tinycnn"}
    assert [s["step"] for s in run.steps] == [1, 2, 3] and run.steps[1]["loss"] == pytest.approx(0.25)
    assert run.evals == [{"step": 3, "accuracy": 0.9, "test_loss": None}]   # NaN -> null
    assert run.summary["ratio"] == 1e308
    for name in (runlog.STEPS, runlog.EVALS):   # strict JSON, one record a line
        for line in (out / name).read_text().splitlines():
            json.loads(line)


def test_other_ranks_write_nothing(tmp_path):
    w = runlog.RunWriter(str(tmp_path / "run"), enabled=False)
    w.config({"a": 1})
    w.step({"step": 1})
    w.summary({})
    w.close()
    assert not (tmp_path / "run").exists()


def test_unfinished_and_truncated_runs(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / runlog.STEPS).write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')   # killed mid-write
    run = runlog.load_run(str(d))
    assert [s["step"] for s in run.steps] == [1, 2]
    assert not run.finished and run.config == {} and run.evals == [] and run.summary == {}
    with pytest.raises(FileNotFoundError):
        runlog.load_run(str(tmp_path / "missing"))


def test_jsonable_without_torch_values():
    assert runlog.jsonable({1: (1.0, -math.inf), "x": object}) == {"1": [1.0, -1e308], "x": str(object)}
