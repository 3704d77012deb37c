"""Drop-in check on 2 ranks (launched by tests/integration/test_horovod_compat.py, alone: it may
leave Horovod's state behind): stock ``hvd.DistributedOptimizer`` with one of our compressors.
"""
import pytest

import horovod.torch as hvd
import horovod_gravac as hg

from compat_helpers import assert_ranks_identical, flat, make, note, sgd, train

pytestmark = pytest.mark.sizes(2)


def test_stock_hvd_optimizer_with_hg_compressor():
    model = make()
    try:
        opt = hvd.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters(),
                                       compression=hg.TopKCompressor(cf=100))
        train(model, opt, 3)
    except Exception as exc:
        msg = f"{type(exc).__name__}: {exc}"
        assert "horovod_gravac.DistributedOptimizer" in msg, \
            f"hvd.DistributedOptimizer(compression=hg.TopKCompressor) failed without naming " \
            f"horovod_gravac.DistributedOptimizer: {msg}"
        note(f"stock hvd optimizer + TopKCompressor raises: {msg[:200]}")
        return
    assert_ranks_identical(flat(model), "hvd.DistributedOptimizer(compression=TopKCompressor)")
    note("stock hvd optimizer + TopKCompressor works (ranks identical)")
