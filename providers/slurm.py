"""The on-prem pool: a Slurm cluster behind slurmrestd (JWT auth).

Offers are built from node GRES (configured minus used GPUs), node features
(fabric, rack, intra-node link) and partitions; owned hardware is priced at
its amortised cost (``SlurmConfig.owned``), per GPU. Launch submits a batch
job whose comment carries the owner, the Lockstep job id and the launch's
client token, so a job can be found again after a crash (``owned``) and a
launch is never submitted twice.

Everything that differs between slurmrestd versions lives in
:mod:`providers.slurm_api`; this module only sees flat shapes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import heapq
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from broker.config import SlurmConfig
from broker.errors import BadRequestError, CapacityError, ProviderAuthError, TransientError
from broker.gpus import GPU_SPECS, normalise_gpu
from broker.models import (
    Allocation,
    AllocationState,
    AllocationStatus,
    Colocate,
    Fabric,
    FabricNeed,
    IntraNode,
    Locality,
    Market,
    Network,
    Offer,
)
from providers import slurm_api as api
from providers.base import JOB_TAG, OWNER_TAG, TENANT_TAG, LaunchRequest, OfferQuery, Provider

log = logging.getLogger(__name__)
PROVIDER = "slurm"
TOKEN_TAG = "lockstep:token"
ATTEMPT_TAG = "lockstep:attempt"
CANCEL_TAG = "lockstep:cancelled"

# Feature → fabric. Features are matched case-insensitively; ib_ndr / ib_hdr / plain ib.
_IB_SPEEDS = {"ndr": 400.0, "hdr": 200.0, "edr": 100.0, "fdr": 56.0, "xdr": 800.0}
_FABRIC_GBPS = {Fabric.infiniband: 200.0, Fabric.roce: 200.0, Fabric.ethernet: 100.0, Fabric.none: 0.0}

_RUNNING_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "STAGE_OUT", "RESIZING", "SIGNALING"})
_PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "SUSPENDED", "RESV_DEL_HOLD"})
_FAILED_STATES = frozenset(
    {"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
)


# --------------------------------------------------------------------------- features


@dataclass(frozen=True)
class NodeTraits:
    """What a node's features say about its network and place."""

    fabric: Fabric
    fabric_gbps: float
    fabric_feature: str  # the feature that named the fabric ("ib_ndr"), for constraints
    intra: IntraNode
    rack: str  # "rack1", or ""


def node_traits(features: Iterable[str]) -> NodeTraits:
    """Fabric (ib_*/ib → InfiniBand, roce, eth), intra-node link (nvlink/pcie) and rack (rackN)."""
    fabric, gbps, ffeat = Fabric.none, 0.0, ""
    intra, rack = IntraNode.pcie, ""
    rank = {Fabric.none: 0, Fabric.ethernet: 1, Fabric.roce: 2, Fabric.infiniband: 3}
    for feat in features:
        f = feat.strip().lower()
        cand: Fabric | None = None
        speed = 0.0
        if f == "ib" or f.startswith(("ib_", "ib-", "infiniband")):
            cand = Fabric.infiniband
            suffix = re.split(r"[_-]", f, maxsplit=1)[1] if re.search(r"[_-]", f) else ""
            speed = _IB_SPEEDS.get(suffix, _FABRIC_GBPS[Fabric.infiniband])
        elif f == "roce" or f.startswith(("roce_", "roce-")):
            cand, speed = Fabric.roce, _FABRIC_GBPS[Fabric.roce]
        elif f in ("eth", "ethernet") or f.startswith(("eth_", "eth-")):
            cand, speed = Fabric.ethernet, _FABRIC_GBPS[Fabric.ethernet]
        elif f == "nvlink" or f.startswith("nvlink"):
            intra = IntraNode.nvlink
        elif re.fullmatch(r"rack[-_]?\w+", f):
            rack = feat.strip()
        if cand is not None and (rank[cand], speed) > (rank[fabric], gbps):
            fabric, gbps, ffeat = cand, speed, feat.strip()
    return NodeTraits(fabric, gbps, ffeat, intra, rack)


def gpu_model(gres_type: str, features: Iterable[str] = ()) -> str | None:
    """Canonical GPU model from a GRES type (``h100``, ``nvidia_a100_80gb_pcie``) or, failing that, a feature."""
    if re.fullmatch(r"\d+g\.\d+gb", gres_type.lower()):
        return None  # a MIG slice ("1g.10gb"): a fraction of a GPU, not a model the router can price
    if gres_type:
        direct = normalise_gpu(gres_type)
        if direct:
            return direct
        tokens = [t for t in re.split(r"[_\-\s]+", gres_type.lower()) if t and t != "nvidia"]
        mem = next((float(m.group(1)) for t in tokens if (m := re.fullmatch(r"(\d+)gb?", t))), None)
        form = next((t for t in tokens if t in ("pcie", "sxm", "sxm4", "sxm5", "nvl")), "")
        if tokens:
            family = tokens[0]
            for name in (f"{family}{form}{int(mem)}gb" if mem else "", f"{family}{form}", family):
                if name and (model := normalise_gpu(name, mem)):
                    return model
    for feat in features:
        model = normalise_gpu(feat)
        if model:
            return model
    return None


