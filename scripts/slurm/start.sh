#!/usr/bin/env bash
# Start a real single-node SLURM (munge, MariaDB, slurmdbd, slurmctld, slurmd) on this machine,
# without systemd, for the test suite and for trying the slurm backend locally.
#
# Idempotent: when everything already runs with the same config it returns in about a second.
# Needs root and Debian/Ubuntu (apt-get) the first time, to install the packages.
#
# Exit codes: 0 ready; 1 a daemon failed (log tails are printed); 2 not root;
# 3 the packages are missing and cannot be installed (no apt-get, or apt failed).
#
# Environment (all optional):
#   SCALELAB_SLURM_STATE    state directory          (default /var/lib/scalelab-slurm)
#   SCALELAB_SLURM_LOGS     log directory            (default /var/log/scalelab-slurm)
#   SCALELAB_SLURM_DB_PORT  private MariaDB TCP port (default 3307, bound to 127.0.0.1)
#   SCALELAB_SLURM_TIMEOUT  seconds to wait for the cluster to come up (default 60)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${SCALELAB_SLURM_STATE:-/var/lib/scalelab-slurm}"
LOGS="${SCALELAB_SLURM_LOGS:-/var/log/scalelab-slurm}"
DB_PORT="${SCALELAB_SLURM_DB_PORT:-3307}"
TIMEOUT="${SCALELAB_SLURM_TIMEOUT:-60}"
CLUSTER=scalelab
PARTITION=debug
ETC=/etc/slurm
MARKER="# written by scalelab scripts/slurm/start.sh"
PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
# Commands whose presence means the packages are installed.
NEEDED=(munged mungekey slurmctld slurmd slurmdbd sinfo sacct sacctmgr mariadbd mariadb-install-db)

log() { printf '[slurm] %s\n' "$*" >&2; }

die() { # die CODE MESSAGE: print the message (and the daemon logs for a failed start), exit CODE
  local code=$1
  shift
  log "ERROR: $*"
  if ((code == 1)); then
    for f in "$LOGS"/*.log; do
      [[ -f "$f" && "$f" != */apt.log ]] || continue
      printf '\n----- tail of %s -----\n' "$f" >&2
      tail -n 25 "$f" >&2 || true
    done
    log "ERROR: $* (log tails above)"
  fi
  exit "$code"
}

[[ $EUID -eq 0 ]] || die 2 "needs root (to install packages and run the SLURM daemons); uid is $EUID"

mkdir -p "$STATE" "$LOGS"
# One start at a time (pytest-xdist workers, two terminals).
# Daemons started below must not inherit fd 9, or they would hold the lock forever (9>&-).
exec 9>"$STATE/start.lock"
flock 9

missing_commands() {
  local c
  for c in "${NEEDED[@]}"; do
    command -v "$c" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$c" >/dev/null 2>&1 ||
      echo "$c"
  done
}

install_packages() {
  command -v apt-get >/dev/null 2>&1 ||
    die 3 "SLURM is not installed ($(missing_commands | tr '\n' ' ')) and there is no apt-get to install it"
  log "installing ${PACKAGES[*]} (apt-get, log in $LOGS/apt.log)"
  # Package scripts must not start services themselves (there is no systemd; we start them below).
  local made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  local ok=0
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${PACKAGES[@]}")
  if compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null && "${apt[@]}" >"$LOGS/apt.log" 2>&1; then
    ok=1
  else
    # No package lists yet (fresh image) or stale ones: update once and retry.
    if apt-get update -q >>"$LOGS/apt.log" 2>&1 && "${apt[@]}" >>"$LOGS/apt.log" 2>&1; then
      ok=1
    fi
  fi
  ((made_policy)) && rm -f /usr/sbin/policy-rc.d
  ((ok)) || { tail -n 30 "$LOGS/apt.log" >&2; die 3 "apt-get could not install ${PACKAGES[*]} (see $LOGS/apt.log)"; }
}

