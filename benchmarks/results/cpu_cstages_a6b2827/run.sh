#!/usr/bin/env bash
# This session's changes together (a6b2827: SIDCo's CPU stage loop in C, its candidates planned at
# 3k at least, the select pass's loop switch at 0.5 % instead of 2 %, the AVX-512 host sample) against
# 95461c9, the tree before them, on Laplace data and captured gradients, over bucket sizes and CFs
# from 10 to 1000, alternated twice.  Ratios are to each tree's own exact Top-k, which the select and
# sample changes also sped up.
# Run from the repository root; writes the CSVs and compare.txt here.
set -euo pipefail
HERE=benchmarks/results/cpu_cstages_a6b2827
OLD=$(mktemp -d)
git archive 95461c9 | tar -x -C "$OLD"
(cd "$OLD" && "$OLDPWD/.venv/bin/python" setup.py build_ext --inplace > /dev/null 2>&1)   # that tree's own kernels
SIZES=262144,1048576,4194304,6553600
CFS=10,15,20,50,100,300,1000
for round in 1 2; do
  for input in laplace real; do
    (cd "$OLD" && PYTHONPATH=. "$OLDPWD/.venv/bin/python" -m benchmarks.compressors --sweep-only \
        --sweep-input "$input" --sizes "$SIZES" --cfs "$CFS" --sweep-repeats 21 \
        --compressors dgc,redsync,sidco-exp,sidco-gamma --csv "$OLDPWD/$HERE/old_${input}_$round.csv" > /dev/null)
    .venv/bin/python -m benchmarks.compressors --sweep-only --sweep-input "$input" --sizes "$SIZES" \
        --cfs "$CFS" --sweep-repeats 21 --compressors dgc,redsync,sidco-exp,sidco-gamma \
        --csv "$HERE/new_${input}_$round.csv" > /dev/null
  done
done
for input in laplace real; do
  echo "# $input"
  .venv/bin/python -m benchmarks.sweep_compare --new "$HERE/new_${input}_1.csv,$HERE/new_${input}_2.csv" \
      --old "$HERE/old_${input}_1.csv,$HERE/old_${input}_2.csv"
done > "$HERE/compare.txt"
rm -rf "$OLD"
