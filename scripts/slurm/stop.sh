#!/usr/bin/env bash
# Stop the single-node SLURM started by start.sh (slurmd, slurmctld, slurmdbd, MariaDB, munged).
# State (job ids, accounting database) stays in $SCALELAB_SLURM_STATE; start.sh resumes from it.
# Pass --purge to also delete that state (the next start.sh begins from an empty cluster).
set -euo pipefail
STATE="${SCALELAB_SLURM_STATE:-/var/lib/scalelab-slurm}"

# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

stop_pidfile "$STATE/run/slurmd.pid" slurmd
stop_pidfile "$STATE/run/slurmctld.pid" slurmctld
stop_pidfile "$STATE/run/slurmdbd.pid" slurmdbd
stop_pidfile "$STATE/run/mariadb.pid" mariadbd
stop_pidfile /run/munge/munged.pid munged

if [[ "${1:-}" == "--purge" ]]; then
  rm -rf "$STATE"
  rm -f /etc/slurm/slurm.conf /etc/slurm/slurmdbd.conf
  echo "[slurm] removed $STATE and the scalelab slurm configs" >&2
fi
