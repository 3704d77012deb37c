#!/usr/bin/env bash
# Accordion (Agarwal et al., MLSys 2021), the adaptive baseline of the paper: low
# compression in critical regimes, high compression otherwise. Section IV-D: PowerSGD
# rank 4 / rank 1 (Table 4) and the Random-k special case with CF 1.5x / 1000x (Fig. 11).
set -euo pipefail
SCRIPT_NAME="run_accordion.sh"
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<'TXT'
Usage: launch/run_accordion.sh [--dry-run] [-h|--help] [TRAINER ARGS...]

Accordion under multi-node horovodrun (or mpirun), 32 ranks from
launch/hostfile.example by default. A regime is critical when the norm of the gradient
accumulated over an interval changes by at least ACCORDION_THRESHOLD (default 0.5,
Accordion's eta) relative to the previous interval.

CONFIG (comma-separated list; default powersgd):
  powersgd  PowerSGD, rank 4 in critical regimes and rank 1 otherwise (Table 4):
            --compressor powersgd --powersgd-rank 4 --low-cf 10 --high-cf 1000; the
            rank given is the one used at the low CF (critical regimes), rank 1 at the
            high CF. For PowerSGD the two CFs only name the regimes (they must differ
            and exceed 1, which means dense); the floats sent are measured.
  randomk   Random-k, low CF 1.5x, high CF 1000x: the same bounds GraVAC gets in its
            Random-k special case (Fig. 11)
  paper     both, one after the other

Overrides (environment): COMPRESSOR, LOW_CF, HIGH_CF, POWERSGD_RANK,
ACCORDION_THRESHOLD (0.5), ACCORDION_INTERVAL (steps between regime checks; default:
the trainer's). With SMOKE=1 the interval defaults to 5 steps.

Examples:
  launch/run_accordion.sh                                    # ResNet101, 32 GPUs
  CONFIG=randomk MODEL=resnet101 launch/run_accordion.sh
  CONFIG=paper MODEL=vgg16 DRY_RUN=1 launch/run_accordion.sh
  SMOKE=1 CONFIG=randomk launch/run_accordion.sh             # 2 local ranks, --gloo

TXT
  gravac_env_help
}

gravac_init "$@"
CONFIG="${CONFIG:-powersgd}"
ACCORDION_THRESHOLD="${ACCORDION_THRESHOLD:-0.5}"
[ "$SMOKE" = 1 ] && ACCORDION_INTERVAL="${ACCORDION_INTERVAL:-5}"

# accordion_preset NAME COMPRESSOR LOW_CF HIGH_CF [more trainer args]
accordion_preset() {
  local name="$1" compressor="${COMPRESSOR:-$2}" low="${LOW_CF:-$3}" high="${HIGH_CF:-$4}"
  shift 4
  local args=(--controller accordion --compressor "$compressor" --low-cf "$low" --high-cf "$high"
              --accordion-threshold "$ACCORDION_THRESHOLD")
  [ -n "${ACCORDION_INTERVAL:-}" ] && args+=(--accordion-interval "$ACCORDION_INTERVAL")
  gravac_run "accordion-$name" "${args[@]}" "$@"
}

mapfile -t configs < <(gravac_configs "$CONFIG" "powersgd randomk")
[ "${#configs[@]}" -gt 0 ] || die "CONFIG is empty"
for config in "${configs[@]}"; do
  case "$config" in
    powersgd) accordion_preset powersgd powersgd 10 1000 --powersgd-rank "${POWERSGD_RANK:-4}" ;;
    randomk)  accordion_preset randomk randomk 1.5 1000 ;;
    *) die "unknown CONFIG '$config' (powersgd, randomk, paper)" ;;
  esac
done
