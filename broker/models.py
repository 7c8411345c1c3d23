"""Lockstep's domain model, in one place.

Every layer imports this module and nothing here imports the rest of the
project (except the GPU table, another leaf). Models are pydantic v2; the ones
users write (JobSpec) forbid unknown fields so a typo is an error, not a
silently ignored setting.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from broker.gpus import GPU_SPECS, accepted_models


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime | str) -> datetime:
    """A timezone-aware UTC datetime from a datetime (naive means UTC) or an ISO-8601 string ('Z' allowed)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# --------------------------------------------------------------------------- enums


class Market(StrEnum):
    spot = "spot"
    on_demand = "on_demand"
    reserved = "reserved"
    owned = "owned"


class Fabric(StrEnum):
    """Inter-node fabric class of an offer."""

    infiniband = "infiniband"
    efa = "efa"
    roce = "roce"
    ethernet = "ethernet"
    none = "none"


RDMA_FABRICS: frozenset[Fabric] = frozenset({Fabric.infiniband, Fabric.efa, Fabric.roce})

# Higher is better; used to order fabrics and to test "at least".
FABRIC_RANK: dict[Fabric, int] = {
    Fabric.none: 0,
    Fabric.ethernet: 1,
    Fabric.roce: 2,
    Fabric.efa: 3,
    Fabric.infiniband: 4,
}


class FabricNeed(StrEnum):
    """What a job asks of the inter-node fabric."""

    any = "any"  # no requirement (single node jobs, or anything goes)
    ethernet = "ethernet"  # some network: ethernet or better
    rdma = "rdma"  # infiniband, efa or roce
    infiniband = "infiniband"
    efa = "efa"
    roce = "roce"

    def accepts(self, fabric: Fabric) -> bool:
        if self is FabricNeed.any:
            return True
        if self is FabricNeed.ethernet:
            return fabric is not Fabric.none
        if self is FabricNeed.rdma:
            return fabric in RDMA_FABRICS
        return fabric.value == self.value


class IntraNode(StrEnum):
    nvlink = "nvlink"
    pcie = "pcie"


class Colocate(StrEnum):
    """How tightly nodes must sit together, tightest first."""

    node = "node"
    rack = "rack"
    cluster = "cluster"  # placement group / IB island
    zone = "zone"
    region = "region"
    any = "any"


COLOCATE_RANK: dict[Colocate, int] = {c: i for i, c in enumerate(Colocate)}


def colocation_satisfies(offered: Colocate, wanted: Colocate) -> bool:
    """True when an offer's guarantee is at least as tight as the job wants."""
    return COLOCATE_RANK[offered] <= COLOCATE_RANK[wanted]


class JobState(StrEnum):
    pending = "pending"
    placing = "placing"
    provisioning = "provisioning"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    preempted = "preempted"


TERMINAL_STATES: frozenset[JobState] = frozenset({JobState.succeeded, JobState.failed, JobState.cancelled})

ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.pending: frozenset({JobState.placing, JobState.cancelled, JobState.failed}),
    JobState.placing: frozenset(
        {JobState.provisioning, JobState.pending, JobState.failed, JobState.cancelled}
    ),
    JobState.provisioning: frozenset(
        {JobState.running, JobState.failed, JobState.cancelled, JobState.preempted, JobState.pending,
         JobState.succeeded}
    ),
    JobState.running: frozenset(
        {JobState.succeeded, JobState.failed, JobState.cancelled, JobState.preempted}
    ),
    JobState.preempted: frozenset({JobState.pending, JobState.failed, JobState.cancelled}),
    JobState.succeeded: frozenset(),
    JobState.failed: frozenset(),
    JobState.cancelled: frozenset(),
}


class AllocationState(StrEnum):
    intent = "intent"  # written before the provider call
    pending = "pending"  # provider accepted, not running yet (Slurm PENDING, EC2 pending)
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    preempted = "preempted"
    released = "released"
    unknown = "unknown"


# --------------------------------------------------------------------------- offers


class Locality(BaseModel):
    model_config = ConfigDict(frozen=True)

    provider: str
    region: str = ""
    zone: str = ""
    cluster: str = ""  # placement group, IB island, Slurm fabric island
    rack: str = ""
    host: str = ""


class Network(BaseModel):
    model_config = ConfigDict(frozen=True)

    intra: IntraNode = IntraNode.pcie
    fabric: Fabric = Fabric.none
    fabric_gbps: float = 0.0  # inter-node bandwidth per node, Gbit/s
    inet_down_mbps: float | None = None
    inet_up_mbps: float | None = None


