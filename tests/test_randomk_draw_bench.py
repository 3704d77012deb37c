"""benchmarks/randomk_draw.py: its reference (the PCG64 draw Random-k used before) draws what
the current draw does, one index per stratum, and the table runs."""
import numpy as np
import torch

from benchmarks import randomk_draw
from horovod_gravac.selection.randomk import stratified_draw


def test_reference_and_current_draw_the_same_strata():
    rng = np.random.Generator(np.random.PCG64(0))
    for numel, k in ((1003, 10), (1000, 10), (6_553_607, 655)):
        old, new = randomk_draw.pcg64_draw(numel, k, rng).long(), stratified_draw(numel, k, 12345).long()
        starts = torch.arange(k + 1, dtype=torch.int64) * numel // k
        for idx in (old, new):
            assert idx.numel() == k and bool((idx >= starts[:-1]).all()) and bool((idx < starts[1:]).all())


def test_table_runs(capsys):
    assert randomk_draw.main(["--cfs", "1000", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "R101 step" in out and out.count("x\n") == len(randomk_draw.SIZES) + 1
