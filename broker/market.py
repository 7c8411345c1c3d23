"""The offer book: offers from every provider, refreshed concurrently, never blocking placement.

Each provider is asked with its own timeout. A provider that fails or times
out keeps its last offers, marked stale with their age, and its health says
why; the others stand. Readers always get the last complete snapshot (a
refresh swaps it in atomically), so placement never waits on a slow market.

A refresh with a query filters every provider's answer with
:func:`providers.base.matches`, here and nowhere else (providers may answer more
than asked). Snapshot rows (``Offer.source``: the bundled catalog) give way to
live offers of the same market.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime

from pydantic import BaseModel

from broker.models import Offer, OfferSource, Perf, utcnow
from policies.book import OfferBook
from providers.base import OfferQuery, Provider, matches
from providers.capabilities import Launches, Snapshot

log = logging.getLogger(__name__)


class ProviderHealth(BaseModel):
    name: str
    ok: bool = False
    offers: int = 0
    last_ok: datetime | None = None
    last_attempt: datetime | None = None
    last_error: str = ""
    latency_s: float | None = None
    stale: bool = True
    age_s: float | None = None


class Marketplace:
    def __init__(
        self,
        providers: Mapping[str, Provider],
        *,
        timeout_s: float = 30.0,
        clock: Callable[[], datetime] = utcnow,
        on_refresh: Callable[[str, bool, float], None] | None = None,
        after_refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.providers = dict(providers)
        self.timeout_s = timeout_s
        self.clock = clock
        self.on_refresh = on_refresh  # metrics hook: (provider, ok, seconds)
        # Measured performance by (provider, host) or (provider, sku): beats the datasheet and priors.
        # The service refreshes it (from stored benchmarks) in ``after_refresh``.
        self.measured: dict[tuple[str, str], Perf] = {}
        self.after_refresh = after_refresh
        self._offers: dict[str, list[Offer]] = {name: [] for name in self.providers}
        self._health: dict[str, ProviderHealth] = {name: ProviderHealth(name=name) for name in self.providers}
        self._book: OfferBook | None = None
        self._base_book: OfferBook | None = None  # columns and index, built once per refresh
        self._snapshot: list[Offer] | None = None  # merged offers of the last refresh
        self._by_id: dict[str, Offer] = {}
        self._book_key: object = None
        self._lock = asyncio.Lock()
        self.refreshed_at: datetime | None = None

    def launcher(self, name: str) -> Launches | None:
        """The provider ``name`` if it launches (typed for launch/poll/release/owned), else None."""
        p = self.providers.get(name)
        return p if isinstance(p, Launches) else None

    @property
    def has_snapshot(self) -> bool:
        """A provider answers from a snapshot (no network needed): quotes work with every live market down."""
        return any(isinstance(p, Snapshot) for p in self.providers.values())

    async def _refresh_one(self, name: str, provider: Provider, query: OfferQuery | None) -> None:
        health = self._health[name]
        started = time.perf_counter()
        health.last_attempt = self.clock()
        try:
            offers = await asyncio.wait_for(provider.offers(query), self.timeout_s)
        except Exception as exc:  # a market failing must not take the others down
            elapsed = time.perf_counter() - started
            reason = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            log.warning("provider %s refresh failed: %s", name, reason)
            health.ok, health.last_error, health.latency_s = False, reason[:500], elapsed
            if self.on_refresh:
                self.on_refresh(name, False, elapsed)
            return
        elapsed = time.perf_counter() - started
        if query is not None:
            offers = [o for o in offers if matches(o, query)]
        self._offers[name] = offers
        health.ok, health.last_error, health.latency_s = True, "", elapsed
        health.last_ok, health.offers = self.clock(), len(offers)
        if self.on_refresh:
            self.on_refresh(name, True, elapsed)

    async def refresh(self, query: OfferQuery | None = None) -> dict[str, ProviderHealth]:
        """Ask every provider at once; returns their health. Concurrent callers share one refresh."""
        async with self._lock:
            await asyncio.gather(*(self._refresh_one(n, p, query) for n, p in self.providers.items()))
            if self.after_refresh is not None:
                try:
                    await self.after_refresh()
                except Exception:  # benchmarks and risk improve quotes; they never fail a refresh
                    log.exception("after-refresh hook")
            self.refreshed_at = self.clock()
            self._book = self._base_book = None
            self._snapshot = None
        return self.health()

    def _with_measured(self, o: Offer) -> Offer:
        perf = None
        if o.locality.host:
            perf = self.measured.get((o.provider, o.locality.host))
        if perf is None:
            perf = self.measured.get((o.provider, o.sku))
        if perf is None or (o.perf is not None and o.perf.source != "dlperf" and perf.source == "dlperf"):
            return o
        return o.model_copy(update={"perf": perf})

    def health(self) -> dict[str, ProviderHealth]:
        now = self.clock()
        for h in self._health.values():
            h.age_s = (now - h.last_ok).total_seconds() if h.last_ok else None
            h.stale = not h.ok
        return {n: h.model_copy() for n, h in self._health.items()}

    def offers(self) -> list[Offer]:
        """All offers; those of a provider whose last refresh failed are marked stale.

        Snapshot offers of a market that answers live (e.g. the catalog's AWS list
        prices when the AWS adapter answers) are dropped: live beats a snapshot.
        Merged once per refresh and shared by the book, ``find`` and listings.
        """
        if self._snapshot is None:
            self._snapshot = self._merge()
            self._by_id = {o.id: o for o in self._snapshot}
        return list(self._snapshot)

    def live_markets(self) -> set[str]:
        """Markets (``Offer.provider``) with live offers from a provider whose last refresh succeeded."""
        return {
            o.provider
            for name, offers in self._offers.items()
            if self._health[name].ok
            for o in offers
            if o.source is OfferSource.live
        }

    def _merge(self) -> list[Offer]:
        live = self.live_markets()
        out: list[Offer] = []
        for name, offers in self._offers.items():
            stale = not self._health[name].ok
            for o in offers:
                if o.source is OfferSource.snapshot and o.provider in live:
                    continue
                if self.measured:
                    o = self._with_measured(o)
                out.append(o.model_copy(update={"stale": True}) if stale and not o.stale else o)
        return out

    def book(
        self,
        *,
        unhealthy_hosts: Mapping[tuple[str, str], str] | None = None,
        preemption_rates: Mapping[tuple[str, str, str], float] | None = None,
    ) -> OfferBook:
        """The columnar book of the current snapshot: built once per refresh; node health and spot
        risk are swapped in (two columns) when they change."""
        key = (self.refreshed_at, tuple(sorted((unhealthy_hosts or {}).items())),
               tuple(sorted((preemption_rates or {}).items())))
        if self._base_book is None:
            self._base_book = OfferBook.build(self.offers())
        if self._book is None or key != self._book_key:
            self._book = self._base_book.with_health(unhealthy_hosts, preemption_rates)
            self._book_key = key
        return self._book

    def find(self, offer_id: str) -> Offer | None:
        """The current snapshot's offer by id."""
        self.offers()
        return self._by_id.get(offer_id)

    async def aclose(self) -> None:
        for p in self.providers.values():
            try:
                await p.aclose()
            except Exception:  # closing must go on for the others
                log.exception("closing provider %s", p.name)
