"""Several runs of one example script in one horovodrun launch: each rank runs the script's
``__main__`` once per argument list, in order, in a fresh namespace (``runpy``), as
``python SCRIPT ARGS...`` would.  Used by tests/integration/test_horovod_examples.py, where a
launch costs more start-up (Python, torch, Horovod's rendezvous) than a tiny example's run.

    horovodrun -np 2 -H localhost:2 --gloo python _runs.py SCRIPT '[["--impl", "hvd"], [...]]'

Every example seeds torch itself and builds its model, data and optimizer afresh, so a run
gives the parameters it gives alone.  Rank 0 brackets run k's output with ``RUN_BEGIN k`` and
``RUN_END k`` lines; a run that raises ends the launch (the runs after it do not start).
"""
import json
import runpy
import sys

import horovod.torch as hvd


def main(script, runs):
    for k, args in enumerate(json.loads(runs)):
        hvd.init()
        if hvd.rank() == 0:
            print(f"RUN_BEGIN {k}", flush=True)
        sys.argv = [script, *args]
        runpy.run_path(script, run_name="__main__")
        if hvd.rank() == 0:
            print(f"RUN_END {k}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])
