#!/usr/bin/env bash
# Set up everything, then run the embedded default: short 2-rank Horovod trainings
# (dense, static CF, GraVAC) on data that ships with scikit-learn, and a report.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
OMP_NUM_THREADS=1 exec .venv/bin/python -m horovod_gravac.harness.demo --out "${1:-reports/demo}"
