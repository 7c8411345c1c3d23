"""pytest fixtures for the local Slurm cluster (deploy/slurm/up.sh starts it; .ci/run does so before pytest).

- ``slurm_cluster`` (session): reads deploy/slurm/.state/env, checks that ``sinfo`` lists nodes and that
  slurmrestd answers a ping with the token; otherwise ``missing()`` (skip outside CI, fail in CI).
  Gives a :class:`SlurmCluster` with the URL, user, token, slurm.conf path and ``cli()`` to run Slurm's
  command-line tools safely (SLURM_CONF set, SLURM_JWT removed).
- ``slurm_config`` (function): a ready :class:`providers.slurm.config.SlurmConfig` for that cluster.
- ``slurm_installation`` (session): an installation name unique to this test session, so the tests' jobs
  are told apart from anyone else's; every job it owns is cancelled at the end of the session.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from providers.slurm.config import SlurmConfig
from tests.conftest import ROOT, missing

ENV_FILE = ROOT / "deploy" / "slurm" / ".state" / "env"


@dataclass(frozen=True)
class SlurmCluster:
    url: str
    user: str
    token: str = field(repr=False)  # a secret: never in failure output
    conf: str = ""

    def env(self) -> dict[str, str]:
        # SLURM_CONF always: without it the tools look the controller up in DNS, off loopback.
        # SLURM_JWT never: sbatch would copy it into jobs and srun there would fail to authenticate.
        env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
        env["SLURM_CONF"] = self.conf
        return env

    def cli(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(args, env=self.env(), capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{shlex.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout


def read_env_file(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line.startswith("export "):
            continue
        name, _, value = line.removeprefix("export ").partition("=")
        out[name.strip()] = shlex.split(value)[0] if value.strip() else ""
    return out


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    if not ENV_FILE.is_file():
        missing(f"local Slurm cluster is not up ({ENV_FILE} is absent): run deploy/slurm/up.sh")
    env = read_env_file(ENV_FILE)
    try:
        cluster = SlurmCluster(
            url=env["LOCKSTEP_SLURM_URL"],
            user=env.get("LOCKSTEP_SLURM_USER", "root"),
            token=env["LOCKSTEP_SLURM_TOKEN"],
            conf=env["SLURM_CONF"],
        )
    except KeyError as exc:
        missing(f"{ENV_FILE} lacks {exc}: rerun deploy/slurm/up.sh")
    try:
        nodes = cluster.cli("sinfo", "-h", "-N", "-o", "%N").split()
    except (AssertionError, OSError, subprocess.TimeoutExpired) as exc:
        missing(f"sinfo does not answer ({exc}): run deploy/slurm/up.sh")
    if not nodes:
        missing("sinfo lists no nodes: run deploy/slurm/up.sh")
    try:
        resp = httpx.get(
            f"{cluster.url}/slurm/v0.0.38/ping",
            headers={"X-SLURM-USER-NAME": cluster.user, "X-SLURM-USER-TOKEN": cluster.token},
            timeout=10,
        )
    except httpx.HTTPError as exc:
        missing(f"slurmrestd at {cluster.url} does not answer ({type(exc).__name__}): run deploy/slurm/up.sh")
    if resp.status_code != 200:
        missing(f"slurmrestd ping answered HTTP {resp.status_code}: rerun deploy/slurm/up.sh (token expired?)")
    return cluster


@pytest.fixture(scope="session")
def slurm_installation(slurm_cluster: SlurmCluster) -> Iterator[str]:
    name = f"lstest-{uuid.uuid4().hex[:8]}"
    yield name
    # Leave nothing running: cancel every job this session's installation still has.
    out = slurm_cluster.cli("squeue", "-h", "-o", "%i %k", check=False)
    ids = [line.split()[0] for line in out.splitlines() if name in line]
    if ids:
        slurm_cluster.cli("scancel", *ids, check=False)


@pytest.fixture
def slurm_config(slurm_cluster: SlurmCluster, tmp_path: Path) -> SlurmConfig:
    return SlurmConfig(
        job_dir=str(tmp_path / "slurm-jobs"),  # the jobs' shared directory: one host, so any local one
        enabled=True,
        url=slurm_cluster.url,
        user=slurm_cluster.user,
        token=SecretStr(slurm_cluster.token),
        conf_path=slurm_cluster.conf,
        cluster_name="onprem",
        timeout_s=10.0,
    )
