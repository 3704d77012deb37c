#!/usr/bin/env python3
"""What would compression save at the paper's scale (32 workers, 10 Gbit/s)?  An alpha-beta
cost model of dense and sparse gradient synchronisation (paper II-A).

Collectives (alpha: per-hop latency in s, beta: s per byte, N workers, M bytes):

* ring allreduce (dense SGD):        2 (N-1) alpha + 2 M beta (N-1)/N
* tree allreduce:                    2 alpha log2 N + 2 M beta log2 N        (paper's tree form)
* ring allgather of k bytes / rank:  (N-1) alpha + (N-1) k beta              (sparse payloads)
* recursive-doubling allgather:      alpha log2 N + (N-1) k beta             (tree variant)

Each collective also pays ``overhead`` seconds once (Horovod's per-operation
negotiation and bookkeeping); the paper's model has no such term (overhead=0 gives
exactly the paper's formulas). A sparse payload of k kept entries is k fp32 values
plus k int32 indices = 8 k bytes (the project's wire format). Dense allreduce is
split into Horovod fusion buffers (128 MiB by default), one collective each.

Per-step time for CF c (paper eq. for t_iter^(c)):
    t_step(c) = t_compute + t_compress(c) + t_decompress(c) + t_sync(c)

Inputs are measurements (CSV, see ``load_measurements``): per-step compute time,
compress time per CF and achieved density per model. The link parameters default to
the fit of benchmarks/net_probe.py measurements on the emulated network (see
``fit_link``); the projection to the paper's cluster (32 workers, 10 Gbit/s) keeps
the measured alpha/overhead and scales beta to 10 Gbit/s with the bandwidth
efficiency measured on the emulated link.

Past two ranks (``ranks``): the same link model prices every exchange the optimizer can pick
(``horovod_gravac/exchange.py``: dense allreduce, allgather, pair exchange, sparse allreduce);
``ranks`` checks it against ``benchmarks/rank_sweep.py``'s measured steps (compute measured,
communication modelled with the probe fit) and projects each exchange to 32, 64 and 256
ranks at 10 and 100 Gbit/s.

CLI::

    python -m benchmarks.cost_model ranks [--sweep benchmarks/results/rank_sweep/results.csv]
    python -m benchmarks.cost_model project [--measurements m.csv] [--csv out.csv]
    python -m benchmarks.cost_model fit --probe benchmarks/results/net_probe.csv
    python -m benchmarks.cost_model agree --probe benchmarks/results/net_probe.csv [--csv out.csv]
    python -m benchmarks.cost_model measure-compress --compressor topk --cfs 10,100,1000
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os
import statistics
import sys
import time
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from benchmarks.net_probe import read_csv
from benchmarks.netem import parse_rate

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

# Parameter counts (float32). Paper Table 1 sizes in MiB: ResNet101 170, LSTM 252,
# VGG16 528; 44.5M * 4 B = 170 MiB, 66M * 4 B = 252 MiB, 138M * 4 B = 527 MiB.
MODELS: Dict[str, int] = {
    "resnet101": 44_500_000,
    "vgg16": 138_000_000,
    "lstm": 66_000_000,
}
DEFAULT_CFS = (1, 10, 20, 40, 80, 160, 320, 500, 1000, 2000)
FUSION_BYTES = 128 * 1024 * 1024   # Horovod's default HOROVOD_FUSION_THRESHOLD
VALUE_BYTES = 4                    # fp32 values
INDEX_BYTES = 4                    # int32 indices


@dataclasses.dataclass(frozen=True)
class Link:
    """alpha: s per hop; beta: s per byte; overhead: s per collective (Horovod)."""
    alpha: float
    beta: float
    overhead: float = 0.0
    name: str = ""

    @property
    def gbit_s(self) -> float:
        return 8.0 / self.beta / 1e9

    @staticmethod
    def nominal(rate_bit_s: float, alpha: float = 0.0, overhead: float = 0.0,
                efficiency: float = 1.0, name: str = "") -> "Link":
        return Link(alpha=alpha, beta=8.0 / (rate_bit_s * efficiency), overhead=overhead,
                    name=name or f"{rate_bit_s / 1e9:g}Gbit/s")


# Fitted on benchmarks/results/net_probe.csv (emulated network, Horovod 0.28.1 + Gloo,
# 2 and 3 ranks, tbf-shaped veth links) by `python -m benchmarks.cost_model fit`.
# Regenerate after re-running the probe; see PROBE_FIT_NOTE.
PROBE_FIT: Dict[str, Link] = {
    "100mbit": Link(alpha=1.572e-03, beta=8.892e-08, overhead=1.604e-03, name="fit@100mbit"),
    "1gbit": Link(alpha=1.559e-03, beta=1.068e-08, overhead=0.0, name="fit@1gbit"),
}
# The projection to the paper's network takes alpha, overhead and bandwidth efficiency
# from the link-bound probe configuration: at 1 Gbit/s the 2-core shared machine that
# runs the emulation is CPU-bound, not link-bound, so its fit understates the network.
PAPER_FIT_RATE = "100mbit"
PROBE_FIT_NOTE = ("fitted on allreduce rows of benchmarks/results/net_probe.csv: 2 and 3 ranks,"
                  " 4 KiB..16 MiB, 2-core VM shared with other jobs (1-min load 6-10);"
                  " 100mbit is link-bound (90 Mbit/s effective), 1gbit is CPU-bound (749)")


# ---------------------------------------------------------------------------
# Collective costs
# ---------------------------------------------------------------------------

def _log2(n: int) -> float:
    return math.log2(n) if n > 1 else 0.0


def ring_allreduce(m_bytes: float, n: int, link: Link) -> float:
    if n <= 1:
        return 0.0
    return link.overhead + 2 * (n - 1) * link.alpha + 2 * m_bytes * link.beta * (n - 1) / n


def tree_allreduce(m_bytes: float, n: int, link: Link) -> float:
    if n <= 1:
        return 0.0
    return link.overhead + 2 * link.alpha * _log2(n) + 2 * m_bytes * _log2(n) * link.beta


def ring_allgather(k_bytes: float, n: int, link: Link) -> float:
    if n <= 1:
        return 0.0
    return link.overhead + (n - 1) * link.alpha + (n - 1) * k_bytes * link.beta


def tree_allgather(k_bytes: float, n: int, link: Link) -> float:
    """Recursive doubling: log2 N rounds, still (N-1) k bytes received per rank."""
    if n <= 1:
        return 0.0
    return link.overhead + _log2(n) * link.alpha + (n - 1) * k_bytes * link.beta


def collective_time(op: str, m_bytes: float, n: int, link: Link, algo: str = "ring") -> float:
    table = {("allreduce", "ring"): ring_allreduce, ("allreduce", "tree"): tree_allreduce,
             ("allgather", "ring"): ring_allgather, ("allgather", "tree"): tree_allgather}
    return table[(op, algo)](m_bytes, n, link)


def dense_sync_time(params: int, n: int, link: Link, algo: str = "ring",
                    fusion_bytes: int = FUSION_BYTES) -> float:
    """Dense SGD: fp32 allreduce of all gradients, in fusion-buffer sized pieces."""
    total = params * VALUE_BYTES
    pieces = max(1, math.ceil(total / fusion_bytes))
    return pieces * collective_time("allreduce", total / pieces, n, link, algo)


def kept_elements(params: int, cf: float, density: Optional[float] = None) -> int:
    if density is not None:
        return max(1, int(round(params * density)))
    return max(1, int(params / cf))


def sparse_sync_time(params: int, cf: float, n: int, link: Link, algo: str = "ring",
                     density: Optional[float] = None) -> float:
    """Sparse SGD: one allgather of (values fp32, indices int32) per step."""
    k = kept_elements(params, cf, density)
    return collective_time("allgather", k * (VALUE_BYTES + INDEX_BYTES), n, link, algo)


def exchange_link(link: Link):
    """The optimizer's link model (``horovod_gravac.exchange.LinkModel``) with this link's
    alpha, beta and per-collective overhead (its CPU costs per entry as measured there)."""
    from horovod_gravac.exchange import LinkModel
    return LinkModel(bandwidth=1.0 / link.beta, latency=link.alpha, overhead=link.overhead)


def exchange_sync_time(kind: str, params: int, cf: float, n: int, link: Link) -> Tuple[float, float]:
    """(seconds, bytes a rank sends) of one step's exchange of a one-bucket gradient of
    ``params`` float32 entries at ``cf`` by ``kind`` (``exchange.py``'s kinds; ``"dense"``
    ignores ``cf``), CPU terms included."""
    from horovod_gravac.exchange import exchange_cost, kept_count
    k = params if kind == "dense" else kept_count(params, cf)
    cost = exchange_cost(kind, params, k, n, exchange_link(link))
    return cost.seconds, cost.wire_bytes


# ---------------------------------------------------------------------------
# Inputs (measurements)
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class Measurement:
    """Per model and CF: what the harness measured (seconds; density = kept / numel)."""
    compute_s: float = 0.0
    compress_s: float = 0.0
    decompress_s: float = 0.0
    density: Optional[float] = None
    source: str = ""


def load_measurements(path: str) -> Dict[Tuple[str, float], Measurement]:
    """CSV columns: model, cf, and any of compute_s, compress_s, decompress_s, density,
    source. model '*' applies to every model; cf 1 is dense (compute only usually).
    A row with cf empty gives the model's compute time for every CF."""
    out: Dict[Tuple[str, float], Measurement] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            model = row["model"].strip().lower()
            cf = float(row["cf"]) if row.get("cf", "").strip() else -1.0

            def num(key, default=None):
                v = (row.get(key) or "").strip()
                return float(v) if v else default
            out[(model, cf)] = Measurement(
                compute_s=num("compute_s", 0.0), compress_s=num("compress_s", 0.0),
                decompress_s=num("decompress_s", 0.0), density=num("density"),
                source=(row.get("source") or "").strip())
    return out


