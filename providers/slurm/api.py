"""Everything that differs between slurmrestd versions, in one place.

slurmrestd changed its JSON between releases: Slurm 22.05 speaks OpenAPI
v0.0.38 (plain numbers, node state as one lower-case string plus
``state_flags``, job state as one string, ``gres`` in submit requests,
environment as a dict); Slurm 23.11 / 24.05 speak v0.0.40 / v0.0.41 (numbers
wrapped as ``{"set", "infinite", "number"}``, states as lists of upper-case
flags, features as lists, ``tres_per_node`` in submit requests, environment as
a list of ``NAME=value``). The adapter (providers/slurm/) only sees the flat
shapes below and calls the request builders here; nothing else in the project
knows a version exists.

Parsers are tolerant on purpose: they accept either shape whatever version was
negotiated, because real servers mix (a v0.0.40 plugin on a 24.05 daemon).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

# Newest first: the adapter takes the first one the server offers.
SUPPORTED_VERSIONS: tuple[str, ...] = ("v0.0.41", "v0.0.40", "v0.0.39", "v0.0.38")

# Job states after which a job holds nothing any more.
FINISHED_JOB_STATES: frozenset[str] = frozenset(
    {
        "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
        "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT",
    }
)

# Node base states and flags under which a node must not be offered.
UNHEALTHY_NODE_STATES: frozenset[str] = frozenset(
    {
        "DOWN", "DRAIN", "DRAINED", "DRAINING", "NOT_RESPONDING", "FAIL", "FAILING", "INVALID",
        "INVALID_REG", "FUTURE", "UNKNOWN", "POWERED_DOWN", "POWER_DOWN", "POWERING_DOWN",
        "POWERING_UP", "MAINTENANCE", "REBOOT_ISSUED", "REBOOT_REQUESTED", "NO_RESPOND",
    }
)

# Slurm error numbers (slurm_errno.h) the adapter maps to Lockstep errors.
ESLURM_INVALID_JOB_ID = 2017
CAPACITY_ERRNOS: frozenset[int] = frozenset(
    {
        2014,  # ESLURM_REQUESTED_NODE_CONFIG_UNAVAILABLE
        2015,  # ESLURM_REQUESTED_PART_CONFIG_UNAVAILABLE
        2016,  # ESLURM_NODES_BUSY
        2052,  # ESLURM_INVALID_GRES / too many GRES on some versions
    }
)
TRANSIENT_ERRNOS: frozenset[int] = frozenset(
    {
        1001, 1002, 1003, 1004,  # SLURMCTLD communication errors, shutdown in progress
        1007,  # SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT (older numbering)
        2051,  # ESLURM_IN_STANDBY_MODE
        5004, 5005,  # socket timeouts
    }
)
AUTH_ERRNOS: frozenset[int] = frozenset(
    {
        1800, 1801,  # ESLURM_AUTH_CRED_INVALID…
        2002,  # ESLURM_ACCESS_DENIED
        2010,  # ESLURM_USER_ID_MISSING
    }
)

# Assumed run time of a job with no time limit, for the queue estimate only.
UNLIMITED_JOB_HOURS = 24.0


# --------------------------------------------------------------------------- paths


_PATHS: dict[str, str] = {
    "ping": "ping",
    "diag": "diag",
    "nodes": "nodes",
    "node": "node/{name}",
    "partitions": "partitions",
    "jobs": "jobs",
    "job": "job/{job_id}",
    "submit": "job/submit",
}


def path(version: str, what: str, **params: str | int) -> str:
    """The request path of an endpoint in a version, e.g. ``/slurm/v0.0.38/job/12``."""
    return f"/slurm/{version}/" + _PATHS[what].format(**params)


OPENAPI_PATHS: tuple[str, ...] = ("/openapi/v3", "/openapi")


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.lstrip("v").split("."))


def pick_version(openapi_doc: dict[str, Any]) -> str | None:
    """The newest supported version among the ``/slurm/vX/...`` paths an OpenAPI document lists."""
    offered = set()
    for p in (openapi_doc.get("paths") or {}):
        m = re.match(r"^/slurm/(v\d+\.\d+\.\d+)/", p)
        if m:
            offered.add(m.group(1))
    for v in SUPPORTED_VERSIONS:
        if v in offered:
            return v
    return None


def has_node_update(version: str) -> bool:
    """v0.0.38 has no POST /node/{name}; v0.0.39 and later do."""
    return version_key(version) >= (0, 0, 39)


# --------------------------------------------------------------------------- small parsers


def number(value: Any) -> float | None:
    """A plain number or a v0.0.40+ ``{"set","infinite","number"}``; None when unset, inf when infinite."""
    if isinstance(value, dict):
        if value.get("infinite"):
            return math.inf
        if not value.get("set", True):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        # v0.0.38 spells "unset"/"infinite" as NO_VAL / INFINITE sentinels.
        if value in (0xFFFFFFFE, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFE, 0xFFFFFFFFFFFFFFFF):
            return math.inf if value in (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF) else None
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def states(value: Any, flags: Any = None) -> frozenset[str]:
    """Upper-case state names from ``"idle"`` + ``["DRAIN"]`` (v0.0.38) or ``["IDLE","DRAIN"]`` (newer)."""
    out: set[str] = set()
    for v in (value, flags):
        if isinstance(v, str):
            out.update(s for s in re.split(r"[+,\s]+", v.upper()) if s)
        elif isinstance(v, list):
            out.update(str(s).upper() for s in v if s)
    return frozenset(out)


def csv_list(value: Any) -> list[str]:
    """``"a,b"`` (v0.0.38) or ``["a","b"]`` (newer) → ``["a","b"]``."""
    if isinstance(value, list):
        return [str(v) for v in value if v]
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return []


def expand_hostlist(text: str | None) -> list[str]:
    """``"gpu-node[1-3,5],login1"`` → names; keeps zero padding (``n[0111-0112]``)."""
    if not text or text in ("(null)", "None"):
        return []
    parts: list[str] = []
    depth = 0
    cur = ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out: list[str] = []
    for part in (p.strip() for p in parts):
        m = re.match(r"^(.*?)\[([^\]]+)\](.*)$", part)
        if not m:
            if part:
                out.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for rng in ranges.split(","):
            if "-" in rng:
                lo, hi = rng.split("-", 1)
                width = len(lo)
                out.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
            else:
                out.append(f"{prefix}{rng}{suffix}")
    return out


_GRES_ITEM = re.compile(r"^gpu(?::([^:(]+))?:(\d+)")


def parse_gres(text: str | None) -> dict[str, int]:
    """GPU counts by type from ``gpu:h100:8(S:0-1),gpu:a100:2`` or ``gpu:h100:3(IDX:0-2)``; type '' if none."""
    out: dict[str, int] = {}
    if not text or text in ("N/A", "(null)"):
        return out
    depth = 0
    cur = ""
    items = []
    for ch in text:  # split on commas outside parentheses
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    for item in items:
        m = _GRES_ITEM.match(item.strip().removeprefix("gres/").removeprefix("gres:"))
        if m:
            out[m.group(1) or ""] = out.get(m.group(1) or "", 0) + int(m.group(2))
    return out


_TRES_GPU = re.compile(r"gpu(?::([A-Za-z0-9_.\-]+?))?[:=](\d+)(?=\D|$)")


def parse_tres_gpus(text: str | None) -> tuple[str, int]:
    """(type, count) from a job's ``tres_per_node``: ``gres:gpu:h100:4`` (22.05) or ``gres/gpu:h100=4`` (23.11+)."""
    if not text:
        return "", 0
    m = _TRES_GPU.search(text)
    if not m:
        return "", 0
    return m.group(1) or "", int(m.group(2))


