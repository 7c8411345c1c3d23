#!/usr/bin/env bash
# Stop every process of the cluster whose state dir this is (LOCKSTEP_SLURM_STATE, default .state), and
# nothing of any other cluster on the host:
#   - the daemons deploy/slurm/up.sh started, by their pid files (a pid is only signalled while its command
#     line still names this state dir: a recycled pid belongs to someone else);
#   - every job step left behind: slurmstepd outlives slurmd, so a node whose slurmd died (kill -9, crash)
#     keeps running its job's commands. They are found by what ties them to this cluster only: a slurmstepd
#     whose SLURM_CONF, working directory or open files are this state dir's, a job process (SLURM_JOB_ID set)
#     whose SLURM_CONF is this cluster's, and every descendant of those.
# Cancels the cluster's jobs first (--keep-jobs: leave jobs and their steps, for a restart: slurmd picks them
# up again). Keeps keys and saved state so that the next `up` is quick; --purge removes the state dir too.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STATE="${LOCKSTEP_SLURM_STATE:-$HERE/.state}"
RUN="$STATE/run"
STATE_REAL="$(realpath -m "$STATE")"
REST_CONFDIR=""
[[ -s "$RUN/slurmrestd.confdir" ]] && REST_CONFDIR="$(cat "$RUN/slurmrestd.confdir")"

names_state() { # text → true when it names this state dir (as given or resolved) or slurmrestd's conf copy
  [[ "$1" == *"$STATE/"* || "$1" == *"$STATE_REAL/"* ]] || [[ -n "$REST_CONFDIR" && "$1" == *"$REST_CONFDIR/"* ]]
}

stop() { # pidfile: TERM, wait up to 10 s, then KILL
  local pidfile=$1 pid
  [[ -s "$pidfile" ]] || return 0
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null && names_state "$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")"; then
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

# ---------------------------------------------------------------- job steps a dead slurmd left behind
CONF="$STATE/etc/slurm.conf"
CONF_REAL="$STATE_REAL/etc/slurm.conf"

conf_of() { # pid → its SLURM_CONF, or nothing
  tr '\0' '\n' 2>/dev/null <"/proc/$1/environ" | sed -n 's/^SLURM_CONF=//p' | head -n1
}

stepd_is_ours() { # pid of a slurmstepd
  local pid=$1 conf fd
  conf="$(conf_of "$pid")"
  [[ -n "$conf" && ( "$conf" == "$CONF" || "$conf" == "$CONF_REAL" ) ]] && return 0
  names_state "$(readlink "/proc/$pid/cwd" 2>/dev/null)/" && return 0
  for fd in /proc/"$pid"/fd/*; do  # the node's log file and the spool sockets it serves
    names_state "$(readlink "$fd" 2>/dev/null)" && return 0
  done
  return 1
}

job_is_ours() { # pid → true for a process of one of this cluster's jobs
  local conf
  grep -qz '^SLURM_JOB_ID=' "/proc/$1/environ" 2>/dev/null || return 1
  conf="$(conf_of "$1")"
  [[ -n "$conf" && ( "$conf" == "$CONF" || "$conf" == "$CONF_REAL" ) ]]
}

stat_field() { # pid, n → the n-th field of /proc/PID/stat after the command name (1 state, 2 ppid)
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || { echo 1; return; }  # gone: as if a child of init
  stat="${stat##*) }"  # the command name may hold spaces and parentheses: cut after the last ") "
  read -ra f <<<"$stat"
  echo "${f[$(($2 - 1))]}"
}

leftovers() { # the cluster's step daemons and job processes, with every descendant; never this script
  local seeds=() d pid comm spared
  spared=" $$ "
  pid=$$
  while [[ "$pid" -gt 1 ]]; do  # this script's ancestors (down.sh run from inside a job of the cluster)
    pid="$(stat_field "$pid" 2)"
    spared+="$pid "
  done
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [[ "$spared" == *" $pid "* ]] && continue
    comm="$(cat "$d/comm" 2>/dev/null)" || continue
    [[ "$(stat_field "$pid" 1)" == Z ]] && continue  # ended, waiting to be reaped
    if [[ "$comm" == slurmstepd ]]; then
      stepd_is_ours "$pid" && seeds+=("$pid")
    elif job_is_ours "$pid"; then
      seeds+=("$pid")
    fi
  done
  [[ ${#seeds[@]} -gt 0 ]] || return 0
  ps -e -o pid=,ppid= | awk -v seeds="${seeds[*]}" -v spared="$spared" '
    { parent[$1] = $2 }
    END {
      n = split(seeds, s, " "); for (i = 1; i <= n; i++) mine[s[i]] = 1
      do {  # close over children until nothing is added
        added = 0
        for (p in parent) if (!(p in mine) && (parent[p] in mine) && index(spared, " " p " ") == 0) {
          mine[p] = 1; added = 1
        }
      } while (added)
      for (p in mine) print p
    }'
}

if [[ $keep_jobs -eq 0 ]]; then
  for attempt in 1 2 3; do  # a step may fork while it is being ended: look again
    mapfile -t victims < <(leftovers)
    [[ ${#victims[@]} -gt 0 ]] || break
    echo "ending ${#victims[@]} processes left by this cluster's jobs (pids ${victims[*]})" >&2
    kill -TERM "${victims[@]}" 2>/dev/null || true
    for _ in $(seq 1 25); do
      alive=()
      for pid in "${victims[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
      [[ ${#alive[@]} -eq 0 ]] && break
      sleep 0.2
    done
    [[ ${#alive[@]} -gt 0 ]] && kill -KILL "${alive[@]}" 2>/dev/null || true
    [[ $attempt -lt 3 ]] || echo "some processes of this cluster's jobs may remain" >&2
  done
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
