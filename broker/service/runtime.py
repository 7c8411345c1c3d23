"""What every operation of the service stands on: settings, clock, store, market, the background loops.

:class:`Runtime` is the base of each domain's operations (``broker.service.jobs``, ``offers``, …) and so
of the :class:`~broker.service.Lockstep` facade. The store and the market are opened on first use, so a
command that only reads tenants never loads the offer book (or numpy), and one that only quotes never
opens the database. Blocking store calls run in a worker thread (:meth:`Runtime.db`) so the event loop
(API, broker loops) never waits on the database.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from broker.config import Settings
from broker.models import Allocation, Benchmark, Job, utcnow
from providers.base import Provider
from providers.registry import build_providers
from providers.registry import config_notes as config_notes  # re-exported: `config check` asks the service

if TYPE_CHECKING:
    from broker.loops import BrokerLoops
    from broker.market import Marketplace, ProviderHealth
    from broker.store import Store
    from broker.tracker import Tracker
    from broker.webhooks import WebhookDispatcher

log = logging.getLogger(__name__)

UNHEALTHY_CACHE_S = 1.0
QUOTE_REUSE_S = 1.0  # how long an identical quote on the same book is answered from memory
WRITERS_IN_FLIGHT = 4  # submission transactions at once on PostgreSQL (GroupCommit)


def new_job_id() -> str:
    """Time-ordered, unguessable: 'j' + milliseconds (hex) + 8 random hex digits."""
    return f"j{int(time.time() * 1000):011x}{secrets.token_hex(4)}"


K = TypeVar("K")
V = TypeVar("V")


# A submission's snapshot-only verdict: the warning ('' for none), or the refusal's message and reasons.
SnapshotVerdict = tuple[str, tuple[str, dict[str, int]] | None]


class BookMemo(Generic[K, V]):
    """Answers worked out on one offer book, reused for ``ttl_s`` seconds: a burst of identical requests (a
    sweep, a retrying client) pays once. A new book (a refresh, a drain, new spot rates) forgets them all;
    at ``size`` answers, the expired ones go (or the oldest quarter when none has)."""

    def __init__(self, ttl_s: float, size: int = 512) -> None:
        self.ttl_s, self.size = ttl_s, size
        self._book: object = None
        self._memo: dict[K, tuple[float, V]] = {}

    def get(self, book: object, key: K, work: Callable[[], V]) -> V:
        if self._book is not book:
            self._memo.clear()
            self._book = book
        now = time.monotonic()
        hit = self._memo.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        value = work()
        if len(self._memo) >= self.size:
            old = [k for k, (until, _) in self._memo.items() if until <= now]
            for k in old or list(self._memo)[:self.size // 4]:
                del self._memo[k]
        self._memo[key] = (now + self.ttl_s, value)
        return value


class GroupCommit:
    """Submissions written together: while one transaction of them is being written, the next ones gather,
    and are written by the next transaction as one (a group commit). Each caller still returns only once
    its own job is committed, with exactly what :meth:`Store.create_job` would have given it alone; under
    load, one transaction and one worker-thread hop serve many submissions instead of one each.
    """

    def __init__(self, runtime: Runtime, most: int = 256) -> None:
        self._runtime = runtime
        self._most = most
        self._waiting: list[tuple[Job, str | None, asyncio.Future[tuple[Job, bool]]]] = []
        self._writers: set[asyncio.Task[None]] = set()

    def _in_flight(self) -> int:
        """Transactions of submissions written at once: one on SQLite (one writer at a time anyway), a few
        on PostgreSQL (row locks; two batches that race on one idempotency key fall back to one by one)."""
        return 1 if self._runtime.settings.db_url.startswith("sqlite") else WRITERS_IN_FLIGHT

    async def write(self, job: Job, idempotency_key: str | None) -> tuple[Job, bool]:
        fut: asyncio.Future[tuple[Job, bool]] = asyncio.get_running_loop().create_future()
        self._waiting.append((job, idempotency_key, fut))
        # Only writers still running count (the set also keeps their tasks referenced): a finished one must not
        # keep this submission from starting a writer, or nobody would write it.
        self._writers = {t for t in self._writers if not t.done()}
        if len(self._writers) < self._in_flight():
            self._writers.add(asyncio.create_task(self._drain()))
        return await asyncio.shield(fut)  # a caller that goes away does not cancel the others' write

    async def _drain(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting[:self._most], self._waiting[self._most:]
            try:
                results = await self._runtime.db(self._runtime.store.create_jobs, [(j, k) for j, k, _ in batch])
            except Exception as exc:  # the database failed the whole transaction: each caller sees it
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, _, fut), res in zip(batch, results, strict=True):
                if fut.done():
                    continue
                if isinstance(res, BaseException):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)


class Runtime:
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
        self._providers = providers
        self._market: Marketplace | None = None
        self._store = store
        # Metrics hooks (``observe``): (seconds); (provider, ok, seconds); (provider, outcome).
        self.quote_observer: Callable[[float], None] | None = None
        self.refresh_observer: Callable[[str, bool, float], None] | None = None
        self.job_submitted = asyncio.Event()  # wakes the placement loop early
        self.submitted_ids: set[str] = set()  # ...and tells it which jobs are new (BrokerLoops.hints)
        self._submissions = GroupCommit(self)
        self.placement_observer: Callable[[str, str], None] | None = None
        self._broker: BrokerLoops | None = None
        self._preemption_rates: dict[tuple[str, str, str], float] = {}
        self._background: list[asyncio.Task[None]] = []
        self._stop_tracker: asyncio.Event | None = None
        self._tracker: Tracker | None = None
        self._webhooks: WebhookDispatcher | None = None
        self._unhealthy_cache: tuple[float, dict[tuple[str, str], str]] | None = None
        # The API's quotes as JSON (OffersService.quote_json), and each spec's snapshot-only verdict at
        # submission (the warning, or the refusal's message and reasons), reused briefly on the same book.
        self._quote_texts: BookMemo[tuple[str, int, int | None], str] = BookMemo(QUOTE_REUSE_S)
        self._snapshot_verdicts: BookMemo[str, SnapshotVerdict] = BookMemo(QUOTE_REUSE_S)

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

    @property
    def market(self) -> Marketplace:
        """The offer book over this service's providers."""
        if self._market is None:
            from broker.config import credential_files
            from broker.market import CircuitPolicy, Marketplace

            b = self.settings.broker
            self._market = Marketplace(
                self._providers, timeout_s=b.provider_timeout_s, clock=self.clock, after_refresh=self._after_refresh,
                on_refresh=self._refreshed,
                circuit=CircuitPolicy(b.circuit_failures, b.circuit_backoff_s, b.circuit_backoff_max_s),
                credentials=lambda name: credential_files(getattr(self.settings, name, None)))
        return self._market

    def observe(self, *, quotes: Callable[[float], None] | None = None,
                refreshes: Callable[[str, bool, float], None] | None = None,
                placements: Callable[[str, str], None] | None = None) -> Callable[[], None]:
        """Call these as quotes are ranked, providers refreshed, launches tried (the API's metrics); each is
        chained before whatever observed already. Returns what puts the earlier observers back."""
        old = self.quote_observer, self.refresh_observer, self.placement_observer

        def chain(new: Callable[..., None] | None, prev: Callable[..., None] | None) -> Callable[..., None] | None:
            if new is None or prev is None:
                return new or prev

            def both(*args: object) -> None:
                new(*args)
                prev(*args)
            return both

        self.quote_observer = chain(quotes, old[0])
        self.refresh_observer = chain(refreshes, old[1])
        self.placement_observer = chain(placements, old[2])

        def undo() -> None:
            self.quote_observer, self.refresh_observer, self.placement_observer = old
        return undo

    def _refreshed(self, provider: str, ok: bool, seconds: float) -> None:
        if self.refresh_observer is not None:
            self.refresh_observer(provider, ok, seconds)

    def _placed(self, provider: str, outcome: str) -> None:
        if self.placement_observer is not None:
            self.placement_observer(provider, outcome)

    @property
    def offers_refreshed_at(self) -> datetime | None:
        """When the offer book was last refreshed (None: never, in this process)."""
        return self._market.refreshed_at if self._market is not None else None

    async def open_store(self) -> None:
        """Open (and migrate) the store now, off the event loop, rather than on its first use."""
        await self.db(lambda: self.store)

    async def db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run a blocking store call off the event loop."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def aclose(self) -> None:
        if self._webhooks is not None:
            await self._webhooks.aclose()
        if self._market is not None:
            await self.market.aclose()
        else:  # the book was never opened: close the providers themselves
            await asyncio.gather(*(p.aclose() for p in self._providers.values()), return_exceptions=True)
        if self._store is not None:
            self._store.close()

    async def refresh(self) -> dict[str, ProviderHealth]:
        return await self.market.refresh()

    async def ensure_offers(self) -> None:
        if self.market.refreshed_at is None:
            await self.market.refresh()

    async def unhealthy_nodes(self) -> dict[tuple[str, str], str]:
        """Nodes marked unhealthy, cached for a second: a quote must not pay a database round trip.

        A drain through this service clears the cache at once; other writers are seen within a second.
        """
        if self._store is None:
            return {}
        now = time.monotonic()
        if self._unhealthy_cache is None or now >= self._unhealthy_cache[0]:
            self._unhealthy_cache = (now + UNHEALTHY_CACHE_S, await self.db(self._store.unhealthy_nodes))
        return self._unhealthy_cache[1]

    # ------------------------------------------------------------------ the background loops
    @property
    def broker(self) -> BrokerLoops:
        """The placement and polling engine over this service's store and market."""
        if self._broker is None:
            from broker.loops import BrokerLoops

            self._broker = BrokerLoops(
                self.settings, self.store, self.market, clock=self.clock, preemption_rates=self.preemption_rates,
                on_placed=self._placed, wake=self.job_submitted, burn_in=self.burn_in_results,
                hints=self.submitted_ids)
        return self._broker

    async def burn_in_results(self, job: Job, alloc: Allocation) -> list[Benchmark]:
        """What a job's burn-in step measured, recorded and judged (the nodes domain does it)."""
        raise NotImplementedError

    @property
    def tracker(self) -> Tracker:
        """The price tracker over this service's store and providers."""
        if self._tracker is None:
            from broker.tracker import Tracker

            self._tracker = Tracker(self.settings, self.store, self._providers, clock=self.clock)
        return self._tracker

    @property
    def webhooks(self) -> WebhookDispatcher:
        """The webhook outbox: filled from the event stream, delivered, retried (broker/webhooks.py)."""
        if self._webhooks is None:
            from broker.webhooks import WebhookDispatcher

            self._webhooks = WebhookDispatcher(self.settings.events, self.store, self.clock)
        return self._webhooks

    def preemption_rates(self) -> dict[tuple[str, str, str], float]:
        """Observed preemptions per hour by (provider, zone, sku); the tracker fills it when running."""
        return dict(self._preemption_rates)

    async def start(self) -> None:
        """Start the broker loops: reconcile, then refresh / place / poll, and the price tracker."""
        await self.broker.start()
        self._stop_tracker = asyncio.Event()
        self._background = [asyncio.create_task(self.tracker.run_forever(self._stop_tracker)),
                            asyncio.create_task(self.webhooks.run_forever(self._stop_tracker))]

    async def stop(self) -> None:
        if self._stop_tracker is not None:
            self._stop_tracker.set()
        for t in self._background:
            t.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._broker is not None:
            await self._broker.stop()

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
