"""The paper reproductions (the demo, the end-to-end benchmark, the launch scripts) ask for
GraVAC's rules as published, whatever ``GraVAC()``'s default is."""
from benchmarks import end_to_end
from horovod_gravac.harness import demo
from launcher import ROOT


def test_the_paper_reproductions_pin_algorithm_1():
    """The demo, the end-to-end benchmark and the launch scripts reproduce the paper's GraVAC
    (and their committed results ran it): they ask for variant paper."""
    gravac_runs = [flags for _, _, flags in demo.RUNS if "gravac" in flags]
    gravac_runs += [flags for _, _, flags in end_to_end.CONFIGS.values() if "gravac" in flags]
    assert len(gravac_runs) >= 9
    for flags in gravac_runs:
        assert flags[flags.index("--variant") + 1] == "paper", flags
    assert '--variant "${VARIANT:-paper}"' in (ROOT / "launch" / "run_gravac.sh").read_text()
