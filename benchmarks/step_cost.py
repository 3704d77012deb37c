"""What does each compressor add to a training step on one device?  Plain torch, the dense
controller and each static compressor side by side.

    python -m benchmarks.step_cost --device cuda                      # ResNet101/CIFAR-10, batch 32
    python -m benchmarks.step_cost --device cpu --preset cnn1d-digits --steps 20   # a quick look

One rank, so there is no network: what differs between the rows is the work each
compressor adds to a step (compressing, error feedback, decompressing) and the host
synchronisations inside the bucket hooks, which on a GPU hold back the launches of the
backward kernels queued after them (so a row's step time can grow by more than its
``compress`` column).  The first row is the same model and batch trained with no
distributed optimizer at all (plain torch), the compute floor; then the harness
(``horovod_gravac.harness.train``) with the dense controller and with each static
compressor.  Each harness row is its own process, run one after the other; the table gives
medians over the steps after the first ``--skip`` (warm-up).  Data: the real data set under
``--data`` or, by default, random data in the real formats
(``scripts/make_synthetic_datasets.py``; nothing is downloaded).

The GPU check (``scripts/gpu_check.sh``) runs it; its figures are in docs/gpu.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from horovod_gravac.harness import runlog


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name -> harness arguments after --preset/--data
RUNS = {
    "dense": ["--controller", "dense"],
    "topk-10": ["--controller", "static", "--compressor", "topk", "--cf", "10"],
    "dgc-10": ["--controller", "static", "--compressor", "dgc", "--cf", "10"],
    "randomk-10": ["--controller", "static", "--compressor", "randomk", "--cf", "10"],
    "topk-100": ["--controller", "static", "--compressor", "topk", "--cf", "100"],
    "dgc-100": ["--controller", "static", "--compressor", "dgc", "--cf", "100"],
    "redsync-100": ["--controller", "static", "--compressor", "redsync", "--cf", "100"],
    "sidco-100": ["--controller", "static", "--compressor", "sidco", "--cf", "100"],
    "gravac-dgc": ["--controller", "gravac", "--compressor", "dgc", "--window", "10"],
}


def median_ms(fn, device, repeats, warmup=3):
    """Median wall time of ``fn()`` in ms over ``repeats`` calls after ``warmup`` calls; on a
    GPU each call is timed between two synchronizations (its kernels, not their launch)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3

def plain_step_ms(preset: str, device: str, steps: int, skip: int) -> float | None:
    """Median step of the preset's image model and batch with plain torch SGD, or None
    for a model this loop does not build (text models: the harness rows still run)."""
    from horovod_gravac.harness.models import build_model
    from horovod_gravac.harness.train import PRESETS
    p = PRESETS[preset]
    shapes = {"cifar10": (10, 3, 32), "cifar100": (100, 3, 32)}
    if p.get("dataset") not in shapes:
        return None
    classes, channels, side = shapes[p["dataset"]]
    torch.manual_seed(0)
    model = build_model(p["model"], num_classes=classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=p.get("lr", 0.1), momentum=p.get("momentum", 0.0),
                          weight_decay=p.get("weight_decay", 0.0))
    batch = p.get("batch_size", 32)
    x = torch.randn(batch, channels, side, side, device=device)
    y = torch.randint(0, classes, (batch,), device=device)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return median_ms(step, torch.device(device), steps - skip, warmup=skip)


def summarize(run_dir: str, skip: int) -> dict:
    """Medians (ms) of a harness run's per-step times, and the floats it sent."""
    rows = runlog.load_run(run_dir).steps
    rows = rows[skip:] or rows

    def med(key):
        vals = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(vals) * 1e3 if vals else float("nan")
    return {"step": med("step_time"), "compress": med("compress_time"), "comm": med("comm_time"),
            "floats": sum(r["floats_sent"] for r in rows) / max(1, sum(r["dense_floats"] for r in rows)),
            "cfs": sorted({r["cf"] for r in rows})}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--preset", default="resnet101-cifar10")
    ap.add_argument("--data", help="the data set's directory (default: random data in its format)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the medians")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, from {','.join(RUNS)}")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per harness run")
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args(argv)
    names = [n for n in args.runs.split(",") if n]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        ap.error(f"unknown run(s) {unknown}; choose from {list(RUNS)}")
    if args.steps <= args.skip:
        ap.error("--steps must exceed --skip")

    from horovod_gravac.harness.train import PRESETS
    dataset = PRESETS[args.preset].get("dataset")
    work = tempfile.mkdtemp(prefix="step_cost_")
    data = args.data
    if data is None and dataset in ("cifar10", "cifar100", "ptb"):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_synthetic_datasets.py"), work],
                       check=True, stdout=subprocess.DEVNULL)
        data = os.path.join(work, dataset)

    lines = [f"# step cost: {args.preset}, one rank, device {args.device}"
             + (f" ({torch.cuda.get_device_name(0)})" if args.device.startswith("cuda") else "")
             + f", torch {torch.__version__}; medians of steps {args.skip + 1}-{args.steps}",
             f"{'run':14s} {'step ms':>8s} {'x plain':>8s} {'x dense':>8s} {'compress':>9s} {'comm':>7s} "
             f"{'floats':>7s}  CFs sent"]
    print("\n".join(lines), flush=True)
    plain = plain_step_ms(args.preset, args.device, args.steps, args.skip)
    if plain is not None:
        lines.append(f"{'plain torch':14s} {plain:8.1f} {1.0:8.2f} {'-':>8s} {'-':>9s} {'-':>7s} {'-':>7s}  -")
        print(lines[-1], flush=True)
    dense = None
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in names:
        out = os.path.join(work, name)
        cmd = [sys.executable, "-m", "horovod_gravac.harness.train", "--preset", args.preset,
               "--device", args.device, "--steps", str(args.steps), "--eval-every", str(10 * args.steps),
               "--max-eval-batches", "1", "--log-every", str(args.steps), "--out", out] + RUNS[name]
        if data:
            cmd += ["--data", data]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            failed = proc.returncode != 0 and (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        except subprocess.TimeoutExpired:
            failed = [f"timed out after {args.timeout:g} s"]
        if failed:
            lines.append(f"{name:14s} FAILED: {failed[0] if failed else ''}")
        else:
            s = summarize(out, args.skip)
            dense = s["step"] if name == "dense" else dense
            x_plain = f"{s['step'] / plain:8.2f}" if plain else f"{'-':>8s}"
            x_dense = f"{s['step'] / dense:8.2f}" if dense else f"{'-':>8s}"
            lines.append(f"{name:14s} {s['step']:8.1f} {x_plain} {x_dense} {s['compress']:9.1f} {s['comm']:7.1f} "
                         f"{s['floats']:7.3f}  {', '.join(f'{c:g}' for c in s['cfs'])}")
        print(lines[-1], flush=True)
    lines.append(f"# harness runs and their logs: {work}")
    print(lines[-1])
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
