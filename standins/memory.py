"""An in-memory market that implements the provider interface, for the router's, the lifecycle's and
reconciliation's own logic (which offer next, which state next, what to adopt or release).

It imitates no real market: the adapters are tested against their real parts (tests/aws, tests/vast,
tests/slurm). It keeps what it has launched, honours the idempotency token, and can be told to
refuse a launch, fail after the launch went through, or fail to list what it holds.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from broker.config import BrokerConfig, SecretsConfig, Settings
from broker.lifecycle import JobLifecycle
from broker.market import Marketplace
from broker.models import (
    Allocation,
    AllocationState,
    AllocationStatus,
    Colocate,
    Fabric,
    Job,
    JobExit,
    JobSpec,
    JobState,
    Locality,
    Market,
    Network,
    Offer,
)
from broker.router import PlacementResult, Router
from broker.specs import parse_spec
from providers.base import LaunchRequest, OfferQuery, matches
from providers.capabilities import Launches

if TYPE_CHECKING:
    from broker.store import Store

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
SPEC = {"name": "mem", "gpu": "A10G", "gpus": 1, "markets": ["on_demand"], "workload": {"hours": 1},
        "command": "sleep 600"}


def spec(**kw: object) -> JobSpec:
    return parse_spec({**SPEC, **kw})


def offer(provider: str, oid: str, usd: float, zone: str = "z1", **kw: object) -> Offer:
    """A cloud instance type (several nodes of it to be had, so not a single machine)."""
    base: dict[str, object] = dict(
        id=f"{provider}:{oid}", provider=provider, market=Market.on_demand, sku=f"g5.{oid}", gpu="A10G",
        gpu_count=1, gpu_memory_gb=24, usd_per_hour=usd, max_nodes=4, colocation=Colocate.zone,
        locality=Locality(provider=provider, region="r1", zone=zone),
        network=Network(fabric=Fabric.ethernet, fabric_gbps=25), observed_at=NOW,
    )
    base.update(kw)
    return Offer.model_validate(base)


class MemoryProvider(Launches):
    """Offers from a list; launches kept in a dict. Faults are set per offer id.

    - ``refuse[offer_id] = exc``: launch raises ``exc`` and launches nothing;
    - ``fail_after[offer_id] = exc``: the launch goes through, then ``exc`` is raised (a lost answer);
    - ``owned_error``: ``owned()`` raises it (the provider cannot be listed);
    - ``on_launch(req)``: called first on every launch (to look at the store at that moment).
    """

    def __init__(self, name: str, offers: list[Offer]) -> None:
        self.name = name
        self._offers = offers
        self.refuse: dict[str, Exception] = {}
        self.fail_after: dict[str, Exception] = {}
        self.owned_error: Exception | None = None
        self.on_launch: Callable[[LaunchRequest], None] | None = None
        self.launches: list[LaunchRequest] = []  # every call, refused or not
        self.held: dict[str, Allocation] = {}  # resource id → what it launched
        self.released: list[str] = []
        self.owned_calls = 0
        self.exits: dict[str, JobExit] = {}  # resource id → how its command ended (as a wrapper reports it)
        self._ids = itertools.count(1)

    async def offers(self, query: OfferQuery | None = None) -> list[Offer]:
        return [o for o in self._offers if query is None or matches(o, query)]

    async def launch(self, req: LaunchRequest) -> Allocation:
        self.launches.append(req)
        if self.on_launch is not None:
            self.on_launch(req)
        if req.offer.id in self.refuse:
            raise self.refuse[req.offer.id]
        got = next((a for a in self.held.values() if a.client_token == req.client_token), None)
        if got is None:  # idempotent on the token: a repeat returns what the first call launched
            rid = f"{self.name}-i{next(self._ids)}"
            got = Allocation(id=f"{self.name}-{rid}", job_id=req.job_id, attempt=req.attempt, provider=self.name,
                             offer_id=req.offer.id, state=AllocationState.pending, client_token=req.client_token,
                             resource_ids=[rid], nodes=req.nodes, region=req.offer.region, zone=req.offer.zone,
                             usd_per_hour=req.offer.usd_per_hour)
            self.held[rid] = got
        if req.offer.id in self.fail_after:
            raise self.fail_after[req.offer.id]
        return got

    def hold(self, alloc: Allocation) -> None:
        """Something this installation holds here that the store may not know of (as after a crash)."""
        for rid in alloc.resource_ids:
            self.held[rid] = alloc

    def set_state(self, alloc: Allocation, state: AllocationState) -> None:
        for rid in alloc.resource_ids:
            self.held[rid] = self.held[rid].model_copy(update={"state": state})

    def end(self, alloc: Allocation, exit: JobExit) -> None:
        """The job's command ends (the machine keeps running, as a cloud machine does until released)."""
        for rid in alloc.resource_ids:
            self.exits[rid] = exit

    async def poll(self, alloc: Allocation) -> AllocationStatus:
        got = [self.held[r] for r in alloc.resource_ids if r in self.held]
        if not got:
            return AllocationStatus(state=AllocationState.released, reason="gone")
        exit = self.exits.get(alloc.resource_ids[0])
        if exit is not None:
            state = AllocationState.succeeded if exit.succeeded else AllocationState.failed
            return AllocationStatus(state=state, hosts=[f"host-{r}" for r in alloc.resource_ids], exit=exit)
        return AllocationStatus(state=got[0].state, hosts=[f"host-{r}" for r in alloc.resource_ids])

    async def release(self, alloc: Allocation) -> None:
        for rid in alloc.resource_ids:
            if self.held.pop(rid, None) is not None:
                self.released.append(rid)

    async def owned(self) -> list[Allocation]:
        self.owned_calls += 1
        if self.owned_error is not None:
            raise self.owned_error
        return list({id(a): a for a in self.held.values()}.values())


