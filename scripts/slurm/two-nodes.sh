#!/usr/bin/env bash
# A 2-node SLURM on this one host, for testing multi-node trials: its own slurmctld and two
# slurmd (`slurmd -N`), on their own ports and state, beside the single-node cluster of
# start.sh, which it leaves alone (it starts that one first, for munge and accounting).
#
#   sudo scripts/slurm/two-nodes.sh          # start (idempotent); prints SLURM_CONF=<path>
#   sudo scripts/slurm/two-nodes.sh stop     # stop its three daemons
#   SLURM_CONF=<path> sinfo                  # localhost and <hostname>, partition two
#
# Exit codes: those of start.sh; 1 when a daemon of this cluster fails.
# Environment: SCALELAB_SLURM2_STATE (default /var/lib/scalelab-slurm2),
#   SCALELAB_SLURM2_LOGS (default /var/log/scalelab-slurm2), SCALELAB_SLURM_TIMEOUT (60).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${SCALELAB_SLURM2_STATE:-/var/lib/scalelab-slurm2}"
LOGS="${SCALELAB_SLURM2_LOGS:-/var/log/scalelab-slurm2}"
TIMEOUT="${SCALELAB_SLURM_TIMEOUT:-60}"
CONF="$STATE/slurm.conf"
CLUSTER=scalelab2
PARTITION=two
# Two node names for this host that resolve to a loopback address, neither "localhost"
# (which SLURM reads as this host's own name): SCALELAB_SLURM2_NODES="a b", else the first
# two such names in /etc/hosts. The first is the rendezvous host of a 2-node job.
loopback_names() {
  awk '$1 ~ /^127\./ { for (i = 2; i <= NF; i++) { if ($i ~ /^#/) break; if ($i != "localhost") print $i } }' \
    /etc/hosts | sort -u | tr '\n' ' '
}
# A host with fewer such names (a plain container) gets two, marked, when run as root.
if [[ -z "${SCALELAB_SLURM2_NODES:-}" ]] && (($(wc -w <<<"$(loopback_names)") < 2)) &&
  [[ -w /etc/hosts ]]; then
  echo "127.0.0.1 scalelab-node-a scalelab-node-b # added by scalelab scripts/slurm/two-nodes.sh" >>/etc/hosts
fi
read -r NODE1 NODE2 _ <<<"${SCALELAB_SLURM2_NODES:-$(loopback_names)}"
MARKER="# written by scalelab scripts/slurm/two-nodes.sh"
export PATH="$PATH:/usr/sbin:/sbin"

log() { printf '[slurm2] %s\n' "$*" >&2; }
# shellcheck source=lib.sh
source "$HERE/lib.sh"
die() {
  log "ERROR: $1"
  for f in "$LOGS"/*.log; do
    [[ -f "$f" ]] && { printf '\n----- tail of %s -----\n' "$f" >&2; tail -n 15 "$f" >&2; }
  done
  exit 1
}

if [[ "${1:-start}" == "stop" ]]; then
  for f in "$STATE"/run/slurmd-*.pid; do stop_pidfile "$f" slurmd; done
  stop_pidfile "$STATE/run/slurmctld.pid" slurmctld
  exit 0
fi

bash "$HERE/start.sh" # munge and slurmdbd (and the single-node cluster, untouched)
[[ -n "${NODE2:-}" ]] ||
  die "need two names for 127.0.0.1 besides localhost (/etc/hosts, or SCALELAB_SLURM2_NODES)"
for name in "$NODE1" "$NODE2"; do
  [[ "$(getent ahostsv4 "$name" | awk 'NR == 1 {print $1}')" == 127.* ]] ||
    die "$name does not resolve to a loopback address (the rendezvous and the nodes listen there)"
done
[[ "$(scontrol show config 2>/dev/null)" =~ MULTIPLE_SLURMD\ *=\ *Yes ]] ||
  die "this SLURM is built without multiple-slurmd support (--enable-multiple-slurmd)"

mkdir -p "$STATE"/{ctld,run,spool-"$NODE1",spool-"$NODE2"} "$LOGS"
exec 9>"$STATE/start.lock"
flock 9
MEM_MB="$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)"
tmp="$(mktemp)"
sed -e "s|@MARKER@|$MARKER|" -e "s|@CLUSTER@|$CLUSTER|g" -e "s|@PARTITION@|$PARTITION|g" \
  -e "s|@HOST@|$(uname -n | cut -d. -f1)|g" -e "s|@NODE1@|$NODE1|g" -e "s|@NODE2@|$NODE2|g" -e "s|@STATE@|$STATE|g" -e "s|@LOGS@|$LOGS|g" \
  -e "s|@CTLD_PORT@|7817|g" -e "s|@PORT1@|7818|g" -e "s|@PORT2@|7819|g" \
  -e "s|@REAL_MEM@|$((MEM_MB * 45 / 100))|g" "$HERE/two-nodes.conf.in" >"$tmp"
if ! cmp -s "$tmp" "$CONF"; then # new or changed config: restart this cluster's daemons
  for f in "$STATE"/run/slurmd-*.pid; do stop_pidfile "$f" slurmd; done
  stop_pidfile "$STATE/run/slurmctld.pid" slurmctld
  install -m 644 "$tmp" "$CONF"
fi
rm -f "$tmp"
export SLURM_CONF="$CONF"

sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" ||
  sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr could not add cluster $CLUSTER"
pid_alive "$STATE/run/slurmctld.pid" slurmctld || slurmctld -f "$CONF" 9>&- || die "slurmctld did not start"
for node in "$NODE1" "$NODE2"; do
  pid_alive "$STATE/run/slurmd-$node.pid" slurmd || slurmd -f "$CONF" -N "$node" 9>&- ||
    die "slurmd -N $node did not start"
done
deadline=$((SECONDS + TIMEOUT))
until [[ "$(timeout 5 sinfo -h -p "$PARTITION" -o '%D %T' 2>/dev/null)" =~ ^2\ (idle|mixed|allocated)$ ]]; do
  ((SECONDS < deadline)) || die "nodes not ready after ${TIMEOUT}s: $(sinfo -N -o '%N %T' 2>&1 | tr '\n' ' ')"
  sleep 0.3
done
log "ready: nodes $NODE1 and $NODE2 (1 CPU each), partition $PARTITION"
echo "SLURM_CONF=$CONF"
