"""benchmarks/horovod_parity.py: hg.DistributedOptimizer and hvd.DistributedOptimizer side by
side on 2 real ranks (a short run; the measurement itself takes minutes)."""
import re
import sys

import pytest

from launcher import ROOT, horovodrun_cmd, run_with_timeout

pytestmark = pytest.mark.parallel


def test_parity_table_has_every_optimizer_against_its_horovod_reference():
    cmd = horovodrun_cmd(2, [sys.executable, "-m", "benchmarks.horovod_parity", "--models", "mlp,cnn",
                             "--width", "64", "--rounds", "1", "--steps", "1"])
    rc, out = run_with_timeout(cmd, timeout=300, cwd=ROOT)
    assert rc == 0, out[-3000:]
    rows = re.findall(r"\[0\]<stdout>:(hvd|hg-dense|hvd-fp16|hg-dense-fp16|hg-topk10) +([\d.]+) +([\d.]+)x", out)
    assert [r[0] for r in rows] == ["hvd", "hg-dense", "hvd-fp16", "hg-dense-fp16", "hg-topk10"] * 2, out[-3000:]
    for name, ms, ratio in rows:
        assert float(ms) > 0 and float(ratio) > 0
        if name in ("hvd", "hvd-fp16"):
            assert float(ratio) == 1.0   # each reference against itself
    assert "[1]<stdout>:" not in "".join(line for line in out.splitlines() if "vs hvd" in line)  # rank 0 prints
