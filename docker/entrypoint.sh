#!/usr/bin/env bash
# Entrypoint of the horovod_gravac image.
#
# 1. SSH for multi-node horovodrun / mpirun between containers: if a key folder is
#    mounted at $GRAVAC_SSH_KEYS (default /ssh-keys, read-only is fine), its private
#    key(s) id_* and authorized_keys (or, failing that, the *.pub files) are copied to
#    /root/.ssh with the permissions sshd and ssh insist on. Nothing secret is baked
#    into the image: without the mount there is no key and sshd is not started.
# 2. sshd on port $SSH_PORT (default 12345, the port the image's ssh client also
#    uses), with host keys generated per container at first start. GRAVAC_SSHD=0
#    skips it; GRAVAC_SSHD=1 starts it even without mounted keys. GRAVAC_SSH_LISTEN
#    (default: every address) binds it to one address, so that several containers
#    sharing one network namespace (--network host on one machine) each have their own
#    sshd on the same port: docker/two_containers.sh.
# 3. exec the command (default: bash). `sleep infinity` keeps a worker container up.
set -euo pipefail

keys="${GRAVAC_SSH_KEYS:-/ssh-keys}"
port="${SSH_PORT:-12345}"
want_sshd="${GRAVAC_SSHD:-auto}"
listen="${GRAVAC_SSH_LISTEN:-}"

if [ -d "$keys" ]; then
  install -d -m 700 /root/.ssh
  found=0
  for k in "$keys"/id_*; do
    [ -f "$k" ] || continue
    case "$k" in
      *.pub) install -m 644 "$k" "/root/.ssh/$(basename "$k")" ;;
      *) install -m 600 "$k" "/root/.ssh/$(basename "$k")"; found=1 ;;
    esac
  done
  if [ -f "$keys/authorized_keys" ]; then
    install -m 600 "$keys/authorized_keys" /root/.ssh/authorized_keys
  else
    : >/root/.ssh/authorized_keys
    for pub in "$keys"/*.pub; do
      [ -f "$pub" ] && cat "$pub" >>/root/.ssh/authorized_keys
    done
    chmod 600 /root/.ssh/authorized_keys
  fi
  [ "$found" = 1 ] || echo "[entrypoint] note: no private key id_* in $keys; this container can accept ssh but not start remote ranks" >&2
  [ "$want_sshd" = auto ] && want_sshd=1
fi

if [ "$want_sshd" = 1 ]; then
  ssh-keygen -A >/dev/null          # per-container host keys (none ship in the image)
  mkdir -p /run/sshd
  # Remote ranks are started over ssh, and ssh sessions do not see the image's ENV:
  # hand them this container's PATH / LD_LIBRARY_PATH (venv, CUDA, NCCL).
  printf 'SetEnv PATH=%s LD_LIBRARY_PATH=%s\n' "$PATH" "${LD_LIBRARY_PATH:-}" \
    >/etc/ssh/sshd_config.d/60-gravac-env.conf
  # Outgoing ssh (horovodrun, mpirun) uses the same port as this sshd.
  printf 'Host *\n    Port %s\n' "$port" >/etc/ssh/ssh_config.d/40-gravac-port.conf
  if [ -n "$listen" ]; then
    /usr/sbin/sshd -p "$port" -o "ListenAddress=$listen"
  else
    /usr/sbin/sshd -p "$port"
  fi
  echo "[entrypoint] sshd listening on ${listen:-every address}, port $port" >&2
fi

if [ "$#" -eq 0 ]; then
  set -- bash
fi
exec "$@"
