# Shared by start.sh, stop.sh and two-nodes.sh (sourced, not run).

pid_alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pidfile() { # stop_pidfile PIDFILE [NAME]: TERM the daemon, wait up to 10 s, then KILL
  pid_alive "$1" || return 0
  local pid
  pid="$(cat "$1")"
  [[ -n "${2:-}" ]] && printf '[slurm] stopping %s (%s)\n' "$2" "$pid" >&2
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.2
  done
  kill -9 "$pid" 2>/dev/null || true
}
