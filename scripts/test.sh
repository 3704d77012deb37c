#!/usr/bin/env bash
# Run the whole test suite: unit tests plus real 2- and 3-rank horovodrun tests.
# Sets the machine up first (scripts/setup.sh is idempotent and quick once done).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
# OMP_NUM_THREADS=1: ranks share the machine's cores; oversubscription only slows tests.
# --timeout: a last guard; every multi-rank run also has its own, shorter timeout.
OMP_NUM_THREADS=1 exec .venv/bin/python -m pytest -q -ra --timeout 900 tests "$@"