def lookup(meas: Dict[Tuple[str, float], Measurement], model: str, cf: float) -> Measurement:
    m = Measurement()
    for key in ((model, -1.0), ("*", -1.0)):        # compute time for all CFs
        if key in meas:
            m.compute_s = meas[key].compute_s
            break
    for key in ((model, float(cf)), ("*", float(cf))):
        if key in meas:
            x = meas[key]
            return Measurement(compute_s=x.compute_s or m.compute_s, compress_s=x.compress_s,
                               decompress_s=x.decompress_s, density=x.density, source=x.source)
    return m


# ---------------------------------------------------------------------------
# Projection
# ---------------------------------------------------------------------------

def project(models: Dict[str, int] = MODELS, cfs: Sequence[float] = DEFAULT_CFS, n: int = 32,
            link: Optional[Link] = None,
            measurements: Optional[Dict[Tuple[str, float], Measurement]] = None) -> List[Dict]:
    """Per-step time per CF and model; speedups over dense and over CF 10."""
    link = link or paper_link()
    measurements = measurements or {}
    rows = []
    for model, params in models.items():
        base: Dict[float, float] = {}
        for cf in cfs:
            m = lookup(measurements, model, cf)
            if cf == 1:
                ring = dense_sync_time(params, n, link, "ring")
                tree = dense_sync_time(params, n, link, "tree")
                k, wire = params, params * VALUE_BYTES
                shared = ring
                compress = decompress = 0.0
            else:
                ring = sparse_sync_time(params, cf, n, link, "ring", m.density)
                tree = sparse_sync_time(params, cf, n, link, "tree", m.density)
                k = kept_elements(params, cf, m.density)
                wire = k * (VALUE_BYTES + INDEX_BYTES)
                # Random-k with a seed shared by all ranks: same indices everywhere, so the
                # k values can be summed by a dense allreduce and no indices travel.
                shared = collective_time("allreduce", k * VALUE_BYTES, n, link, "ring")
                compress, decompress = m.compress_s, m.decompress_s
            step = m.compute_s + compress + decompress + ring
            base[cf] = step
            rows.append({
                "model": model, "params": params, "workers": n, "link_gbit_s": link.gbit_s,
                "alpha_us": link.alpha * 1e6, "overhead_us": link.overhead * 1e6,
                "cf": cf, "kept": k, "payload_mib": wire / 2 ** 20,
                "sync_ring_ms": ring * 1e3, "sync_tree_ms": tree * 1e3,
                "sync_shared_idx_ms": shared * 1e3,
                "compute_ms": m.compute_s * 1e3, "compress_ms": compress * 1e3,
                "decompress_ms": decompress * 1e3, "step_ms": step * 1e3,
                "source": m.source or ("comm only: no compute/compress measurement given"
                                       if not (m.compute_s or compress) else ""),
            })
        for r in rows:
            if r["model"] == model:
                r["speedup_vs_dense"] = base[1] / base[r["cf"]] if 1 in base else None
                r["speedup_vs_cf10"] = base[10] / base[r["cf"]] if 10 in base else None
    return rows


