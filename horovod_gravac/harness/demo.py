"""The embedded default: short 2-rank trainings on data that ships with installed packages, and a report.

    python -m horovod_gravac.harness.demo --out reports/demo

Runs, one after another, each as ``horovodrun -np 2 -H localhost:2 --gloo python -m
horovod_gravac.harness.train --preset PRESET ...`` in a subprocess with a timeout.  Two
workloads:

**digits** (``--preset digits``: a small CNN on scikit-learn's handwritten digits, 1000 steps):

1. ``dense``          dense SGD (plain allreduce), the reference;
2. ``static-topk100`` Top-k at a fixed CF of 100 (2 % of dense floats: values + indices);
3. ``gravac``         ``GraVAC()`` with every default (the README's recommendation when the
                      CF is unknown): the predictive rule set, epsilon 0.9, theta 10..1000,
                      window 500, with Top-k;
4. ``gravac-paper``   ``GraVAC(variant="paper")``: Algorithm 1 as the paper publishes it
                      (epsilon 0.9, theta 10..1000, Exponential policy, the preset's window of
                      100), for comparison.  It is not checked against the targets.

Why the two GraVAC rows differ.  Floats count values *and* int32 indices, so CF 10 sends 20 %
of dense and 10x fewer floats needs CFs above 20 for most of the run.  The paper's rule
measures the gain of a candidate CF on each step's own gradient, which on a small CNN falls
quickly with the CF, so it can stay near theta_min and send about a fifth of dense's floats.
The default measures what error feedback delivered over a window, and its coherence hold keeps
10x only while the gradient the ranks average is mostly signal; otherwise it moves to the CF
its step-time model predicts fastest among those that keep the gain.  That choice follows
measured step times, which is why every run pays its bytes on an emulated link (``LINKS``,
``--link``; :mod:`horovod_gravac.link_emulation`): two ranks on one machine exchange at memory
speed, a step at 10x is then no slower than one at 1000x, and the choice would follow the
noise of the machine.  ``--link none`` shows that case.  Digits is
easy: every run, even static Top-k at 100x, ends near dense accuracy, so this workload shows
the mechanics, not a case where adaptivity is needed for accuracy.

All runs use the same seed, data order and number of steps. Then it builds the report
(:mod:`horovod_gravac.harness.report`: PNG plots, CSV/JSON) in ``--out`` and prints the summary
table: final test accuracy, difference to dense, floats sent relative to dense, time,
and the fraction of step time spent producing batches. Finally it checks the targets
(``GraVAC()`` within 1 percentage point of dense accuracy with at least 10x fewer floats)
and prints the paper's rule beside them.

**ngram-pydoc-chars** (``--preset ngram-pydoc-chars``: next-character prediction on
CPython's own pydoc text with a fastText-style model whose gradient is sparse):

5. ``ngram-dense``   dense SGD, the reference;
6. ``ngram-gravac``  ``GraVAC()`` with every default, as on digits: Top-k with error feedback
                     keeps nearly the whole gradient up to CF 160, so it climbs to a few
                     hundred x at dense accuracy.

Each workload gets its own report (``--out``/digits, ``--out``/ngram-pydoc-chars) and
target checks.  Nothing is downloaded: the digits (1797 8x8 images) ship inside
scikit-learn, the pydoc text inside CPython.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

from ..controllers import GraVAC
from .runlog import is_finished

# GraVAC() as constructed with no arguments: the harness's --controller gravac takes the
# library's rule set, epsilon and policy; the presets' window (100) is the one setting to undo.
DEFAULT_GRAVAC = ["--controller", "gravac", "--compressor", "topk", "--window", str(GraVAC().window)]
# Algorithm 1 as published, with the preset's settings (epsilon 0.9, window 100, Exponential).
PAPER_GRAVAC = ["--controller", "gravac", "--variant", "paper", "--compressor", "topk", "--epsilon", "0.9",
                "--policy", "exponential", "--theta-min", "10", "--theta-max", "1000"]
# name, preset, extra flags for horovod_gravac.harness.train
RUNS = [
    ("dense", "digits", ["--controller", "dense"]),
    ("static-topk100", "digits", ["--controller", "static", "--compressor", "topk", "--cf", "100"]),
    ("gravac", "digits", DEFAULT_GRAVAC),
    ("gravac-paper", "digits", PAPER_GRAVAC),
    ("ngram-dense", "ngram-pydoc-chars", ["--controller", "dense"]),
    ("ngram-gravac", "ngram-pydoc-chars", DEFAULT_GRAVAC),
]
#: Runs shown beside the checked ones, with what they are (not targets of this package).
REFERENCES = {"gravac-paper": 'GraVAC(variant="paper"): the paper\'s published rule, for comparison'}
#: The link each workload's collectives pay for (``--emulate-link``; module doc): slow enough
#: that the dense exchange is most of a dense step on two CPU cores, as on a
#: communication-bound cluster job, and that a CF's wire time stands out of the timing noise
#: of a busy machine (docs/benchmarks.md, "The demo's link", has the figures).
LINKS = {"digits": "25mbit", "ngram-pydoc-chars": "1gbit"}
ACCURACY_TOLERANCE = 0.01     # GraVAC within 1 percentage point of dense
MIN_COMPRESSION = 10.0        # ... with at least 10x fewer floats sent


def find_horovodrun() -> str:
    """``horovodrun`` next to this Python (a virtual environment) or on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    found = shutil.which("horovodrun")
    if not found:
        raise SystemExit("horovodrun not found: install Horovod (scripts/setup.sh) in this environment")
    return found


