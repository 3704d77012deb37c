#!/usr/bin/env bash
# PyTorch DDP with horovod_gravac's comm hook under multi-node torchrun: run the same command
# on every node; the nodes meet at RDZV_ENDPOINT through torchrun's c10d rendezvous.
# No Horovod, no hostfile, no ssh: torchrun starts the local processes of each node.
set -euo pipefail
SCRIPT_NAME="run_ddp.sh"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() {
  cat <<'TXT'
Usage: launch/run_ddp.sh [--dry-run] [-h|--help] [TRAINING ARGS...]

Starts launch/ddp_train.py (a DDP script with the two-line swap to hg.ddp.gravac_hook) with
  torchrun --nnodes NNODES --nproc-per-node NPROC_PER_NODE --rdzv-backend c10d
           --rdzv-endpoint RDZV_ENDPOINT --rdzv-id RDZV_ID launch/ddp_train.py ...
Run the same command on every node (8 nodes x 4 GPUs by default, the paper's cluster).

Environment:
  NNODES=8              nodes (a range MIN:MAX lets torchrun start with fewer)
  NPROC_PER_NODE=4      processes per node (one per GPU)
  RDZV_ENDPOINT=gravac-vm-0:29400   host:port of the rendezvous (any node's address)
  RDZV_ID=gravac-ddp    the job's id, the same on every node
  PYTHON=python         the interpreter torchrun starts (-m torch.distributed.run)
  CONTROLLER=gravac     dense | static | gravac | accordion
  COMPRESSOR=topk       topk | dgc | redsync | randomk | sidco | powersgd
  DRY_RUN=1             print the command and start nothing (also --dry-run)
  SMOKE=1               one node, 2 local Gloo processes, 20 steps (--standalone)
Extra arguments go to ddp_train.py last (e.g. --steps 100 --cf 100 --compression fp16).

Examples:
  RDZV_ENDPOINT=node0:29400 launch/run_ddp.sh                # on each of the 8 nodes
  NNODES=2 NPROC_PER_NODE=8 CONTROLLER=accordion launch/run_ddp.sh --steps 500
  SMOKE=1 launch/run_ddp.sh
TXT
}

DRY_RUN="${DRY_RUN:-0}"
args=()
for a in "$@"; do
  case "$a" in
    -h|--help) usage; exit 0 ;;
    --dry-run) DRY_RUN=1 ;;
    *) args+=("$a") ;;
  esac
done

PYTHON="${PYTHON:-python}"
CONTROLLER="${CONTROLLER:-gravac}"
COMPRESSOR="${COMPRESSOR:-topk}"
if [ "${SMOKE:-0}" = 1 ]; then
  where=(--standalone --nnodes 1 --nproc-per-node 2)
  args=(--backend gloo --steps 20 --width 64 --window 5 "${args[@]}")
else
  where=(--nnodes "${NNODES:-8}" --nproc-per-node "${NPROC_PER_NODE:-4}" --rdzv-backend c10d
         --rdzv-endpoint "${RDZV_ENDPOINT:-gravac-vm-0:29400}" --rdzv-id "${RDZV_ID:-gravac-ddp}")
fi
cmd=("$PYTHON" -m torch.distributed.run "${where[@]}" "$HERE/ddp_train.py"
     --controller "$CONTROLLER" --compressor "$COMPRESSOR" "${args[@]}")

if [ "$DRY_RUN" = 1 ]; then
  printf 'torchrun'
  printf ' %q' "${cmd[@]:3}"
  printf '\n'
  exit 0
fi
printf '[%s] %s\n' "$SCRIPT_NAME" "${cmd[*]}" >&2
exec "${cmd[@]}"
