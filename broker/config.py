"""All configuration in one typed model.

Sources, later wins: defaults here → a YAML file (``LOCKSTEP_CONFIG`` or
``--config``) → environment variables ``LOCKSTEP_<SECTION>__<FIELD>`` (for
example ``LOCKSTEP_SLURM__URL``) → the short aliases users reach for
(``LOCKSTEP_DB``, ``LOCKSTEP_AWS_ENDPOINT_URL``, ``LOCKSTEP_VAST_URL``,
``LOCKSTEP_VAST_API_KEY``, ``LOCKSTEP_SLURM_URL``, ``LOCKSTEP_SLURM_TOKEN``).
Secrets are ``SecretStr``: they print as ``**********`` in logs and reprs.
``lockstep config show`` prints the effective configuration, secrets masked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from platformdirs import user_data_dir
from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from policies.health import HealthThresholds

_HEALTH = HealthThresholds()


def default_db_url() -> str:
    path = Path(user_data_dir("lockstep", appauthor=False)) / "lockstep.db"
    return f"sqlite:///{path}"


class CatalogConfig(BaseModel):
    enabled: bool = True
    path: str | None = None  # another catalog file; default: the one shipped in the package


class OwnedCost(BaseModel):
    """Amortised cost of owned hardware, per node (see README: 'Owned hardware')."""

    capex_usd: float = 300_000.0  # an 8×H100 node
    lifetime_years: float = 4.0
    power_kw: float = 6.0
    usd_per_kwh: float = 0.12
    pue: float = 1.3
    ops_usd_per_year: float = 20_000.0
    utilisation: float = 0.7  # expected share of hours in use: idle hours are paid too

    def usd_per_node_hour(self) -> float:
        hours = 8766.0
        capex = self.capex_usd / (self.lifetime_years * hours)
        power = self.power_kw * self.pue * self.usd_per_kwh
        ops = self.ops_usd_per_year / hours
        return (capex + ops) / max(self.utilisation, 0.05) + power


class SlurmConfig(BaseModel):
    enabled: bool = False
    url: str = "http://127.0.0.1:6820"
    user: str = "root"
    token: SecretStr | None = None
    token_file: str | None = None  # re-read when it changes: a sidecar may rotate it
    api_version: str | None = None  # pin (e.g. "v0.0.40"); default: what the server advertises
    timeout_s: float = 10.0
    partition: str | None = None
    cluster_name: str = "onprem"
    owned: OwnedCost = Field(default_factory=OwnedCost)
    gpus_per_node_default: int = 8
    # slurm.conf for `scontrol` (node drain/resume where the REST version lacks it); default: $SLURM_CONF
    conf_path: str | None = None
    default_time_limit_min: int = 1440  # jobs whose workload gives no duration
    max_attempts: int = 4  # bounded retries on transient errors


class ReservedPool(BaseModel):
    """Capacity an operator holds (e.g. '8 × p4d.24xlarge in us-east-1a at $X/h under a 1-year plan')."""

    name: str
    provider: str = "aws"
    sku: str
    region: str
    zone: str
    count: int = Field(ge=1)
    usd_per_hour: float = Field(default=0.0, ge=0)  # marginal cost; 0 when paid up front
    capacity_reservation_id: str | None = None


class AwsConfig(BaseModel):
    enabled: bool = False
    regions: list[str] = Field(default_factory=lambda: ["us-east-1", "us-west-2"])
    endpoint_url: str | None = None  # moto in tests, VPC endpoints in production
    profile: str | None = None
    region_timeout_s: float = 20.0
    max_attempts: int = 3
    image_id: str = "ami-12c6146b"  # a Deep Learning AMI id per region in production; moto accepts this one
    subnet_ids: dict[str, str] = Field(default_factory=dict)  # zone → subnet
    security_group_ids: list[str] = Field(default_factory=list)
    key_name: str | None = None
    use_pricing_api: bool = False
    capacity_reservations: bool = True
    reserved_pools: list[ReservedPool] = Field(default_factory=list)
    egress_usd_per_gb: float = 0.09
    max_cluster_nodes: int = Field(default=16, ge=1)  # nodes offered together in one cluster placement group
    placement_groups: bool = True  # multi-node jobs get a cluster placement group (off only for emulators)


class VastConfig(BaseModel):
    enabled: bool = False
    url: str = "https://console.vast.ai"
    api_key: SecretStr | None = None
    timeout_s: float = 15.0
    max_attempts: int = 5
    min_reliability: float = 0.9
    verified_only: bool = True
    egress_usd_per_gb: float = 0.0
    # Retry pacing (tests shorten it); Retry-After from the API is honoured up to retry_after_max_s.
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 20.0
    retry_after_max_s: float = 30.0
    min_inet_down_mbps: float = 0.0  # pushed down to the search; 0 = no floor
    search_limit: int = 256  # offers asked for per search


class BrokerConfig(BaseModel):
    refresh_interval_s: float = 60.0
    provider_timeout_s: float = 30.0
    stale_after_s: float = 600.0
    poll_interval_s: float = 5.0
    place_interval_s: float = 1.0
    max_launch_tries: int = 5
    max_queue_wait_hours: float = 4.0  # burst when on-prem wait exceeds this
    installation: str = "lockstep"


class TrackerConfig(BaseModel):
    interval_s: float = 300.0
    spike_multiple: float = 1.5  # flag when price > multiple × trailing median
    clear_multiple: float = 1.2
    window: int = 12  # points in the trailing median
    retention_days: int = 90
    compact_after_days: int = 7
    webhook_url: SecretStr | None = None  # often carries a token: never printed


class HealthConfig(BaseModel):
    """The health gates' limits; defaults are policies.health.HealthThresholds' (one definition)."""

    min_relative_tflops: float = _HEALTH.min_relative_tflops  # below 70% of datasheet → unhealthy
    max_allreduce_latency_us: dict[str, float] = Field(
        default_factory=lambda: dict(_HEALTH.max_allreduce_latency_us)
    )
    max_ecc_double_bit: int = _HEALTH.max_ecc_double_bit
    # Where burn-in jobs leave their probe JSON for the broker to read: any directory on a single-host
    # cluster, a filesystem shared by the nodes and the broker on a real one. "" = <temp dir>/lockstep-burnin.
    burnin_results_dir: str = ""


class ApiConfig(BaseModel):
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 1_048_576
    rate_per_s: float = 50.0  # per tenant
    burst: int = 100


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LOCKSTEP_", env_nested_delimiter="__", extra="ignore", case_sensitive=False
    )

    db_url: str = Field(default_factory=default_db_url)
    log_level: str = "INFO"
    catalog: CatalogConfig = Field(default_factory=CatalogConfig)
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)
    aws: AwsConfig = Field(default_factory=AwsConfig)
    vast: VastConfig = Field(default_factory=VastConfig)
    broker: BrokerConfig = Field(default_factory=BrokerConfig)
    tracker: TrackerConfig = Field(default_factory=TrackerConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    api: ApiConfig = Field(default_factory=ApiConfig)

    @field_validator("db_url")
    @classmethod
    def _db_url(cls, v: str) -> str:
        """A plain path means an SQLite file."""
        v = v.strip()
        if "://" not in v:
            return f"sqlite:///{os.path.abspath(os.path.expanduser(v))}"
        return v

    def masked(self) -> dict[str, Any]:
        """The effective configuration as JSON-ready data, secrets masked."""
        return self.model_dump(mode="json")


_ALIASES: dict[str, tuple[str, str]] = {
    # env var → (section, field); setting a URL or key also enables the provider
    "LOCKSTEP_DB": ("", "db_url"),
    "LOCKSTEP_AWS_ENDPOINT_URL": ("aws", "endpoint_url"),
    "LOCKSTEP_VAST_URL": ("vast", "url"),
    "LOCKSTEP_VAST_API_KEY": ("vast", "api_key"),
    "LOCKSTEP_SLURM_URL": ("slurm", "url"),
    "LOCKSTEP_SLURM_TOKEN": ("slurm", "token"),
    "LOCKSTEP_SLURM_USER": ("slurm", "user"),
}


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Build the settings from defaults, file, environment and explicit overrides."""
    file_data: dict[str, Any] = {}
    path = config_file or os.environ.get("LOCKSTEP_CONFIG")
    if path:
        with open(path, encoding="utf-8") as fh:
            file_data = yaml.safe_load(fh) or {}
    env_settings = Settings()  # environment (LOCKSTEP_SECTION__FIELD)
    data = _deep_merge(file_data, env_settings.model_dump(exclude_unset=True))
    for var, (section, field) in _ALIASES.items():
        value = os.environ.get(var)
        if not value:
            continue
        if section:
            data.setdefault(section, {})[field] = value
            if section in ("aws", "vast", "slurm"):
                data[section].setdefault("enabled", True)
        else:
            data[field] = value
    data = _deep_merge(data, overrides)
    return Settings.model_validate(data)
