"""benchmarks/controller_study.py: the offline controller study runs the real controller and
summarises per seed (a short run; the study itself takes minutes)."""
import json

import pytest

from benchmarks import controller_study as S
from horovod_gravac.controllers import Dense, GraVAC, StaticCF


def test_specs_build_the_real_controllers():
    assert isinstance(S.make_controller("static:1"), Dense)
    assert S.make_controller("static:10").cf == 10
    g = S.make_controller('gravac:{"variant": "delivered", "hold_windows": 0, "epsilon": 0.9}')
    assert isinstance(g, GraVAC) and g.window == 20 and g.hold_windows == 0 and g.epsilon == 0.9
    with pytest.raises(ValueError, match="spec"):
        S.make_controller("accordion:10")


def test_a_short_delivered_run_climbs_and_reports_each_evaluation():
    evals = S.simulate("rowlstm", 'gravac:{"variant": "delivered", "window": 5, "hold_windows": 0}', 0,
                       steps=30, lr_drop_after=20, eval_every=10)
    assert [e[0] for e in evals] == [10, 20, 30]
    assert all(0.0 <= e[2] <= 100.0 for e in evals)
    assert evals[-1][1] > evals[0][1] > 0          # modelled seconds accumulate
    assert max(e[3] for e in evals) > 10           # the row LSTM's early gains let it climb


def test_summary_compares_with_dense_and_static_10():
    def line(spec, seed, accs, t):
        return json.dumps({"workload": "cnn1d", "spec": spec, "seed": seed,
                           "evals": [[i * 20, t * (i + 1), a, 10.0] for i, a in enumerate(accs)]})
    lines = [line("static:1", 1, [90, 99, 99, 99, 99], 5.0), line("static:10", 1, [90, 98.6, 99, 99, 99], 2.0),
             line("x", 1, [98.6, 98, 98, 98, 98], 1.0)]
    text = S.summary(lines, ["static:1", "static:10", "x"], [1])
    row = next(r for r in text.splitlines() if r.strip().startswith("x "))
    # last four: 98 against 99 -> -1.00; reached at its first evaluation (1 s) vs static:10's second (4 s)
    assert "-1.00" in row and "reached 1/1" in row and "4.00x" in row
