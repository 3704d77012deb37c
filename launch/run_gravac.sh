#!/usr/bin/env bash
# GraVAC runs of the paper (section IV-B, Fig. 7-11): Exponential policy on DGC with
# epsilon 0.7 and 0.9, Geometric policy on RedSync, and the Random-k special case.
set -euo pipefail
SCRIPT_NAME="run_gravac.sh"
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'TXT'
Usage: launch/run_gravac.sh [--dry-run] [-h|--help] [TRAINER ARGS...]

GraVAC (adaptive compression factor) under multi-node horovodrun (or mpirun), 32 ranks
from launch/hostfile.example by default.

CONFIG (comma-separated list; default exponential-eps0.7):
  exponential-eps0.7  DGC, theta 10..1000, Exponential policy (10, 20, 40, 160, 1000),
                      window 500, omega 0.01, epsilon 0.7          (Fig. 7-9)
  exponential-eps0.9  the same with epsilon 0.9                    (Fig. 7-9)
  geometric           RedSync, theta 10..2000, Geometric policy (ratio 2),
                      window 2000, omega 0.01, epsilon 0.7         (Fig. 10)
  randomk             Random-k, theta 1.5..1000, Geometric policy,
                      window 2000, omega 0.01, epsilon 0.7         (Fig. 11)
  paper               all four, one after the other

Overrides of a preset (environment): COMPRESSOR, THETA_MIN, THETA_MAX, EPSILON,
OMEGA, WINDOW, POLICY (exponential|geometric), VARIANT (paper, the default here: the paper's
rules; ladder, GraVAC()'s default; delivered). With SMOKE=1 the window defaults to 5
steps so that the compression factor really moves in a 20-step run.

Examples:
  launch/run_gravac.sh                                       # ResNet101, 32 GPUs
  CONFIG=exponential-eps0.9 MODEL=vgg16 launch/run_gravac.sh
  CONFIG=paper MODEL=lstm DRY_RUN=1 launch/run_gravac.sh
  LAUNCHER=mpirun HOSTFILE=~/hosts launch/run_gravac.sh
  SMOKE=1 launch/run_gravac.sh                               # 2 local ranks, --gloo

TXT
  gravac_env_help
}

gravac_init "$@"
CONFIG="${CONFIG:-exponential-eps0.7}"
[ "$SMOKE" = 1 ] && WINDOW="${WINDOW:-5}"

# gravac_preset NAME COMPRESSOR THETA_MIN THETA_MAX POLICY WINDOW OMEGA EPSILON
gravac_preset() {
  local name="$1"
  gravac_run "gravac-$name" --controller gravac --variant "${VARIANT:-paper}" \
    --compressor "${COMPRESSOR:-$2}" \
    --theta-min "${THETA_MIN:-$3}" --theta-max "${THETA_MAX:-$4}" \
    --policy "${POLICY:-$5}" --window "${WINDOW:-$6}" \
    --omega "${OMEGA:-$7}" --epsilon "${EPSILON:-$8}"
}

mapfile -t configs < <(gravac_configs "$CONFIG" \
  "exponential-eps0.7 exponential-eps0.9 geometric randomk")
[ "${#configs[@]}" -gt 0 ] || die "CONFIG is empty"
for config in "${configs[@]}"; do
  case "$config" in
    exponential-eps0.7) gravac_preset "$config" dgc 10 1000 exponential 500 0.01 0.7 ;;
    exponential-eps0.9) gravac_preset "$config" dgc 10 1000 exponential 500 0.01 0.9 ;;
    geometric)          gravac_preset "$config" redsync 10 2000 geometric 2000 0.01 0.7 ;;
    randomk)            gravac_preset "$config" randomk 1.5 1000 geometric 2000 0.01 0.7 ;;
    *) die "unknown CONFIG '$config' (exponential-eps0.7, exponential-eps0.9, geometric, randomk, paper)" ;;
  esac
done