PROJECTION_FIELDS = ["model", "params", "workers", "link_gbit_s", "alpha_us", "overhead_us", "cf",
                     "kept", "payload_mib", "sync_ring_ms", "sync_tree_ms", "sync_shared_idx_ms", "compute_ms",
                     "compress_ms", "decompress_ms", "step_ms", "speedup_vs_dense",
                     "speedup_vs_cf10", "source"]


def format_projection(rows: List[Dict]) -> str:
    head = (f"{'model':10} {'CF':>6} {'payload MiB':>11} {'ring ms':>9} {'tree ms':>9} "
            f"{'compute':>8} {'compress':>8} {'decomp':>7} {'step ms':>9} {'vs dense':>8} {'vs 10x':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['model']:10} {r['cf']:>6g} {r['payload_mib']:>11.3f} "
                     f"{r['sync_ring_ms']:>9.2f} {r['sync_tree_ms']:>9.2f} "
                     f"{r['compute_ms']:>8.1f} {r['compress_ms']:>8.1f} {r['decompress_ms']:>7.1f} "
                     f"{r['step_ms']:>9.2f} "
                     f"{r['speedup_vs_dense']:>8.2f} {r['speedup_vs_cf10']:>7.2f}")
    return "\n".join(lines)


def write_rows(rows: Iterable[Dict], path: str, fields: Sequence[str]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


# ---------------------------------------------------------------------------
# Fitting alpha/beta to the probe, and agreement with it
# ---------------------------------------------------------------------------

def hops(op: str, n: int) -> int:
    return 2 * (n - 1) if op == "allreduce" else (n - 1)


def wire_bytes(op: str, m_bytes: float, n: int) -> float:
    return 2 * m_bytes * (n - 1) / n if op == "allreduce" else (n - 1) * m_bytes


def fit_link(rows: Sequence[Dict], ops: Sequence[str] = ("allreduce",),
             name: str = "") -> Link:
    """Least-squares fit of t = overhead + hops*alpha + wire_bytes*beta (ring formulas)
    to probe rows, minimising relative error so small messages count as much as
    large ones. With a single world size hops and overhead cannot be told apart and
    alpha is set to 0 (everything goes into overhead)."""
    import numpy as np
    use = [r for r in rows if r["op"] in ops]
    if len(use) < 2:
        raise ValueError("need at least two probe rows to fit")
    sizes = {int(r["np"]) for r in use}
    a, y = [], []
    for r in use:
        n, t = int(r["np"]), float(r["median_ms"]) / 1e3
        feats = [1.0, wire_bytes(r["op"], float(r["bytes"]), n)]
        if len(sizes) > 1:
            feats.insert(1, float(hops(r["op"], n)))
        a.append([x / t for x in feats])
        y.append(1.0)
    coef = _nnls(np.array(a), np.array(y))
    if len(sizes) > 1:
        overhead, alpha, beta = coef
    else:
        (overhead, beta), alpha = coef, 0.0
    return Link(alpha=float(alpha), beta=float(beta), overhead=float(overhead), name=name)


def _nnls(a, y):
    """Tiny non-negative least squares (active set by enumeration; <= 3 unknowns)."""
    import itertools
    import numpy as np
    best, best_err = np.zeros(a.shape[1]), float("inf")
    cols = range(a.shape[1])
    for k in range(1, a.shape[1] + 1):
        for subset in itertools.combinations(cols, k):
            x, *_ = np.linalg.lstsq(a[:, subset], y, rcond=None)
            if np.all(x >= 0):
                full = np.zeros(a.shape[1])
                full[list(subset)] = x
                err = float(np.sum((a @ full - y) ** 2))
                if err < best_err:
                    best, best_err = full, err
    return best


def fit_probe(rows: Sequence[Dict]) -> Dict[str, Link]:
    """One link per configured rate, fitted on dense allreduce only (allgather rows are
    then an out-of-sample test in `agreement`)."""
    out = {}
    for rate in sorted({r["rate"] for r in rows if r.get("mode") == "netns"}):
        sel = [r for r in rows if r["rate"] == rate and r.get("mode") == "netns"]
        out[rate] = fit_link(sel, ("allreduce",), name=f"fit@{rate}")
    return out


def agreement(rows: Sequence[Dict], links: Optional[Dict[str, Link]] = None) -> List[Dict]:
    """Model vs measurement, row by row, for the fitted link and for the bare nominal
    link (beta = 8/rate, no latency): where and by how much they disagree."""
    links = links or fit_probe(rows)
    out = []
    for r in rows:
        if r.get("mode") != "netns" or r["rate"] not in links:
            continue
        n, m = int(r["np"]), float(r["bytes"])
        meas = float(r["median_ms"])
        fitted = collective_time(r["op"], m, n, links[r["rate"]]) * 1e3
        nominal = collective_time(r["op"], m, n, Link.nominal(parse_rate(r["rate"]))) * 1e3
        out.append({"rate": r["rate"], "np": n, "op": r["op"], "bytes": int(m),
                    "measured_ms": meas, "fitted_ms": fitted, "nominal_ms": nominal,
                    "measured_over_fitted": meas / fitted if fitted else None,
                    "measured_over_nominal": meas / nominal if nominal else None,
                    "in_fit": r["op"] == "allreduce"})
    return out


AGREEMENT_FIELDS = ["rate", "np", "op", "bytes", "measured_ms", "fitted_ms", "nominal_ms",
                    "measured_over_fitted", "measured_over_nominal", "in_fit"]


def format_agreement(rows: List[Dict], links: Dict[str, Link]) -> str:
    lines = []
    for rate, l in links.items():
        lines.append(f"fit @ {rate}: overhead {l.overhead * 1e3:.3f} ms/collective, "
                     f"alpha {l.alpha * 1e6:.1f} us/hop, beta -> {l.gbit_s * 1e3:.1f} Mbit/s")
    head = (f"{'rate':>8} {'np':>2} {'op':9} {'bytes':>9} {'measured':>9} {'fitted':>9} "
            f"{'nominal':>9} {'meas/fit':>8} {'meas/nom':>8}  fit?")
    lines += [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['rate']:>8} {r['np']:>2} {r['op']:9} {r['bytes']:>9} "
                     f"{r['measured_ms']:>9.2f} {r['fitted_ms']:>9.2f} {r['nominal_ms']:>9.2f} "
                     f"{r['measured_over_fitted']:>8.2f} {r['measured_over_nominal']:>8.2f}  "
                     f"{'yes' if r['in_fit'] else 'no'}")
    return "\n".join(lines)


