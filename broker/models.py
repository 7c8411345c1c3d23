"""Lockstep's domain model, in one place.

Every layer imports this module and nothing here imports the rest of the
project (except the GPU table, another leaf). Models are pydantic v2; the ones
users write (JobSpec) forbid unknown fields so a typo is an error, not a
silently ignored setting.

Models a quote never touches (jobs, allocations, logs, prices, tenants) are ``defer_build=True``:
pydantic builds their validators on first use instead of at import, which `lockstep quote` would
otherwise pay for at every start (docs/benchmarks.md, "Start-up"). Their behaviour is the same.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from broker.gpus import GPU_SPECS, Runtime, normalise_gpu, resolve_request


def utcnow() -> datetime:
    return datetime.now(UTC)


def month_start(now: datetime) -> datetime:
    """The start of ``now``'s calendar month (UTC): where month-to-date spend and budgets begin."""
    now = now.astimezone(UTC)
    return datetime(now.year, now.month, 1, tzinfo=UTC)


def as_utc(value: datetime | str) -> datetime:
    """A timezone-aware UTC datetime from a datetime (naive means UTC) or an ISO-8601 string ('Z' allowed)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def billing_start(created_at: datetime, attrs: Mapping[str, str] | None) -> datetime:
    """When an allocation began to cost: when a poll first saw it running (``attrs["running_since"]``), else
    when it was launched (an attempt that ended before any poll saw it run)."""
    since = (attrs or {}).get("running_since")
    return as_utc(since) if since else as_utc(created_at)


def accrues(state: str, attrs: Mapping[str, str] | None) -> bool:
    """Is a live allocation being billed now? Once its market started it (running, or ``running_since`` set:
    the market's own start where it reports one); a job waiting in a market's queue (Slurm PENDING, EC2
    pending) costs nothing yet."""
    return state in ("running", "draining") or bool((attrs or {}).get("running_since"))


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
# States in which a job holds (or is getting) an allocation.
HOLDING: tuple[JobState, ...] = (JobState.placing, JobState.provisioning, JobState.running)

ALLOWED_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.pending: frozenset({JobState.placing, JobState.cancelled, JobState.failed}),
    JobState.placing: frozenset(
        {JobState.provisioning, JobState.pending, JobState.failed, JobState.cancelled}
    ),
    JobState.provisioning: frozenset(
        {JobState.running, JobState.failed, JobState.cancelled, JobState.preempted, JobState.pending,
         JobState.succeeded}
    ),
    JobState.running: frozenset(  # → pending: moved off on-demand to be placed on spot (a rebalance)
        {JobState.succeeded, JobState.failed, JobState.cancelled, JobState.preempted, JobState.pending}
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
    # Superseded at the market's interruption notice (issue 30): its job was requeued and placed again at once
    # (make before break) while this machine, still billing, lets the command checkpoint until the market's
    # deadline. Not live (the job's one live allocation is its replacement's); followed to its end and booked.
    draining = "draining"


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
    """Where an offer's figures (its price above all) come from, and so what ``observed_at`` means."""

    live = "live"  # the market's latest answer; ``observed_at``: when it answered
    tracked = "tracked"  # an earlier live answer kept while the market fails to answer; ``observed_at``: its time
    snapshot = "snapshot"  # a dated snapshot (the bundled catalog); ``observed_at``: the snapshot's date


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


@functools.lru_cache(maxsize=256)
def _snapshot_label(observed_ts: float) -> str:
    return f"snapshot {datetime.fromtimestamp(observed_ts, UTC):%Y-%m-%d}"


def source_label_at(source: OfferSource, observed_ts: float, age_s: float) -> str:
    """:func:`source_label` from a POSIX time and an age in seconds (what the offer book holds)."""
    if source is OfferSource.snapshot:
        return _snapshot_label(observed_ts)
    if source is OfferSource.live and age_s < 60:
        return "live"
    return f"{source.value} {_age(age_s)}"


def source_label(source: OfferSource, observed_at: datetime, now: datetime) -> str:
    """How tables show where a price comes from: 'live', 'live 3h' (older than a minute), 'tracked 5m',
    'snapshot 2026-11-29'."""
    ts = observed_at.timestamp()
    return source_label_at(source, ts, now.timestamp() - ts)


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
# A relative deadline further out than this is a typo (and 999999999d overflows every date type).
MAX_DURATION = timedelta(days=3660)
# Absolute deadlines outside these years are typos too; inside them, date arithmetic cannot overflow.
DEADLINE_YEARS = (1970, 9000)
DEFAULT_CUDA_IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"
DEFAULT_ROCM_IMAGE = "rocm/pytorch:latest"


def parse_duration(text: str) -> timedelta:
    """'90m', '36h', '7d' → timedelta; ValueError otherwise (also beyond ``MAX_DURATION``)."""
    m = _DURATION_RE.match(str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90m, 36h, 7d)")
    seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    if not seconds <= MAX_DURATION.total_seconds():  # also catches inf from a 400-digit number
        raise ValueError(f"{str(text).strip()[:40]!r} is longer than {MAX_DURATION.days} days")
    return timedelta(seconds=seconds)


class FieldError(ValueError):
    """A validator's error about a named field (a model validator's own errors have no location)."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(reason)


def _clean_text(value: str) -> str:
    """Text every database takes: no NUL (pydantic itself refuses lone surrogates, invalid UTF-8)."""
    if "\x00" in value:
        raise ValueError("NUL characters are not allowed")
    return value


# Spelled out (not made by a function) so a type checker sees them as aliases of str.
Text64 = Annotated[str, Field(max_length=64), AfterValidator(_clean_text)]
Text256 = Annotated[str, Field(max_length=256), AfterValidator(_clean_text)]
Text1k = Annotated[str, Field(max_length=1024), AfterValidator(_clean_text)]

# The run-time parts of a spec (docs/runtime.md): variables, secrets by name, small files.
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_ENV = frozenset({"MASTER_ADDR", "MASTER_PORT"})  # set by the wrapper from the rendezvous
RESERVED_ENV_PREFIX = "LOCKSTEP_"
FILES_MAX_BYTES = 512 * 1024  # a job's files, all together: code and configs, not data (data.uri is for data)
FILES_MAX_COUNT = 1_000
DEFAULT_RDZV_PORT = 29500


def _env_name(value: str) -> str:
    if not _ENV_NAME_RE.match(value):
        raise ValueError(f"{value[:60]!r} is not a variable name (letters, digits and '_', not starting with a digit)")
    if value.startswith(RESERVED_ENV_PREFIX) or value in RESERVED_ENV:
        raise ValueError(f"{value} is set by Lockstep itself (docs/runtime.md)")
    return value


def _file_path(value: str) -> str:
    parts = value.replace("\\", "/").split("/")
    if not value or value.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{value[:80]!r}: a relative path inside the working directory (no '..', no leading '/')")
    return value


EnvName = Annotated[str, Field(max_length=128), AfterValidator(_env_name)]
# _env_name's rule for the document: a variable's name, not one Lockstep sets itself.
ENV_NAME_SCHEMA: dict[str, Any] = {"maxLength": 128, "pattern": _ENV_NAME_RE.pattern,
                   "not": {"anyOf": [{"pattern": f"^{RESERVED_ENV_PREFIX}"}, {"enum": sorted(RESERVED_ENV)}]}}
SecretName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")]
# _file_path's rule as a pattern: '/'-separated parts, none empty, '.' or '..', no '\\' or NUL.
_PART = r"(?:[^/\\\x00.][^/\\\x00]*|\.[^/\\\x00.][^/\\\x00]*|\.\.[^/\\\x00]+)"
FILE_PATH_SCHEMA: dict[str, Any] = {"maxLength": 512, "pattern": f"^{_PART}(?:/{_PART})*$"}
FilePath = Annotated[str, Field(max_length=512), AfterValidator(_clean_text), AfterValidator(_file_path)]


# JSON true/false only: 0, 1 or "yes" for a flag is a mistake the schema says is one (YAML's yes/no are
# already booleans when the file is read).
SpecBool = Annotated[bool, Strict()]


def _kinds(tp: Any) -> set[Any]:
    """The plain types an annotation admits (Annotated and unions unwrapped; containers as their origin)."""
    if tp is None or tp is type(None):
        return {type(None)}
    origin = get_origin(tp)
    if origin is Annotated:
        return _kinds(get_args(tp)[0])
    if origin is Union or origin is UnionType:
        return set().union(*(_kinds(a) for a in get_args(tp)))
    return {origin or tp}


@functools.cache
def _field_kinds(model: type[BaseModel], name: str) -> frozenset[Any]:
    """``_kinds`` of a model field's annotation, worked out once per field (specs are validated often)."""
    return frozenset(_kinds(model.model_fields[name].annotation) - {type(None)})


def _strict_number_field(model: type[BaseModel], name: str) -> bool:
    """Whether :meth:`SpecModel._numbers_are_numbers` can refuse a value of this field: its type is only
    numbers, or a datetime (for any other field it passes every value on)."""
    kinds = _field_kinds(model, name)
    return bool(kinds) and (kinds <= {int, float} or kinds == {datetime})


# The fields _numbers_are_numbers runs on: named rather than "*", because pydantic calls a Python validator
# for every field given (a dozen per spec, a tenth of a new-spec quote's validation) and on the others it
# does nothing. SpecModel.__pydantic_init_subclass__ refuses a model with a field it can refuse that is
# missing here, so a new number field cannot slip past the check.
_NUMBER_FIELDS = (
    "size_gb", "egress_usd_per_gb",  # DataSpec
    "reference_gpu_hours", "params_b", "tokens_b", "hours", "steps", "global_batch_tokens_m",  # Workload
    "grad_bytes_per_param",
    "gpus", "gpus_per_node", "min_gpu_memory_gb", "min_fabric_gbps", "max_usd_per_hour", "max_total_usd",  # JobSpec
    "deadline", "checkpoint_minutes", "min_reliability", "max_cost_usd", "rdzv_port", "disk_gb",
)


class SpecModel(BaseModel):
    """Base of the models users write: unknown fields are errors, numbers are finite, text is clean,
    ``true``/``false`` where the schema says number is an error, not 1 or 0, and so is a number where it
    says date-time (not seconds since 1970). A numeric string still reads as its number: YAML 1.1 reads
    ``1e3`` as a string."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, allow_inf_nan=False)

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        unchecked = sorted(n for n in cls.model_fields if n not in _NUMBER_FIELDS and _strict_number_field(cls, n))
        if unchecked:
            raise TypeError(f"{cls.__name__}: add {', '.join(unchecked)} to _NUMBER_FIELDS (broker/models.py)")

    @field_validator(*_NUMBER_FIELDS, mode="before", check_fields=False)
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool | int | float) and info.field_name is not None:
            kinds = _field_kinds(cls, info.field_name)
            if isinstance(value, bool) and kinds and kinds <= {int, float}:
                raise ValueError(f"a number, not {json.dumps(value)}")
            if kinds == {datetime}:  # not seconds since 1970: a date and time, as the schema says
                raise ValueError(f"a datetime in ISO 8601 (2026-01-31T18:00:00Z), not {json.dumps(value)}")
        return value


class DataSpec(SpecModel):
    location: Text256 = Field(
        default="", description="Where the data lives: 'SITE:REGION' as offers name their site (e.g. "
        "'aws:us-east-1'), 'onprem' for the owned market, '' for nowhere"
    )
    size_gb: float = Field(default=0.0, ge=0, le=1e9)
    uri: Text1k = Field(
        default="", json_schema_extra={"pattern": r"^(?:(?:s3://|https?://|/)[^\x00]*)?$"},  # _uri's rule
        description="the input itself: an s3:// URI (AWS: fetched through a presigned URL when it "
        "is one object), an http(s):// URL (downloaded before the command), or an absolute path on the pool's "
        "shared filesystem; the command finds it in LOCKSTEP_DATA_PATH / LOCKSTEP_DATA_URI",
    )
    egress_usd_per_gb: float | None = Field(
        default=None, ge=0, le=1000,
        description="what moving a GB out of the data's site costs (default: what offers at that site declare)",
    )


    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        if v and not (v.startswith(("s3://", "http://", "https://", "/"))):
            raise ValueError("an s3:// URI, an http(s):// URL or an absolute path")
        return v


class RegistryAuth(SpecModel):
    """Credentials for a private image registry: the password is a secret's name, never its value."""

    server: Text256
    username: Text256
    password_secret: SecretName


def _number(*names: str) -> dict[str, Any]:
    return {"required": list(names), "properties": {n: {"type": "number"} for n in names}}


class Workload(SpecModel):
    """How much work: GPU-hours on a reference GPU, or parameters × tokens (6·P·T FLOPs)."""

    # _one_size's rule, in the document: reference_gpu_hours; or params_b with tokens_b; or hours with
    # neither of those two (one alone is an error).
    model_config = ConfigDict(json_schema_extra={"anyOf": [
        _number("reference_gpu_hours"), _number("params_b", "tokens_b"),
        {**_number("hours"), "properties": {"hours": {"type": "number"}, "params_b": {"type": "null"},
                                            "tokens_b": {"type": "null"}}}]})

    reference_gpu_hours: float | None = Field(default=None, gt=0, le=1e9)
    reference_gpu: Annotated[Text64, WithJsonSchema({"type": "string", "enum": sorted(GPU_SPECS)},
                                                    mode="validation")] = Field(
        default="A100-SXM-80GB", description="a known model's canonical name (aliases are taken too)")
    params_b: float | None = Field(default=None, gt=0, le=1e6, description="model parameters, billions")
    tokens_b: float | None = Field(default=None, gt=0, le=1e9, description="training tokens, billions")
    hours: float | None = Field(default=None, gt=0, le=1e6, description="wall-clock hours, for services")
    steps: int | None = Field(default=None, gt=0, le=10**12,
                              description="optimizer steps (default: tokens/batch)")
    # At least 1,000 tokens: a batch of 5e-324 made steps (and so comm hours) infinite, a quote with nulls.
    global_batch_tokens_m: float | None = Field(default=None, ge=1e-3, le=1e6, description="global batch, M tokens")
    grad_bytes_per_param: float = Field(default=2.0, gt=0, le=64, description="bytes all-reduced per param")

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
        ref = normalise_gpu(self.reference_gpu)
        if ref is None:
            raise FieldError("reference_gpu", f"unknown reference GPU {self.reference_gpu!r}")
        self.reference_gpu = ref
        return self


def _split_gpu_request(items: list[Any]) -> tuple[list[Any], set[int]]:
    """SkyPilot's 'H100:8' shorthand: the names, and the GPU counts the items gave."""
    names: list[Any] = []
    counts: set[int] = set()
    for item in items:
        if isinstance(item, str) and ":" in item:
            name, _, count = item.rpartition(":")
            count = count.strip()
            if not (count.isdecimal() and len(count) <= 7 and 0 < int(count) <= MAX_GPUS):
                raise FieldError("gpu", f"{item[:60]!r}: use MODEL:COUNT with 1 to {MAX_GPUS} GPUs, e.g. H100:8")
            names.append(name.strip())
            counts.add(int(count))
        else:
            names.append(item)
    return names, counts


MAX_GPUS = 100_000
# A page cursor of GET /v1/jobs: the last job's creation time (µs since 1970) and id. Plain text, so that
# every value of the pattern is a cursor the store can use (the API document's pattern is exactly this).
CURSOR_PATTERN = r"^([0-9]{1,17})\.([A-Za-z0-9_-]{1,64})$"
# The document's form of a spec's duration (max_duration, deadline_in): digits bounded per unit so every
# match is at least 1s and within MAX_DURATION. The server takes more (parse_duration's form: 0.5m, 3000d).
SPEC_DURATION_PATTERN = (r"^(?:[1-9][0-9]{0,7}(?:\.[0-9]{1,6})?s|[1-9][0-9]{0,5}(?:\.[0-9]{1,6})?m"
                         r"|[1-9][0-9]{0,3}(?:\.[0-9]{1,6})?h|[1-9][0-9]{0,2}(?:\.[0-9]{1,6})?d"
                         r"|[1-9][0-9]?(?:\.[0-9]{1,6})?w)$")
# What the document says a GPU name is: a subset of what resolve_request takes (known names, or any
# GPU-shaped one: alphanumeric words joined by ' ', '.', '_' or '-', one with a digit, six words at most).
GPU_NAME_PATTERN = r"^(?:[A-Za-z]+[ ._-])?[A-Za-z0-9]*[0-9][A-Za-z0-9]*(?:[ ._-][A-Za-z0-9]+){0,4}$"
GPU_NAME_SCHEMA: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 40, "pattern": GPU_NAME_PATTERN}


