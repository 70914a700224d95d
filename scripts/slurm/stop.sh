#!/usr/bin/env bash
# Stop the single-node SLURM started by start.sh (slurmd, slurmctld, slurmdbd, MariaDB, munged).
# State (job ids, accounting database) stays in $SCALELAB_SLURM_STATE; start.sh resumes from it.
# Pass --purge to also delete that state (the next start.sh begins from an empty cluster).
set -euo pipefail
STATE="${SCALELAB_SLURM_STATE:-/var/lib/scalelab-slurm}"

stop_pidfile() { # stop_pidfile NAME PIDFILE: TERM the daemon and wait up to 10 s for it to go
  local pid
  [[ -s "$2" ]] && pid="$(cat "$2")" && kill -0 "$pid" 2>/dev/null || return 0
  echo "[slurm] stopping $1 ($pid)" >&2
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -9 "$pid" 2>/dev/null || true
}

stop_pidfile slurmd "$STATE/run/slurmd.pid"
stop_pidfile slurmctld "$STATE/run/slurmctld.pid"
stop_pidfile slurmdbd "$STATE/run/slurmdbd.pid"
stop_pidfile mariadb "$STATE/run/mariadb.pid"
stop_pidfile munged /run/munge/munged.pid

if [[ "${1:-}" == "--purge" ]]; then
  rm -rf "$STATE"
  rm -f /etc/slurm/slurm.conf /etc/slurm/slurmdbd.conf
  echo "[slurm] removed $STATE and the scalelab slurm configs" >&2
fi