def paper_link(rate_bit_s: float = 10e9, fit: Optional[Link] = None,
               efficiency: Optional[float] = None, alpha: Optional[float] = None,
               overhead: Optional[float] = None) -> Link:
    """The paper's network (default 10 Gbit/s), with latency/overhead and bandwidth
    efficiency taken from the probe fit unless given."""
    fit = fit or PROBE_FIT.get(PAPER_FIT_RATE)
    if efficiency is None:
        efficiency = _fit_efficiency(fit) if fit else 1.0
    return Link.nominal(rate_bit_s,
                        alpha=alpha if alpha is not None else (fit.alpha if fit else 0.0),
                        overhead=overhead if overhead is not None else (fit.overhead if fit else 0.0),
                        efficiency=efficiency, name=f"{rate_bit_s / 1e9:g}Gbit/s")


def _fit_efficiency(fit: Link) -> float:
    rate = {"fit@1gbit": 1e9, "fit@100mbit": 1e8}.get(fit.name)
    return min(1.0, (8.0 / fit.beta) / rate) if rate else 1.0


# ---------------------------------------------------------------------------
# Measuring compress time of the project's compressors (on this machine)
# ---------------------------------------------------------------------------

def measure_compress(compressor: str, cfs: Sequence[float], models: Dict[str, int],
                     repeats: int = 3, device: str = "cpu", seed: int = 0) -> List[Dict]:
    """Time compress() (and decompress()) of horovod_gravac's compressor on a random
    gradient of each model's size; record achieved density. Rows fit load_measurements."""
    import torch
    import horovod_gravac.compressors as comps
    names = {n.lower(): getattr(comps, n) for n in dir(comps) if n.endswith("Compressor")}
    key = compressor.lower() + "compressor"
    if key not in names:
        raise ValueError(f"no compressor {compressor!r}; available: "
                         f"{sorted(n[:-len('compressor')] for n in names if n != 'sparsecompressor')}")
    cls = names[key]
    g = torch.Generator(device="cpu").manual_seed(seed)
    rows = []
    for model, params in models.items():
        x = torch.randn(params, generator=g).to(device)
        for cf in cfs:
            if cf == 1:
                continue
            c = cls(cf=cf)
            tc, td, kept = [], [], 0
            for _ in range(repeats):
                t0 = time.perf_counter()
                payload, ctx = c.compress(x)
                if device != "cpu":
                    torch.cuda.synchronize()
                t1 = time.perf_counter()
                c.decompress(payload, ctx)
                if device != "cpu":
                    torch.cuda.synchronize()
                t2 = time.perf_counter()
                tc.append(t1 - t0)
                td.append(t2 - t1)
                kept = payload.values.numel()
            rows.append({"model": model, "cf": cf, "compress_s": sorted(tc)[len(tc) // 2],
                         "decompress_s": sorted(td)[len(td) // 2], "density": kept / params,
                         "source": f"{compressor} on {device} ({torch.get_num_threads()} threads),"
                                   f" {time.strftime('%Y-%m-%d')}"})
        del x
    return rows


MEASUREMENT_FIELDS = ["model", "cf", "compute_s", "compress_s", "decompress_s", "density", "source"]


# ---------------------------------------------------------------------------
# Past two ranks: the sweep's measured steps, and the projection
# ---------------------------------------------------------------------------

SWEEP_CSV = os.path.join(RESULTS, "rank_sweep", "results.csv")
PROJECT_RANKS = (32, 64, 256)
PROJECT_GBIT = (10.0, 100.0)
_KIND = {"allreduce": "dense", "dense": "dense", "pair": "pair", "sparse": "sparse",
         "sparse_allreduce": "sparse_allreduce"}


def check_sweep(rows: Sequence[Dict], link: Link) -> List[Dict]:
    """Each measured (ranks, path) of the sweep against the model: the measured compute
    (step less wait) plus the modelled exchange of what the path sent."""
    out = []
    for r in rows:
        kind = _KIND.get(r["transfers"])
        if kind is None:
            continue
        n, cf, params = int(r["ranks"]), float(r["cf"]), int(r["numel"])
        comm, wire = exchange_sync_time(kind, params, cf, n, link)
        modelled = float(r["compute_ms"]) + 1e3 * comm
        out.append({"ranks": n, "path": r["path"], "kind": kind, "cf": cf, "measured_ms": float(r["step_ms"]),
                    "modelled_ms": modelled, "measured_over_model": float(r["step_ms"]) / modelled,
                    "modelled_wire_kb": wire / 1e3, "measured_wire_kb": float(r["wire_kb"]),
                    "link_kb_median": float(r["link_kb_median"]) if r.get("link_kb_median") else None})
    return out


def project_ranks(models: Dict[str, int], link_for, ranks: Sequence[int] = PROJECT_RANKS,
                  gbits: Sequence[float] = PROJECT_GBIT, cfs: Sequence[float] = (10.0, 100.0)) -> List[Dict]:
    """Modelled exchange per step (communication only) of each kind, and ``auto``'s pick,
    for each model, rate, world size and CF."""
    from horovod_gravac.exchange import choose, kept_count
    out = []
    for name, params in models.items():
        for gbit in gbits:
            link = link_for(gbit * 1e9)
            for n in ranks:
                dense, dense_wire = exchange_sync_time("dense", params, 1.0, n, link)
                for cf in cfs:
                    row = {"model": name, "params": params, "gbit_s": gbit, "ranks": n, "cf": cf,
                           "dense_ms": 1e3 * dense, "dense_mb": dense_wire / 1e6}
                    for kind in ("sparse", "sparse_allreduce"):
                        t, wire = exchange_sync_time(kind, params, cf, n, link)
                        row[f"{kind}_ms"], row[f"{kind}_mb"] = 1e3 * t, wire / 1e6
                    pick = choose("auto", params, kept_count(params, cf), n, exchange_link(link))
                    row["auto"], row["auto_ms"] = pick.kind, 1e3 * pick.seconds
                    row["auto_vs_dense"] = pick.seconds / dense
                    out.append(row)
    return out


def ranks_report(sweep_csv: str, out_dir: str) -> str:
    """``check_sweep`` and ``project_ranks`` written to ``out_dir/projection.md``."""
    fit = PROBE_FIT[PAPER_FIT_RATE]
    with open(sweep_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    rate = rows[0]["rate"] if rows else PAPER_FIT_RATE
    measured_link = PROBE_FIT.get(rate, fit)
    checked = check_sweep(rows, measured_link)
    sweep_params = int(rows[0]["numel"]) if rows else 1_414_698
    models = {"sweep-cnn1d": sweep_params, **MODELS}
    projected = project_ranks(models, lambda bits: paper_link(bits, fit=fit))
    os.makedirs(out_dir, exist_ok=True)
    ratios = [c["measured_over_model"] for c in checked]
    lines = ["# The exchange cost model past two ranks", "",
             f"Written by `python -m benchmarks.cost_model ranks` from `{os.path.relpath(sweep_csv, os.path.dirname(HERE))}`.",
             f"Link model of the measured points: the probe fit at {rate} (alpha {measured_link.alpha * 1e3:.2f} ms a hop, "
             f"overhead {measured_link.overhead * 1e3:.2f} ms a collective, {measured_link.gbit_s * 1e3:.0f} Mbit/s "
             f"effective) and the CPU costs of `horovod_gravac/exchange.py`; projection: {PAPER_FIT_RATE}'s alpha, "
             "overhead and bandwidth efficiency at 10 and 100 Gbit/s (`paper_link`).", "",
             "## Measured against modelled (step = measured compute + modelled exchange)", ""]
    if ratios:
        lines += [f"measured / modelled: median {statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f} "
                  f"over {len(ratios)} points.", ""]
    lines += ["| ranks | path | exchange | measured ms | modelled ms | measured / model | stats kB | model kB | link kB |",
              "|" + "---|" * 9]
    for c in checked:
        lines.append(f"| {c['ranks']} | {c['path']} | {c['kind']} | {c['measured_ms']:.1f} | {c['modelled_ms']:.1f} | "
                     f"{c['measured_over_model']:.2f} | {c['measured_wire_kb']:.0f} | {c['modelled_wire_kb']:.0f} | "
                     f"{'-' if c['link_kb_median'] is None else format(c['link_kb_median'], '.0f')} |")
    lines += ["", "## Projection (communication per step, one bucket; ms)", "",
              "| model | Gbit/s | ranks | CF | dense | allgather | sparse allreduce | auto picks | auto / dense |",
              "|" + "---|" * 9]
    for p in projected:
        lines.append(f"| {p['model']} | {p['gbit_s']:g} | {p['ranks']} | {p['cf']:g} | {p['dense_ms']:.2f} | "
                     f"{p['sparse_ms']:.2f} | {p['sparse_allreduce_ms']:.2f} | {p['auto']} | {p['auto_vs_dense']:.2f} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out_dir, "projection.md"), "w") as f:
        f.write(text)
    return text


# ---------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------

def _read_probe(path: str) -> List[Dict]:
    return read_csv(path)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command")
    default_probe = os.path.join(RESULTS, "net_probe.csv")

    p = sub.add_parser("project", help="per-step time per CF at the paper's scale")
    p.add_argument("--workers", type=int, default=32)
    p.add_argument("--gbit", type=float, default=10.0, help="link rate, Gbit/s")
    p.add_argument("--alpha-us", type=float, default=None, help="per-hop latency (default: probe fit)")
    p.add_argument("--overhead-us", type=float, default=None,
                   help="per-collective overhead (default: probe fit; 0 = paper's formulas)")
    p.add_argument("--efficiency", type=float, default=None,
                   help="achieved/nominal bandwidth (default: probe fit)")
    p.add_argument("--probe", default=default_probe, help="probe CSV to fit alpha/beta from")
    p.add_argument("--measurements", default=None, help="CSV: model,cf,compute_s,compress_s,...")
    p.add_argument("--cfs", default=",".join(f"{c:g}" for c in DEFAULT_CFS))
    p.add_argument("--csv", default=None)

    p = sub.add_parser("ranks", help="check the exchange model against benchmarks/rank_sweep.py and project "
                                     "to 32, 64, 256 ranks at 10 and 100 Gbit/s")
    p.add_argument("--sweep", default=SWEEP_CSV)
    p.add_argument("--out", default=os.path.dirname(SWEEP_CSV))

    p = sub.add_parser("fit", help="fit alpha/beta/overhead to a probe CSV")
    p.add_argument("--probe", default=default_probe)

    p = sub.add_parser("agree", help="model vs probe measurements")
    p.add_argument("--probe", default=default_probe)
    p.add_argument("--csv", default=None)

    p = sub.add_parser("measure-compress", help="time a compressor at the models' sizes")
    p.add_argument("--compressor", default="topk")
    p.add_argument("--cfs", default="10,100,1000")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--csv", default=None)
    args = ap.parse_args(argv)

    if args.command == "fit":
        for rate, l in fit_probe(_read_probe(args.probe)).items():
            print(f"{rate}: Link(alpha={l.alpha:.3e}, beta={l.beta:.3e}, overhead={l.overhead:.3e})"
                  f"  # {l.gbit_s * 1e3:.1f} Mbit/s effective")
        return 0
    if args.command == "ranks":
        print(ranks_report(args.sweep, args.out))
        return 0
    if args.command == "agree":
        rows = _read_probe(args.probe)
        links = fit_probe(rows)
        agr = agreement(rows, links)
        print(format_agreement(agr, links))
        if args.csv:
            write_rows(agr, args.csv, AGREEMENT_FIELDS)
        return 0
    if args.command == "project":
        fit = None
        if args.probe and os.path.exists(args.probe):
            fit = fit_probe(_read_probe(args.probe)).get(PAPER_FIT_RATE)
        link = paper_link(args.gbit * 1e9, fit=fit, efficiency=args.efficiency,
                          alpha=None if args.alpha_us is None else args.alpha_us * 1e-6,
                          overhead=None if args.overhead_us is None else args.overhead_us * 1e-6)
        meas = load_measurements(args.measurements) if args.measurements else {}
        cfs = [float(c) for c in args.cfs.split(",")]
        rows = project(MODELS, cfs, args.workers, link, meas)
        print(f"# {args.workers} workers, {link.gbit_s:.2f} Gbit/s effective "
              f"({args.gbit:g} Gbit/s nominal), alpha {link.alpha * 1e6:.1f} us/hop, "
              f"overhead {link.overhead * 1e6:.0f} us/collective"
              + (f"; fitted on {args.probe}" if fit else f"; built-in PROBE_FIT[{PAPER_FIT_RATE!r}]"))
        if not meas:
            print("# no --measurements: compute and compress times are 0 (communication only)")
        print(format_projection(rows))
        if args.csv:
            write_rows(rows, args.csv, PROJECTION_FIELDS)
        return 0
    if args.command == "measure-compress":
        models = {m: MODELS[m] for m in args.models.split(",")}
        rows = measure_compress(args.compressor, [float(c) for c in args.cfs.split(",")], models,
                                args.repeats, args.device)
        for r in rows:
            print(r)
        if args.csv:
            write_rows(rows, args.csv, MEASUREMENT_FIELDS)
        return 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
