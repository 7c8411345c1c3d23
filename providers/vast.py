"""Vast.ai marketplace adapter: search asks, rent one, poll it, destroy it, list what we hold.

Talks to the Vast REST API as the official CLI does (shared/vast-api-notes.md): ``POST /api/v0/bundles/`` with the
API's own query operators, ``PUT /api/v0/asks/{id}/`` to rent, ``GET /api/v0/instances/{id}/`` to poll,
``DELETE /api/v0/instances/{id}/`` to release and ``GET /api/v1/instances/`` (paged) to list.

What it normalises, and why:

- Every ask is one machine: ``max_nodes=1``, ``colocation=node``, fabric ``ethernet`` at the machine's internet
  speed (the slower of up and down, in Gbit/s), since that is all two Vast machines share.
- ``usd_per_hour`` is the whole node with the job's disk: ``dph_total`` less the storage the API priced in for
  ``allocated_storage``, plus ``storage_cost`` ($/GB/month) for ``query.disk_gb``. The search sends
  ``allocated_storage = disk_gb``, so the API's price filter compares like with like.
- An ask that takes bids gives a second offer, market ``spot``, at ``min_bid`` plus the same storage.
- ``gpu_ram`` and ``cpu_ram`` are MB on the wire (the CLI multiplies GB by 1000 before sending), so memory is
  MB / 1000: anything that passes the pushed-down ``gpu_ram`` filter also passes the router's GB check.
- ``dlperf`` (Vast's DL performance score) becomes ``Perf(source="dlperf")`` with ``relative`` = dlperf over a
  datasheet expectation, ``DLPERF_SCALE * sqrt(bf16 TFLOP/s * memory TB/s)`` per GPU: DLPerf blends compute and
  memory bandwidth, so a geometric mean of the two datasheet figures tracks it across generations. It is a prior
  from the host's self-test, not our own measurement.

Errors: 401/403 → ProviderAuthError at once; 429 and 5xx → TransientError, retried with tenacity (bounded by
``max_attempts``, exponential backoff with jitter, Retry-After honoured up to a cap); the daily search quota 429 →
QuotaError, not retried (it resets at midnight UTC); an ask gone or rented → CapacityError. Messages carry the
status and Vast's error code only; the key travels in the Authorization header and nowhere else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from collections import defaultdict
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_random_exponential

from broker.config import VastConfig
from broker.errors import (
    BadRequestError,
    CapacityError,
    ProviderAuthError,
    QuotaError,
    TransientError,
)
from broker.gpus import GPU_SPECS, normalise_gpu
from broker.models import (
    Allocation,
    AllocationState,
    AllocationStatus,
    Colocate,
    Fabric,
    IntraNode,
    Locality,
    Market,
    Network,
    Offer,
    Perf,
    utcnow,
)
from providers.base import LaunchRequest, OfferQuery, Provider, matches

log = logging.getLogger(__name__)

PROVIDER = "vast"
HOURS_PER_MONTH = 730.0
DEFAULT_STORAGE_GB = 5.0  # what the API prices in when allocated_storage is not sent
DLPERF_SCALE = 3.2  # calibrated so an RTX 4090 at datasheet scores about 41, as on the market
LIST_PAGE = 50
MAX_PAGES = 1000

# Vast's gpu_name spellings of each canonical model (Vast names the board; memory tells A100 40/80 apart).
VAST_NAMES: dict[str, tuple[str, ...]] = {
    "B200": ("B200",),
    "H200": ("H200", "H200 NVL"),
    "H100-SXM": ("H100 SXM",),
    "H100-NVL": ("H100 NVL",),
    "H100-PCIe": ("H100 PCIE",),
    "A100-SXM-80GB": ("A100 SXM4",),
    "A100-SXM-40GB": ("A100 SXM4",),
    "A100-PCIe-80GB": ("A100 PCIE", "A100X"),
    "A100-PCIe-40GB": ("A100 PCIE",),
    "L40S": ("L40S",),
    "L40": ("L40",),
    "L4": ("L4",),
    "A40": ("A40",),
    "A10": ("A10",),
    "RTX-6000-Ada": ("RTX 6000Ada",),
    "RTX-A6000": ("RTX A6000",),
    "RTX-5090": ("RTX 5090",),
    "RTX-4090": ("RTX 4090",),
    "RTX-3090": ("RTX 3090",),
    "V100-32GB": ("Tesla V100",),
    "V100-16GB": ("Tesla V100",),
    "T4": ("Tesla T4",),
    "K80": ("Tesla K80",),
}

_COUNTRY = re.compile(r"^[A-Za-z]{2}$")
_QUOTA = re.compile(r"quota", re.IGNORECASE)
_GONE_CODES = frozenset({"no_such_ask", "ask_not_available", "bid_too_low", "insufficient_disk"})


class _Throttled(TransientError):
    """A 429/503 that named how long to wait."""

    def __init__(self, message: str, code: str, retry_after: float | None) -> None:
        super().__init__(PROVIDER, message, code)
        self.retry_after = retry_after


class _Refused(BadRequestError):
    """A 4xx answer other than auth and throttling; callers turn some into CapacityError."""

    def __init__(self, message: str, status: int, error: str) -> None:
        super().__init__(PROVIDER, message, error or f"http_{status}")
        self.status = status
        self.error = error


def _num(value: Any, default: float = 0.0) -> float:
    """A number the API may send as a number, a string or null."""
    if value is None or value == "":
        return default
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return out if math.isfinite(out) else default


def expected_dlperf(model: str, num_gpus: int) -> float | None:
    spec = GPU_SPECS.get(model)
    if spec is None:
        return None
    return DLPERF_SCALE * math.sqrt(spec.tflops_bf16 * spec.mem_bw_gbps / 1000.0) * num_gpus


def country_of(geolocation: Any) -> str:
    """'Texas, US' → 'US' (Vast's geolocation ends with the country code users filter on)."""
    if not isinstance(geolocation, str) or not geolocation.strip():
        return ""
    code = geolocation.rsplit(",", 1)[-1].strip()
    return code.upper() if _COUNTRY.match(code) else ""


def _retry_after(header: str | None) -> float | None:
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(header) - utcnow()).total_seconds())
    except (TypeError, ValueError):
        return None


