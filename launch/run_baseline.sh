#!/usr/bin/env bash
# Baselines of the paper: dense SGD (Fig. 7-9) and static compression factors on every
# compressor (Table 2: Top-k, DGC, RedSync, Random-k at 10x and 1000x).
set -euo pipefail
SCRIPT_NAME="run_baseline.sh"
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'TXT'
Usage: launch/run_baseline.sh [--dry-run] [-h|--help] [TRAINER ARGS...]

Dense SGD and static-CF baselines of the GraVAC paper under multi-node horovodrun (or
mpirun), 32 ranks from launch/hostfile.example by default.

CONFIG (comma-separated list; default dense):
  dense    --controller dense
  static   --controller static --compressor $COMPRESSOR --cf $CF (default topk, 10)
  paper    dense, then every compressor of $COMPRESSORS at every CF of $CFS
           (default "topk dgc redsync randomk" x "10 1000": the paper's Table 2)

Examples:
  launch/run_baseline.sh                                   # dense ResNet101, 32 GPUs
  CONFIG=static COMPRESSOR=dgc CF=1000 MODEL=vgg16 launch/run_baseline.sh
  CONFIG=paper MODEL=lstm DRY_RUN=1 launch/run_baseline.sh # print the 9 commands
  SMOKE=1 CONFIG=dense,static launch/run_baseline.sh       # 2 local ranks, --gloo

TXT
  gravac_env_help
}

gravac_init "$@"
CONFIG="${CONFIG:-dense}"
COMPRESSOR="${COMPRESSOR:-topk}"
CF="${CF:-10}"
COMPRESSORS="${COMPRESSORS:-topk dgc redsync randomk}"
CFS="${CFS:-10 1000}"

static_run() {   # static_run COMPRESSOR CF
  gravac_run "static-$1-cf$2" --controller static --compressor "$1" --cf "$2"
}

mapfile -t configs < <(gravac_configs "$CONFIG" "dense static-sweep")
[ "${#configs[@]}" -gt 0 ] || die "CONFIG is empty"
for config in "${configs[@]}"; do
  case "$config" in
    dense) gravac_run dense --controller dense ;;
    static) static_run "$COMPRESSOR" "$CF" ;;
    static-sweep)
      for c in $COMPRESSORS; do
        for cf in $CFS; do static_run "$c" "$cf"; done
      done ;;
    *) die "unknown CONFIG '$config' (dense, static, paper)" ;;
  esac
done