# --------------------------------------------------------------------------- flat shapes


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: frozenset[str]
    gpu_type: str  # Slurm's GRES type, e.g. "h100" or "nvidia_h100_80gb_hbm3"; "" if untyped
    gpus_total: int
    gpus_used: int
    features: tuple[str, ...]
    partitions: tuple[str, ...]
    cpus: int = 0
    memory_mb: float = 0.0
    reason: str = ""

    @property
    def healthy(self) -> bool:
        return not (self.state & UNHEALTHY_NODE_STATES)

    @property
    def gpus_free(self) -> int:
        return max(self.gpus_total - self.gpus_used, 0)


@dataclass(frozen=True)
class JobInfo:
    job_id: int
    name: str
    state: str  # base state, upper case: PENDING, RUNNING, COMPLETED…
    flags: frozenset[str]
    reason: str
    comment: str
    partition: str
    nodes: tuple[str, ...]
    node_count: int
    gpu_type: str
    gpus_per_node: int
    constraints: str
    time_limit_min: float | None  # None: no limit
    submit_time: float | None
    start_time: float | None
    end_time: float | None
    priority: float = 0.0
    exit_code: int | None = None
    restart_count: int = 0  # times Slurm requeued it (a node failure, a preemption with requeue)

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_JOB_STATES


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    nodes: tuple[str, ...]
    default: bool
    state: str


