"""The AWS markets' settings (``aws:`` in the configuration; docs/aws.md): EC2 spot and on-demand, and the
capacity an operator holds (the reserved market reads the same section)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from broker.configbase import Attempts, HttpUrl, MarketSection, Seconds, Section, Usd, alias


class ReservedPool(Section):
    """Capacity an operator holds (e.g. '8 × p4d.24xlarge in us-east-1a at $X/h under a 1-year plan')."""

    name: str
    provider: str = "aws"
    sku: str
    region: str
    zone: str
    count: int = Field(ge=1, le=100_000)
    usd_per_hour: Usd = 0.0  # marginal cost; 0 when paid up front
    capacity_reservation_id: str | None = None


DLAMI_PARAMETER = ("resolve:ssm:/aws/service/deeplearning/ami/x86_64/"
                   "base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id")
SSM_PREFIX = "resolve:ssm:"


class AwsConfig(MarketSection):
    enabled: bool = False
    # The regions scanned, or "all": every region the account has enabled (DescribeRegions, opted-in only).
    regions: list[str] | Literal["all"] = Field(default_factory=lambda: ["us-east-1", "us-west-2"])
    endpoint_url: HttpUrl | None = alias("LOCKSTEP_AWS_ENDPOINT_URL", None)  # moto in tests, VPC endpoints
    profile: str | None = None
    region_timeout_s: Seconds = 20.0
    max_attempts: Attempts = 3
    # The machine image: an AMI id (regional: it names one region's image) or "resolve:ssm:<parameter>", read per
    # region at launch (cached image_cache_s). Default: AWS's public Deep Learning AMI parameter (NVIDIA driver,
    # Docker, the NVIDIA container toolkit), which every region has. `images` sets a region's own.
    image_id: str = DLAMI_PARAMETER
    images: dict[str, str] = Field(default_factory=dict)  # region → AMI id or resolve:ssm:<parameter>
    image_cache_s: Seconds = 3600.0
    ssm_endpoint_url: HttpUrl | None = None  # SSM's endpoint (resolve:ssm:); default: endpoint_url, else AWS's own
    # An IAM instance profile (name or ARN) the instances run with: they then fetch their files and write their
    # log and status under the run-time prefix with its role, not through presigned URLs that die with the
    # broker's temporary credentials (docs/aws.md "Run-time reporting"). Unset: presigned URLs, and a launch
    # whose URLs cannot be shown to outlive its max_duration is refused.
    instance_profile: str | None = None
    subnet_ids: dict[str, str] = Field(default_factory=dict)  # zone → subnet
    security_group_ids: list[str] = Field(default_factory=list)
    key_name: str | None = None
    # On-demand prices from the AWS Price List API (GetProducts), cached for pricing_refresh_s; off, or when it
    # cannot be reached, they come from the bundled snapshot and those offers say so (source: snapshot).
    # None (the default): on, unless endpoint_url points EC2 at something else (moto has no Price List API).
    use_pricing_api: bool | None = None
    pricing_region: str = "us-east-1"  # the Price List API answers in us-east-1, eu-central-1 and ap-south-1
    pricing_endpoint_url: HttpUrl | None = None  # a proxy or a test double; default: AWS's own endpoint
    pricing_refresh_s: Seconds = 21_600.0  # list prices change rarely: every 6 h
    pricing_retry_s: Seconds = 300.0  # after a failed fetch, the snapshot until then
    pricing_concurrency: int = Field(default=4, ge=1, le=64)  # regions fetched at once (GetProducts is throttled)
    capacity_reservations: bool = True
    reserved_pools: list[ReservedPool] = Field(default_factory=list)
    egress_usd_per_gb: Usd = 0.09
    max_cluster_nodes: int = Field(default=16, ge=1, le=10_000)  # nodes offered together in one cluster placement group
    placement_groups: bool = True  # multi-node jobs get a cluster placement group (off only for emulators)
    # The run-time contract on EC2 (docs/aws.md "At run time"): the in-job wrapper, its manifest, each node's
    # log and status go through this bucket by presigned URLs. Unset: a job runs as a bare `docker run` with no
    # logs or exit status, and a job that needs env, secrets, files or a data input is refused at launch.
    runtime_bucket: str | None = Field(default=None, min_length=3, max_length=63)
    runtime_prefix: str = Field(default="lockstep", max_length=200)  # key prefix inside the bucket
    runtime_region: str | None = None  # the bucket's region (SigV4 signs for it); default: the first of regions
    s3_endpoint_url: HttpUrl | None = None  # S3's endpoint (moto in tests, a gateway endpoint); default: AWS's own
    # Lifetime of the presigned GETs an instance boots with (wrapper, manifest, peer list, data input).
    runtime_url_ttl_s: float = Field(default=3600.0, gt=0, le=604_800)

    @field_validator("regions", mode="before")
    @classmethod
    def _regions(cls, value: Any) -> Any:
        # `regions: all`, LOCKSTEP_AWS__REGIONS=all or ["all"]: discover them.
        if value == "all" or value == ["all"]:
            return "all"
        if isinstance(value, str):
            raise ValueError('a list of region names, or "all"')
        if isinstance(value, list) and not value:
            raise ValueError('at least one region, or "all"')
        return value

    @model_validator(mode="after")
    def _one_image_per_region(self) -> AwsConfig:
        # An AMI id names one region's image: with it as the image of several regions, every launch but those in
        # its own region would fail (InvalidAMIID.NotFound). Said here, at `config check`, not at launch.
        if not self.enabled or self.image_id.startswith(SSM_PREFIX):
            return self
        if self.regions == "all":
            raise ValueError(f"image_id: {self.image_id} is one region's AMI, and regions is 'all': give "
                             f"image_id as resolve:ssm:<parameter> (default: the Deep Learning AMI's)")
        shared = [r for r in self.regions if r not in self.images]
        if len(shared) > 1:
            raise ValueError(f"images: no image for region {', '.join(shared[1:])}: image_id "
                             f"{self.image_id} is one region's AMI (AMI ids are regional); set aws.images."
                             f"<region> for each, or image_id: resolve:ssm:<parameter>")
        return self

    def image_for(self, region: str) -> str:
        """The configured image of a region: its own (``images``), else ``image_id``."""
        return self.images.get(region) or self.image_id

    @property
    def all_regions(self) -> bool:
        """Regions come from DescribeRegions (``regions: all``)."""
        return self.regions == "all"

    @property
    def home_region(self) -> str:
        """Where account-wide calls go (DescribeRegions) and the bucket's default region."""
        if self.runtime_region:
            return self.runtime_region
        return self.regions[0] if isinstance(self.regions, list) else "us-east-1"

    @property
    def pricing_enabled(self) -> bool:
        return self.use_pricing_api if self.use_pricing_api is not None else self.endpoint_url is None