class JobSpec(SpecModel):
    """What a user submits (YAML or JSON). _shape's cross-field rules are not in the API document
    (docs/api.md says which and why)."""

    name: str = Field(json_schema_extra={"pattern": _NAME_RE.pattern})  # _name checks it, in its own words
    # What a request may say (a list, one name, "H100:8", null); a stored spec always holds the list.
    gpu: Annotated[list[str], WithJsonSchema({"anyOf": [
        {"type": "array", "items": GPU_NAME_SCHEMA, "maxItems": 64}, GPU_NAME_SCHEMA, {"type": "null"}]},
        mode="validation")] = Field(
        default_factory=list, max_length=64,
        description="accepted GPU models or families, e.g. [H100, H200]; 'H100:8' also sets gpus; "
        "omitted, [] or 'any': any model that meets the other constraints",
    )
    gpus: int = Field(gt=0, le=MAX_GPUS, description="total GPUs")
    gpus_per_node: int | None = Field(default=None, gt=0, le=16)
    min_gpu_memory_gb: float = Field(default=0.0, ge=0, le=10_000)
    fabric: FabricNeed = FabricNeed.any
    min_fabric_gbps: float = Field(default=0.0, ge=0, le=1e6)
    colocate: Colocate = Colocate.any
    data: DataSpec = Field(default_factory=DataSpec)
    workload: Workload | None = Field(
        default=None, description="how much work; omitted: options are ranked by $/h for the shape and their "
        "hours are unknown (a deadline then needs one)")
    markets: list[Market] = Field(default_factory=lambda: list(Market), min_length=1, max_length=16)
    providers: list[Text64] | None = Field(default=None, max_length=64)
    regions: list[Text64] | None = Field(default=None, max_length=256)
    max_usd_per_hour: float | None = Field(default=None, gt=0, le=1e9)
    max_total_usd: float | None = Field(default=None, gt=0, le=1e12)
    # The years _deadline_tz takes, as the document's pattern.
    deadline: datetime | None = Field(default=None,
                                      json_schema_extra={"pattern": r"^(?:19[7-9][0-9]|[2-8][0-9]{3}|9000)-"})
    deadline_in: str | None = Field(default=None, max_length=64, json_schema_extra={"pattern": SPEC_DURATION_PATTERN},
                                    description="deadline relative to submission, e.g. 48h")
    interruptible: SpecBool = Field(default=False, description="tolerates preemption (checkpoints and resumes)")
    checkpoint_minutes: float = Field(default=30.0, gt=0, le=1e6)
    min_reliability: float = Field(default=0.0, ge=0, le=1)
    onprem_only: SpecBool = False
    cloud_ok: SpecBool = True
    runtime: Runtime | None = Field(
        default=None, description="GPU software stack the image needs: cuda (NVIDIA), rocm (AMD) or any; "
        "default: read from the image name, or from the GPU models when no image is given",
    )
    image: Text1k | None = Field(
        default=None, description="container image to run the command in; default: none on a pool that runs "
        "commands on its hosts (Slurm), else the stack's default image (NVIDIA PyTorch, or ROCm PyTorch)",
    )
    command: Annotated[str, Field(max_length=65_536), AfterValidator(_clean_text)] = ""
    # A number or boolean value is taken as its text (_env_text), so the document says so too.
    env: dict[EnvName, Annotated[str, Field(max_length=32_768), AfterValidator(_clean_text), WithJsonSchema(
        {"anyOf": [{"type": "string", "maxLength": 32_768}, {"type": "number"}, {"type": "boolean"}]},
        mode="validation")]] = Field(
        default_factory=dict, json_schema_extra={"propertyNames": ENV_NAME_SCHEMA}, max_length=256,
        description="environment variables for the command")
    secrets: dict[EnvName, SecretName] = Field(
        default_factory=dict, json_schema_extra={"propertyNames": ENV_NAME_SCHEMA}, max_length=64,
        description="variables whose values the broker resolves at launch from its secret sources, by name: "
        "[HF_TOKEN] or {HF_TOKEN: hf-prod}; never stored, never shown")
    files: dict[FilePath, Annotated[str, AfterValidator(_clean_text)]] = Field(
        default_factory=dict, json_schema_extra={"propertyNames": FILE_PATH_SCHEMA},
        description=f"small text files unpacked into the working directory before the "
        f"command (relative path → content; {FILES_MAX_BYTES // 1024} KiB and {FILES_MAX_COUNT} files at most; "
        f"the CLI fills it from `workdir`)")
    registry: RegistryAuth | None = Field(default=None, description="a private registry for the image")
    checkpoint_uri: Text1k | None = Field(
        default=None, description="where every attempt saves and resumes checkpoints (LOCKSTEP_CHECKPOINT_URI); "
        "default: the market's own convention (docs/runtime.md)")
    max_duration: str | None = Field(
        default=None, max_length=64, json_schema_extra={"pattern": SPEC_DURATION_PATTERN},
        description="hard wall-clock cap per attempt, e.g. 12h: the command is "
        "stopped, the job fails with that reason and its machines are released")
    max_cost_usd: float | None = Field(
        default=None, gt=0, le=1e9, allow_inf_nan=False,
        description="a cap on what the job may cost in USD, all attempts together: options dearer than what is "
        "left are not placed, and a running job that reaches it is stopped the way its tenant's "
        "on_budget_exhausted says (docs/runtime.md)")
    rdzv_port: int = Field(default=DEFAULT_RDZV_PORT, ge=1024, le=65535,
                           description="the port of the multi-node rendezvous (LOCKSTEP_RDZV_PORT)")
    disk_gb: float = Field(default=100.0, ge=0, le=1e7)
    labels: dict[Text64, Text256] = Field(default_factory=dict, max_length=64)
    burn_in: SpecBool = Field(
        default=False,
        description="on Slurm, run the node probe before the command; an unhealthy node is drained and the job "
        "placed elsewhere",
    )

    @model_validator(mode="before")
    @classmethod
    def _gpu_shorthand(cls, data: Any) -> Any:
        """``gpu: H100:8`` is ``gpu: [H100], gpus: 8`` (SkyPilot's spelling)."""
        if not isinstance(data, dict):
            return data
        raw = data.get("gpu")
        items = [raw] if isinstance(raw, str) else raw
        if not isinstance(items, list) or not any(isinstance(i, str) and ":" in i for i in items):
            return data
        names, counts = _split_gpu_request(items)
        if len(counts) > 1:
            raise FieldError("gpu", f"the models ask for different GPU counts ({sorted(counts)})")
        count = counts.pop()
        given = data.get("gpus")
        if given is not None and given != count and str(given).strip() != str(count):
            raise FieldError("gpus", f"gpu asks for {count} GPUs, gpus says {given!r}")
        return {**data, "gpu": names, "gpus": count}

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME_RE.match(v):
            raise ValueError("use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return v

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu_list(cls, v: Any) -> Any:
        if v is None:
            return []
        return [v] if isinstance(v, str) else v

    @field_validator("gpu")
    @classmethod
    def _gpu_known(cls, v: list[str]) -> list[str]:
        if any(name.strip().lower() == "any" for name in v):
            return []
        out: list[str] = []
        for name in v:
            models = resolve_request(name.strip())  # ValueError for a name that is not a GPU model's
            out.extend(m for m in models if m not in out)
        return out

    @field_validator("env", mode="before")
    @classmethod
    def _env_text(cls, v: Any) -> Any:
        """YAML's numbers and booleans as the text a shell would see (EPOCHS: 3 → "3", DEBUG: true → "true")."""
        if isinstance(v, dict):
            return {k: (str(x).lower() if isinstance(x, bool) else str(x)) if isinstance(x, int | float) else x
                    for k, x in v.items()}
        return v

    @field_validator("secrets", mode="before")
    @classmethod
    def _secret_list(cls, v: Any) -> Any:
        """``[HF_TOKEN]`` is ``{HF_TOKEN: HF_TOKEN}``: the variable takes the secret's name."""
        if isinstance(v, list):
            return {name: name for name in v if isinstance(name, str)} if all(isinstance(n, str) for n in v) else v
        return v

    @field_validator("files")
    @classmethod
    def _files_size(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > FILES_MAX_COUNT:
            raise ValueError(f"{len(v)} files: at most {FILES_MAX_COUNT} (put larger inputs in data.uri)")
        total = sum(len(k) + len(text.encode("utf-8")) for k, text in v.items())
        if total > FILES_MAX_BYTES:
            raise ValueError(f"{total / 1024:,.0f} KiB of files is over the {FILES_MAX_BYTES // 1024} KiB cap "
                             f"(put larger inputs in data.uri)")
        return v

    @field_validator("max_duration")
    @classmethod
    def _max_duration(cls, v: str | None) -> str | None:
        if v is not None and parse_duration(v).total_seconds() < 1:
            raise ValueError("at least 1s")
        return v

    @field_validator("deadline_in")
    @classmethod
    def _deadline_in(cls, v: str | None) -> str | None:
        if v is not None:
            parse_duration(v)
        return v

    @field_validator("deadline")
    @classmethod
    def _deadline_tz(cls, v: datetime | None) -> datetime | None:
        if v is None:
            return v
        if not DEADLINE_YEARS[0] <= v.year <= DEADLINE_YEARS[1]:
            raise ValueError(f"a deadline between the years {DEADLINE_YEARS[0]} and {DEADLINE_YEARS[1]}")
        return v.replace(tzinfo=UTC) if v.tzinfo is None else v

    @model_validator(mode="after")
    def _shape(self) -> JobSpec:
        if self.gpus_per_node is None:
            self.gpus_per_node = self.gpus if self.gpus <= 8 else 8
        if self.gpus % self.gpus_per_node:
            raise FieldError(
                "gpus_per_node", f"gpus ({self.gpus}) must be a multiple of gpus_per_node ({self.gpus_per_node})"
            )
        if self.deadline is not None and self.deadline_in is not None:
            raise FieldError("deadline", "give deadline or deadline_in, not both")
        if self.workload is None and (self.deadline is not None or self.deadline_in is not None):
            given = "deadline" if self.deadline is not None else "deadline_in"
            raise FieldError("workload", f"needed with {given}: without a workload the finish time is unknown")
        if self.workload is None and self.max_total_usd is not None:
            raise FieldError("workload", "needed with max_total_usd: without a workload the job's cost is unknown")
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise FieldError("secrets", f"{', '.join(both)} also in env: a variable is either plain or a secret")
        self._resolve_runtime()
        return self

    def _resolve_runtime(self) -> None:
        """Which GPU stack the job needs: said, read from the image, or (no image given) from the GPUs."""
        image_given = self.image is not None
        from_image = runtime_of_image(self.image) if self.image is not None else None
        if self.runtime is not None:
            if from_image not in (None, self.runtime) and self.runtime is not Runtime.any:
                raise FieldError("runtime", f"the image {(self.image or '')[:80]!r} is built for {from_image.value}, "
                                            f"not {self.runtime.value}")
        elif image_given:
            self.runtime = from_image or Runtime.any
        else:
            vendors = {GPU_SPECS[m].runtime for m in self.gpu if m in GPU_SPECS}
            self.runtime = Runtime.rocm if vendors == {Runtime.rocm} else Runtime.cuda
        known = [GPU_SPECS[m].runtime for m in self.gpu if m in GPU_SPECS]
        # Every model asked for is known and none runs the job's stack: no offer could ever fit.
        if self.runtime is not Runtime.any and known and len(known) == len(self.gpu) and self.runtime not in known:
            needs = "/".join(sorted({r.value for r in known}))
            raise FieldError("runtime", f"{', '.join(self.gpu[:4])} need(s) {needs}; the job's image is built for "
                                        f"{self.runtime.value} (set image or runtime)")

    @property
    def nodes(self) -> int:
        assert self.gpus_per_node is not None
        return self.gpus // self.gpus_per_node

    def container_image(self) -> str:
        """The image to run the command in where a market always uses one: the spec's, else its stack's default."""
        if self.image is not None:
            return self.image
        return DEFAULT_ROCM_IMAGE if self.runtime is Runtime.rocm else DEFAULT_CUDA_IMAGE

    @property
    def max_duration_s(self) -> float | None:
        return parse_duration(self.max_duration).total_seconds() if self.max_duration else None

    def deadline_at(self, submitted: datetime) -> datetime | None:
        if self.deadline is not None:
            return self.deadline
        if self.deadline_in is not None:
            return submitted + parse_duration(self.deadline_in)
        return None

    def fingerprint(self, dumped: dict[str, Any] | None = None) -> str:
        """Stable hash of the normalised spec (idempotency, dedup). ``dumped``: its ``model_dump(mode="json")``
        when the caller has it already."""
        blob = json.dumps(dumped if dumped is not None else self.model_dump(mode="json"), sort_keys=True,
                          separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def runtime_of_image(image: str) -> Runtime | None:
    """The GPU stack an image name says it is built for, or None when the name does not say."""
    name = image.lower()
    if "rocm" in name:
        return Runtime.rocm
    if any(word in name for word in ("cuda", "nvidia", "nvcr.io", "cudnn")):
        return Runtime.cuda
    return None


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
    expected_hours: float | None = Field(description="wall-clock hours incl. queue wait; null: unknown (the spec "
                                                     "gives no workload)")
    expected_cost_usd: float = Field(description="the job's expected cost; with no workload in the spec, one "
                                                 "hour's (the options are then ranked by $/h)")
    interruptible: bool = False
    stale: bool = False
    perf_source: str = "datasheet"
    source: OfferSource = Field(default=OfferSource.live, description="where the offer's price comes from")
    observed_at: datetime | None = Field(default=None, description="when the price was observed (a snapshot's date)")
    age_s: float | None = Field(default=None, description="seconds from observed_at to the quote")
    source_label: str = Field(default="", description="'live', 'tracked 5m', 'snapshot 2026-11-29'")
    breakdown: CostBreakdown | None = None


class Rejection(BaseModel):
    provider: str
    sku: str
    region: str
    zone: str = ""
    offer_id: str = ""
    code: str  # machine-readable: gpu_model, fabric, colocation, price_cap…
    reason: str


# A quote's note when its spec gives no workload: there is no job length to cost, only the shape's price.
NO_WORKLOAD_NOTE = "no workload: ranked by $/h (expected hours unknown; expected cost is one hour's)"


class Quote(BaseModel):
    job: JobSpec
    options: list[QuoteOption]
    rejected: list[Rejection] = Field(default_factory=list)
    rejected_counts: dict[str, int] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list,
                             description="what the job asks for that no market offers, e.g. 'no market offers B300'")
    offers_considered: int = 0
    late_onprem: QuoteOption | None = Field(
        default=None, description="the cheapest on-prem option the deadline rejected (its queue wait and cost): "
        "what a deadline burst weighs the cloud against")
    feasible_sources: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="feasible offers per market and price source, e.g. "
        '{"aws": {"live": 12, "snapshot": 3}}: a job whose options are all snapshot rows cannot run yet')
    at: datetime = Field(default_factory=utcnow)


class GpuMarketSummary(BaseModel):
    """One GPU model in one market kind: how much is on offer, where, and the $/GPU-hour range."""

    model_config = ConfigDict(defer_build=True)

    market: Market
    offers: int
    gpus: int = Field(description="GPUs across these offers, one node each")
    min_usd_per_gpu_hour: float
    max_usd_per_gpu_hour: float
    providers: list[str]
    regions: list[str]


class GpuSummary(BaseModel):
    """A GPU model as the current book offers it (``lockstep gpus``, ``GET /v1/gpus``)."""

    model_config = ConfigDict(defer_build=True)

    gpu: str
    vendor: str = Field(description="nvidia, amd, or '' for a model outside Lockstep's GPU table")
    memory_gb: float
    offers: int
    gpus: int
    regions: list[str]
    markets: list[GpuMarketSummary]


# --------------------------------------------------------------------------- jobs


class JobEvent(BaseModel):
    model_config = ConfigDict(defer_build=True)

    job_id: str
    at: datetime = Field(default_factory=utcnow)
    from_state: JobState | None = None
    to_state: JobState
    reason: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


# The tenant a job belongs to when no other is named (local mode, a token without one): it has no row until someone
# creates one, but its jobs still spend, so the tenant list shows it.
DEFAULT_TENANT = "default"


class Job(BaseModel):
    model_config = ConfigDict(defer_build=True)

    id: str
    tenant: str = DEFAULT_TENANT
    spec: JobSpec
    state: JobState = JobState.pending
    reason: str = ""
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    deadline: datetime | None = None
    attempts: int = 0
    preemptions: int = 0
    placement: QuoteOption | None = None
    spent_usd: float = Field(default=0.0, description="USD booked for the job's ended allocations: each one's "
                                                      "price × billed time, recorded once when it is released")
    accruing_usd: float = Field(default=0.0, description="USD its live allocation has cost so far (not booked "
                                                         "yet; 0 when it holds none)")
    decision: dict[str, Any] = Field(default_factory=dict)  # burst / market decision and its numbers
    events: list[JobEvent] = Field(default_factory=list)


class Allocation(BaseModel):
    """What a provider handed out for one attempt of one job."""

    model_config = ConfigDict(defer_build=True)

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
    cost_usd: float | None = Field(default=None, description="what it cost, booked when it ended (None until then)")
    billed_s: float | None = Field(default=None, description="the seconds billed, per its market's granularity")
    ended_at: datetime | None = None


class JobDetail(Job):
    """A job with its events (always) and the allocations providers handed out for it: what
    ``GET /v1/jobs/{id}`` answers and ``lockstep status --json`` prints, through a server or locally."""

    model_config = ConfigDict(defer_build=True)

    allocations: list[Allocation] = Field(default_factory=list)


class Billing(BaseModel):
    """How a market bills a machine's time: whole increments of ``increment_s`` seconds (rounded up), and at
    least ``minimum_s`` once it has started. A provider says its own (``Provider.billing``)."""

    model_config = ConfigDict(frozen=True)

    increment_s: float = Field(default=1.0, ge=0)
    minimum_s: float = Field(default=0.0, ge=0)

    def billed_seconds(self, seconds: float) -> float:
        s = max(seconds, 0.0)
        if self.increment_s > 0:
            s = math.ceil(s / self.increment_s - 1e-9) * self.increment_s
        return max(s, self.minimum_s)

    def cost(self, usd_per_hour: float, seconds: float) -> float:
        """USD for ``seconds`` of a machine at ``usd_per_hour``, as the market bills them."""
        return usd_per_hour * self.billed_seconds(seconds) / 3600.0


PER_SECOND = Billing()  # Vast.ai; the default
PER_SECOND_MIN_60 = Billing(increment_s=1.0, minimum_s=60.0)  # EC2 Linux instances, on-demand and spot
HOURLY = Billing(increment_s=3600.0)  # a pool amortised per hour started


class ExitReason(StrEnum):
    """Why a job's command ended, as its in-job wrapper saw it (docs/runtime.md)."""

    exited = "exited"  # the command ended by itself; see the exit code
    max_duration = "max_duration"  # stopped at the spec's max_duration
    signal = "signal"  # stopped by a signal to the job (preemption, cancel)
    error = "error"  # the wrapper could not start the command (the log says why)


class JobExit(BaseModel):
    """How one attempt's command ended: the job's exit code and reason, and its last output lines."""

    model_config = ConfigDict(defer_build=True)

    exit_code: int
    reason: ExitReason = ExitReason.exited
    rank: int = 0  # the node whose status decided it
    last_lines: list[str] = Field(default_factory=list)
    started_at: datetime | None = None  # when the wrapper started the command (its status.json), where it says

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0 and self.reason is ExitReason.exited

    def describe(self) -> str:
        if self.reason is ExitReason.max_duration:
            return f"stopped at its max_duration (exit code {self.exit_code})"
        if self.reason is ExitReason.error:
            return "the command could not be started" + (f": {self.last_lines[-1]}" if self.last_lines else "")
        if self.reason is ExitReason.signal:
            return f"stopped by a signal (exit code {self.exit_code})"
        return f"exit code {self.exit_code}" + (f" on node {self.rank}" if self.rank else "")


class Notice(BaseModel):
    """A market's interruption notice, as a node's in-job wrapper heard and reported it (docs/runtime.md):
    AWS's two-minute ``spot/instance-action``, Slurm's ``--signal`` before preemption or the time limit."""

    model_config = ConfigDict(defer_build=True)

    kind: str = "interruption"
    source: str = ""  # imds | slurm
    action: str = ""  # terminate | stop | hibernate (AWS)
    deadline: datetime | None = None  # when the market takes the machine, where it says
    seen_at: datetime | None = None  # when the wrapper heard it
    rank: int = 0


class AllocationStatus(BaseModel):
    """A provider's answer to poll(). ``exit`` is set once the job's command has ended (succeeded/failed)."""

    model_config = ConfigDict(defer_build=True)

    state: AllocationState
    reason: str = ""
    hosts: list[str] = Field(default_factory=list)
    exit: JobExit | None = None
    # The market's own record of when it began and stopped billing the allocation, where it reports one
    # (Slurm's start_time/end_time): billed time follows the market, not the moment a poll noticed.
    started_at: datetime | None = None
    ended_at: datetime | None = None
    # The market's own price for it where it reports one (Vast's dph_total: the rental plus its disk's storage).
    usd_per_hour: float | None = None


class LogLine(BaseModel):
    """One line a job printed, as its wrapper recorded it."""

    model_config = ConfigDict(defer_build=True)

    at: datetime | None = None
    stream: str = "out"  # out | err | lockstep (the wrapper's own notes)
    text: str
    rank: int = 0


# --------------------------------------------------------------------------- prices, benchmarks


SeriesKey = tuple[str, str, str, str, str, str]  # (provider, market, sku, region, zone, stat)


class PriceSeriesKey(BaseModel):
    """What a price series is: ``key`` identifies it in the store; ``gpu`` describes its SKU."""

    model_config = ConfigDict(defer_build=True)

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


_NUMBER_RE = re.compile(r"^\s*[+-]?\d+(\.\d*)?\s*$")


def _iso_only(value: Any) -> Any:
    """pydantic reads '1700000000' as a Unix time; times here are ISO 8601 (or datetimes), so say so."""
    if isinstance(value, str) and _NUMBER_RE.match(value):
        raise ValueError("use an ISO 8601 date-time, e.g. 2025-01-31T00:00:00Z")
    return value


IsoDateTime = Annotated[datetime, BeforeValidator(_iso_only)]


class PriceFilter(BaseModel):
    """Which stored price points to read: the store, the service, ``GET /v1/prices/…`` and
    ``lockstep prices`` all take this one model. Each field given narrows the match; ``gpu`` matches
    a canonical model, a family ("H100") or a prefix; ``since`` is inclusive, ``until`` exclusive;
    ``limit`` keeps the newest points."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    gpu: str | None = Field(default=None, max_length=64)
    sku: str | None = Field(default=None, max_length=128)
    provider: str | None = Field(default=None, max_length=64)
    market: Market | None = None
    zone: str | None = Field(default=None, max_length=64)
    region: str | None = Field(default=None, max_length=64)
    stat: str | None = Field(default=None, max_length=16)
    since: IsoDateTime | None = None
    until: IsoDateTime | None = None
    limit: int | None = Field(default=None, ge=1, le=100_000, description="the newest points at most")


class Benchmark(BaseModel):
    model_config = ConfigDict(defer_build=True)

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


class BudgetAction(StrEnum):
    """What happens to a tenant's running jobs once its monthly budget is spent (or a job's max_cost_usd)."""

    stop = "stop"  # released at once, the job failed with the reason
    signal_then_stop = "signal_then_stop"  # SIGTERM where its market can signal, a checkpoint window, then stop
    continue_ = "continue"  # alerts only: running jobs run on (no new placement either way)


class Tenant(BaseModel):
    model_config = ConfigDict(defer_build=True)

    name: str
    monthly_budget_usd: float | None = None
    max_gpus: int | None = None
    on_budget_exhausted: BudgetAction = BudgetAction.signal_then_stop
    created_at: datetime = Field(default_factory=utcnow)
    month_to_date_usd: float = Field(default=0.0, description="USD spent this calendar month (UTC): ended "
                                                              "allocations' booked costs plus what live ones "
                                                              "have accrued; the figure the budget check uses")


class Role(StrEnum):
    """What a bearer token may do (the API's table of routes and roles: docs/api.md)."""

    user = "user"  # its tenant's jobs; quotes, offers, prices, providers
    admin = "admin"  # everything
    metrics = "metrics"  # GET /metrics only: what a Prometheus scraper holds


class TokenInfo(BaseModel):
    model_config = ConfigDict(defer_build=True)

    id: str
    tenant: str
    role: Role = Role.user
    created_at: datetime = Field(default_factory=utcnow)
    revoked: bool = False
    label: str = ""

    @property
    def scope(self) -> str | None:
        """The tenant whose jobs and events this caller may see: its own, or None (every tenant) for an admin.
        The one rule the API, the event stream and the dashboard apply."""
        return None if self.role is Role.admin else self.tenant


# --------------------------------------------------------------------------- tenants and tokens: what may be asked

NAME_PATTERN = _NAME_RE.pattern  # tenant names follow the job-name rule
def _no_bool_or_text(value: Any) -> Any:
    """JSON Schema's integer is any number without a fraction (5.0 too); true/false and "5" are not numbers."""
    if isinstance(value, bool | str):
        raise ValueError("an integer")
    return value


# JSON true/false are not numbers: strict, so a boolean budget is refused, as the API's schema says.
MonthlyBudgetUsd = Annotated[float, Strict(), Field(ge=0, le=1e12)]
GpuCap = Annotated[int, Field(ge=0, le=1_000_000), BeforeValidator(_no_bool_or_text)]


class TenantCreate(BaseModel):
    """A new tenant with its caps (``POST /v1/tenants``, ``lockstep tenants create``)."""

    model_config = ConfigDict(defer_build=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(pattern=NAME_PATTERN)
    monthly_budget_usd: MonthlyBudgetUsd | None = None
    max_gpus: GpuCap | None = None
    on_budget_exhausted: BudgetAction = BudgetAction.signal_then_stop


class TenantPatch(BaseModel):
    """Caps to change (``PATCH /v1/tenants/{name}``, ``lockstep tenants set-budget``): only the fields
    given are set; null clears a cap."""

    model_config = ConfigDict(defer_build=True, extra="forbid", allow_inf_nan=False)

    monthly_budget_usd: MonthlyBudgetUsd | None = None
    max_gpus: GpuCap | None = None
    on_budget_exhausted: BudgetAction | None = None


class TokenCreate(BaseModel):
    """A new API token for a tenant (``POST /v1/tokens``, ``lockstep tokens create``)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    tenant: str = Field(pattern=NAME_PATTERN)
    role: Role = Role.user
    label: str = Field(default="", max_length=256)


# --------------------------------------------------------------------------- events and webhooks (issue 26)

EVENT_KIND_PATTERN = r"^[a-z*][a-z0-9_.*]{0,63}$"


class StreamEvent(BaseModel):
    """One line of ``GET /v1/events``: a job's state change (kind ``job.<new state>``), an event another part
    recorded in a job's history with its own ``data.kind`` (a budget alert: ``budget.alert``), or a market's
    price spike (``price.spike``, every tenant's). ``cursor`` is where to resume after this event."""

    model_config = ConfigDict(defer_build=True)

    cursor: str
    kind: str
    at: datetime
    tenant: str | None = Field(default=None, description="the job's tenant; null for a market-wide event")
    job_id: str | None = None
    from_state: JobState | None = None
    to_state: JobState | None = None
    reason: str = ""
    data: dict[str, Any] = Field(default_factory=dict)


class WebhookCreate(BaseModel):
    """A webhook to register (``POST /v1/webhooks``): where to POST, which event kinds (``*`` wildcards:
    ``job.*``, ``budget.*``), and the secret each delivery is signed with (never shown again)."""

    model_config = ConfigDict(defer_build=True, extra="forbid")

    # The document's pattern is narrower than the server's: a host (no user:password@, no [IPv6]) and a port
    # in range, so every match is one check_url takes (with webhook_allow_private; a public-only broker also
    # resolves the host, docs/api.md); the server's own words name what else is wrong.
    url: str = Field(min_length=8, max_length=2048, pattern=r"^https?://[^\s]+$", json_schema_extra={
        "pattern": r"^https?://[A-Za-z0-9._~%!$&'()*+,;=-]+(?::(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}"
                   r"|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?(?:[/?#][^\s]*)?$"})
    kinds: list[Annotated[str, Field(pattern=EVENT_KIND_PATTERN)]] = Field(default_factory=lambda: ["*"],
                                                                           min_length=1, max_length=32)
    secret: str = Field(min_length=16, max_length=256, pattern=r"^[\x21-\x7e]+$")
    tenant: str | None = Field(default=None, pattern=NAME_PATTERN,
                               description="admins only: the tenant it is for (default: the caller's)")


class Webhook(BaseModel):
    model_config = ConfigDict(defer_build=True)

    id: str
    tenant: str
    url: str
    kinds: list[str]
    created_at: datetime = Field(default_factory=utcnow)


class DeliveryState(StrEnum):
    pending = "pending"  # waiting for its (next) attempt
    delivered = "delivered"  # the receiver answered 2xx
    failed = "failed"  # gave up after the last attempt (webhooks.max_attempts)


class WebhookDelivery(BaseModel):
    """One event for one webhook, kept in the store's outbox from the moment it is due to when it is done."""

    model_config = ConfigDict(defer_build=True)

    id: str
    webhook_id: str
    tenant: str
    cursor: str
    kind: str
    state: DeliveryState = DeliveryState.pending
    attempts: int = 0
    next_attempt_at: datetime | None = None
    last_status: int | None = None
    last_error: str = ""
    created_at: datetime = Field(default_factory=utcnow)
    delivered_at: datetime | None = None


# --------------------------------------------------------------------------- providers' health and price spikes
# Defined here (not in broker.market / policies.spikes, which use them) so the shells that show them import
# only the models (tests/test_architecture.py).


class CircuitState(StrEnum):
    closed = "closed"  # calls go through
    open = "open"  # no calls until ``next_probe_at``
    half_open = "half_open"  # one probe call is allowed (or in flight); its outcome closes or reopens
    auth_failed = "auth_failed"  # credentials refused: no calls until the provider's configuration changes


class CircuitInfo(BaseModel):
    """A provider's circuit as ``GET /v1/providers`` shows it."""

    state: CircuitState = CircuitState.closed
    failures: int = Field(default=0, description="consecutive failed calls (refresh, launch, poll)")
    opened: int = Field(default=0, description="times opened in a row; the backoff doubles with each")
    since: datetime | None = Field(default=None, description="when it entered this state")
    next_probe_at: datetime | None = Field(default=None, description="when an open circuit lets one probe call through")
    reason: str = Field(default="", description="the last failure")


class ProviderHealth(BaseModel):
    # A provider as the market last saw it (GET /v1/providers); no docstring, which would change the OpenAPI text.
    name: str
    ok: bool = False
    offers: int = 0
    last_ok: datetime | None = None
    last_attempt: datetime | None = None
    last_error: str = ""
    latency_s: float | None = None
    stale: bool = True
    age_s: float | None = None
    circuit: CircuitInfo = Field(default_factory=CircuitInfo)
    notes: list[str] = Field(default_factory=list,
                             description="what is degraded though it answered, e.g. prices from a snapshot, and why")


@dataclass(frozen=True, slots=True)
class Spike:
    """A price spike in one series (the rule: policies.spikes)."""

    start: datetime
    end: datetime | None  # None: still open at the end of the series
    peak: float
    baseline: float

    @property
    def ratio(self) -> float:
        return self.peak / self.baseline if self.baseline > 0 else math.inf
