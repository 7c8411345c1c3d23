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

A multi-node job may be assembled from several machines (policies/assembly.py; capability ``AssemblesNodes``):
``launch`` then rents every member or none (one failed rent destroys those already rented), labels each
machine ``<label>#<rank>``, and gives each the same rendezvous with its own rank; ``poll`` follows them all.

Capabilities: launches, job logs, assembles nodes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, defaultdict
from datetime import UTC, datetime
from typing import Any

from broker.errors import BadRequestError, CapacityError
from broker.models import (
    Allocation,
    AllocationState,
    AllocationStatus,
    Billing,
    ExitReason,
    JobExit,
    Market,
    Offer,
)
from providers.base import LaunchRequest, OfferQuery
from providers.capabilities import AssemblesNodes, HasJobLogs, ReportsEnd
from providers.runtime.manifest import exit_nonce
from providers.vast.client import VastClient
from providers.vast.config import VastConfig
from providers.vast.errors import GONE_CODES, PROVIDER, Refused
from providers.vast.offers import country_of, normalise, num, search_query, wanted_markets
from providers.vast.requests import create_body, label_for, label_prefix, member_label, parse_label
from providers.vast.runtime import (
    IDENTITY_PORT,
    head_env,
    image_login,
    node_env,
    node_exit,
    node_manifest,
    peers_env,
    single_node,
)

log = logging.getLogger(__name__)

FINAL_LOGS_KEPT = 256  # ended nodes' last logs kept in memory: Vast's go with the destroyed instance
PORTS_POLL_S = 1.0  # how often a multi-machine launch looks for its head's mapped port (one list call each)


def identity_port(inst: dict[str, Any]) -> int | None:
    """The port Vast chose for the head's ``-p 70000:70000`` (identity form: the same number inside and out),
    from the instance's ``ports`` (docker's ``{"X/tcp": [{"HostPort": "X"}]}``); None until it shows."""
    ports = inst.get("ports")
    if not isinstance(ports, dict):
        return None
    for key, binds in ports.items():
        inner = str(key).split("/")[0]
        if not inner.isdigit() or inner == "22" or not isinstance(binds, list):
            continue
        for bind in binds:
            outer = str(bind.get("HostPort") or "") if isinstance(bind, dict) else ""
            if outer.isdigit() and (outer == inner or int(inner) == IDENTITY_PORT):
                return int(outer)
    return None


def map_instance_state(inst: dict[str, Any], *, bid: bool = False) -> tuple[AllocationState, str]:
    """Vast's actual_status / cur_state / intended_status → AllocationState and a short reason.

    ``bid``: the instance was rented as an interruptible bid. Vast's instance rows do not say so (``is_bid`` is
    a field of offers, not of instances): the allocation remembers it from the launch. An interruptible instance
    its renter still wants running (``intended_status``) that its host has stopped was outbid."""
    actual = str(inst.get("actual_status") or "").lower()
    intended = str(inst.get("intended_status") or "").lower()
    cur = str(inst.get("cur_state") or "").lower()
    msg = str(inst.get("status_msg") or "")
    if actual == "running":
        return AllocationState.running, ""
    bid = bid or bool(inst.get("is_bid"))  # an older row shape that carried it
    stopped = cur == "stopped" or actual in ("exited", "stopped", "inactive", "offline")
    if bid and intended == "running" and stopped:
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


