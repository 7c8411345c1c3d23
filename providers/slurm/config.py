"""The Slurm market's settings (``slurm:`` in the configuration; docs/slurm.md), and what its owned hardware costs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from broker.configbase import Attempts, HttpUrl, MarketSection, Seconds, Section, Usd, alias, secret


class OwnedCost(Section):
    """Amortised cost of owned hardware, per node (see README: 'Owned hardware')."""

    capex_usd: Usd = 300_000.0  # an 8×H100 node
    lifetime_years: float = Field(default=4.0, gt=0, le=50)
    power_kw: float = Field(default=6.0, ge=0, le=10_000)
    usd_per_kwh: float = Field(default=0.12, ge=0, le=100)
    pue: float = Field(default=1.3, ge=1, le=10)  # power usage effectiveness: 1 = every watt reaches the node
    ops_usd_per_year: Usd = 20_000.0
    utilisation: float = Field(default=0.7, gt=0, le=1)  # expected share of hours in use: idle hours are paid too

    def usd_per_node_hour(self) -> float:
        hours = 8766.0
        capex = self.capex_usd / (self.lifetime_years * hours)
        power = self.power_kw * self.pue * self.usd_per_kwh
        ops = self.ops_usd_per_year / hours
        return (capex + ops) / max(self.utilisation, 0.05) + power


class SlurmConfig(MarketSection):
    enabled: bool = False
    url: HttpUrl = alias("LOCKSTEP_SLURM_URL", "http://127.0.0.1:6820")
    user: str = alias("LOCKSTEP_SLURM_USER", "root")
    token: SecretStr | None = secret("token_file", "LOCKSTEP_SLURM_TOKEN", credential=True)
    token_file: str | None = None  # re-read when it changes: a sidecar may rotate it
    api_version: str | None = None  # pin (e.g. "v0.0.40"); default: what the server advertises
    timeout_s: Seconds = 10.0
    partition: str | None = None
    cluster_name: str = "onprem"
    owned: OwnedCost = Field(default_factory=OwnedCost)
    gpus_per_node_default: int = Field(default=8, ge=1, le=1024)
    # slurm.conf for `scontrol` (node drain/resume where the REST version lacks it); default: $SLURM_CONF
    conf_path: str | None = None
    default_time_limit_min: int = Field(default=1440, ge=1, le=525_600)  # jobs whose workload gives no duration
    max_attempts: Attempts = 4  # bounded retries on transient errors
    # The run-time contract on Slurm (docs/slurm.md "At run time"): each attempt's wrapper, manifest, logs and
    # statuses live in <job_dir>/<installation>/<job>/a<attempt>/, a directory the broker and every node share
    # (one host: any local directory). The broker writes the manifest there (mode 0600) and reads logs back.
    job_dir: str = "/tmp/lockstep-slurm"
    # How a job's `image` runs: pyxis (srun --container-image), apptainer (apptainer exec docker://…) or none
    # (commands run on the hosts; a job with an image is rejected at quote time).
    container_runtime: Literal["none", "pyxis", "apptainer"] = "none"
    python: str = "python3"  # the interpreter that runs the wrapper on the nodes (or in a pyxis container)
    # A failed attempt's node-local work folder is kept this many hours for a post-mortem, then removed by the
    # next Lockstep job on that node (0: removed at once); a released or succeeded attempt's, at once.
    keep_failed_workdirs_h: float = Field(default=24.0, ge=0, le=24 * 365)