def map_instance_state(inst: dict[str, Any]) -> tuple[AllocationState, str]:
    """Vast's actual_status / cur_state / intended_status → AllocationState and a short reason."""
    actual = str(inst.get("actual_status") or "").lower()
    intended = str(inst.get("intended_status") or "").lower()
    cur = str(inst.get("cur_state") or "").lower()
    msg = str(inst.get("status_msg") or "")
    if actual == "running":
        return AllocationState.running, ""
    if inst.get("is_bid") and intended == "running" and cur == "stopped":
        return AllocationState.preempted, "outbid: the interruptible instance was stopped by a higher bid"
    if actual == "exited":
        # The container's command returned; Vast reports no exit code, only a message on errors.
        if "error" in msg.lower():
            return AllocationState.failed, "container exited with an error"
        return AllocationState.succeeded, "container exited"
    if actual in ("", "created", "creating", "scheduling", "loading"):
        return AllocationState.pending, actual or "created"
    if actual in ("stopped", "inactive"):
        return AllocationState.failed, f"instance {actual} outside Lockstep"
    return AllocationState.unknown, actual


class VastProvider(Provider):
    name = PROVIDER

    def __init__(self, config: VastConfig, *, installation: str = "lockstep") -> None:
        self.config = config
        self.installation = installation
        headers = {"Accept": "application/json"}
        if config.api_key is not None:
            headers["Authorization"] = f"Bearer {config.api_key.get_secret_value()}"
        self._client = httpx.AsyncClient(base_url=config.url.rstrip("/"), headers=headers,
                                         timeout=config.timeout_s)
        # Two placements in this process never race for one ask; the API answers the cross-process case.
        self._ask_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def __repr__(self) -> str:
        return f"VastProvider(url={self.config.url!r}, installation={self.installation!r})"

    async def aclose(self) -> None:
        await self._client.aclose()

    # ----------------------------------------------------------------------- HTTP

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Throttled) and exc.retry_after is not None:
            return min(exc.retry_after, self.config.retry_after_max_s)
        backoff = wait_random_exponential(multiplier=self.config.backoff_initial_s, max=self.config.backoff_max_s)
        return float(backoff(state))

    async def _call(self, method: str, path: str, *, body: Any = None,
                    params: dict[str, str] | None = None) -> Any:
        """One API call, retried on TransientError only (bounded, exponential backoff with jitter)."""
        retrying = AsyncRetrying(
            stop=stop_after_attempt(max(1, self.config.max_attempts)),
            wait=self._wait,
            retry=retry_if_exception_type(TransientError),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                result = await self._once(method, path, body, params)
        return result

    async def _once(self, method: str, path: str, body: Any, params: dict[str, str] | None) -> Any:
        what = f"{method} {path}"
        try:
            resp = await self._client.request(method, path, json=body, params=params)
        except httpx.TimeoutException:
            raise TransientError(PROVIDER, f"{what}: timed out", "timeout") from None
        except httpx.TransportError as exc:
            raise TransientError(PROVIDER, f"{what}: {type(exc).__name__}", "network") from None
        status = resp.status_code
        log.debug("vast %s → %s", what, status)
        if status < 300:
            try:
                return resp.json()
            except ValueError:
                raise TransientError(PROVIDER, f"{what}: HTTP {status} with a body that is not JSON",
                                     "bad_json") from None
        error = ""
        try:
            payload = resp.json()
            if isinstance(payload, dict):
                error = str(payload.get("error") or "")[:64]
                text = f"{error} {payload.get('msg') or ''}"
            else:
                text = ""
        except ValueError:
            text = ""
        if status in (401, 403):
            raise ProviderAuthError(PROVIDER, f"{what}: HTTP {status}, the API key was refused",
                                    error or f"http_{status}")
        if status == 429 and _QUOTA.search(text):
            raise QuotaError(PROVIDER, f"{what}: HTTP 429, daily search quota used up (resets 00:00 UTC)",
                             error or "daily_quota")
        if status == 429 or status >= 500:
            raise _Throttled(f"{what}: HTTP {status}", error or f"http_{status}",
                             _retry_after(resp.headers.get("Retry-After")))
        raise _Refused(f"{what}: HTTP {status}", status, error)

    # ----------------------------------------------------------------------- offers

    def search_query(self, query: OfferQuery | None = None) -> dict[str, Any]:
        """The body of ``POST /api/v0/bundles/`` for ``query``: every constraint the API can apply itself."""
        q = query or OfferQuery()
        want_od, want_spot = self._markets(q)
        body: dict[str, Any] = {
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "external": {"eq": False},
        }
        if self.config.verified_only:
            body["verified"] = {"eq": True}
        if q.gpus:
            names = [self._vast_names(g) for g in q.gpus]
            if all(names):  # a model we cannot spell for Vast: do not push down (never return fewer)
                body["gpu_name"] = {"in": sorted({n for group in names for n in group})}
        if q.min_gpus_per_node:
            body["num_gpus"] = {"gte": q.min_gpus_per_node}
        if q.min_gpu_memory_gb:
            body["gpu_ram"] = {"gte": q.min_gpu_memory_gb * 1000.0}  # GB → MB, as the CLI sends it
        floor = max(q.min_reliability or 0.0, self.config.min_reliability)
        if floor > 0:
            body["reliability"] = {"gte": floor}
        if self.config.min_inet_down_mbps > 0:
            body["inet_down"] = {"gte": self.config.min_inet_down_mbps}
        if q.disk_gb:
            body["disk_space"] = {"gte": q.disk_gb}
        codes = sorted({r.upper() for r in q.regions or [] if _COUNTRY.match(r)})
        if codes:
            body["geolocation"] = {"in": codes}
        bid_only = want_spot and not want_od
        if q.max_usd_per_hour is not None:
            # With both markets, an ask that takes no bids may still be cheap enough on demand: no push-down.
            if bid_only:
                body["min_bid"] = {"lte": q.max_usd_per_hour}
            elif not want_spot:
                body["dph_total"] = {"lte": q.max_usd_per_hour}
        body["order"] = [["min_bid" if bid_only else "dph_total", "asc"]]
        body["type"] = "bid" if bid_only else "on-demand"
        body["limit"] = self.config.search_limit
        if q.disk_gb:
            body["allocated_storage"] = q.disk_gb
        return body

    async def offers(self, query: OfferQuery | None = None) -> list[Offer]:
        q = query or OfferQuery()
        want_od, want_spot = self._markets(q)
        if not (want_od or want_spot):
            return []
        data = await self._call("POST", "/api/v0/bundles/", body=self.search_query(q))
        raws = data.get("offers") if isinstance(data, dict) else None
        out: list[Offer] = []
        for raw in raws or []:
            if not isinstance(raw, dict):
                continue
            for offer in self._normalise(raw, q, want_od, want_spot):
                if matches(offer, q):
                    out.append(offer)
        return out

    @staticmethod
    def _markets(q: OfferQuery) -> tuple[bool, bool]:
        if q.markets is None:
            return True, True
        return Market.on_demand in q.markets, Market.spot in q.markets

    @staticmethod
    def _vast_names(model: str) -> tuple[str, ...]:
        return VAST_NAMES.get(model, ())

    def _normalise(self, raw: dict[str, Any], q: OfferQuery, want_od: bool, want_spot: bool) -> list[Offer]:
        gpu_name = str(raw.get("gpu_name") or "")
        num_gpus = int(_num(raw.get("num_gpus")))
        mem_gb = round(_num(raw.get("gpu_ram")) / 1000.0, 2)
        model = normalise_gpu(gpu_name, mem_gb or None)
        ask_id = raw.get("id")
        if model is None or ask_id is None or num_gpus < 1:
            log.debug("vast: skipping ask %s (%r × %s)", ask_id, gpu_name, num_gpus)
            return []
        disk = q.disk_gb if q.disk_gb is not None else DEFAULT_STORAGE_GB
        storage_h = _num(raw.get("storage_cost")) * disk / HOURS_PER_MONTH
        if raw.get("storage_total_cost") is not None:
            compute_h = _num(raw.get("dph_total")) - _num(raw.get("storage_total_cost"))
        else:
            compute_h = _num(raw.get("dph_base"), _num(raw.get("dph_total")))
        inet_down = _num(raw.get("inet_down"))
        inet_up = _num(raw.get("inet_up"))
        dlperf = _num(raw.get("dlperf"))
        expect = expected_dlperf(model, num_gpus)
        perf = None
        if dlperf > 0 and expect:
            perf = Perf(source="dlperf", relative=round(dlperf / expect, 3))
        nvlink = _num(raw.get("bw_nvlink")) > 0 and num_gpus > 1
        locality = Locality(provider=PROVIDER, region=country_of(raw.get("geolocation")),
                            host=str(raw.get("machine_id") or ""))
        network = Network(
            intra=IntraNode.nvlink if nvlink else IntraNode.pcie,
            fabric=Fabric.ethernet,
            fabric_gbps=round(min(inet_up, inet_down) / 1000.0, 3),
            inet_down_mbps=inet_down or None,
            inet_up_mbps=inet_up or None,
        )
        min_bid = raw.get("min_bid")
        attrs = {
            "ask_id": str(ask_id),
            "machine_id": str(raw.get("machine_id") or ""),
            "host_id": str(raw.get("host_id") or ""),
            "vast_gpu_name": gpu_name,
            "geolocation": str(raw.get("geolocation") or ""),
            "pcie_bw": str(_num(raw.get("pcie_bw"))),
            "disk_bw": str(_num(raw.get("disk_bw"))),
            "dlperf": str(dlperf),
            "verified": str(bool(raw.get("verified"))).lower(),
            "dph_total": str(_num(raw.get("dph_total"))),
            "storage_cost": str(_num(raw.get("storage_cost"))),
        }
        if min_bid is not None:
            attrs["min_bid"] = str(_num(min_bid))
        egress = raw.get("inet_up_cost")
        common: dict[str, Any] = dict(
            provider=PROVIDER, sku=f"{num_gpus}x-{model}", gpu=model, gpu_count=num_gpus,
            gpu_memory_gb=mem_gb, vcpus=int(_num(raw.get("cpu_cores_effective"))),
            ram_gb=round(_num(raw.get("cpu_ram")) / 1000.0, 2), disk_gb=_num(raw.get("disk_space")),
            max_nodes=1, colocation=Colocate.node, locality=locality, network=network,
            reliability=_num(raw.get("reliability"), _num(raw.get("reliability2"))) if (
                raw.get("reliability") is not None or raw.get("reliability2") is not None) else None,
            perf=perf,
            egress_usd_per_gb=_num(egress) if egress is not None else self.config.egress_usd_per_gb,
        )
        out: list[Offer] = []
        if want_od:
            out.append(Offer(id=f"vast:{ask_id}", market=Market.on_demand,
                             usd_per_hour=round(max(compute_h, 0.0) + storage_h, 6),
                             attrs=attrs, **common))
        if want_spot and min_bid is not None:
            out.append(Offer(id=f"vast:{ask_id}:spot", market=Market.spot, interruptible=True,
                             usd_per_hour=round(_num(min_bid) + storage_h, 6),
                             attrs=dict(attrs), **common))
        return out

    # ----------------------------------------------------------------------- instances

    def label_for(self, req: LaunchRequest) -> str:
        """The label marking an instance as this installation's, for this job and attempt."""
        return f"lockstep:{self.installation}:{req.job_id}:{req.attempt}"

    def _label_prefix(self) -> str:
        return f"lockstep:{self.installation}:"

    async def _instances(self, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every current instance (all pages of GET /api/v1/instances/)."""
        out: list[dict[str, Any]] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            params = {"limit": str(LIST_PAGE), "order_by": json.dumps([{"col": "id", "dir": "asc"}])}
            if filters:
                params["select_filters"] = json.dumps(filters)
            if token:
                params["after_token"] = token
            data = await self._call("GET", "/api/v1/instances/", params=params)
            page = data.get("instances") if isinstance(data, dict) else None
            out.extend(i for i in page or [] if isinstance(i, dict))
            nxt = data.get("next_token") if isinstance(data, dict) else None
            if not nxt or nxt == token or not page:
                break
            token = str(nxt)
        return out

    async def _find_by_label(self, label: str) -> dict[str, Any] | None:
        for inst in await self._instances({"label": {"eq": label}}):
            if inst.get("label") == label:  # the filter is a hint; the label is the truth
                return inst
        return None

    def _allocation(self, inst: dict[str, Any], *, job_id: str, attempt: int, client_token: str = "",
                    offer: Offer | None = None) -> Allocation:
        state, reason = map_instance_state(inst)
        iid = str(inst.get("id"))
        attrs = {"label": str(inst.get("label") or ""), "machine_id": str(inst.get("machine_id") or ""),
                 "market": Market.spot.value if inst.get("is_bid") else Market.on_demand.value}
        if offer is not None and "ask_id" in offer.attrs:
            attrs["ask_id"] = offer.attrs["ask_id"]
        return Allocation(
            id=f"vast-{iid}", job_id=job_id, attempt=attempt, provider=PROVIDER,
            offer_id=offer.id if offer else "", state=state, client_token=client_token,
            resource_ids=[iid], nodes=1,
            region=offer.region if offer else country_of(inst.get("geolocation")),
            usd_per_hour=offer.usd_per_hour if offer else _num(inst.get("dph_total")),
            reason=reason, attrs=attrs,
        )

    def _create_body(self, req: LaunchRequest, label: str) -> dict[str, Any]:
        spec = req.spec
        bid = None
        if req.offer.market == Market.spot:
            if "min_bid" not in req.offer.attrs:
                raise BadRequestError(PROVIDER, f"offer {req.offer.id} is spot but has no min_bid", "no_bid")
            bid = float(req.offer.attrs["min_bid"])
        return {
            "client_id": "me",
            "image": spec.image,
            "env": {"LOCKSTEP_JOB_ID": req.job_id, "LOCKSTEP_ATTEMPT": str(req.attempt)},
            "price": bid,  # set = an interruptible bid at this $/h; null = on-demand
            "disk": spec.disk_gb,
            "label": label,
            "onstart": spec.command,
            "runtype": "ssh",
            "image_login": None,
            "python_utf8": False,
            "lang_utf8": False,
            "use_jupyter_lab": False,
            "jupyter_dir": None,
            "force": False,
            "cancel_unavail": True,  # fail now rather than queue when the machine cannot host it
        }

    async def launch(self, req: LaunchRequest) -> Allocation:
        ask_id = req.offer.attrs.get("ask_id") or req.offer.id.split(":")[1]
        label = self.label_for(req)

        def done(inst: dict[str, Any]) -> Allocation:
            return self._allocation(inst, job_id=req.job_id, attempt=req.attempt,
                                    client_token=req.client_token, offer=req.offer)

        async with self._ask_locks[ask_id]:
            existing = await self._find_by_label(label)
            if existing is not None:  # idempotent: this job and attempt already hold an instance
                return done(existing)
            try:
                data = await self._call("PUT", f"/api/v0/asks/{ask_id}/", body=self._create_body(req, label))
            except _Refused as exc:
                if exc.status in (404, 410) or exc.error in _GONE_CODES:
                    # A retried create may have succeeded the first time: look before saying no.
                    existing = await self._find_by_label(label)
                    if existing is not None:
                        return done(existing)
                    raise CapacityError(PROVIDER, f"ask {ask_id} is no longer available",
                                        exc.error or f"http_{exc.status}") from None
                raise
            if not isinstance(data, dict) or not data.get("success") or data.get("new_contract") is None:
                code = str(data.get("error") or "create_failed") if isinstance(data, dict) else "create_failed"
                raise CapacityError(PROVIDER, f"ask {ask_id} was not rented", code)
            inst = {"id": data["new_contract"], "label": label, "actual_status": None,
                    "is_bid": req.offer.market == Market.spot, "machine_id": req.offer.attrs.get("machine_id")}
            return done(inst)

    async def poll(self, alloc: Allocation) -> AllocationStatus:
        iid = alloc.resource_ids[0]
        try:
            data = await self._call("GET", f"/api/v0/instances/{iid}/", params={"owner": "me"})
        except _Refused as exc:
            if exc.status == 404:
                return AllocationStatus(state=AllocationState.released, reason="instance no longer exists")
            raise
        inst = data.get("instances") if isinstance(data, dict) else None
        if not isinstance(inst, dict) or not inst:
            return AllocationStatus(state=AllocationState.released, reason="instance no longer exists")
        state, reason = map_instance_state(inst)
        host = str(inst.get("public_ipaddr") or inst.get("ssh_host") or "")
        return AllocationStatus(state=state, reason=reason, hosts=[host] if host else [])

    async def release(self, alloc: Allocation) -> None:
        for iid in alloc.resource_ids:
            try:
                await self._call("DELETE", f"/api/v0/instances/{iid}/", body={})
            except _Refused as exc:
                if exc.status != 404:  # already gone is what we wanted
                    raise

    async def owned(self) -> list[Allocation]:
        prefix = self._label_prefix()
        out: list[Allocation] = []
        for inst in await self._instances():
            label = str(inst.get("label") or "")
            if not label.startswith(prefix):
                continue
            job_id, _, attempt = label[len(prefix):].rpartition(":")
            if not job_id or not attempt.isdigit():
                continue
            out.append(self._allocation(inst, job_id=job_id, attempt=int(attempt)))
        return out
