"""The operations users have. The CLI and the HTTP API are thin shells over this class.

``Lockstep`` owns the market (offer book) and the store; each public method is
one user-facing operation. Blocking store calls run in a worker thread so the
event loop (API, broker loops) never waits on the database.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from broker.config import Settings
from broker.errors import NotFoundError, ProviderError, SpecError
from broker.lifecycle import JobLifecycle
from broker.market import Marketplace, ProviderHealth
from broker.models import (
    TERMINAL_STATES,
    Allocation,
    AllocationState,
    GpuSummary,
    Job,
    JobSpec,
    JobState,
    Market,
    Offer,
    PricePoint,
    PriceSeries,
    Quote,
    utcnow,
)
from policies.offers import OfferFilter, gpu_summary, select
from policies.ranking import quote as rank_quote
from providers.base import Provider
from providers.capabilities import DrainsNodes
from providers.registry import build_providers

if TYPE_CHECKING:
    from broker.burnin import BurnIn
    from broker.loops import BrokerLoops
    from broker.store import Store

log = logging.getLogger(__name__)

UNHEALTHY_CACHE_S = 1.0


def new_job_id() -> str:
    """Time-ordered, unguessable: 'j' + milliseconds (hex) + 8 random hex digits."""
    return f"j{int(time.time() * 1000):011x}{secrets.token_hex(4)}"


class Lockstep:
    def __init__(
        self,
        settings: Settings,
        *,
        providers: dict[str, Provider] | None = None,
        only_providers: list[str] | None = None,
        store: Store | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.settings = settings
        self.clock = clock
        if providers is None:
            providers = build_providers(settings, only=only_providers)
        self.market = Marketplace(providers, timeout_s=settings.broker.provider_timeout_s, clock=clock,
                                  after_refresh=self._after_refresh)
        self._store = store
        self.quote_observer: Callable[[float], None] | None = None  # metrics hook
        self.job_submitted = asyncio.Event()  # wakes the placement loop early
        self.placement_observer: Callable[[str, str], None] | None = None  # metrics hook: (provider, outcome)
        self._broker: BrokerLoops | None = None
        self._preemption_rates: dict[tuple[str, str, str], float] = {}
        self._background: list[asyncio.Task[None]] = []
        self._stop_tracker: asyncio.Event | None = None
        self._tracker: Any = None
        self._unhealthy_cache: tuple[float, dict[tuple[str, str], str]] | None = None

    # ------------------------------------------------------------------ plumbing
    @property
    def store(self) -> Store:
        if self._store is None:
            from broker.store import Store

            self._store = Store(self.settings.db_url)
            self._store.migrate()
        return self._store

    @property
    def has_store(self) -> bool:
        return self._store is not None

    async def db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a blocking store call off the event loop."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def aclose(self) -> None:
        await self.market.aclose()
        if self._store is not None:
            self._store.close()

    async def refresh(self) -> dict[str, ProviderHealth]:
        return await self.market.refresh()

    @property
    def broker(self) -> BrokerLoops:
        """The placement and polling engine over this service's store and market."""
        if self._broker is None:
            from broker.burnin import collect_burnin, job_stem
            from broker.loops import BrokerLoops

            self._broker = BrokerLoops(
                self.settings, self.store, self.market, clock=self.clock, preemption_rates=self.preemption_rates,
                on_placed=self.placement_observer, wake=self.job_submitted,
                burn_in=lambda job, alloc: collect_burnin(self.burnin, alloc.provider, job_stem(job.id, alloc.attempt)))
        return self._broker

    @property
    def burnin(self) -> BurnIn:
        """What burn-in and benchmark recording (broker.burnin) use: the store, settings, providers, drain."""
        from broker.burnin import BurnIn

        return BurnIn(self.settings, self.store, self.market.providers, self.drain_node, self.resume_node)

    def preemption_rates(self) -> dict[tuple[str, str, str], float]:
        """Observed preemptions per hour by (provider, zone, sku); the tracker fills it when running."""
        return dict(self._preemption_rates)

    async def start(self) -> None:
        """Start the broker loops: reconcile, then refresh / place / poll (and the tracker when configured)."""
        await self.broker.start()
        self._background = []
        try:
            from broker.tracker import Tracker
        except ImportError:
            return
        self._stop_tracker = asyncio.Event()
        self._tracker = Tracker(self.settings, self.store, self.market.providers, clock=self.clock)
        self._background.append(asyncio.create_task(self._tracker.run_forever(self._stop_tracker)))

    async def stop(self) -> None:
        if self._stop_tracker is not None:
            self._stop_tracker.set()
        for t in self._background:
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._broker is not None:
            await self._broker.stop()

    async def place_now(self, job_ids: list[str] | None = None) -> None:
        """One placement pass in this process (the CLI without a server uses it)."""
        await self.ensure_offers()
        await self.broker.place_pending(job_ids)

    async def poll_now(self) -> None:
        await self.broker.poll_once()

    async def ensure_offers(self) -> None:
        if self.market.refreshed_at is None:
            await self.market.refresh()

    async def _after_refresh(self) -> None:
        """After each market refresh: measured performance and spot risk from the store."""
        if self._store is None:
            return
        from broker.tracker import load_preemption_rates
        from policies.health import perf_from_benchmark

        benches = await self.db(self._store.benchmarks)
        self.market.measured = {(b.provider, b.target): perf_from_benchmark(b, b.gpu or None)
                                for b in benches if b.healthy}
        self._preemption_rates = await self.db(load_preemption_rates, self._store, self.clock())

    async def unhealthy_nodes(self) -> dict[tuple[str, str], str]:
        """Nodes marked unhealthy, cached for a second: a quote must not pay a database round trip.

        A drain through this service clears the cache at once; other writers are seen within a second.
        """
        if self._store is None:
            return {}
        now = time.monotonic()
        if self._unhealthy_cache is None or now >= self._unhealthy_cache[0]:
            self._unhealthy_cache = (now + UNHEALTHY_CACHE_S, await self.db(self._unhealthy))
        return self._unhealthy_cache[1]

    def _unhealthy(self) -> dict[tuple[str, str], str]:
        if self._store is None:
            return {}
        return self._store.unhealthy_nodes()

    # ------------------------------------------------------------------ operations
    async def quote(self, spec: JobSpec, *, top: int = 10, max_rejected: int | None = None) -> Quote:
        """Ranked options for ``spec`` with the reason for every rejected offer."""
        await self.ensure_offers()
        unhealthy = await self.unhealthy_nodes()
        started = time.perf_counter()
        book = self.market.book(unhealthy_hosts=unhealthy, preemption_rates=self.preemption_rates())
        result = rank_quote(book, spec, now=self.clock(), top=top, max_rejected=max_rejected)
        if self.quote_observer:
            self.quote_observer(time.perf_counter() - started)
        return result

    async def offers(self, f: OfferFilter, limit: int | None = None) -> list[Offer]:
        await self.ensure_offers()
        return select(self.market.offers(), f, limit)

    async def gpus(self, models: list[str] | None = None) -> list[GpuSummary]:
        """Per GPU model in the current book: markets, regions, units and $/GPU-hour ranges."""
        await self.ensure_offers()
        book = self.market.book(unhealthy_hosts=await self.unhealthy_nodes(),
                                preemption_rates=self.preemption_rates())
        return gpu_summary(book, models)

    def providers_health(self) -> dict[str, ProviderHealth]:
        return self.market.health()

    # ------------------------------------------------------------------ jobs
    async def submit(self, spec: JobSpec, *, tenant: str = "default", idempotency_key: str | None = None) -> Job:
        """Accept a job: once this returns, the job is in the store and survives a crash."""
        job, _ = await self.submit_job(spec, tenant=tenant, idempotency_key=idempotency_key)
        return job

    async def list_jobs(self, *, tenant: str | None = None, states: list[JobState] | None = None, limit: int = 50,
                        cursor: str | None = None) -> tuple[list[Job], str | None]:
        return await self.db(self.store.list_jobs, tenant, states, limit, cursor)

    async def get_job(self, job_id: str, tenant: str | None = None) -> Job:
        return await self.db(self.store.get_job, job_id, tenant)

    async def job_allocations(self, job_id: str) -> list[Allocation]:
        return await self.db(self.store.allocations, job_id)

    async def release_allocation(self, alloc: Allocation, reason: str) -> Allocation:
        """Give an allocation back to its provider and record it; already-gone counts as released."""
        provider = self.market.launcher(alloc.provider)
        if provider is None:
            raise ProviderError(alloc.provider, "provider not configured; cannot release " + alloc.id)
        if alloc.resource_ids or alloc.state is not AllocationState.intent:
            await provider.release(alloc)
        return await self.db(self.store.update_allocation, alloc.id, state=AllocationState.released, reason=reason)

    async def cancel(self, job_id: str, tenant: str | None = None, reason: str = "cancelled by user") -> Job:
        """Cancel a job and release everything it holds. Cancelling a finished job changes nothing."""
        job = await self.get_job(job_id, tenant)
        if job.state in TERMINAL_STATES:
            return job
        job = await JobLifecycle(self.store).cancel(job_id, reason)
        for alloc in await self.db(self.store.allocations, job_id):
            if alloc.state in (AllocationState.released, AllocationState.failed, AllocationState.succeeded):
                continue
            try:
                await self.release_allocation(alloc, reason)
            except ProviderError as exc:  # the reconciler retries releases of cancelled jobs
                log.warning("release of %s for cancelled job %s failed: %s", alloc.id, job_id, exc)
        return await self.get_job(job_id, tenant)

    # ------------------------------------------------------------------ nodes, prices
    async def drain_node(self, provider: str, node: str, reason: str) -> dict[str, Any]:
        """Mark a node unhealthy (it leaves the offers at once) and drain it at its provider when possible."""
        if not reason.strip():
            raise SpecError("reason", "a drain needs a reason")
        prov = self.market.providers.get(provider)
        if prov is None:
            raise NotFoundError(f"provider {provider} not configured")
        await self.db(self.store.set_node_health, provider, node, False, reason)
        self._unhealthy_cache = None
        drained = False
        if isinstance(prov, DrainsNodes):
            await prov.drain(node, reason)
            drained = True
        return {"provider": provider, "node": node, "healthy": False, "reason": reason, "drained": drained}

    async def resume_node(self, provider: str, node: str) -> None:
        """The inverse of a drain: healthy in the store (and in this process's quotes at once), resumed at
        its provider when it can. Never called automatically: a drained node stays out until someone decides."""
        await self.db(self.store.set_node_health, provider, node, True, "")
        self._unhealthy_cache = None
        prov = self.market.providers.get(provider)
        if isinstance(prov, DrainsNodes):
            await prov.resume(node)

    async def price_history(self, *, gpu: str | None = None, sku: str | None = None, provider: str | None = None,
                            market: Market | None = None, zone: str | None = None, region: str | None = None,
                            since: datetime | None = None, until: datetime | None = None,
                            stat: str | None = None, limit: int | None = None) -> list[PricePoint]:
        return await self.db(self.store.price_history, gpu=gpu, sku=sku, provider=provider, market=market,
                             zone=zone, region=region, since=since, until=until, stat=stat, limit=limit)

    async def price_series(self, *, gpu: str | None = None, sku: str | None = None, provider: str | None = None,
                           market: Market | None = None, zone: str | None = None, region: str | None = None,
                           stat: str | None = None, since: datetime | None = None,
                           until: datetime | None = None) -> list[PriceSeries]:
        """Stored history per series, in columns; ``since`` defaults to seven days before ``until``
        (or before now)."""
        if since is None:
            since = (until if until is not None else self.clock()) - timedelta(days=7)
        return await self.db(self.store.price_series, gpu=gpu, sku=sku, provider=provider, market=market,
                             zone=zone, region=region, stat=stat, since=since, until=until)

    # ------------------------------------------------------------------ API additions (issue 7)
    async def submit_job(self, spec: JobSpec, *, tenant: str = "default",
                         idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Like :meth:`submit`, and says whether the job is new (False: an idempotent repeat).

        The API answers 201 for a new job and 200 for a repeat, so it needs the flag
        that ``submit`` drops.
        """
        now = self.clock()
        job = Job(id=new_job_id(), tenant=tenant, spec=spec, deadline=spec.deadline_at(now), created_at=now,
                  updated_at=now)
        job, created = await self.db(self.store.create_job, job, idempotency_key)
        if created:
            self.job_submitted.set()
        return job, created