class Clock:
    """A clock a test moves by hand (``clock.now = …``), starting at :data:`NOW`."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now


async def poll(life: JobLifecycle, market: Launches, alloc_id: str) -> JobState | None:
    """What the poll loop does for one allocation: ask its market, let the lifecycle follow."""
    alloc = life.store.get_allocation(alloc_id)
    status = await market.poll(alloc)
    return await life.follow(alloc, status.state, status.reason, status.hosts, status.exit)


def clock() -> datetime:
    return NOW


async def router_over(store: Store, *providers: MemoryProvider, tries: int = 4,
                      secrets: SecretsConfig | None = None) -> Router:
    """A router over these in-memory markets (refreshed once) and ``store``."""
    settings = Settings(broker=BrokerConfig(installation="mem", max_launch_tries=tries),
                        secrets=secrets or SecretsConfig())
    market = Marketplace({p.name: p for p in providers}, clock=clock)
    health = await market.refresh()
    assert all(h.ok for h in health.values()), health
    return Router(settings, store, market, clock=clock)


async def submit_and_place(store: Store, router: Router, **spec_fields: object) -> PlacementResult:
    """Store a job, claim it as a worker would, and let the router place it."""
    job, _ = store.create_job(Job(id="j" + secrets.token_hex(6), spec=spec(**spec_fields), created_at=NOW,
                                  updated_at=NOW))
    claimed = await JobLifecycle(store).claim(job.id, "test-worker")
    assert claimed is not None and claimed.state is JobState.placing
    return await router.place(claimed)


async def placed_job(store: Store, usd_per_hour: float = 2.0) -> tuple[MemoryProvider, Job, Allocation]:
    """A job placed (provisioning) on a fresh in-memory market "mem", and its allocation."""
    mem = MemoryProvider("mem", [offer("mem", "a", usd_per_hour)])
    res = await submit_and_place(store, await router_over(store, mem))
    assert res.placed, res.reason
    [alloc] = store.allocations(res.job.id)
    return mem, res.job, alloc
