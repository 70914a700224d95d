# Shared by start.sh, stop.sh and two-nodes.sh (sourced, not run).

pid_is() { [[ "$(cat "/proc/$1/comm" 2>/dev/null)" == "$2" ]]; } # pid_is PID NAME

# pid_alive PIDFILE NAME: the pid file names a live process called NAME.
# A pid file outlives its daemon when the machine restarts or is restored from a snapshot, and
# its PID may by then belong to another process: checking the name keeps us from taking that
# process for the daemon (and from killing it).
pid_alive() {
  [[ -s "$1" ]] || return 1
  local pid
  pid="$(tr -d '[:space:]' <"$1")"
  [[ "$pid" =~ ^[0-9]+$ ]] && pid_is "$pid" "$2"
}

stop_pidfile() { # stop_pidfile PIDFILE NAME: TERM the daemon NAME, wait up to 10 s, then KILL
  pid_alive "$1" "$2" || return 0
  local pid
  pid="$(tr -d '[:space:]' <"$1")"
  printf '[slurm] stopping %s (%s)\n' "$2" "$pid" >&2
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do
    pid_is "$pid" "$2" || return 0
    sleep 0.2
  done
  kill -9 "$pid" 2>/dev/null || true
}
