# shellcheck shell=bash
# Shared by launch/run_baseline.sh, run_gravac.sh and run_accordion.sh (sourced, not run).
#
# Each script calls `gravac_init "$@"` (environment + script options), then `gravac_run
# NAME TRAINER-ARGS...` once per training run. gravac_run builds
#   <launcher> python -m horovod_gravac.harness.train --model ... <TRAINER-ARGS> <extra args>
# and runs it, or prints it when DRY_RUN=1. Extra arguments given to the script go
# last, so they override a preset (argparse keeps the last occurrence of a flag).

GRAVAC_LAUNCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SCRIPT_NAME="${SCRIPT_NAME:-$(basename "$0")}"

die() { printf '%s: error: %s\n' "$SCRIPT_NAME" "$*" >&2; exit 2; }
say() { printf '[%s] %s\n' "$SCRIPT_NAME" "$*" >&2; }

# Quote one word for a POSIX shell only when it needs it, so that printed commands stay
# readable and can be pasted back into a shell.
gravac_quote() {
  local w="$1"
  if [ -z "$w" ]; then
    printf "''"
  elif [[ "$w" =~ ^[A-Za-z0-9_./:=,@%^+-]+$ ]]; then
    printf '%s' "$w"
  else
    printf "'%s'" "${w//\'/\'\\\'\'}"
  fi
}

gravac_print_cmd() {
  local out="" w
  for w in "$@"; do out+="$(gravac_quote "$w") "; done
  printf '%s\n' "${out% }"
}