class Perf(BaseModel):
    """What is known of an offer's real speed; measured beats prior beats datasheet."""

    model_config = ConfigDict(frozen=True)

    source: str  # "probe", "nccl-tests", "dlperf", ...
    tflops_bf16: float | None = None  # per GPU
    busbw_gbps: float | None = None  # all-reduce bus bandwidth, GB/s
    allreduce_latency_us: float | None = None
    relative: float | None = None  # speed relative to the datasheet, 1.0 = as specified


class OfferSource(StrEnum):
    """Where an offer's figures come from: the market now, or a dated snapshot of it (the catalog)."""

    live = "live"
    snapshot = "snapshot"  # read-only; ``observed_at`` is the snapshot's date


class Offer(BaseModel):
    """One rentable unit: a node type in a place, at a price, in a market."""

    id: str
    provider: str
    market: Market
    sku: str
    gpu: str
    gpu_count: int = Field(ge=0)  # GPUs per node (free GPUs, for a partially used owned node)
    gpu_memory_gb: float = 0.0
    vcpus: int = 0
    ram_gb: float = 0.0
    disk_gb: float = 0.0
    usd_per_hour: float = Field(ge=0)  # per node (whole node), USD
    divisible: bool = False  # a job may take some of the node's GPUs and pay per GPU
    interruptible: bool = False
    max_nodes: int = Field(default=1, ge=1)  # nodes to be had together under `colocation`
    colocation: Colocate = Colocate.node
    locality: Locality
    network: Network = Network()
    reliability: float | None = None
    perf: Perf | None = None
    egress_usd_per_gb: float = 0.0
    queue_wait_hours: float = 0.0  # expected wait before it starts (on-prem queue)
    observed_at: datetime = Field(default_factory=utcnow)
    source: OfferSource = OfferSource.live
    stale: bool = False
    attrs: dict[str, str] = Field(default_factory=dict)  # provider specifics: ask id, partition…

    @property
    def usd_per_gpu_hour(self) -> float:
        return self.usd_per_hour / self.gpu_count if self.gpu_count else self.usd_per_hour

    @property
    def region(self) -> str:
        return self.locality.region

    @property
    def zone(self) -> str:
        return self.locality.zone


# --------------------------------------------------------------------------- job specs

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """'90m', '36h', '7d' → timedelta; ValueError otherwise."""
    m = _DURATION_RE.match(str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90m, 36h, 7d)")
    return timedelta(seconds=float(m.group(1)) * _DURATION_UNITS[m.group(2)])


class DataSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    location: str = Field(
        default="", description="Where the data lives: 'aws:us-east-1', 'onprem', 'vast', '' for nowhere"
    )
    size_gb: float = Field(default=0.0, ge=0)


class Workload(BaseModel):
    """How much work: GPU-hours on a reference GPU, or parameters × tokens (6·P·T FLOPs)."""

    model_config = ConfigDict(extra="forbid")

    reference_gpu_hours: float | None = Field(default=None, gt=0)
    reference_gpu: str = "A100-SXM-80GB"
    params_b: float | None = Field(default=None, gt=0, description="model parameters, billions")
    tokens_b: float | None = Field(default=None, gt=0, description="training tokens, billions")
    hours: float | None = Field(default=None, gt=0, description="wall-clock hours, for services")
    steps: int | None = Field(default=None, gt=0, description="optimizer steps (default: tokens/batch)")
    global_batch_tokens_m: float | None = Field(default=None, gt=0, description="global batch, M tokens")
    grad_bytes_per_param: float = Field(default=2.0, gt=0, description="bytes all-reduced per param")

    @model_validator(mode="after")
    def _one_size(self) -> Workload:
        given = [
            self.reference_gpu_hours is not None,
            self.params_b is not None and self.tokens_b is not None,
            self.hours is not None,
        ]
        if (self.params_b is None) != (self.tokens_b is None) and self.reference_gpu_hours is None:
            raise ValueError("params_b and tokens_b go together")
        if not any(given):
            raise ValueError("give reference_gpu_hours, params_b with tokens_b, or hours")
        if self.reference_gpu not in GPU_SPECS:
            raise ValueError(f"unknown reference GPU {self.reference_gpu!r}")
        return self


