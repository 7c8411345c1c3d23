"""Offers and quotes: what the market has, and what a job would cost where, with the reasons."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from broker.models import GpuSummary, JobSpec, Offer, Quote
from broker.service.runtime import Runtime

if TYPE_CHECKING:
    from broker.market import ProviderHealth
    from policies.book import OfferBook
    from policies.offers import OfferFilter
    from policies.ranking import QuoteParts




class OffersService(Runtime):
    async def quote(self, spec: JobSpec, *, top: int = 10, max_rejected: int | None = None) -> Quote:
        """Ranked options for ``spec`` with the reason for every rejected offer."""
        await self.ensure_offers()
        book = self.market.book(unhealthy_hosts=await self.unhealthy_nodes(), preemption_rates=self.preemption_rates())
        return self._rank(book, spec, top, max_rejected)

    def _rank(self, book: OfferBook, spec: JobSpec, top: int, max_rejected: int | None) -> Quote:
        return self._parts(book, spec, top, max_rejected).model()

    def _parts(self, book: OfferBook, spec: JobSpec, top: int, max_rejected: int | None) -> QuoteParts:
        from policies.ranking import quote_parts

        started = time.perf_counter()
        result = quote_parts(book, spec, now=self.clock(), top=top, max_rejected=max_rejected)
        if self.quote_observer:
            self.quote_observer(time.perf_counter() - started)
        return result

    async def quote_json(self, spec: JobSpec, *, top: int = 10, max_rejected: int | None = None) -> str:
        """:meth:`quote` as JSON text (what the API answers), written straight from the ranking's values (no
        Quote model made, nothing validated twice). The same spec, ``top`` and ``max_rejected`` on the same
        book (same refresh, node health and spot risk) within ``QUOTE_REUSE_S`` get the same text, ranked and
        serialised once (its ``at`` says when). A refresh, a drain or new spot rates make a new book, and a
        new book forgets every quote of the old one."""
        await self.ensure_offers()
        book = self.market.book(unhealthy_hosts=await self.unhealthy_nodes(), preemption_rates=self.preemption_rates())
        job_json = spec.model_dump_json()  # the key of the reuse, and the answer's "job" as it is
        return self._quote_texts.get(book, (job_json, top, max_rejected),
                                     lambda: self._parts(book, spec, top, max_rejected).json(job_json))

    async def offers(self, f: OfferFilter, limit: int | None = None) -> list[Offer]:
        """The offer book narrowed by ``f``, cheapest per GPU-hour first. Offers on a node marked unhealthy
        (a drain) leave at once, as they do from quotes: the book's health column says which."""
        from policies.offers import select

        await self.ensure_offers()
        offers = self.market.offers()
        unhealthy = await self.unhealthy_nodes()
        if unhealthy:
            book = self.market.book(unhealthy_hosts=unhealthy, preemption_rates=self.preemption_rates())
            drained = {book.ids[row] for row in book.unhealthy_rows.tolist()}
            offers = [o for o in offers if o.id not in drained]
        return select(offers, f, limit)

    async def gpus(self, models: list[str] | None = None) -> list[GpuSummary]:
        """Per GPU model in the current book: markets, regions, units and $/GPU-hour ranges."""
        from policies.offers import gpu_summary

        await self.ensure_offers()
        book = self.market.book(unhealthy_hosts=await self.unhealthy_nodes(),
                                preemption_rates=self.preemption_rates())
        return gpu_summary(book, models)

    def providers_health(self) -> dict[str, ProviderHealth]:
        return self.market.health()
