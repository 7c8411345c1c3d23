"""Vast.ai marketplace adapter: search asks, rent one, poll it, destroy it, list what we hold.

Talks to the Vast REST API as the official CLI does (shared/vast-api-notes.md): ``POST /api/v0/bundles/`` with the
API's own query operators, ``PUT /api/v0/asks/{id}/`` to rent, ``GET /api/v0/instances/{id}/`` to poll,
``DELETE /api/v0/instances/{id}/`` to release and ``GET /api/v1/instances/`` (paged) to list.

How asks become offers is :mod:`.offers`; the requests Lockstep sends :mod:`.requests`; the run-time contract
(the wrapper and its manifest in the create body, the exit status from the log) :mod:`.runtime`; transport and
retries :mod:`.client`; error mapping :mod:`.errors` (an ask gone or rented → CapacityError).

A job's container runs its command and exits (``runtype: "args"``); ``poll`` then reads the container's log
through Vast's logs API (``PUT /api/v0/instances/request_logs/{id}/``) for the wrapper's ``LOCKSTEP-EXIT``
line and answers succeeded/failed with the exit, and the lifecycle destroys the instance in the same poll.

Capabilities: launches, job logs.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, defaultdict
from typing import Any

from broker.config import VastConfig
from broker.errors import CapacityError
from broker.models import PER_SECOND, Allocation, AllocationState, AllocationStatus, ExitReason, Market, Offer
from providers.base import LaunchRequest, OfferQuery
from providers.capabilities import HasJobLogs
from providers.vast.client import VastClient
from providers.vast.errors import GONE_CODES, PROVIDER, Refused
from providers.vast.offers import country_of, normalise, num, search_query, wanted_markets
from providers.vast.requests import create_body, label_for, label_prefix
from providers.vast.runtime import image_login, node_env, node_exit, node_manifest, single_node

FINAL_LOGS_KEPT = 256  # ended nodes' last logs kept in memory: Vast's go with the destroyed instance


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
        # The container's command returned. Vast reports no exit code: it is in the log (poll reads it), so
        # until then the allocation is still live, and polled.
        return AllocationState.unknown, "container exited" + (f": {msg[:200]}" if msg else "")
    if actual in ("", "created", "creating", "scheduling", "loading"):
        return AllocationState.pending, actual or "created"
    if actual in ("stopped", "inactive"):
        return AllocationState.failed, f"instance {actual} outside Lockstep"
    return AllocationState.unknown, actual


class VastProvider(HasJobLogs):
    name = PROVIDER
    billing = PER_SECOND  # Vast bills a rented instance per second

    def __init__(self, config: VastConfig, *, installation: str = "lockstep") -> None:
        self.config = config
        self.installation = installation
        self.client = VastClient(config)
        # Two placements in this process never race for one ask; the API answers the cross-process case.
        self._ask_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # instance id → the log read when its container had exited: served by job_log once the instance (and
        # Vast's copy of its log) is destroyed.
        self._final_logs: OrderedDict[str, str] = OrderedDict()

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
            run = req.run_request()
            # One machine, rank 0 of 1; a multi-machine launch makes one body per rank, with a peers rendezvous.
            body = create_body(req, label, env=node_env(run, node_manifest(run, rendezvous=single_node())),
                               image_login=image_login(run))
            try:
                data = await self.client.call("PUT", f"/api/v0/asks/{ask_id}/", body=body)
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

    async def _instance(self, iid: str) -> dict[str, Any] | None:
        """The instance as Vast shows it now; None when it no longer exists."""
        try:
            data = await self.client.call("GET", f"/api/v0/instances/{iid}/", params={"owner": "me"})
        except Refused as exc:
            if exc.status == 404:
                return None
            raise
        inst = data.get("instances") if isinstance(data, dict) else None
        return inst if isinstance(inst, dict) and inst else None

    async def poll(self, alloc: Allocation) -> AllocationStatus:
        iid = alloc.resource_ids[0]
        inst = await self._instance(iid)
        if inst is None:  # the lifecycle requeues the job it held (a preemption, counted, with this reason)
            return AllocationStatus(state=AllocationState.released,
                                    reason=f"Vast instance {iid} vanished: destroyed outside Lockstep or lost "
                                           f"with its host")
        state, reason = map_instance_state(inst)
        host = str(inst.get("public_ipaddr") or inst.get("ssh_host") or "")
        hosts = [host] if host else []
        if str(inst.get("actual_status") or "").lower() != "exited":
            return AllocationStatus(state=state, reason=reason, hosts=hosts)
        # The container has exited: how its command ended is the last line of its log.
        log = await self.client.instance_log(iid, tail=self.config.log_tail_lines)
        self._keep_final_log(iid, log)
        end = node_exit(log, str(inst.get("status_msg") or ""))
        if state is AllocationState.preempted and end.reason in (ExitReason.signal, ExitReason.error):
            return AllocationStatus(state=state, reason=reason, hosts=hosts)  # outbid: the TERM was Vast's
        return AllocationStatus(state=AllocationState.succeeded if end.succeeded else AllocationState.failed,
                                reason=end.describe(), hosts=hosts, exit=end)

    def _keep_final_log(self, iid: str, log: str) -> None:
        self._final_logs[iid] = log
        self._final_logs.move_to_end(iid)
        while len(self._final_logs) > FINAL_LOGS_KEPT:
            self._final_logs.popitem(last=False)

    async def job_log(self, alloc: Allocation, *, rank: int = 0) -> str:
        """The node's container log through Vast's logs API: the wrapper's time-stamped lines, then its
        ``LOCKSTEP-EXIT`` line once the command has ended. An ended node's last log is kept in memory, since
        Vast's goes with the instance when it is destroyed ('' when neither is there)."""
        if rank >= len(alloc.resource_ids):
            return ""
        iid = alloc.resource_ids[rank]
        if iid in self._final_logs:
            return self._final_logs[iid]
        try:
            return await self.client.instance_log(iid, tail=self.config.log_tail_lines)
        except Refused as exc:
            if exc.status == 404:  # destroyed: its log is gone with it
                return ""
            raise

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
