"""The paper reproductions (the demo's reference row, the end-to-end benchmark, the launch
scripts) ask for GraVAC's rules as published, whatever ``GraVAC()``'s default is."""
from benchmarks import end_to_end
from horovod_gravac.harness import demo
from launcher import ROOT


def test_the_paper_reproductions_pin_algorithm_1():
    """The demo's paper row, the end-to-end benchmark and the launch scripts reproduce the
    paper's GraVAC (and their committed results ran it): they ask for variant paper.  (The
    demo's other GraVAC rows are ``GraVAC()`` with its defaults: ``test_demo.py``.)"""
    gravac_runs = [flags for name, _, flags in demo.RUNS if "gravac" in flags and name in demo.REFERENCES]
    assert len(gravac_runs) == len(demo.REFERENCES) >= 1
    e2e = [flags for _, _, flags in end_to_end.CONFIGS.values() if "gravac" in flags]
    assert len(e2e) >= 6
    gravac_runs += e2e
    for flags in gravac_runs:
        assert flags[flags.index("--variant") + 1] == "paper", flags
    assert '--variant "${VARIANT:-paper}"' in (ROOT / "launch" / "run_gravac.sh").read_text()
