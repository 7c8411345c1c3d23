#!/usr/bin/env bash
# Install Debian's Slurm (slurmctld, slurmd, slurmrestd) and munge, if they are missing.
# Idempotent: does nothing when the binaries are already there.
set -euo pipefail

need=()
for bin in slurmctld slurmd slurmrestd scontrol sinfo munged; do
  command -v "$bin" >/dev/null 2>&1 || [[ -x "/usr/sbin/$bin" ]] || need+=("$bin")
done
# slurmctld's JWT auth plugin (auth_jwt.so): Debian 12 ships it in slurm-wlm-jwt-plugin, which
# nothing above depends on; slurmctld dies at start without it ("cannot find auth plugin").
if ! compgen -G "/usr/lib/*/slurm-wlm/auth_jwt.so" >/dev/null; then
  need+=("auth_jwt.so")
fi
if [[ ${#need[@]} -eq 0 ]]; then
  exit 0
fi

echo "installing slurm-wlm, slurmrestd, munge, the JWT plugin (missing: ${need[*]})" >&2
export DEBIAN_FRONTEND=noninteractive
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  sudo_cmd=(sudo)
fi
# The package index may be stale or absent on a fresh machine: update once on failure.
packages=(slurm-wlm slurmrestd munge)
jwt_package() {
  if apt-cache show slurm-wlm-jwt-plugin >/dev/null 2>&1; then echo slurm-wlm-jwt-plugin; fi
}
if ! "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${packages[@]}" $(jwt_package); then
  "${sudo_cmd[@]}" apt-get update
  "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${packages[@]}" $(jwt_package)
fi
