#!/usr/bin/env bash
# Install Debian's Slurm (slurmctld, slurmd, slurmrestd) and munge, if they are missing.
# Idempotent: does nothing when the binaries are already there.
set -euo pipefail

need=()
for bin in slurmctld slurmd slurmrestd scontrol sinfo munged; do
  command -v "$bin" >/dev/null 2>&1 || [[ -x "/usr/sbin/$bin" ]] || need+=("$bin")
done
if [[ ${#need[@]} -eq 0 ]]; then
  exit 0
fi

echo "installing slurm-wlm, slurmrestd, munge (missing: ${need[*]})" >&2
export DEBIAN_FRONTEND=noninteractive
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  sudo_cmd=(sudo)
fi
# The package index may be stale or absent on a fresh machine: update once on failure.
if ! "${sudo_cmd[@]}" apt-get install -y --no-install-recommends slurm-wlm slurmrestd munge; then
  "${sudo_cmd[@]}" apt-get update
  "${sudo_cmd[@]}" apt-get install -y --no-install-recommends slurm-wlm slurmrestd munge
fi