def wait_or_stop(proc: subprocess.Popen, timeout: float, grace: float = 10.0) -> bool:
    """Wait for a job started with ``start_new_session=True``; past ``timeout`` seconds send
    its process group SIGTERM, then SIGKILL after ``grace``.  True if it timed out."""
    try:
        proc.wait(timeout=timeout)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)   # the job's own process group only
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return True


def run_one(name: str, preset: str, flags: List[str], run_dir: str, steps: Optional[int], timeout: float,
            np_: int, quiet: bool, link: Optional[str] = None) -> Dict:
    """Launch one 2-rank training; stream rank 0's progress; kill the job on timeout."""
    cmd = [find_horovodrun(), "-np", str(np_), "-H", f"localhost:{np_}", "--gloo",
           sys.executable, "-m", "horovod_gravac.harness.train", "--preset", preset, "--out", run_dir] + flags
    if steps:
        cmd += ["--steps", str(steps)]
    if link:
        cmd += ["--emulate-link", link]
    log_path = run_dir.rstrip("/") + ".log"
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    print(f"\n== {name}: {' '.join(cmd[cmd.index('-m'):])}", flush=True)
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, start_new_session=True)

        def pump():   # copy the job's output to the log; echo rank 0's lines
            for line in proc.stdout:
                log.write(line)
                if not quiet and line.startswith("[0]<stdout>:"):
                    print("   " + line[len("[0]<stdout>:"):].rstrip(), flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = wait_or_stop(proc, timeout)
        reader.join(timeout=10)
    seconds = time.perf_counter() - t0
    ok = proc.returncode == 0 and not timed_out and is_finished(run_dir)
    status = "ok" if ok else ("timed out" if timed_out else f"failed (exit {proc.returncode})")
    print(f"   {name}: {status} in {seconds:.1f}s (log {log_path})", flush=True)
    return {"name": name, "preset": preset, "ok": ok, "status": status, "seconds": seconds, "log": log_path,
            "dir": run_dir}


def check_targets(rows: List[dict]) -> List[dict]:
    """The default GraVAC runs vs the targets: accuracy within 1 pp of dense, >= 10x fewer
    floats.  The paper's rule (``REFERENCES``) is reported beside them, not checked."""
    out = []
    for r in rows:
        if r.get("controller") != "gravac":
            continue
        diff, comp = r.get("diff_vs_dense"), r.get("compression_vs_dense")
        acc_ok = diff is not None and diff >= -ACCURACY_TOLERANCE
        comp_ok = comp is not None and comp >= MIN_COMPRESSION
        reference = REFERENCES.get(r["run"])
        out.append({"run": r["run"], "accuracy_within_1pp": acc_ok, "at_least_10x_fewer_floats": comp_ok,
                    "diff_pp": None if diff is None else 100 * diff, "compression": comp,
                    "meets_targets": None if reference else acc_ok and comp_ok, "reference": reference})
    return out


def target_line(t: dict) -> str:
    """The line printed for one GraVAC run: its target check, or, for the paper's rule, what it
    reached, labelled as such."""
    diff = "n/a (no dense run finished)" if t["diff_pp"] is None else f"{t['diff_pp']:+.2f} pp vs dense"
    comp = "n/a" if t["compression"] is None else f"{t['compression']:.1f}x"
    if t["reference"]:
        return f"{t['reference']}: {t['run']}: accuracy {diff}, {comp} fewer floats"
    return (f"target check {t['run']}: accuracy {diff} "
            f"({'ok' if t['accuracy_within_1pp'] else 'MISSED'}: within 1 pp), "
            f"{comp} fewer floats ({'ok' if t['at_least_10x_fewer_floats'] else 'MISSED'}: >= 10x)")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m horovod_gravac.harness.demo",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join("reports", "demo"), help="report directory")
    p.add_argument("--steps", type=int, help="override the presets' training steps (see train.py)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per run")
    p.add_argument("--np", type=int, default=2, help="ranks per run")
    p.add_argument("--only", help="comma-separated subset of runs: " + ",".join(n for n, _, _ in RUNS))
    p.add_argument("--quiet", action="store_true", help="do not stream the progress lines")
    p.add_argument("--link",
                   help="the link rate every run's collectives pay for, emulated (default: "
                        + ", ".join(f"{k} {v}" for k, v in LINKS.items())
                        + "; 'none': the machine's own, memory-speed on one machine)")
    args = p.parse_args(argv)

    t_start = time.perf_counter()
    selected = [r for r in RUNS if not args.only or r[0] in args.only.split(",")]
    runs_root = os.path.join(args.out, "runs")
    results = []
    for name, preset, flags in selected:
        run_dir = os.path.join(runs_root, name)
        if os.path.isdir(run_dir):
            shutil.rmtree(run_dir)
        link = LINKS.get(preset) if args.link is None else None if args.link.lower() == "none" else args.link
        results.append(run_one(name, preset, flags, run_dir, args.steps, args.timeout, args.np, args.quiet,
                               link))
    done = [r for r in results if r["ok"]]
    if not done:
        print("\nno run finished; see the logs above", file=sys.stderr)
        return 1

    from .report import make_report
    summary = {"runs": results, "workloads": {}}
    for preset in dict.fromkeys(r["preset"] for r in done):   # one report per workload, in run order
        out = os.path.join(args.out, preset)
        report = make_report([r["dir"] for r in done if r["preset"] == preset], out)
        targets = check_targets(report["runs"])
        summary["workloads"][preset] = {"table": report["runs"], "targets": targets, "plots": report["plots"],
                                        "report": out}
        print(f"\n## {preset}\n\n" + report["table"])
        for t in sorted(targets, key=lambda t: bool(t["reference"])):   # the checked runs first
            print(target_line(t))
        print(f"report: {out} ({', '.join(report['plots'])})")
    total = time.perf_counter() - t_start
    summary["total_seconds"] = total
    with open(os.path.join(args.out, "demo_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print("\nfloats: values and int32 indices both count (2 per kept entry); "
          "loader %: share of step time spent producing batches")
    failed = [r["name"] for r in results if not r["ok"]]
    if failed:
        print(f"runs that did not finish: {', '.join(failed)}")
    print(f"total {total:.1f}s")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
