"""The operations users have. The CLI and the HTTP API are thin shells over this class.

``Lockstep`` owns the market (offer book) and the store; each public method is
one user-facing operation. Blocking store calls run in a worker thread so the
event loop (API, broker loops) never waits on the database.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from broker.config import Settings
from broker.market import Market, ProviderHealth
from broker.models import JobSpec, Offer, Quote, utcnow
from broker.registry import build_providers
from policies.offers import OfferFilter, select
from policies.ranking import quote as rank_quote
from providers.base import Provider

if TYPE_CHECKING:
    from broker.store import Store


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
        self.market = Market(providers, timeout_s=settings.broker.provider_timeout_s, clock=clock)
        self._store = store
        self.quote_observer: Callable[[float], None] | None = None  # metrics hook

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

    async def ensure_offers(self) -> None:
        if self.market.refreshed_at is None:
            await self.market.refresh()

    def _unhealthy(self) -> dict[tuple[str, str], str]:
        if self._store is None:
            return {}
        return self._store.unhealthy_nodes()

    # ------------------------------------------------------------------ operations
    async def quote(self, spec: JobSpec, *, top: int = 10, max_rejected: int | None = None) -> Quote:
        """Ranked options for ``spec`` with the reason for every rejected offer."""
        await self.ensure_offers()
        unhealthy = await self.db(self._unhealthy) if self._store is not None else {}
        started = time.perf_counter()
        book = self.market.book(unhealthy_hosts=unhealthy)
        result = rank_quote(book, spec, now=self.clock(), top=top, max_rejected=max_rejected)
        if self.quote_observer:
            self.quote_observer(time.perf_counter() - started)
        return result

    async def offers(self, f: OfferFilter, limit: int | None = None) -> list[Offer]:
        await self.ensure_offers()
        return select(self.market.offers(), f, limit)

    def providers_health(self) -> dict[str, ProviderHealth]:
        return self.market.health()