@dataclass
class SubmitRequest:
    """What the adapter wants to run, independent of the version's JSON."""

    name: str
    script: str
    nodes: int
    gpus_per_node: int
    gpu_type: str
    time_limit_min: int
    comment: str
    partition: str | None = None
    constraints: str | None = None
    cwd: str = "/tmp"
    stdout: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    node: str | None = None  # pin the job to this node (burn-in measures one node)
    # sbatch's --signal=<warn_signal>@<warn_s>: Slurm signals the job's steps that long before its end
    warn_signal: str = ""  # a name without SIG ("USR1"); "" for none
    warn_s: int = 0


# --------------------------------------------------------------------------- response parsers


def parse_node(raw: dict[str, Any]) -> NodeInfo:
    total = parse_gres(raw.get("gres"))
    used = parse_gres(raw.get("gres_used"))
    gpu_type = next((t for t in total if t), "")
    # Used counts come per type; an untyped "gpu:0" belongs to whatever type the node has.
    gpus_used = sum(used.values())
    return NodeInfo(
        name=str(raw.get("name", "")),
        state=states(raw.get("state"), raw.get("state_flags")),
        gpu_type=gpu_type,
        gpus_total=sum(total.values()),
        gpus_used=gpus_used,
        features=tuple(csv_list(raw.get("active_features") or raw.get("features"))),
        partitions=tuple(csv_list(raw.get("partitions"))),
        cpus=int(number(raw.get("cpus")) or 0),
        memory_mb=number(raw.get("real_memory")) or 0.0,
        reason=str(raw.get("reason") or ""),
    )


def parse_nodes(body: dict[str, Any]) -> list[NodeInfo]:
    return [parse_node(n) for n in body.get("nodes") or []]


