"""On-demand prices from the AWS Price List API (GetProducts), cached per region.

The Price List API answers in three regions only (us-east-1, eu-central-1, ap-south-1); one
client (``aws.pricing_region``) prices every region through the ``regionCode`` filter. The
filters are applied by AWS, so a region's answer is its GPU types only (about a hundred
products): ``instanceFamily`` "GPU instance", Linux, shared tenancy, no pre-installed
software, ``capacitystatus`` Used (not reservations' unused capacity). Each item of
``PriceList`` is a JSON document in a string; the hourly on-demand rate is
``terms.OnDemand.<term>.priceDimensions.<rate>.pricePerUnit.USD``.

A region's prices are kept ``aws.pricing_refresh_s`` (list prices change rarely) and
fetched again after that; regions are fetched concurrently, at most
``aws.pricing_concurrency`` at once, and a region is fetched once however many scans
ask for it meanwhile. When a fetch fails, the region's earlier live prices are used,
marked ``tracked`` with their age; without any, the bundled snapshot's, marked
``snapshot`` with its date; either way the reason is logged and reported in
:meth:`OnDemandPricing.notes` (the provider's health). No fetch is tried again for
``aws.pricing_retry_s``. A scan does not wait for a fetch past its own budget: it prices that
region from the fallback (:meth:`OnDemandPricing.waiting`) and the fetch goes on, for the next scan.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from broker.errors import ProviderError
from broker.models import OfferSource
from providers.aws.client import PricingClient
from providers.aws.config import AwsConfig
from providers.catalog.client import aws_on_demand_price, load_catalog
from providers.catalog.offers import as_of

log = logging.getLogger(__name__)

SERVICE_CODE = "AmazonEC2"
GPU_FAMILY = "GPU instance"  # the Price List's instanceFamily of p* and g* types
HOURLY = "Hrs"


def product_filters(region: str) -> list[dict[str, str]]:
    """GetProducts filters for the Linux on-demand rates of a region's GPU types (applied by AWS)."""
    terms = {
        "instanceFamily": GPU_FAMILY,
        "regionCode": region,
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
    }
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in terms.items()]


@dataclass(frozen=True)
class PriceList:
    """One region's parsed answer: $/h by instance type, and the Price List's publication date."""

    prices: dict[str, float]
    published: str = ""


