"""The offer book in this process: ``quote``/``offers``/``gpus`` when no server and no background broker is
up (they write nothing, so they start none), or over the ``--provider`` ones alone."""

from __future__ import annotations

from typing import Any

from broker.config import Settings
from broker.models import GpuSummary, Offer, Quote
from broker.service import Lockstep
from broker.specs import parse_spec
from policies.offers import OfferFilter


class LocalMarket:
    def __init__(self, settings: Settings, providers: list[str] | None = None) -> None:
        self.svc = Lockstep(settings, only_providers=providers)

    async def quote(self, spec_data: dict[str, Any], *, top: int, max_rejected: int | None) -> Quote:
        return await self.svc.quote(parse_spec(spec_data), top=top, max_rejected=max_rejected)

    async def offers(self, f: OfferFilter, limit: int | None) -> list[Offer]:
        return await self.svc.offers(f, limit)

    async def gpus(self) -> list[GpuSummary]:
        return await self.svc.gpus()

    async def aclose(self) -> None:
        await self.svc.aclose()
