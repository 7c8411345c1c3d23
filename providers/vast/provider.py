"""Vast.ai marketplace adapter: search asks, rent one, poll it, destroy it, list what we hold.

Talks to the Vast REST API as the official CLI does (shared/vast-api-notes.md): ``POST /api/v0/bundles/`` with the
API's own query operators, ``PUT /api/v0/asks/{id}/`` to rent, ``GET /api/v0/instances/{id}/`` to poll,
``DELETE /api/v0/instances/{id}/`` to release and ``GET /api/v1/instances/`` (paged) to list.

How asks become offers is :mod:`.offers`; the requests Lockstep sends :mod:`.requests`; transport and retries
:mod:`.client`; error mapping :mod:`.errors` (an ask gone or rented → CapacityError).

Capabilities: launches.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from broker.config import VastConfig
from broker.errors import CapacityError
from broker.models import Allocation, AllocationState, AllocationStatus, Market, Offer
from providers.base import LaunchRequest, OfferQuery
from providers.capabilities import Launches
from providers.vast.client import VastClient
from providers.vast.errors import GONE_CODES, PROVIDER, Refused
from providers.vast.offers import country_of, normalise, num, search_query, wanted_markets
from providers.vast.requests import create_body, label_for, label_prefix


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


class VastProvider(Launches):
    name = PROVIDER

    def __init__(self, config: VastConfig, *, installation: str = "lockstep") -> None:
        self.config = config
        self.installation = installation
        self.client = VastClient(config)
        # Two placements in this process never race for one ask; the API answers the cross-process case.
        self._ask_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def __repr__(self) -> str:
        return f"VastProvider(url={self.config.url!r}, installation={self.installation!r})"

    async def aclose(self) -> None:
        await self.client.aclose()

    # ----------------------------------------------------------------------- offers

    async def offers(self, query: OfferQuery | None = None) -> list[Offer]:
        q = query or OfferQuery()
        want_od, want_spot = wanted_markets(q)
        if not (want_od or want_spot):
            return []
        data = await self.client.call("POST", "/api/v0/bundles/", body=search_query(self.config, q))
        raws = data.get("offers") if isinstance(data, dict) else None
        return [o for raw in raws or [] if isinstance(raw, dict)
                for o in normalise(self.config, raw, q, want_od, want_spot)]

    # ----------------------------------------------------------------------- instances

    async def _find_by_label(self, label: str) -> dict[str, Any] | None:
        for inst in await self.client.instances({"label": {"eq": label}}):
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
            usd_per_hour=offer.usd_per_hour if offer else num(inst.get("dph_total")),
            reason=reason, attrs=attrs,
        )

    async def launch(self, req: LaunchRequest) -> Allocation:
        ask_id = req.offer.attrs.get("ask_id") or req.offer.id.split(":")[1]
        label = label_for(self.installation, req)

        def done(inst: dict[str, Any]) -> Allocation:
            return self._allocation(inst, job_id=req.job_id, attempt=req.attempt,
                                    client_token=req.client_token, offer=req.offer)

        async with self._ask_locks[ask_id]:
            existing = await self._find_by_label(label)
            if existing is not None:  # idempotent: this job and attempt already hold an instance
                return done(existing)
            try:
                data = await self.client.call("PUT", f"/api/v0/asks/{ask_id}/", body=create_body(req, label))
            except Refused as exc:
                if exc.status in (404, 410) or exc.error in GONE_CODES:
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
            data = await self.client.call("GET", f"/api/v0/instances/{iid}/", params={"owner": "me"})
        except Refused as exc:
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
                await self.client.call("DELETE", f"/api/v0/instances/{iid}/", body={})
            except Refused as exc:
                if exc.status != 404:  # already gone is what we wanted
                    raise

    async def owned(self) -> list[Allocation]:
        prefix = label_prefix(self.installation)
        out: list[Allocation] = []
        for inst in await self.client.instances():
            label = str(inst.get("label") or "")
            if not label.startswith(prefix):
                continue
            job_id, _, attempt = label[len(prefix):].rpartition(":")
            if not job_id or not attempt.isdigit():
                continue
            out.append(self._allocation(inst, job_id=job_id, attempt=int(attempt)))
        return out