def parse_job(raw: dict[str, Any]) -> JobInfo:
    st = states(raw.get("job_state"))
    # Newer versions give the base state first and flags after (["PENDING","REQUEUED"]).
    raw_state = raw.get("job_state")
    if isinstance(raw_state, list) and raw_state:
        base = str(raw_state[0]).upper()
    elif isinstance(raw_state, str):
        base = raw_state.upper()
    else:
        base = "UNKNOWN"
    gpu_type, gpus = parse_tres_gpus(raw.get("tres_per_node") or raw.get("gres") or "")
    limit = number(raw.get("time_limit"))
    exit_raw = raw.get("exit_code")
    if isinstance(exit_raw, dict):  # v0.0.40+: {"status": [...], "return_code": {...}}
        exit_code_f = number(exit_raw.get("return_code"))
    else:
        exit_code_f = number(exit_raw)
    return JobInfo(
        job_id=int(number(raw.get("job_id")) or 0),
        name=str(raw.get("name") or ""),
        state=base,
        flags=st - {base},
        reason=str(raw.get("state_reason") or ""),
        comment=str(raw.get("comment") or ""),
        partition=str(raw.get("partition") or ""),
        nodes=tuple(expand_hostlist(raw.get("nodes"))),
        node_count=int(number(raw.get("node_count")) or 1),
        gpu_type=gpu_type,
        gpus_per_node=gpus,
        constraints=str(raw.get("features") or ""),
        time_limit_min=None if limit is None or math.isinf(limit) else limit,
        submit_time=number(raw.get("submit_time")),
        start_time=number(raw.get("start_time")),
        end_time=number(raw.get("end_time")),
        priority=number(raw.get("priority")) or 0.0,
        exit_code=None if exit_code_f is None or math.isinf(exit_code_f) else int(exit_code_f),
        restart_count=int(number(raw.get("restart_cnt")) or 0),
    )


def parse_jobs(body: dict[str, Any]) -> list[JobInfo]:
    return [parse_job(j) for j in body.get("jobs") or []]


def parse_partition(raw: dict[str, Any]) -> PartitionInfo:
    nodes_field = raw.get("nodes")
    if isinstance(nodes_field, dict):  # v0.0.40+: {"configured": "n[1-3]", "total": 3, ...}
        hostlist = nodes_field.get("configured") or ""
    else:
        hostlist = nodes_field or ""
    flags = {f.lower() for f in csv_list(raw.get("flags"))}
    part_state = raw.get("state")
    if part_state is None and isinstance(raw.get("partition"), dict):
        part_state = raw["partition"].get("state")
    default = "default" in flags
    if isinstance(raw.get("partition"), dict):  # v0.0.40+ may keep the default flag under defaults
        default = default or "DEFAULT" in states(raw["partition"].get("state"))
    return PartitionInfo(
        name=str(raw.get("name", "")),
        nodes=tuple(expand_hostlist(hostlist)),
        default=default,
        state=",".join(sorted(states(part_state))) or "UP",
    )


def parse_partitions(body: dict[str, Any]) -> list[PartitionInfo]:
    return [parse_partition(p) for p in body.get("partitions") or []]


def parse_submit(body: dict[str, Any]) -> int | None:
    """The new job id of a submit response (top level in v0.0.38–40, under ``result`` in v0.0.41+)."""
    job_id = body.get("job_id")
    if job_id is None and isinstance(body.get("result"), dict):
        job_id = body["result"].get("job_id")
    n = number(job_id)
    return int(n) if n else None


# Fields of a submit that Lockstep relies on (GPUs, nodes, time limit, features): slurmrestd v0.0.39+ ignores
# an unknown or mistyped field with a warning and submits anyway, so a warning naming one of these means the
# job would run without its GPUs, on other nodes or with another limit.
RELIED_FIELDS = ("tres_per_node", "tres_per_job", "tres_per_task", "gres", "gpus", "gpus_per_node",
                 "minimum_nodes", "maximum_nodes", "nodes", "required_nodes", "time_limit", "constraints",
                 "features")
_RELIED = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(RELIED_FIELDS) + r")(?![A-Za-z0-9_])", re.IGNORECASE)


def parse_warnings(body: Any) -> list[str]:
    """The texts of an answer's ``warnings`` (``description``, with ``source`` where it says where)."""
    out: list[str] = []
    if not isinstance(body, dict):
        return out
    for w in body.get("warnings") or []:
        if isinstance(w, dict):
            text = str(w.get("description") or w.get("warning") or "").strip()
            source = str(w.get("source") or "").strip()
            if text or source:
                out.append(f"{text} ({source})" if text and source else text or source)
        elif isinstance(w, str) and w.strip():
            out.append(w.strip())
    return out