class JobSpec(BaseModel):
    """What a user submits (YAML or JSON)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: str
    gpu: list[str] = Field(min_length=1, description="accepted GPU models or families, e.g. [H100, H200]")
    gpus: int = Field(gt=0, le=100_000, description="total GPUs")
    gpus_per_node: int | None = Field(default=None, gt=0, le=16)
    min_gpu_memory_gb: float = Field(default=0.0, ge=0)
    fabric: FabricNeed = FabricNeed.any
    min_fabric_gbps: float = Field(default=0.0, ge=0)
    colocate: Colocate = Colocate.any
    data: DataSpec = Field(default_factory=DataSpec)
    workload: Workload
    markets: list[Market] = Field(default_factory=lambda: list(Market), min_length=1)
    providers: list[str] | None = None
    regions: list[str] | None = None
    max_usd_per_hour: float | None = Field(default=None, gt=0)
    max_total_usd: float | None = Field(default=None, gt=0)
    deadline: datetime | None = None
    deadline_in: str | None = Field(default=None, description="deadline relative to submission, e.g. 48h")
    interruptible: bool = Field(default=False, description="tolerates preemption (checkpoints and resumes)")
    checkpoint_minutes: float = Field(default=30.0, gt=0)
    min_reliability: float = Field(default=0.0, ge=0, le=1)
    onprem_only: bool = False
    cloud_ok: bool = True
    image: str = "nvcr.io/nvidia/pytorch:24.05-py3"
    command: str = ""
    disk_gb: float = Field(default=100.0, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    burn_in: bool = Field(
        default=False,
        description="on Slurm, run the node probe before the command; an unhealthy node is drained and the job "
        "placed elsewhere",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return v

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_list(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("gpu")
    @classmethod
    def _gpu_known(cls, v: list[str]) -> list[str]:
        out: list[str] = []
        for name in v:
            models = accepted_models(name)
            if models is None:
                known = ", ".join(sorted(GPU_SPECS))
                raise ValueError(f"unknown GPU model {name!r} (known: {known}, or a family like A100, H100)")
            out.extend(m for m in models if m not in out)
        return out

    @field_validator("deadline_in")
    @classmethod
    def _deadline_in(cls, v: str | None) -> str | None:
        if v is not None:
            parse_duration(v)
        return v

    @field_validator("deadline")
    @classmethod
    def _deadline_tz(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            v = v.replace(tzinfo=UTC)
        return v

    @model_validator(mode="after")
    def _shape(self) -> JobSpec:
        if self.gpus_per_node is None:
            self.gpus_per_node = self.gpus if self.gpus <= 8 else 8
        if self.gpus % self.gpus_per_node:
            raise ValueError(
                f"gpus ({self.gpus}) must be a multiple of gpus_per_node ({self.gpus_per_node})"
            )
        if self.onprem_only and not self.cloud_ok:
            pass  # consistent: both say "stay on-prem"
        if self.deadline is not None and self.deadline_in is not None:
            raise ValueError("give deadline or deadline_in, not both")
        return self

    @property
    def nodes(self) -> int:
        assert self.gpus_per_node is not None
        return self.gpus // self.gpus_per_node

    def deadline_at(self, submitted: datetime) -> datetime | None:
        if self.deadline is not None:
            return self.deadline
        if self.deadline_in is not None:
            return submitted + parse_duration(self.deadline_in)
        return None

    def fingerprint(self) -> str:
        """Stable hash of the normalised spec (idempotency, dedup)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


# --------------------------------------------------------------------------- quotes


class CostBreakdown(BaseModel):
    compute_hours: float
    comm_hours: float
    queue_wait_hours: float = 0.0
    preemption_overhead_hours: float = 0.0
    egress_usd: float = 0.0
    compute_usd: float = 0.0
    notes: list[str] = Field(default_factory=list)


class QuoteOption(BaseModel):
    """One way to run the job: an offer, how many nodes, what it takes and costs."""

    offer_id: str
    provider: str
    market: Market
    sku: str
    region: str
    zone: str
    cluster: str = ""
    nodes: int
    gpus_per_node: int
    gpu: str
    fabric: Fabric
    fabric_gbps: float
    usd_per_hour: float  # for the whole job (all nodes)
    expected_hours: float
    expected_cost_usd: float
    interruptible: bool = False
    stale: bool = False
    perf_source: str = "datasheet"
    breakdown: CostBreakdown | None = None


class Rejection(BaseModel):
    provider: str
    sku: str
    region: str
    zone: str = ""
    offer_id: str = ""
    code: str  # machine-readable: gpu_model, fabric, colocation, price_cap…
    reason: str


