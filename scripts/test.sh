#!/usr/bin/env bash
# Run the whole test suite: unit tests plus real 2- and 3-rank horovodrun tests.
# Sets the machine up first (scripts/setup.sh is idempotent and quick once done).
#
#   bash scripts/test.sh                 # everything, as CI runs it (.ci/run)
#   bash scripts/test.sh -m "not slow"   # any pytest arguments: one pytest run over tests/
#
# Everything runs in three passes: first every test not marked `serial` or `alone` on one
# pytest-xdist worker per core (at most 4) (each test file on one worker, so a file's shared
# runs are made once); then the `serial` tests, which hold themselves to wall-clock bounds or
# set up network namespaces, on two workers (the fault scenarios mostly wait for their
# timeouts; the network-namespace tests stay one after another); then the `alone` test by
# itself (its decisions follow measured step times).  The `scale` tests (the sparse allreduce on
# 2-8 ranks) are left out: `bash scripts/test.sh -m scale` runs them.  The markers are in pyproject.toml.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
bash scripts/setup.sh || exit 1
# OMP_NUM_THREADS=1: ranks share the machine's cores; oversubscription only slows tests.
# --timeout: a last guard; every multi-rank run also has its own, shorter timeout.
export OMP_NUM_THREADS=1
PYTEST=(.venv/bin/python -m pytest -q -ra --timeout 900 --durations 25)
if [ $# -gt 0 ]; then
  exec "${PYTEST[@]}" tests "$@"
fi
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)   # (nproc obeys OMP_NUM_THREADS=1, exported above)
WORKERS=${GRAVAC_TEST_WORKERS:-$(( CORES < 4 ? CORES : 4 ))}   # one per core, at most 4
"${PYTEST[@]}" -n "$WORKERS" --dist loadfile -m "not serial and not alone and not scale" tests
first=$?
"${PYTEST[@]}" -n 2 --dist loadgroup -m serial tests
second=$?
"${PYTEST[@]}" -m alone tests
third=$?
echo "[test] parallel pass: exit $first; serial pass: exit $second; alone: exit $third"
[ "$first" -eq 0 ] && [ "$second" -eq 0 ] && [ "$third" -eq 0 ]
