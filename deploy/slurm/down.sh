#!/usr/bin/env bash
# Stop exactly the daemons deploy/slurm/up.sh started (by their pid files), nothing else.
# Keeps keys and saved state so that the next `up` is quick; `down.sh --purge` removes .state too.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${LOCKSTEP_SLURM_STATE:-$HERE/.state}"
RUN="$STATE/run"

stop() { # pidfile: TERM, wait up to 10 s, then KILL
  local pidfile=$1 pid
  [[ -s "$pidfile" ]] || return 0
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

if [[ -d "$RUN" ]]; then
  # REST first, then the nodes, then the controller, munge last (the others use it while stopping).
  stop "$RUN/slurmrestd.pid"
  for f in "$RUN"/slurmd-*.pid; do
    [[ -e "$f" ]] && stop "$f"
  done
  stop "$RUN/slurmctld.pid"
  stop "$RUN/munged.pid"
fi

if [[ "${1:-}" == "--purge" ]]; then
  # The config copy up.sh made for slurmrestd when the checkout was not readable by nobody.
  if [[ -s "$RUN/slurmrestd.confdir" ]]; then
    confdir="$(cat "$RUN/slurmrestd.confdir")"
    [[ "$confdir" == /tmp/lockstep-slurmrestd-* ]] && rm -rf "$confdir"
  fi
  rm -rf "$STATE"
fi
echo "slurm cluster down"