def parse_price_list(items: Iterable[str | Mapping[str, Any]], region: str) -> PriceList:
    """GetProducts items (JSON strings) → the hourly on-demand USD rate of each instance type in ``region``.

    Items of another region, without an instance type, of another usage than plain instance hours
    (``BoxUsage``), or without a positive hourly USD rate are skipped; an unreadable item too (logged).
    """
    prices: dict[str, float] = {}
    published = ""
    for raw in items:
        try:
            doc: dict[str, Any] = json.loads(raw) if isinstance(raw, str) else dict(raw)
            attrs = doc["product"]["attributes"]
            sku = attrs.get("instanceType")
            if attrs.get("regionCode") != region or not sku or "BoxUsage" not in attrs.get("usagetype", "BoxUsage"):
                continue
            rates = [
                float(dim["pricePerUnit"]["USD"])
                for term in (doc.get("terms", {}).get("OnDemand") or {}).values()
                for dim in (term.get("priceDimensions") or {}).values()
                if dim.get("unit") == HOURLY and "USD" in (dim.get("pricePerUnit") or {})
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("aws: an unreadable Price List item in %s skipped (%s)", region, type(exc).__name__)
            continue
        rates = [r for r in rates if r > 0]
        if rates:
            prices[sku] = min(rates + ([prices[sku]] if sku in prices else []))
            published = max(published, str(doc.get("publicationDate") or ""))
    return PriceList(prices, published)


@dataclass(frozen=True)
class OnDemandPrices:
    """What a region's on-demand offers are priced with: live (the Price List, fetched at ``observed_at``),
    tracked (an earlier live answer, kept while a fetch fails) or snapshot (the bundled catalog's, of its date).
    ``note`` says why they are not live."""

    region: str
    source: OfferSource
    observed_at: datetime
    prices: Mapping[str, float] = field(default_factory=dict)
    note: str = ""
    published: str = ""

    def lookup(self, sku: str) -> tuple[float, OfferSource, datetime] | None:
        """(price, source, observed_at) of a type: from these prices, else the snapshot's; None: no price."""
        price = self.prices.get(sku)
        if price is not None:
            return price, self.source, self.observed_at
        snap = aws_on_demand_price(sku, self.region)
        return (snap, OfferSource.snapshot, snapshot_date()) if snap is not None else None


def snapshot_date() -> datetime:
    return as_of(load_catalog())


@dataclass
class _Entry:
    prices: PriceList
    fetched_at: datetime


class OnDemandPricing:
    """The per-region cache over the Price List API (see the module docstring)."""

    def __init__(self, config: AwsConfig, client: PricingClient, *,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.config = config
        self.client = client
        self.clock = clock
        self._cache: dict[str, _Entry] = {}
        self._failed: dict[str, tuple[datetime, str]] = {}  # region → (when, why) of its last failed fetch
        self._inflight: dict[str, asyncio.Future[OnDemandPrices]] = {}
        self._late: set[str] = set()  # regions a scan priced from the fallback while their fetch went on
        self._bound = asyncio.Semaphore(config.pricing_concurrency)
        self.fetches = 0  # GetProducts fetches started (each region's pages count once)

    def start(self, region: str) -> asyncio.Future[OnDemandPrices]:
        """A region's prices as a future: done at once from the cache (or the fallback while a failed fetch
        waits out ``pricing_retry_s``), else the fetch in flight, started if none is. Its result never
        raises: a failure falls back, visibly. Awaiting it with a timeout does not cancel the fetch."""
        ready = self._ready(region)
        if ready is not None:
            done: asyncio.Future[OnDemandPrices] = asyncio.get_running_loop().create_future()
            done.set_result(ready)
            return done
        fut = self._inflight.get(region)
        if fut is None:
            fut = asyncio.ensure_future(self._refresh(region))
            self._inflight[region] = fut
            fut.add_done_callback(lambda _f: self._inflight.pop(region, None))
        return fut

    async def region(self, region: str) -> OnDemandPrices:
        """The prices a region's on-demand offers get now (fetched first if due)."""
        return await asyncio.shield(self.start(region))  # a caller that gives up does not cancel the fetch

    def waiting(self, region: str) -> OnDemandPrices:
        """What a scan that cannot wait for the region's fetch any longer prices it with: the last live
        answer (tracked) or the snapshot, noted, until the fetch is done."""
        self._late.add(region)
        return self._fallback(region, "no answer yet (still fetching)")

    async def aclose(self) -> None:
        for fut in list(self._inflight.values()):
            fut.cancel()
        await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        await self.client.aclose()

    def _off(self) -> str:
        if self.config.use_pricing_api is None:
            return ("the Price List API is not asked while aws.endpoint_url is set (an emulator has none): "
                    "set aws.use_pricing_api: true to ask it")
        return "aws.use_pricing_api is off"

    def _ready(self, region: str) -> OnDemandPrices | None:
        if not self.config.pricing_enabled:
            return self._snapshot(region, self._off())
        now = self.clock()
        entry = self._cache.get(region)
        if entry is not None and now - entry.fetched_at < timedelta(seconds=self.config.pricing_refresh_s):
            return self._live(region, entry)
        failed = self._failed.get(region)
        if failed is not None and now - failed[0] < timedelta(seconds=self.config.pricing_retry_s):
            return self._fallback(region, failed[1])
        return None

    async def prices(self, regions: Iterable[str]) -> dict[str, OnDemandPrices]:
        """Several regions' prices, concurrently (at most ``pricing_concurrency`` fetches at once)."""
        regions = list(regions)
        got = await asyncio.gather(*(self.region(r) for r in regions))
        return dict(zip(regions, got, strict=True))

    def notes(self) -> list[str]:
        """Why a region's on-demand prices are not live (for the provider's health)."""
        if not self.config.pricing_enabled:
            return [f"on-demand prices: snapshot {snapshot_date():%Y-%m-%d} ({self._off()})"]
        why_of = {r: "no answer yet (still fetching)" for r in self._late}
        why_of.update({r: why for r, (_at, why) in self._failed.items()})
        out = []
        for region, why in sorted(why_of.items()):
            kept = self._cache.get(region)
            what = (f"tracked from {kept.fetched_at:%Y-%m-%d %H:%M} UTC" if kept is not None
                    else f"snapshot {snapshot_date():%Y-%m-%d}")
            out.append(f"on-demand prices in {region}: {what} (Price List API: {why})")
        return out

    async def _refresh(self, region: str) -> OnDemandPrices:
        started = self.clock()
        try:
            async with self._bound:
                self.fetches += 1
                items = await asyncio.wait_for(
                    self.client.products(SERVICE_CODE, product_filters(region)), self.config.region_timeout_s)
        except (ProviderError, TimeoutError) as exc:
            why = str(exc) if isinstance(exc, ProviderError) else f"no answer within {self.config.region_timeout_s:g}s"
            self._failed[region] = (started, why)
            self._late.discard(region)
            fallback = self._fallback(region, why)
            log.warning("aws: on-demand prices in %s from the %s: the Price List API failed: %s", region,
                        "last live answer" if fallback.source is OfferSource.tracked else "bundled snapshot", why)
            return fallback
        entry = _Entry(parse_price_list(items, region), started)
        self._cache[region] = entry
        self._failed.pop(region, None)
        self._late.discard(region)
        log.debug("aws: %d on-demand GPU prices in %s from the Price List API", len(entry.prices.prices), region)
        return self._live(region, entry)

    def _live(self, region: str, entry: _Entry) -> OnDemandPrices:
        return OnDemandPrices(region, OfferSource.live, entry.fetched_at, entry.prices.prices,
                              published=entry.prices.published)

    def _fallback(self, region: str, why: str) -> OnDemandPrices:
        entry = self._cache.get(region)
        if entry is not None:
            return OnDemandPrices(region, OfferSource.tracked, entry.fetched_at, entry.prices.prices,
                                  note=f"Price List API: {why}", published=entry.prices.published)
        return self._snapshot(region, f"Price List API: {why}")

    def _snapshot(self, region: str, why: str) -> OnDemandPrices:
        return OnDemandPrices(region, OfferSource.snapshot, snapshot_date(), {}, note=why)