export PATH="$PATH:/usr/sbin:/sbin"
[[ -z "$(missing_commands)" ]] || install_packages
[[ -z "$(missing_commands)" ]] || die 3 "still missing after install: $(missing_commands | tr '\n' ' ')"

# ---------------------------------------------------------------- configs
NODE="$(uname -n)"
NODE="${NODE%%.*}" # the short name, as slurmd finds itself
CPUS="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)" # nproc obeys OMP_NUM_THREADS
MEM_MB="$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo)"
REAL_MEM=$((MEM_MB * 95 / 100)) # slurmd drains a node that reports less than RealMemory
DB_PASS_FILE="$STATE/db.pass"
[[ -s "$DB_PASS_FILE" ]] || (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$DB_PASS_FILE")
DB_PASS="$(cat "$DB_PASS_FILE")"

render() { # render TEMPLATE: substitute @VARS@ of the template
  sed -e "s|@MARKER@|$MARKER|g" -e "s|@CLUSTER@|$CLUSTER|g" -e "s|@PARTITION@|$PARTITION|g" \
    -e "s|@NODE@|$NODE|g" -e "s|@CPUS@|$CPUS|g" -e "s|@REAL_MEM@|$REAL_MEM|g" \
    -e "s|@STATE@|$STATE|g" -e "s|@LOGS@|$LOGS|g" -e "s|@DB_PORT@|$DB_PORT|g" \
    -e "s|@DB_PASS@|$DB_PASS|g" "$HERE/$1"
}

CONFIG_CHANGED=0
install_config() { # install_config TEMPLATE DEST MODE
  local tmp dest=$2
  if [[ -e "$dest" ]] && ! grep -qF "$MARKER" "$dest"; then
    die 1 "$dest exists and was not written by scalelab; refusing to overwrite a real SLURM setup"
  fi
  tmp="$(mktemp)"
  render "$1" >"$tmp"
  if [[ -e "$dest" ]] && cmp -s "$tmp" "$dest"; then
    rm -f "$tmp"
  else
    install -m "$3" "$tmp" "$dest"
    rm -f "$tmp"
    CONFIG_CHANGED=1
  fi
}

mkdir -p "$ETC" "$STATE"/{ctld,spool,run} "$LOGS"
install_config slurm.conf.in "$ETC/slurm.conf" 644
install_config slurmdbd.conf.in "$ETC/slurmdbd.conf" 600

# ---------------------------------------------------------------- daemons
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cluster_ready() { # the node answers (idle, or busy with jobs) and accounting answers
  local state
  state="$(timeout 5 sinfo -h -N -n "$NODE" -o %T 2>/dev/null)" || return 1
  [[ "$state" =~ ^(idle|mixed|allocated|completing)$ ]] || return 1
  timeout 5 sacct -n -X -S now >/dev/null 2>&1
}

MUNGE_PID=/run/munge/munged.pid
DB_PID="$STATE/run/mariadb.pid"
DBD_PID="$STATE/run/slurmdbd.pid"
CTLD_PID="$STATE/run/slurmctld.pid"
SLURMD_PID="$STATE/run/slurmd.pid"

if ((!CONFIG_CHANGED)) && pid_alive "$MUNGE_PID" munged && pid_alive "$DB_PID" mariadbd &&
  pid_alive "$DBD_PID" slurmdbd && pid_alive "$CTLD_PID" slurmctld && pid_alive "$SLURMD_PID" slurmd &&
  cluster_ready; then
  log "already running (node $NODE, partition $PARTITION)"
  exit 0
fi

if ((CONFIG_CHANGED)); then
  # New config (first start, or the machine changed): restart SLURM daemons that still run.
  stop_pidfile "$SLURMD_PID" slurmd
  stop_pidfile "$CTLD_PID" slurmctld
  stop_pidfile "$DBD_PID" slurmdbd
fi

# munge: shared-secret authentication between SLURM's daemons and clients.
if ! pid_alive "$MUNGE_PID" munged; then
  [[ -s /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  chmod 755 /run/munge
  touch "$LOGS/munged.log" && chown munge:munge "$LOGS/munged.log"
  log "starting munged"
  runuser -u munge -- munged --pid-file="$MUNGE_PID" --log-file="$LOGS/munged.log" 9>&- ||
    die 1 "munged did not start"
fi

# MariaDB: a private instance (own datadir, port 127.0.0.1:$DB_PORT) for slurmdbd's accounting,
# which sacct reads; submitit needs sacct to see cancelled and finished jobs.
DATADIR="$STATE/mysql"
DB_SOCK="$STATE/run/mariadb.sock"
if ! pid_alive "$DB_PID" mariadbd; then
  if [[ ! -d "$DATADIR/mysql" ]]; then
    log "initialising MariaDB in $DATADIR"
    mkdir -p "$DATADIR"
    chown mysql:mysql "$DATADIR"
    mariadb-install-db --user=mysql --datadir="$DATADIR" --auth-root-authentication-method=socket \
      --skip-test-db >"$LOGS/mariadb-install.log" 2>&1 || die 1 "mariadb-install-db failed"
  fi
  chown mysql:mysql "$STATE/run"
  log "starting MariaDB on 127.0.0.1:$DB_PORT"
  setsid mariadbd --no-defaults --user=mysql --datadir="$DATADIR" --socket="$DB_SOCK" \
    --pid-file="$DB_PID" --bind-address=127.0.0.1 --port="$DB_PORT" --log-error="$LOGS/mariadb.log" \
    --innodb-buffer-pool-size=64M --skip-name-resolve </dev/null >/dev/null 2>&1 9>&- &
fi
for _ in $(seq $((TIMEOUT * 5))); do
  mariadb --no-defaults -S "$DB_SOCK" -e 'SELECT 1' >/dev/null 2>&1 && break
  sleep 0.2
done
mariadb --no-defaults -S "$DB_SOCK" -e "
  CREATE DATABASE IF NOT EXISTS slurm_acct_db;
  CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
  ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
  GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" 2>>"$LOGS/mariadb.log" ||
  die 1 "MariaDB did not come up on socket $DB_SOCK"

start_slurm_daemon() { # start_slurm_daemon NAME PIDFILE CMD...: the daemons fork themselves
  local name=$1 pidfile=$2
  shift 2
  pid_alive "$pidfile" "$name" && return 0
  log "starting $name"
  "$@" 9>&- || die 1 "$name did not start"
  for _ in $(seq 50); do
    pid_alive "$pidfile" "$name" && return 0
    sleep 0.1
  done
  die 1 "$name exited right after start"
}

start_slurm_daemon slurmdbd "$DBD_PID" slurmdbd
for _ in $(seq $((TIMEOUT * 5))); do
  timeout 5 sacctmgr -n list cluster >/dev/null 2>&1 && break
  sleep 0.2
done
timeout 5 sacctmgr -n list cluster >/dev/null 2>&1 || die 1 "slurmdbd does not answer sacctmgr"
if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
  sacctmgr -i add cluster "$CLUSTER" >/dev/null || die 1 "sacctmgr could not add cluster $CLUSTER"
fi

start_slurm_daemon slurmctld "$CTLD_PID" slurmctld
start_slurm_daemon slurmd "$SLURMD_PID" slurmd

log "waiting for node $NODE to be idle and for sacct"
deadline=$((SECONDS + TIMEOUT))
resumed=0
until cluster_ready; do
  ((SECONDS < deadline)) || die 1 "cluster not ready after ${TIMEOUT}s: $(sinfo -N -o '%N %T %E' 2>&1 | tail -n 1)"
  # A node left DOWN/DRAINED by an earlier crash or config change: put it back once.
  if ((!resumed)) && sinfo -h -N -n "$NODE" -o %T 2>/dev/null | grep -Eq 'down|drain'; then
    scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true
    resumed=1
  fi
  sleep 0.3
done
log "ready in ${SECONDS} s: node $NODE ($CPUS CPUs, ${REAL_MEM} MB), partition $PARTITION, logs in $LOGS"