def constraint_matches(constraint: str | None, features: Iterable[str]) -> bool:
    """Does a node with ``features`` satisfy a Slurm constraint (``a&b``, ``a,b``, ``a|b``, ``[a|b]``)?"""
    if not constraint:
        return True
    have = {f.lower() for f in features}
    text = re.sub(r"[\[\]()]", "", constraint.lower())
    text = re.sub(r"\*\d+", "", text)  # counts ("ib*2") do not change which nodes qualify
    for alternative in text.split("|"):
        wanted = [w.strip() for w in re.split(r"[&,]", alternative) if w.strip()]
        if all(w in have for w in wanted):
            return True
    return False


# --------------------------------------------------------------------------- queue model


def estimate_wait_hours(
    nodes: list[api.NodeInfo],
    jobs: list[api.JobInfo],
    now: float,
    gpus_per_node: int,
    nodes_needed: int = 1,
    features: str | None = None,
    gpu_type: str | None = None,
    candidates: set[str] | None = None,
) -> float:
    """How long a job of this shape would wait, in hours (``inf`` if it can never run here).

    The model, simple on purpose: running jobs hold their GPUs until their time
    limit runs out (the limit is what Slurm itself plans with); pending jobs are
    served in priority order, each starting at the first moment enough GPUs are
    free on nodes it may use, and then holding them for its full time limit;
    our job comes last. At each moment every queued job that fits starts (what
    Slurm's backfill does when nothing larger is blocked). Jobs without a limit
    are assumed to run ``slurm_api.UNLIMITED_JOB_HOURS``. More pending jobs on
    the same nodes can only push the answer later.
    """
    return QueueModel(nodes, jobs, now).wait_hours(gpus_per_node, nodes_needed, features, gpu_type, candidates)


class QueueModel:
    """The part of the queue estimate that is the same for every job shape, prepared once.

    An offer refresh asks for the wait of every offer's shape; the healthy nodes, the
    running jobs' release times and the pending queue (with where each pending job may
    run) do not depend on the shape, so they are built here once and every
    :meth:`wait_hours` simulates on its own copies.
    """

    def __init__(self, nodes: list[api.NodeInfo], jobs: list[api.JobInfo], now: float) -> None:
        self.now = now
        self.healthy = {n.name: n for n in nodes if n.healthy and n.gpus_total > 0}
        self.free = {name: n.gpus_free for name, n in self.healthy.items()}
        horizon = api.UNLIMITED_JOB_HOURS * 3600.0
        self.events: list[tuple[float, str, int]] = []
        for job in jobs:
            if job.state not in _RUNNING_STATES or job.gpus_per_node <= 0:
                continue
            if job.time_limit_min is None:
                end = now + horizon
            else:
                end = job.end_time or ((job.start_time or now) + job.time_limit_min * 60)
            end = max(end, now + 60.0)  # past its limit: about to be killed
            for name in job.nodes:
                if name in self.free:
                    heapq.heappush(self.events, (end, name, job.gpus_per_node))
        # (gpus, nodes, eligible nodes, hold seconds, is ours)
        self.queue: list[tuple[int, int, list[str], float, bool]] = []
        pending = [j for j in jobs if j.state in ("PENDING",) and j.gpus_per_node > 0]
        pending.sort(key=lambda j: (-j.priority, j.submit_time or 0.0, j.job_id))
        for job in pending:
            where = self.eligible(job.gpus_per_node, job.gpu_type or None, job.constraints or None, None)
            if len(where) < max(job.node_count, 1):
                continue  # can never run here: it blocks nobody
            hold = horizon if job.time_limit_min is None else job.time_limit_min * 60.0
            self.queue.append((job.gpus_per_node, max(job.node_count, 1), where, hold, False))

    def eligible(self, g: int, gtype: str | None, constraint: str | None,
                 partition_nodes: set[str] | None) -> list[str]:
        return [
            name
            for name, n in self.healthy.items()
            if n.gpus_total >= g
            and (not gtype or n.gpu_type == gtype)
            and constraint_matches(constraint, n.features)
            and (partition_nodes is None or name in partition_nodes)
        ]

    def wait_hours(self, gpus_per_node: int, nodes_needed: int = 1, features: str | None = None,
                   gpu_type: str | None = None, candidates: set[str] | None = None) -> float:
        mine = self.eligible(gpus_per_node, gpu_type, features, candidates)
        if len(mine) < nodes_needed or gpus_per_node <= 0:
            return math.inf
        free = dict(self.free)
        events = list(self.events)  # a copy of a heap is a heap
        queue = [*self.queue, (gpus_per_node, nodes_needed, mine, 0.0, True)]
        now = t = self.now
        while True:
            remaining = []
            for g, k, where, hold, ours in queue:
                fits = sorted((n for n in where if free[n] >= g), key=lambda n: (free[n], n))
                if len(fits) >= k:
                    if ours:
                        return (t - now) / 3600.0
                    for name in fits[:k]:  # best fit: keep big holes for big jobs
                        free[name] -= g
                        heapq.heappush(events, (t + hold, name, g))
                else:
                    remaining.append((g, k, where, hold, ours))
            queue = remaining
            if not events:
                return math.inf
            t = events[0][0]
            while events and events[0][0] <= t:
                _, name, g = heapq.heappop(events)
                free[name] += g