# Common part of every script's --help.
gravac_env_help() {
  cat <<'EOF'
Where and how (environment variables):
  HOSTFILE=launch/hostfile.example  lines "host slots=N" (8 hosts x 4 slots = 32 GPUs,
                          the paper's cluster); used by horovodrun and mpirun alike
  HOSTS=h1:4,h2:4         host list instead of a hostfile (e.g. HOSTS=localhost:2)
  NP=32                   number of ranks (default: all slots of HOSTS/HOSTFILE)
  LAUNCHER=horovodrun     or mpirun (Open MPI: -bind-to none -map-by slot -x NCCL_DEBUG
                          -x LD_LIBRARY_PATH -x PATH -mca pml ob1 -mca btl ^openib)
  GLOO=1                  horovodrun --gloo (default when every host is localhost)
  SSH_PORT=12345          ssh port of the other hosts (the Docker image's sshd port)
  NETWORK_INTERFACE=eth0  NIC for Horovod/NCCL/Open MPI traffic
  SMOKE=1                 local smoke run: HOSTS=localhost:2, --gloo, MODEL=tinycnn
                          (digits data from scikit-learn, nothing to download), STEPS=20
  DRY_RUN=1               print the exact command(s) and exit (same as --dry-run)

What (environment variables):
  MODEL=resnet101         resnet101 (CIFAR-10) | vgg16 (CIFAR-100) | lstm (PTB), or the
                          toy tinycnn (digits) | tinylstm (pydoc text)
  PRESET                  trainer preset holding the paper's hyperparameters (batch,
                          lr and its decay, momentum, weight decay, steps, sizes);
                          default by MODEL: resnet101-cifar10, vgg16-cifar100, lstm-ptb,
                          digits, tinylstm-pydoc
  DATA=PATH               data set folder (default $DATA_ROOT/cifar-10-batches-py,
                          $DATA_ROOT/cifar-100-python or $DATA_ROOT/ptb by MODEL;
                          DATA= (empty) passes no --data)
  DATA_ROOT=/data         parent of the default data folders
  STEPS, BATCH_SIZE, LR, SEED   override the preset (--steps, --batch-size, --lr, --seed)
  REPORT_ROOT=./reports   each run writes its report to REPORT_ROOT/<run name>-<model>
  TRAIN="python -m horovod_gravac.harness.train"   the training command (e.g. TRAIN=gravac-train)

Arguments: -h/--help, --dry-run; everything else (and everything after --) is passed
to the training command after the preset flags, so it overrides them.
EOF
}

# Parse the script's own options and the environment. Sets GRAVAC_EXTRA (trainer args).
gravac_init() {
  GRAVAC_EXTRA=()
  while [ "$#" -gt 0 ]; do
    case "$1" in
      -h|--help) usage; exit 0 ;;
      --dry-run) DRY_RUN=1 ;;
      --) shift; GRAVAC_EXTRA+=("$@"); break ;;
      *) GRAVAC_EXTRA+=("$1") ;;
    esac
    shift
  done

  DRY_RUN="${DRY_RUN:-0}"
  SMOKE="${SMOKE:-0}"
  LAUNCHER="${LAUNCHER:-horovodrun}"
  DATA_ROOT="${DATA_ROOT:-/data}"
  REPORT_ROOT="${REPORT_ROOT:-$PWD/reports}"
  read -r -a GRAVAC_TRAIN <<<"${TRAIN:-python -m horovod_gravac.harness.train}"
  [ "${#GRAVAC_TRAIN[@]}" -gt 0 ] || die "TRAIN is empty"
  case "$LAUNCHER" in horovodrun|mpirun) ;; *) die "LAUNCHER must be horovodrun or mpirun, not '$LAUNCHER'" ;; esac

  if [ "$SMOKE" = 1 ]; then
    MODEL="${MODEL:-tinycnn}"
    HOSTS="${HOSTS:-localhost:2}"
    STEPS="${STEPS:-20}"
  else
    MODEL="${MODEL:-resnet101}"
  fi
  # The trainer's presets carry the paper's hyperparameters (batch, lr and its decay,
  # momentum, weight decay, steps, model sizes: the paper's section IV-A).
  local default_data
  case "$MODEL" in
    resnet101) PRESET="${PRESET:-resnet101-cifar10}"; default_data="$DATA_ROOT/cifar-10-batches-py" ;;
    vgg16)     PRESET="${PRESET:-vgg16-cifar100}";    default_data="$DATA_ROOT/cifar-100-python" ;;
    lstm)      PRESET="${PRESET:-lstm-ptb}";          default_data="$DATA_ROOT/ptb" ;;
    tinycnn)   PRESET="${PRESET:-digits}";            default_data="" ;;  # ships with scikit-learn
    tinylstm)  PRESET="${PRESET:-tinylstm-pydoc}";    default_data="" ;;  # ships with Python
    *) die "MODEL must be resnet101, vgg16, lstm (or tinycnn, tinylstm), not '$MODEL'" ;;
  esac
  DATA="${DATA-$default_data}"

  # Where the ranks go.
  local slots entry n entries only_local
  if [ -n "${HOSTS:-}" ]; then
    GRAVAC_HOSTARGS=(-H "$HOSTS")
    slots=0
    IFS=',' read -r -a entries <<<"$HOSTS"
    for entry in "${entries[@]}"; do
      n="${entry##*:}"
      [ "$n" = "$entry" ] && n=1
      [[ "$n" =~ ^[0-9]+$ ]] || die "bad HOSTS entry '$entry' (want host:slots)"
      slots=$((slots + n))
    done
    only_local=1
    for entry in "${entries[@]}"; do
      case "${entry%%:*}" in localhost|127.0.0.1) ;; *) only_local=0 ;; esac
    done
    GLOO="${GLOO:-$only_local}"
  else
    HOSTFILE="${HOSTFILE:-$GRAVAC_LAUNCH_DIR/hostfile.example}"
    [ -f "$HOSTFILE" ] || die "hostfile '$HOSTFILE' not found (set HOSTFILE=... or HOSTS=host:slots,...)"
    GRAVAC_HOSTARGS=(-hostfile "$HOSTFILE")
    slots="$(awk '
      { sub(/#.*/, "") }
      NF == 0 { next }
      { n = 1; for (i = 2; i <= NF; i++) if ($i ~ /^(slots|max_slots)=/) { split($i, kv, "="); n = kv[2] } total += n }
      END { print total + 0 }' "$HOSTFILE")"
    [ "$slots" -gt 0 ] || die "hostfile '$HOSTFILE' lists no hosts"
    GLOO="${GLOO:-0}"
  fi
  NP="${NP:-$slots}"
  [[ "$NP" =~ ^[1-9][0-9]*$ ]] || die "NP must be a positive integer, not '$NP'"
  [ "$NP" -le "$slots" ] || say "warning: NP=$NP exceeds the $slots slots listed; the launcher may refuse"

  # The launcher in front of the training command.
  if [ "$LAUNCHER" = horovodrun ]; then
    GRAVAC_LAUNCH=(horovodrun -np "$NP" "${GRAVAC_HOSTARGS[@]}")
    [ "$GLOO" = 1 ] && GRAVAC_LAUNCH+=(--gloo)
    [ -n "${SSH_PORT:-}" ] && GRAVAC_LAUNCH+=(-p "$SSH_PORT")
    [ -n "${NETWORK_INTERFACE:-}" ] && GRAVAC_LAUNCH+=(--network-interfaces "$NETWORK_INTERFACE")
  else
    export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
    GRAVAC_LAUNCH=(mpirun -np "$NP" "${GRAVAC_HOSTARGS[@]}"
                   -bind-to none -map-by slot
                   -x NCCL_DEBUG -x LD_LIBRARY_PATH -x PATH
                   -mca pml ob1 -mca btl ^openib)
    [ "$(id -u)" = 0 ] && GRAVAC_LAUNCH+=(--allow-run-as-root)
    [ -n "${SSH_PORT:-}" ] && GRAVAC_LAUNCH+=(-mca plm_rsh_args "-p $SSH_PORT")
    if [ -n "${NETWORK_INTERFACE:-}" ]; then
      export NCCL_SOCKET_IFNAME="$NETWORK_INTERFACE"
      GRAVAC_LAUNCH+=(-mca btl_tcp_if_include "$NETWORK_INTERFACE" -x NCCL_SOCKET_IFNAME)
    fi
  fi
  GRAVAC_RUNS=0
}

# gravac_run NAME ARGS...: one training run with the model/data/optimizer flags, the
# run's own ARGS, then the user's extra arguments.
gravac_run() {
  local name="$1"; shift
  local cmd=("${GRAVAC_LAUNCH[@]}" "${GRAVAC_TRAIN[@]}" --preset "$PRESET")
  [ -n "$DATA" ] && cmd+=(--data "$DATA")
  cmd+=("$@")
  # Only what the user asked for; otherwise the preset's values hold.
  [ -n "${STEPS:-}" ] && cmd+=(--steps "$STEPS")
  [ -n "${BATCH_SIZE:-}" ] && cmd+=(--batch-size "$BATCH_SIZE")
  [ -n "${LR:-}" ] && cmd+=(--lr "$LR")
  [ -n "${SEED:-}" ] && cmd+=(--seed "$SEED")
  cmd+=(--out "$REPORT_ROOT/$name-$MODEL" "${GRAVAC_EXTRA[@]}")
  GRAVAC_RUNS=$((GRAVAC_RUNS + 1))
  if [ "$DRY_RUN" = 1 ]; then
    gravac_print_cmd "${cmd[@]}"
  else
    say "run $GRAVAC_RUNS: $name ($NP ranks)"
    gravac_print_cmd "${cmd[@]}" >&2
    "${cmd[@]}"
  fi
}

# Expand a comma-separated CONFIG into words, replacing "paper" with the full list.
gravac_configs() {
  local spec="$1" all="$2" c out=() parts more
  IFS=',' read -r -a parts <<<"$spec"
  for c in "${parts[@]}"; do
    case "$c" in
      paper|all) read -r -a more <<<"$all"; out+=("${more[@]}") ;;
      "") ;;
      *) out+=("$c") ;;
    esac
  done
  printf '%s\n' "${out[@]}"
}