class Quote(BaseModel):
    job: JobSpec
    options: list[QuoteOption]
    rejected: list[Rejection] = Field(default_factory=list)
    rejected_counts: dict[str, int] = Field(default_factory=dict)
    offers_considered: int = 0
    at: datetime = Field(default_factory=utcnow)


# --------------------------------------------------------------------------- jobs


class JobEvent(BaseModel):
    job_id: str
    at: datetime = Field(default_factory=utcnow)
    from_state: JobState | None = None
    to_state: JobState
    reason: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


class Job(BaseModel):
    id: str
    tenant: str = "default"
    spec: JobSpec
    state: JobState = JobState.pending
    reason: str = ""
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    deadline: datetime | None = None
    attempts: int = 0
    preemptions: int = 0
    placement: QuoteOption | None = None
    spent_usd: float = 0.0
    decision: dict[str, Any] = Field(default_factory=dict)  # burst / market decision and its numbers
    events: list[JobEvent] = Field(default_factory=list)


class Allocation(BaseModel):
    """What a provider handed out for one attempt of one job."""

    id: str
    job_id: str
    attempt: int = 0
    provider: str
    offer_id: str = ""
    state: AllocationState = AllocationState.intent
    client_token: str = ""
    resource_ids: list[str] = Field(default_factory=list)  # instance ids, slurm job id, vast contract id
    nodes: int = 1
    region: str = ""
    zone: str = ""
    usd_per_hour: float = 0.0
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    reason: str = ""
    attrs: dict[str, str] = Field(default_factory=dict)


class AllocationStatus(BaseModel):
    """A provider's answer to poll()."""

    state: AllocationState
    reason: str = ""
    hosts: list[str] = Field(default_factory=list)


# --------------------------------------------------------------------------- prices, benchmarks


SeriesKey = tuple[str, str, str, str, str, str]  # (provider, market, sku, region, zone, stat)


class PriceSeriesKey(BaseModel):
    """What a price series is: ``key`` identifies it in the store; ``gpu`` describes its SKU."""

    provider: str
    market: Market
    sku: str
    gpu: str = ""
    region: str = ""
    zone: str = ""
    # For summaries of a marketplace (many offers of one GPU model): the spread.
    stat: str = "price"  # price | min | p10 | median | utilisation

    @property
    def key(self) -> SeriesKey:
        """(provider, market, sku, region, zone, stat)."""
        return (self.provider, self.market.value, self.sku, self.region, self.zone, self.stat)


class PricePoint(PriceSeriesKey):
    usd_per_hour: float
    at: datetime
    count: int | None = None  # offers behind a marketplace summary


class PriceSeries(PriceSeriesKey):
    """One series' stored points in columns (``at[i]``, ``usd_per_hour[i]``, ``count[i]``), oldest first.

    What charts and the API read: a model per point costs more than the query that
    fetched it, and the series' fields would repeat in every point.
    """

    at: list[datetime] = Field(default_factory=list)
    usd_per_hour: list[float] = Field(default_factory=list)
    count: list[int | None] = Field(default_factory=list)

    def points(self) -> list[PricePoint]:
        """The same points as :class:`PricePoint` rows."""
        fields = self.model_dump(include=set(PriceSeriesKey.model_fields))
        return [
            PricePoint(**fields, usd_per_hour=usd, count=n, at=at)
            for at, usd, n in zip(self.at, self.usd_per_hour, self.count, strict=True)
        ]


class Benchmark(BaseModel):
    provider: str
    target: str  # host name or SKU
    gpu: str = ""
    gpu_count: int = 0
    tflops_bf16: float | None = None
    mem_bw_gbps: float | None = None
    h2d_gbps: float | None = None
    busbw_gbps: float | None = None
    allreduce_latency_us: float | None = None
    disk_write_mbps: float | None = None
    disk_read_mbps: float | None = None
    ecc_double_bit: int = 0
    healthy: bool = True
    reason: str = ""
    measured_at: datetime = Field(default_factory=utcnow)
    raw: dict[str, Any] = Field(default_factory=dict)


class Tenant(BaseModel):
    name: str
    monthly_budget_usd: float | None = None
    max_gpus: int | None = None
    created_at: datetime = Field(default_factory=utcnow)


class Role(StrEnum):
    user = "user"
    admin = "admin"


class TokenInfo(BaseModel):
    id: str
    tenant: str
    role: Role = Role.user
    created_at: datetime = Field(default_factory=utcnow)
    revoked: bool = False
    label: str = ""