class VastProvider(HasJobLogs, AssemblesNodes, ReportsEnd):
    name = PROVIDER
    # Vast charges an instance's price for its exact running time (its record: start_date to destruction, × dph),
    # not whole seconds rounded up: booked the same way, a job of a few seconds books what the market did.
    billing = Billing(increment_s=0)

    def __init__(self, config: VastConfig, *, installation: str = "lockstep") -> None:
        self.config = config
        self.installation = installation
        self.client = VastClient(config)
        # Two placements in this process never race for one ask; the API answers the cross-process case.
        self._ask_locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # instance id → the log read when its container had exited: served by job_log once the instance (and
        # Vast's copy of its log) is destroyed.
        self._final_logs: OrderedDict[str, str] = OrderedDict()
        # The account's instance list, read once for a poll round: (loop time read, instances by id).
        self._listing: tuple[float, dict[str, dict[str, Any]]] | None = None
        self._listing_lock = asyncio.Lock()

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
                    offer: Offer | None = None, more: list[dict[str, Any]] | None = None) -> Allocation:
        """The allocation of one machine, or of several (``more``: the machines of ranks 1…N−1)."""
        insts = [inst, *(more or [])]
        bid = offer.market == Market.spot if offer is not None else bool(inst.get("is_bid"))
        state, reason = map_instance_state(inst, bid=bid)
        iid = str(inst.get("id"))
        attrs = {"label": str(inst.get("label") or ""),
                 "machine_id": ",".join(str(i.get("machine_id") or "") for i in insts),
                 "market": Market.spot.value if bid else Market.on_demand.value}
        if offer is not None and "ask_id" in offer.attrs:
            attrs["ask_id"] = offer.attrs["ask_id"]
        return Allocation(
            id=f"vast-{iid}", job_id=job_id, attempt=attempt, provider=PROVIDER,
            offer_id=offer.id if offer else "", state=state, client_token=client_token,
            resource_ids=[str(i.get("id")) for i in insts], nodes=len(insts),
            region=offer.region if offer else country_of(inst.get("geolocation")),
            usd_per_hour=offer.usd_per_hour if offer else num(inst.get("dph_total")),
            reason=reason, attrs=attrs,
        )

    async def launch(self, req: LaunchRequest) -> Allocation:
        if req.members:
            return await self.launch_members(req)
        label = label_for(self.installation, req)
        run = req.run_request()
        # One machine, rank 0 of 1; a multi-machine launch makes one body per rank, with a peers rendezvous.
        env = node_env(run, node_manifest(run, rendezvous=single_node()))
        # Idempotent: this job and attempt may already hold an instance (looked for under the ask's lock).
        inst = await self._rent(req, req.offer, label, env, look_first=True)
        return self._allocation(inst, job_id=req.job_id, attempt=req.attempt, client_token=req.client_token,
                                offer=req.offer)

    async def _rent(self, req: LaunchRequest, offer: Offer, label: str, env: dict[str, str], *,
                    look_first: bool = False) -> dict[str, Any]:
        """Rent one machine (``offer``) labelled ``label``: the instance as far as we know it. An ask gone →
        CapacityError, unless a retried create went through the first time (found by its label).
        ``look_first``: an instance already labelled ``label`` is returned without renting."""
        ask_id = offer.attrs.get("ask_id") or offer.id.split(":")[1]
        async with self._ask_locks[ask_id]:
            if look_first and (existing := await self._find_by_label(label)) is not None:
                return existing
            body = create_body(req.model_copy(update={"offer": offer}), label, env=env,
                               image_login=image_login(req.run_request()))
            try:
                data = await self.client.call("PUT", f"/api/v0/asks/{ask_id}/", body=body, slow=True)
            except Refused as exc:
                if exc.status in (404, 410) or exc.error in GONE_CODES:
                    existing = await self._find_by_label(label)
                    if existing is not None:
                        return existing
                    raise CapacityError(PROVIDER, f"ask {ask_id} is no longer available",
                                        exc.error or f"http_{exc.status}") from None
                raise
        self._listing = None  # the account changed: the next poll reads the list afresh
        if not isinstance(data, dict) or not data.get("success") or data.get("new_contract") is None:
            code = str(data.get("error") or "create_failed") if isinstance(data, dict) else "create_failed"
            raise CapacityError(PROVIDER, f"ask {ask_id} was not rented", code)
        return {"id": data["new_contract"], "label": label, "actual_status": None,
                "is_bid": offer.market == Market.spot, "machine_id": offer.attrs.get("machine_id")}

    async def _labelled(self, labels: list[str]) -> dict[str, dict[str, Any]]:
        """This account's instances carrying one of ``labels``, by label."""
        wanted = set(labels)
        return {str(i.get("label")): i for i in await self.client.instances({"label": {"in": labels}})
                if i.get("label") in wanted}

    async def launch_members(self, req: LaunchRequest) -> Allocation:
        """Rent every machine of an assembled offer, or none: when one rent fails, every machine of this
        attempt (found by label too, so a create whose answer was lost is not left behind) is destroyed
        before the error is raised. Each machine gets the same rendezvous with its own rank; the addresses
        are the machines' public addresses, which Vast shows with the ask.

        On Vast a container's port is reachable only through the external port Vast maps it to, chosen when the
        container is created. So the head (rank 0) is rented first with Vast's identity form (``-p 70000:70000``:
        a free port X mapped X:X, which its container reads from ``VAST_TCP_PORT_70000``); once its instance
        shows X (``vast.ports_wait_s`` at most), the other machines are rented with X as the rendezvous port,
        and every rank dials ``<head's public address>:X``."""
        members = req.members
        addrs = [m.attrs.get("public_ipaddr", "") for m in members]
        if len(members) < 2 or not all(addrs):
            raise BadRequestError(PROVIDER, f"offer {req.offer.id}: an assembly needs two or more machines with "
                                            f"a public address", "bad_assembly")
        base = label_for(self.installation, req)
        labels = [member_label(base, rank, len(members)) for rank in range(len(members))]
        run = req.run_request()
        manifest = node_manifest(run, rendezvous={"mode": "env"})
        existing = await self._labelled(labels)  # idempotent: a repeated launch rents only what is missing
        insts: list[dict[str, Any]] = []
        try:
            port = 0
            for rank, (offer, label) in enumerate(zip(members, labels, strict=True)):
                inst = existing.get(label)
                if inst is None:
                    extra = head_env(addrs) if rank == 0 else peers_env(rank, addrs, port)
                    inst = await self._rent(req, offer, label, {**node_env(run, manifest), **extra})
                insts.append(inst)
                if rank == 0:
                    port = await self._head_port(str(inst.get("id")))
        except BaseException as exc:
            await self._destroy_attempt(labels, [str(i.get("id")) for i in insts], why=str(exc))
            raise
        return self._allocation(insts[0], job_id=req.job_id, attempt=req.attempt, client_token=req.client_token,
                                offer=req.offer, more=insts[1:])

    async def _head_port(self, iid: str) -> int:
        """The head's rendezvous port, once Vast shows its identity mapping (read from the instance list)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.config.ports_wait_s
        while True:
            inst = (await self._rows([iid], fresh=True)).get(iid)
            if inst is None:
                raise CapacityError(PROVIDER, f"the head machine (instance {iid}) vanished before it showed its "
                                              f"rendezvous port", "head_gone")
            port = identity_port(inst)
            if port is not None:
                return port
            state, why = map_instance_state(inst)
            if state in (AllocationState.failed, AllocationState.preempted) or (
                    str(inst.get("actual_status") or "").lower() == "exited"):
                raise CapacityError(PROVIDER, f"the head machine (instance {iid}) stopped before it showed its "
                                              f"rendezvous port: {why or inst.get('status_msg') or 'exited'}",
                                    "head_failed")
            if loop.time() >= end:
                raise CapacityError(PROVIDER, f"the head machine (instance {iid}) showed no mapped rendezvous port "
                                              f"within {self.config.ports_wait_s:g} s (vast.ports_wait_s)",
                                    "head_no_port")
            await asyncio.sleep(PORTS_POLL_S)

    async def _rows(self, ids: list[str], *, fresh: bool = False) -> dict[str, dict[str, Any]]:
        """The account's instances by id, from one read of the instance list per poll round: a read younger than
        ``vast.list_reuse_s`` serves every poll (Vast rate-limits per endpoint and key; one call per instance
        per round would hit it). An id missing from a reused read is read again before it counts as gone."""
        loop = asyncio.get_running_loop()
        async with self._listing_lock:
            cached = self._listing
            if (not fresh and cached is not None and loop.time() - cached[0] <= self.config.list_reuse_s
                    and all(i in cached[1] for i in ids)):
                return cached[1]
            rows = {str(i.get("id")): i for i in await self.client.instances()}
            self._listing = (loop.time(), rows)
            return rows

    async def _destroy_attempt(self, labels: list[str], ids: list[str], *, why: str) -> None:
        """Give back every machine a failed multi-machine launch rented (never raises: the launch's own
        error is what the caller reports; a machine left behind here is found by ``owned`` and reconciled)."""
        try:
            found = [str(i.get("id")) for i in (await self._labelled(labels)).values()]
        except Exception as exc:  # cannot list: destroy what we know of
            log.warning("vast: cannot list the machines of a failed launch: %s", exc)
            found = []
        for iid in dict.fromkeys([*ids, *found]):
            try:
                await self.client.call("DELETE", f"/api/v0/instances/{iid}/", body={})
            except Refused as exc:
                if exc.status != 404:
                    log.warning("vast: destroying instance %s of a failed launch: %s", iid, exc)
            except Exception as exc:
                log.warning("vast: destroying instance %s of a failed launch: %s", iid, exc)
        log.info("vast: multi-machine launch failed (%s); released %d machine(s)", why[:200],
                 len(dict.fromkeys([*ids, *found])))

    async def poll(self, alloc: Allocation) -> AllocationStatus:
        if alloc.nodes > len(alloc.resource_ids):  # a multi-machine launch cut short (by a crash): never started
            return AllocationStatus(state=AllocationState.released,
                                    reason=f"only {len(alloc.resource_ids)} of the {alloc.nodes} machines of this "
                                           f"attempt were rented (a launch cut short)")
        if len(alloc.resource_ids) > 1:
            return await self._poll_machines(alloc)
        iid = alloc.resource_ids[0]
        bid = alloc.attrs.get("market") == Market.spot.value
        inst = (await self._rows(alloc.resource_ids)).get(iid)
        if inst is None:  # the lifecycle requeues the job it held (a preemption, counted, with this reason)
            return AllocationStatus(state=AllocationState.released,
                                    reason=f"Vast instance {iid} vanished: destroyed outside Lockstep or lost "
                                           f"with its host")
        state, reason = map_instance_state(inst, bid=bid)
        host = str(inst.get("public_ipaddr") or inst.get("ssh_host") or "")
        hosts = [host] if host else []
        # Billing follows Vast's own record: the instance's start, once it runs (or has run).
        started = _started(inst) if state is not AllocationState.pending else None
        if str(inst.get("actual_status") or "").lower() != "exited":
            return AllocationStatus(state=state, reason=reason, hosts=hosts, started_at=started,
                                    usd_per_hour=_price(inst))
        # The container has exited: how its command ended is the last line of its log.
        log = await self.client.instance_log(iid, tail=self.config.log_tail_lines)
        self._keep_final_log(iid, log)
        end = node_exit(log, str(inst.get("status_msg") or ""), exit_nonce(alloc.job_id, alloc.attempt))
        if state is AllocationState.preempted and end.reason in (ExitReason.signal, ExitReason.error):
            return AllocationStatus(state=state, reason=reason, hosts=hosts)  # outbid: the TERM was Vast's
        return AllocationStatus(state=AllocationState.succeeded if end.succeeded else AllocationState.failed,
                                reason=end.describe(), hosts=hosts, exit=end, started_at=started,
                                usd_per_hour=_price(inst))

    async def end_reported(self, alloc: Allocation) -> bool:
        """A machine's container has exited (its wrapper's last line is the exit status): one read of the
        instance list, shared with the polls within ``vast.list_reuse_s`` (Vast's rate limit decides how soon)."""
        rows = await self._rows(alloc.resource_ids)
        return any(str((rows.get(i) or {}).get("actual_status") or "").lower() == "exited"
                   for i in alloc.resource_ids)

    async def _node_end(self, iid: str, inst: dict[str, Any], nonce: str) -> JobExit:
        """How an exited machine's command ended (its log read once, then kept)."""
        text = self._final_logs.get(iid)
        if text is None:
            text = await self.client.instance_log(iid, tail=self.config.log_tail_lines)
            self._keep_final_log(iid, text)
        return node_exit(text, str(inst.get("status_msg") or ""), nonce)

    async def _poll_machines(self, alloc: Allocation) -> AllocationStatus:
        """Several machines as one allocation: one gone → released (the job is requeued and the rest
        destroyed), one preempted → preempted, one failed → failed (the rest are destroyed with it), all
        ended well → succeeded, all running (or ended well) → running, else pending."""
        rows = await self._rows(alloc.resource_ids)
        insts = [rows.get(i) for i in alloc.resource_ids]
        bid = alloc.attrs.get("market") == Market.spot.value
        hosts = [str(i.get("public_ipaddr") or i.get("ssh_host") or "") if i else "" for i in insts]
        for rank, (iid, inst) in enumerate(zip(alloc.resource_ids, insts, strict=True)):
            if inst is None:
                return AllocationStatus(state=AllocationState.released, hosts=hosts,
                                        reason=f"Vast instance {iid} (rank {rank}) vanished: destroyed outside "
                                               f"Lockstep or lost with its host")
        states: list[AllocationState] = []
        ended: list[JobExit] = []
        for rank, (iid, inst) in enumerate(zip(alloc.resource_ids, insts, strict=True)):
            assert inst is not None
            state, reason = map_instance_state(inst, bid=bid)
            if str(inst.get("actual_status") or "").lower() == "exited":
                end = await self._node_end(iid, inst, exit_nonce(alloc.job_id, alloc.attempt))
                if state is AllocationState.preempted and end.reason in (ExitReason.signal, ExitReason.error):
                    return AllocationStatus(state=state, reason=f"rank {rank}: {reason}", hosts=hosts)
                if not end.succeeded:
                    return AllocationStatus(state=AllocationState.failed, hosts=hosts, exit=end,
                                            reason=f"rank {rank}: {end.describe()}")
                ended.append(end)
                continue
            if state in (AllocationState.preempted, AllocationState.failed):
                return AllocationStatus(state=state, reason=f"rank {rank}: {reason}", hosts=hosts)
            states.append(state)
        if len(ended) == len(insts):
            return AllocationStatus(state=AllocationState.succeeded, reason=ended[0].describe(), hosts=hosts,
                                    exit=ended[0])
        if all(s is AllocationState.running for s in states):
            return AllocationStatus(state=AllocationState.running, hosts=hosts)
        return AllocationStatus(state=AllocationState.pending, hosts=hosts,
                                reason=f"{states.count(AllocationState.running)} of {len(insts)} machines running")

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
        self._listing = None
        for iid in alloc.resource_ids:
            try:
                await self.client.call("DELETE", f"/api/v0/instances/{iid}/", body={})
            except Refused as exc:
                if exc.status != 404:  # already gone is what we wanted
                    raise

    async def owned(self) -> list[Allocation]:
        prefix = label_prefix(self.installation)
        attempts: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
        counts: dict[tuple[str, int], int] = {}
        for inst in await self.client.instances():
            parsed = parse_label(prefix, str(inst.get("label") or ""))
            if parsed is not None:  # one attempt's machines together, by rank
                job_id, attempt, rank, count = parsed
                attempts.setdefault((job_id, attempt), {})[rank] = inst
                counts[(job_id, attempt)] = max(count, counts.get((job_id, attempt), 1))
        out: list[Allocation] = []
        for key, by_rank in attempts.items():
            insts = [by_rank[r] for r in sorted(by_rank)]
            alloc = self._allocation(insts[0], job_id=key[0], attempt=key[1], more=insts[1:])
            # A launch a crash cut short holds fewer machines than its labels say: poll answers it as lost.
            out.append(alloc.model_copy(update={"nodes": counts[key]}) if counts[key] > alloc.nodes else alloc)
        return out


def _started(inst: dict[str, Any]) -> datetime | None:
    """When Vast started the instance (its ``start_date``, epoch seconds), where it says."""
    value = inst.get("start_date")
    try:
        return datetime.fromtimestamp(float(value), UTC) if value else None
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _price(inst: dict[str, Any]) -> float | None:
    """What Vast charges for the instance per hour (``dph_total``: the rental and its disk), where it says."""
    try:
        value = float(inst.get("dph_total") or 0)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None
