#!/usr/bin/env bash
# Device call 19 (H100): where the one-copy RedSync and SIDCo paths (9de7cdb) spend their time,
# per operation, against the code before them (bb140a4 in .oldtree/), and what each primitive costs.
set -u
PY=python3
$PY setup.py build_ext --inplace > /dev/null 2>&1; (cd .oldtree && $PY setup.py build_ext --inplace > /dev/null 2>&1)
T="--trace topk:100:1048576 --trace dgc:100:1048576 --trace redsync:100:1048576 --trace redsync:1000:262144 --trace sidco-exp:100:1048576 --trace sidco-exp:1000:6553600 --trace redsync:10:6553600 --trace sidco-exp:10:1048576"
PYTHONPATH=$PWD timeout 150 $PY -m benchmarks.device_primitives --device cuda $T > $OUT/primitives_new.txt 2>&1; echo "new rc=$?"
(cd .oldtree && PYTHONPATH=$PWD timeout 120 $PY -m benchmarks.device_primitives --device cuda --sizes 1048576 $T > $OUT/primitives_old.txt 2>&1); echo "old rc=$?"
