#!/usr/bin/env bash
# Stop exactly the daemons deploy/slurm/up.sh started (by their pid files), nothing else.
# Cancels the cluster's jobs first (--keep-jobs: leave them, for a restart). Keeps keys and saved state so
# that the next `up` is quick; --purge removes .state too.
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

keep_jobs=0
purge=0
for arg in "$@"; do
  case "$arg" in
    --keep-jobs) keep_jobs=1 ;;  # a restart: slurmd picks running job steps up again
    --purge) purge=1 ;;
    *) echo "usage: $0 [--keep-jobs] [--purge]" >&2; exit 2 ;;
  esac
done

# Jobs of this private cluster run under slurmstepd, which outlives slurmd: cancel them first so that
# nothing of the cluster is left behind. SLURM_CONF names this cluster only.
export SLURM_CONF="$STATE/etc/slurm.conf"
unset SLURM_JWT
PATH="$PATH:/usr/sbin:/sbin"
if [[ $keep_jobs -eq 0 && -s "$RUN/slurmctld.pid" ]] && kill -0 "$(cat "$RUN/slurmctld.pid")" 2>/dev/null; then
  jobs="$(squeue -h -o '%i' 2>/dev/null || true)"
  if [[ -n "$jobs" ]]; then
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null || true
    for _ in $(seq 1 50); do
      [[ -z "$(squeue -h -o '%i' 2>/dev/null || true)" ]] && break
      sleep 0.2
    done
  fi
fi

if [[ -d "$RUN" ]]; then
  # REST first, then the nodes, then the controller, munge last (the others use it while stopping).
  stop "$RUN/slurmrestd.pid"
  for f in "$RUN"/slurmd-*.pid; do
    [[ -e "$f" ]] && stop "$f"
  done
  stop "$RUN/slurmctld.pid"
  stop "$RUN/munged.pid"
fi

if [[ $purge -eq 1 ]]; then
  # The config copy up.sh made for slurmrestd when the checkout was not readable by nobody.
  if [[ -s "$RUN/slurmrestd.confdir" ]]; then
    confdir="$(cat "$RUN/slurmrestd.confdir")"
    [[ "$confdir" == /tmp/lockstep-slurmrestd-* ]] && rm -rf "$confdir"
  fi
  rm -rf "$STATE"
fi
echo "slurm cluster down"
