"""benchmarks/step_launches.py: what the optimizer adds to a step, counted and timed, with the
accelerators' paths forced on the CPU and put back afterwards."""
import pytest
import torch

pytest.importorskip("horovod.torch")
import horovod_gravac.encoder as encoder  # noqa: E402
import horovod_gravac.native as native  # noqa: E402
from benchmarks import step_launches  # noqa: E402


def test_step_launches_counts_per_bucket_work_and_restores_the_paths(capsys):
    mode, reads_back = native.mode(), encoder._reads_back_freely
    assert step_launches.main(["--models", "vgg16", "--width", "0.0625", "--steps", "1", "--rounds", "1",
                               "--runs", "dense,dgc-10", "--top", "3"]) == 0
    assert native.mode() == mode and encoder._reads_back_freely is reads_back
    text = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in text.splitlines()
            if line.split() and line.split()[0] in ("plain", "dense", "dgc-10")}
    assert set(rows) == {"plain", "dense", "dgc-10"}, text
    assert "accelerator code paths" in text and "41 parameter tensors" in text, text
    launches, views, syncs = (int(v) for v in rows["dense"][1:4])
    assert launches > 0 and syncs == 1, text   # the NaN check's sync
    if hasattr(torch, "_foreach_copy_"):      # (torch 2.0 copies the gradients back one by one)
        assert launches < 41, text            # per bucket, not per parameter
    assert int(rows["dgc-10"][3]) == 2, text          # and DGC's nonzero
    assert float(rows["dense"][4]) > 0, text


def test_step_launches_cpu_paths_read_back_freely(capsys):
    assert step_launches.main(["--models", "vgg16", "--width", "0.0625", "--steps", "1", "--rounds", "1",
                               "--runs", "dense", "--path", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "cpu code paths" in text, text