# --------------------------------------------------------------------------- comments


def make_comment(req: LaunchRequest, owner: str) -> str:
    """The job comment: who owns it and how to find it again. ``owner`` is the provider's installation."""
    return ";".join(
        [
            f"{OWNER_TAG}={owner}",
            f"{JOB_TAG}={req.job_id}",
            f"{TENANT_TAG}={req.tenant}",
            f"{ATTEMPT_TAG}={req.attempt}",
            f"{TOKEN_TAG}={req.client_token}",
        ]
    )


def parse_comment(comment: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in comment.split(";"):
        key, sep, value = part.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def time_limit_minutes(req: LaunchRequest, default_min: int) -> int:
    """From the workload: wall-clock hours, or reference GPU-hours spread over the job's GPUs (×2 margin)."""
    w = req.spec.workload
    if w.hours is not None:
        return max(1, math.ceil(w.hours * 60))
    if w.reference_gpu_hours is not None:
        return max(1, math.ceil(w.reference_gpu_hours / req.spec.gpus * 60 * 2))
    return default_min


# --------------------------------------------------------------------------- the provider


class SlurmProvider(Provider):
    """Slurm via slurmrestd. Thin: translate, call, normalise, map errors."""

    name = PROVIDER

    def __init__(self, config: SlurmConfig, *, installation: str = "lockstep") -> None:
        self.config = config
        self.installation = installation
        self._version: str | None = config.api_version
        self._version_lock = asyncio.Lock()
        self._cancelled: set[str] = set()  # job ids this process cancelled (also marked in the comment)
        self._client: httpx.AsyncClient | None = None
        self._auth = TokenAuth(config)
        if config.token is not None and config.token_file:
            log.warning("slurm: both token and token_file are set; using token, so token_file (and its "
                        "rotation) is ignored")

    def __repr__(self) -> str:
        return f"SlurmProvider(url={self.config.url!r}, user={self.config.user!r}, version={self._version!r})"

    # ------------------------------------------------------------------ transport

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.config.url,
                timeout=self.config.timeout_s,
                headers={"X-SLURM-USER-NAME": self.config.user, "Accept": "application/json"},
                auth=self._auth,
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _once(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        try:
            resp = await self._http().request(method, path, json=body)
        except httpx.TimeoutException:
            raise TransientError(PROVIDER, f"timeout on {method} {path}") from None
        except httpx.TransportError as exc:
            raise TransientError(PROVIDER, f"cannot reach slurmrestd ({type(exc).__name__})") from None
        try:
            data = resp.json()
        except (json.JSONDecodeError, ValueError):
            data = None
        return resp.status_code, data

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, ok_errnos: frozenset[int] = frozenset()
    ) -> Any:
        """One request with bounded, jittered retries on transient failures; raises the mapped error."""
        async for attempt in self._retrying():
            with attempt:
                status, data = await self._once(method, path, body)
                if status < 300:
                    return data
                errs = api.parse_errors(data)
                if any(code in ok_errnos for code, _ in errs):
                    return data  # e.g. "invalid job id" where gone is an answer, not a failure
                raise_for(status, errs, f"{method} {path}")
        raise AssertionError("unreachable")  # pragma: no cover

    def _retrying(self) -> AsyncRetrying:
        return AsyncRetrying(
            retry=retry_if_exception_type(TransientError),
            stop=stop_after_attempt(max(1, self.config.max_attempts)),
            wait=wait_random_exponential(multiplier=0.2, max=5.0),  # "full jitter" backoff
            reraise=True,
        )

    async def version(self) -> str:
        """The API version to speak: the pinned one, else the newest the server advertises."""
        if self._version:
            return self._version
        async with self._version_lock:
            if not self._version:
                async for attempt in self._retrying():
                    with attempt:
                        self._version = await self._negotiate()
            assert self._version
            return self._version

    async def _negotiate(self) -> str:
        for doc_path in api.OPENAPI_PATHS:
            status, data = await self._once("GET", doc_path)
            if status in (401, 403) or status >= 500:
                raise_for(status, api.parse_errors(data), f"GET {doc_path}")
            if status == 200 and isinstance(data, dict) and (v := api.pick_version(data)):
                return v
        # No OpenAPI document: probe the ping endpoints, newest first.
        for v in api.SUPPORTED_VERSIONS:
            status, data = await self._once("GET", api.path(v, "ping"))
            if status in (401, 403) or status >= 500:
                raise_for(status, api.parse_errors(data), "GET ping")
            if status == 200:
                return v
        raise BadRequestError(PROVIDER, "slurmrestd offers none of " + ", ".join(api.SUPPORTED_VERSIONS))

    async def _get(self, what: str, **params: str | int) -> Any:
        v = await self.version()
        return await self._call("GET", api.path(v, what, **params))

    # ------------------------------------------------------------------ reads

    async def nodes(self) -> list[api.NodeInfo]:
        return api.parse_nodes(await self._get("nodes") or {})

    async def jobs(self) -> list[api.JobInfo]:
        return api.parse_jobs(await self._get("jobs") or {})

    async def partitions(self) -> list[api.PartitionInfo]:
        return api.parse_partitions(await self._get("partitions") or {})

    async def ping(self) -> bool:
        data = await self._get("ping")
        pings = (data or {}).get("pings") or []
        return any(str(p.get("pinged", p.get("ping", ""))).upper() in ("UP", "RESPONDING") for p in pings)

    async def queue_wait_hours(
        self, gpus_per_node: int, nodes: int = 1, features: str | None = None, *, gpu_type: str | None = None
    ) -> float:
        """Expected wait before a job of this shape starts (see :func:`estimate_wait_hours`)."""
        node_list, job_list = await asyncio.gather(self.nodes(), self.jobs())
        return estimate_wait_hours(node_list, job_list, time.time(), gpus_per_node, nodes, features, gpu_type)

    # ------------------------------------------------------------------ offers

    async def offers(self, query: OfferQuery | None = None) -> list[Offer]:
        if query and query.markets and Market.owned not in query.markets:
            return []
        node_list, part_list, job_list = await asyncio.gather(self.nodes(), self.partitions(), self.jobs())
        now = time.time()
        builder = _OfferBuilder(self.config, part_list, node_list, job_list, now)
        out = builder.build()
        if query and query.gpus:
            out = [o for o in out if o.gpu in query.gpus]
        return out

    # ------------------------------------------------------------------ launch / poll / release

    async def _find_by_token(self, token: str) -> api.JobInfo | None:
        for job in await self.jobs():
            tags = parse_comment(job.comment)
            if tags.get(OWNER_TAG) == self.installation and tags.get(TOKEN_TAG) == token:
                return job
        return None

    async def launch(self, req: LaunchRequest) -> Allocation:
        spec, offer = req.spec, req.offer
        gpus_per_node = spec.gpus_per_node or self.config.gpus_per_node_default
        limit = time_limit_minutes(req, self.config.default_time_limit_min)
        constraints: list[str] = []
        fabric_feature = offer.attrs.get("fabric_feature", "")
        rack_feature = offer.attrs.get("rack_feature", "")
        if fabric_feature and (req.nodes > 1 or spec.fabric is not FabricNeed.any):
            constraints.append(fabric_feature)
        wants_rack = offer.colocation is Colocate.rack or spec.colocate in (Colocate.node, Colocate.rack)
        if rack_feature and req.nodes > 1 and wants_rack:
            constraints.append(rack_feature)
        command = spec.command.strip() or f"exec sleep {limit * 60}"  # no command: hold the allocation
        submit = api.SubmitRequest(
            name=f"lockstep-{req.job_id}"[:100],
            script=f"#!/bin/bash\n# submitted by Lockstep ({self.installation})\n{command}\n",
            nodes=req.nodes,
            gpus_per_node=gpus_per_node,
            gpu_type=offer.attrs.get("gres_type", ""),
            time_limit_min=limit,
            comment=make_comment(req, self.installation),
            partition=offer.attrs.get("partition") or self.config.partition,
            constraints="&".join(constraints) or None,
            stdout=f"/tmp/lockstep-{req.job_id}-%j.out",
            environment={
                "LOCKSTEP_JOB_ID": req.job_id,
                "LOCKSTEP_ATTEMPT": str(req.attempt),
                "LOCKSTEP_TENANT": req.tenant,
            },
        )
        v = await self.version()
        async for attempt in self._retrying():
            with attempt:
                # Idempotency: a job with this token already exists (an earlier try, or before a crash).
                existing = await self._find_by_token(req.client_token)
                if existing is not None:
                    return self._allocation(existing, offer_id=offer.id, usd_per_hour=self._rate(req))
                status, data = await self._once("POST", api.path(v, "submit"), api.submit_body(v, submit))
                job_id = api.parse_submit(data) if isinstance(data, dict) else None
                if status >= 300 or job_id is None:
                    raise_for(status if status >= 300 else 500, api.parse_errors(data), "job submit")
                job = await self._job(job_id)
                if job is None:
                    raise TransientError(PROVIDER, f"submitted job {job_id} not visible yet")
                return self._allocation(job, offer_id=offer.id, usd_per_hour=self._rate(req))
        raise AssertionError("unreachable")  # pragma: no cover

    async def submit(self, submit: api.SubmitRequest) -> str:
        """Submit a batch job as it is (no ownership tags, no idempotency): the Slurm job id.

        For Lockstep's own work beside users' jobs, such as a burn-in pinned to one node; retried
        on transient errors like every call.
        """
        v = await self.version()
        data = await self._call("POST", api.path(v, "submit"), api.submit_body(v, submit))
        job_id = api.parse_submit(data) if isinstance(data, dict) else None
        if job_id is None:
            raise BadRequestError(PROVIDER, "job submit answered without a job id")
        return str(job_id)

    @staticmethod
    def _rate(req: LaunchRequest) -> float:
        per_gpu = req.offer.usd_per_hour / req.offer.gpu_count if req.offer.gpu_count else 0.0
        return per_gpu * (req.spec.gpus_per_node or 0) * req.nodes

    def _allocation(self, job: api.JobInfo, *, offer_id: str = "", usd_per_hour: float = 0.0) -> Allocation:
        tags = parse_comment(job.comment)
        try:
            attempt = int(tags.get(ATTEMPT_TAG, "0"))
        except ValueError:
            attempt = 0
        return Allocation(
            id=f"{PROVIDER}:{self.config.cluster_name}:{job.job_id}",
            job_id=tags.get(JOB_TAG, job.name.removeprefix("lockstep-")),
            attempt=attempt,
            provider=PROVIDER,
            offer_id=offer_id,
            state=self._state(job),
            client_token=tags.get(TOKEN_TAG, ""),
            resource_ids=[str(job.job_id)],
            nodes=job.node_count,
            region=self.config.cluster_name,
            zone=job.partition,
            usd_per_hour=usd_per_hour,
            attrs={
                "slurm_job_id": str(job.job_id),
                "partition": job.partition,
                "name": job.name,
                "tenant": tags.get(TENANT_TAG, ""),
                "nodes": ",".join(job.nodes),
            },
        )

    def _state(self, job: api.JobInfo) -> AllocationState:
        s = job.state
        if s in _PENDING_STATES:
            return AllocationState.pending
        if s in _RUNNING_STATES:
            return AllocationState.running
        if s == "COMPLETED":
            return AllocationState.succeeded
        if s == "PREEMPTED":
            return AllocationState.preempted
        if s == "CANCELLED":
            ours = str(job.job_id) in self._cancelled or parse_comment(job.comment).get(CANCEL_TAG) == "1"
            return AllocationState.released if ours else AllocationState.failed
        if s in _FAILED_STATES:
            return AllocationState.failed
        return AllocationState.unknown

    async def _job(self, job_id: int | str) -> api.JobInfo | None:
        v = await self.version()
        data = await self._call(
            "GET", api.path(v, "job", job_id=job_id), ok_errnos=frozenset({api.ESLURM_INVALID_JOB_ID})
        )
        jobs = api.parse_jobs(data or {})
        return next((j for j in jobs if str(j.job_id) == str(job_id)), None)

    @staticmethod
    def _job_id(alloc: Allocation) -> str:
        if not alloc.resource_ids:
            raise BadRequestError(PROVIDER, f"allocation {alloc.id} has no Slurm job id")
        return alloc.resource_ids[0]

    async def poll(self, alloc: Allocation) -> AllocationStatus:
        job_id = self._job_id(alloc)
        job = await self._job(job_id)
        if job is None:
            # slurmctld forgets finished jobs after MinJobAge; without accounting we cannot say how it ended.
            if job_id in self._cancelled or alloc.state is AllocationState.released:
                return AllocationStatus(state=AllocationState.released, reason="cancelled by Lockstep")
            return AllocationStatus(state=AllocationState.unknown, reason=f"job {job_id} no longer known")
        reason = "" if job.reason in ("None", "") else job.reason
        if job.exit_code and job.state in _FAILED_STATES:
            reason = f"{reason} exit={job.exit_code}".strip()
        return AllocationStatus(state=self._state(job), reason=f"{job.state} {reason}".strip(), hosts=list(job.nodes))

    async def release(self, alloc: Allocation) -> None:
        job_id = self._job_id(alloc)
        self._cancelled.add(job_id)
        v = await self.version()
        job = await self._job(job_id)
        if job is None or job.finished:
            return  # already gone
        # Mark the job first, so that another Lockstep process polling it reads "released", not "failed".
        try:
            await self._call(
                "POST",
                api.path(v, "job", job_id=job_id),
                api.job_update_body(v, f"{job.comment};{CANCEL_TAG}=1"),
            )
        except (BadRequestError, CapacityError):
            pass  # the mark is a courtesy; cancelling is what matters
        await self._call(
            "DELETE", api.path(v, "job", job_id=job_id), ok_errnos=frozenset({api.ESLURM_INVALID_JOB_ID})
        )

    async def owned(self) -> list[Allocation]:
        out = []
        for job in await self.jobs():
            if job.finished or parse_comment(job.comment).get(OWNER_TAG) != self.installation:
                continue
            out.append(self._allocation(job))
        return out

    # ------------------------------------------------------------------ node health

    async def drain(self, node: str, reason: str) -> None:
        """Take a node out of service (running jobs finish, nothing new starts)."""
        await self._node_state(node, "DRAIN", reason or "lockstep: unhealthy")

    async def resume(self, node: str) -> None:
        await self._node_state(node, "RESUME", "")

    async def _node_state(self, node: str, state: str, reason: str) -> None:
        if not re.fullmatch(r"[A-Za-z0-9._\-\[\],]+", node):
            raise BadRequestError(PROVIDER, f"bad node name {node!r}")
        v = await self.version()
        if api.has_node_update(v):
            await self._call("POST", api.path(v, "node", name=node), api.node_update_body(v, state, reason))
            return
        await self._scontrol("update", f"NodeName={node}", f"State={state}", *([f"Reason={reason}"] if reason else []))

    async def _scontrol(self, *args: str) -> None:
        """v0.0.38 has no node update endpoint: run scontrol on this host (needs Slurm client and munge)."""
        conf = self.config.conf_path or os.environ.get("SLURM_CONF")
        if not conf:
            # Without SLURM_CONF scontrol falls back to a DNS SRV lookup: refuse rather than leave the host.
            raise BadRequestError(PROVIDER, "node updates need slurm.conf_path (or SLURM_CONF) with this slurmrestd")
        env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
        env["SLURM_CONF"] = conf
        try:
            proc = await asyncio.create_subprocess_exec(
                "scontrol", *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except FileNotFoundError:
            raise BadRequestError(PROVIDER, "scontrol is not installed on this host") from None
        _, err = await proc.communicate()
        if proc.returncode != 0:
            text = err.decode(errors="replace").strip().splitlines()
            raise BadRequestError(PROVIDER, f"scontrol {args[0]} failed: {text[-1] if text else proc.returncode}")


# --------------------------------------------------------------------------- errors


class TokenAuth(httpx.Auth):
    """``X-SLURM-USER-TOKEN`` on every request, from ``slurm.token`` or ``slurm.token_file``.

    Slurm JWTs are short-lived; a sidecar (or cron running ``scontrol token``) rewrites the
    file before they expire. The file is read again whenever it is a different file or its
    change time, modification time or size differ (a rename into place, a rewrite), and once
    more before giving up on a token that has expired or that slurmrestd answers 401 to, so a
    rotated token is used from the next request on, without a restart. Every token is
    checked before it is sent (:func:`check_token`).
    """

    def __init__(self, config: SlurmConfig) -> None:
        self.config = config
        # (file identity, token) replaced as one value: threads sharing a provider never pair them wrongly.
        self._cache: tuple[tuple[int, ...], str] | None = None

    def current(self, reread: bool = False) -> str:
        if self.config.token is not None:
            return self.config.token.get_secret_value()
        path = self.config.token_file
        if not path:
            raise ProviderAuthError(
                PROVIDER, "no token configured (slurm.token, slurm.token_file or LOCKSTEP_SLURM_TOKEN)"
            )
        try:
            st = os.stat(path)
            ident = (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size)
            cache = self._cache
            if reread or cache is None or cache[0] != ident:
                with open(path, encoding="utf-8") as fh:
                    cache = self._cache = (ident, fh.read().strip())
        except OSError as exc:
            raise ProviderAuthError(PROVIDER, f"cannot read token_file ({exc.strerror})") from None
        except UnicodeDecodeError:  # its repr would carry the file's bytes: the token
            raise ProviderAuthError(PROVIDER, "token_file is not UTF-8 text") from None
        if not cache[1]:
            raise ProviderAuthError(PROVIDER, "token_file is empty")
        return cache[1]

    def _checked(self, reread: bool = False) -> str:
        token = self.current(reread)
        try:
            check_token(token, time.time())
        except ProviderAuthError:
            if reread or self.config.token is not None:
                raise
            return self._checked(reread=True)  # rotated within the same stat tick: look once more
        return token

    def auth_flow(self, request: httpx.Request) -> Iterator[httpx.Request]:
        token = self._checked()
        request.headers["X-SLURM-USER-TOKEN"] = token
        response = yield request
        if response.status_code == 401 and self.config.token is None:
            fresh = self._checked(reread=True)
            if fresh != token:
                request.headers["X-SLURM-USER-TOKEN"] = fresh
                yield request


def check_token(token: str, now: float) -> None:
    """Refuse a token that is not a JWT or has expired, before sending it.

    slurmrestd passes the token through to slurmctld, which answers a bad one
    with a bare "Unspecified error" (HTTP 500): without this check a stale
    token would look like a struggling daemon and be retried.
    """
    parts = token.split(".")
    if len(parts) != 3:
        raise ProviderAuthError(PROVIDER, "token is not a JWT (make one with `scontrol token`)")
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        raise ProviderAuthError(PROVIDER, "token is not a JWT (make one with `scontrol token`)") from None
    exp = payload.get("exp") if isinstance(payload, dict) else None
    if isinstance(exp, int | float) and exp < now:
        raise ProviderAuthError(PROVIDER, f"token expired {int(now - exp)} s ago (make one with `scontrol token`)")



def raise_for(status: int, errors: list[tuple[int | None, str]], what: str) -> None:
    """Map an HTTP status and Slurm's error list to the project's errors; always raises."""
    # -1 is SLURM_ERROR, "Unspecified error": it says nothing about the request, so it counts as no code.
    codes = [c for c, _ in errors if c is not None and c > 0]
    texts = "; ".join(t for _, t in errors if t)
    detail = f"{what}: HTTP {status}" + (f": {texts}" if texts else "")
    code = str(codes[0]) if codes else str(status)
    if status in (401, 403) or any(c in api.AUTH_ERRNOS for c in codes):
        raise ProviderAuthError(PROVIDER, f"{what}: HTTP {status}, credentials refused", code)
    if any(c in api.CAPACITY_ERRNOS for c in codes) or "not available" in texts.lower():
        raise CapacityError(PROVIDER, detail, code)
    if any(c in api.TRANSIENT_ERRNOS for c in codes) or status == 429:
        raise TransientError(PROVIDER, detail, code)
    if codes or 400 <= status < 500:
        raise BadRequestError(PROVIDER, detail, code)  # Slurm refused the request itself
    raise TransientError(PROVIDER, detail, code)  # 5xx without a Slurm error: the daemon is struggling


# --------------------------------------------------------------------------- offers


class _OfferBuilder:
    """Turns nodes, partitions and the queue into offers: per node, per rack group, per fabric island."""

    def __init__(
        self,
        config: SlurmConfig,
        partitions: list[api.PartitionInfo],
        nodes: list[api.NodeInfo],
        jobs: list[api.JobInfo],
        now: float,
    ) -> None:
        self.config = config
        self.partitions = partitions
        self.nodes = nodes
        self.jobs = jobs
        self.now = now
        self.node_rate = config.owned.usd_per_node_hour()
        self.queue_model = QueueModel(nodes, jobs, now)  # shared by every offer's wait estimate

    def _partition_for(self, members: list[api.NodeInfo]) -> str | None:
        """A partition holding all these nodes: the configured one, else the default, else the first.

        The nodes' own partition lists win over the partitions' host lists (both are answers of the
        same daemon, but a node's list is what the scheduler uses for it).
        """
        want = {n.name for n in members}
        up = {p.name: p for p in self.partitions if "UP" in p.state or not p.state}
        known = {p.name for p in self.partitions}
        if all(n.partitions for n in members):
            common = [p for p in members[0].partitions if all(p in n.partitions for n in members[1:])]
            names = [p for p in common if p in up or p not in known]  # hidden partitions are not listed
        else:
            names = [p.name for p in up.values() if want <= set(p.nodes)]
        if not names:
            return None
        if self.config.partition:
            # The operator limited Lockstep to one partition.
            return self.config.partition if self.config.partition in names else None
        return next((n for n in names if n in up and up[n].default), names[0])

    def _wait(self, gpus: int, k: int, names: Iterable[str], gres_type: str) -> float:
        wait = self.queue_model.wait_hours(gpus, k, None, gres_type or None, candidates=set(names))
        return wait if math.isfinite(wait) else api.UNLIMITED_JOB_HOURS * 7

    def _offer(
        self,
        *,
        offer_id: str,
        members: list[api.NodeInfo],
        model: str,
        traits: NodeTraits,
        gpu_count: int,
        max_nodes: int,
        colocation: Colocate,
        partition: str,
        host: str = "",
        rack: str = "",
    ) -> Offer:
        first = members[0]
        configured = min(n.gpus_total for n in members)
        island = f"{self.config.cluster_name}-{traits.fabric_feature}" if traits.fabric_feature else ""
        common = set(first.features).intersection(*(set(n.features) for n in members[1:]))
        return Offer(
            id=offer_id,
            provider=PROVIDER,
            market=Market.owned,
            sku=f"{first.gpu_type or model}x{configured}",
            gpu=model,
            gpu_count=gpu_count,
            gpu_memory_gb=GPU_SPECS[model].memory_gb,
            vcpus=min(n.cpus for n in members),
            ram_gb=round(min(n.memory_mb for n in members) / 1024.0, 1),
            # Owned hardware costs its amortised node-hour whether used or not; a job pays its share of GPUs.
            usd_per_hour=round(self.node_rate * gpu_count / configured, 6),
            divisible=True,
            interruptible=False,
            max_nodes=max_nodes,
            colocation=colocation,
            locality=Locality(
                provider=PROVIDER,
                region=self.config.cluster_name,
                zone=partition,
                cluster=island,
                rack=rack,
                host=host,
            ),
            network=Network(intra=traits.intra, fabric=traits.fabric, fabric_gbps=traits.fabric_gbps),
            queue_wait_hours=self._wait(gpu_count, max_nodes, (n.name for n in members), first.gpu_type),
            attrs={
                "partition": partition,
                "nodes": ",".join(n.name for n in members),
                "features": ",".join(f for f in first.features if f in common),
                "gres_type": first.gpu_type,
                "configured_gpus": str(configured),
                "free_gpus": str(min(n.gpus_free for n in members)),
                "fabric_feature": traits.fabric_feature,
                "rack_feature": rack,
            },
        )

    def build(self) -> list[Offer]:
        cluster = self.config.cluster_name
        out: list[Offer] = []
        usable: list[tuple[api.NodeInfo, str, NodeTraits]] = []
        for node in self.nodes:
            if not node.healthy or node.gpus_total <= 0:
                continue
            model = gpu_model(node.gpu_type, node.features)
            if model is None:
                continue  # MIG slices and unknown models: nothing the router can price
            partition = self._partition_for([node])
            if partition is None:
                continue
            traits = node_traits(node.features)
            usable.append((node, model, traits))
            # A busy node is still offered, at its full size, with the wait until it frees up.
            count = node.gpus_free or node.gpus_total
            out.append(
                self._offer(
                    offer_id=f"{PROVIDER}/{cluster}/{node.name}",
                    members=[node],
                    model=model,
                    traits=traits,
                    gpu_count=count,
                    max_nodes=1,
                    colocation=Colocate.node,
                    partition=partition,
                    host=node.name,
                    rack=traits.rack,
                )
            )

        # Multi-node offers: nodes sharing GPU model and fabric, per rack and per fabric island.
        groups: dict[tuple[str, str, str], list[api.NodeInfo]] = {}
        for node, model, traits in usable:
            if traits.fabric is Fabric.none or node.gpus_free <= 0:
                continue
            key = (model, traits.fabric_feature, "")
            groups.setdefault(key, []).append(node)
            if traits.rack:
                groups.setdefault((model, traits.fabric_feature, traits.rack), []).append(node)
        seen: set[tuple[str, str, int, int]] = set()
        # Racks first: a rack offer dominates the island offer of the same size and shape.
        for (model, ffeat, rack), members in sorted(groups.items(), key=lambda kv: kv[0][2] == ""):
            members = sorted(members, key=lambda n: (-n.gpus_free, n.name))
            traits = node_traits(members[0].features)
            for k in range(2, len(members) + 1):
                g = members[k - 1].gpus_free
                if k < len(members) and members[k].gpus_free == g:
                    continue  # k+1 nodes of the same size dominate k
                if (model, ffeat, k, g) in seen:
                    continue
                chosen = members[:k]
                partition = self._partition_for(chosen)
                if partition is None:
                    continue
                seen.add((model, ffeat, k, g))
                level = "rack" if rack else "island"
                out.append(
                    self._offer(
                        offer_id=f"{PROVIDER}/{cluster}/{level}/{rack or ffeat}/{model}/{k}x{g}",
                        members=chosen,
                        model=model,
                        traits=traits,
                        gpu_count=g,
                        max_nodes=k,
                        colocation=Colocate.rack if rack else Colocate.cluster,
                        partition=partition,
                        rack=rack,
                    )
                )
        return out