def relied_warnings(warnings: list[str]) -> list[str]:
    """The warnings about a field Lockstep relies on (:data:`RELIED_FIELDS`)."""
    return [w for w in warnings if _RELIED.search(w)]


def parse_errors(body: Any) -> list[tuple[int | None, str]]:
    """(Slurm errno, text) pairs from ``errors``; v0.0.38 says ``error_code`` or ``error_number``."""
    out: list[tuple[int | None, str]] = []
    if not isinstance(body, dict):
        return out
    for e in body.get("errors") or []:
        if not isinstance(e, dict):
            continue
        code = e.get("error_number", e.get("error_code"))
        try:
            num = int(code) if code is not None else None
        except (TypeError, ValueError):
            num = None
        text = str(e.get("error") or e.get("description") or "")
        # The v0.0.38 parser reports "Unknown key" as a description-only entry; keep it for the message.
        out.append((num if num else None, text))
    return out


# --------------------------------------------------------------------------- request builders


def submit_body(version: str, req: SubmitRequest) -> dict[str, Any]:
    """The JSON body of POST job/submit for a version."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **req.environment}
    gres_type = f"{req.gpu_type}:" if req.gpu_type else ""
    job: dict[str, Any] = {
        "name": req.name,
        "comment": req.comment,
        "current_working_directory": req.cwd,
    }
    if req.partition:
        job["partition"] = req.partition
    if req.constraints:
        job["constraints"] = req.constraints
    if req.stdout:
        job["standard_output"] = req.stdout
    if version_key(version) <= (0, 0, 38):
        job.update(
            {
                "gres": f"gpu:{gres_type}{req.gpus_per_node}",  # tres_per_node is an unknown key here
                # A count string means min = max here; the [min, max] array the spec shows is read as min only.
                "nodes": str(req.nodes),
                "time_limit": int(req.time_limit_min),
                "environment": env,
            }
        )
        if req.node:
            job["nodelist"] = req.node  # parsed by 22.05 though its schema omits it
        if req.warn_signal:
            job["signal"] = f"{req.warn_signal}@{req.warn_s}"  # the schema's (B:|)sig_num(@sig_time|)
        if req.gpus_per_node <= 0:  # no GPUs: no GRES request at all ("gpu:0" is refused)
            del job["gres"]
        return {"script": req.script, "job": job}
    if req.node:
        job["required_nodes"] = [req.node]
    job.update(
        {
            "tres_per_node": f"gres/gpu:{gres_type}{req.gpus_per_node}",
            "minimum_nodes": req.nodes,
            "maximum_nodes": req.nodes,
            "time_limit": {"set": True, "infinite": False, "number": int(req.time_limit_min)},
            "environment": [f"{k}={v}" for k, v in env.items()],
            "script": req.script,
        }
    )
    if req.gpus_per_node <= 0:
        del job["tres_per_node"]
    if req.warn_signal:  # --signal, as v0.0.39+ spells it (no flags: the steps, not the batch shell)
        job["kill_warning_signal"] = req.warn_signal
        job["kill_warning_delay"] = {"set": True, "infinite": False, "number": int(req.warn_s)}
    if version_key(version) <= (0, 0, 39):
        job["time_limit"] = int(req.time_limit_min)
        if req.warn_signal:
            job["kill_warning_delay"] = int(req.warn_s)
        return {"script": req.script, "job": job}
    return {"job": job}


def job_update_body(version: str, comment: str) -> dict[str, Any]:
    """POST job/{id}: change the comment (the only job update the adapter needs).

    Every version takes a bare job description here (not wrapped in ``job``)."""
    del version
    return {"comment": comment}


def node_update_body(version: str, state: str, reason: str = "") -> dict[str, Any]:
    """POST node/{name} (v0.0.39+): ``state`` is DRAIN or RESUME."""
    body: dict[str, Any] = {"state": [state.upper()]}
    if reason:
        body["reason"] = reason
    return body
