"""Median per-step times of harness runs (steps 11+): python step_summary.py DIR..."""
import json, os, statistics as st, sys
print(f"{'run':28s} {'step ms':>8s} {'compress':>9s} {'comm':>7s} {'iter ms':>8s} {'floats':>7s}  cfs")
for d in sys.argv[1:]:
    try:
        rows = [json.loads(l) for l in open(os.path.join(d, "steps.jsonl"))]; rows = rows[10:] or rows
    except OSError as e:
        print(f"{os.path.basename(d):28s} missing ({e})"); continue
    med = lambda k: st.median(r[k] for r in rows if r.get(k) is not None) * 1e3
    fl = sum(r["floats_sent"] for r in rows) / sum(r["dense_floats"] for r in rows)
    cfs = sorted({r["cf"] for r in rows})
    print(f"{os.path.basename(d):28s} {med('step_time'):8.1f} {med('compress_time'):9.1f} {med('comm_time'):7.1f} "
          f"{med('iter_time'):8.1f} {fl:7.3f}  {cfs}")
