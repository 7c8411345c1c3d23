"""On-demand prices from the AWS Price List API, and `regions: all`.

moto does not emulate the Price List API (it answers GetProducts with an HTML 500), so the
pricing client is driven through botocore's Stubber, which checks every request against the
real ``pricing`` service model and every answer against its output shapes; the answers are
shaped like AWS's (``tests/aws/pricing_data.py``). EC2 itself stays on moto's server where a
test needs offers. Concurrency is proven with a barrier the calls must all reach, not with time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiobotocore.session import AioSession
from botocore.stub import Stubber

from broker.market import Marketplace
from broker.models import JobSpec, Market, OfferSource
from policies.ranking import quote
from providers.aws import AwsProvider
from providers.aws.client import PricingClient
from providers.aws.config import AwsConfig
from providers.aws.pricing import OnDemandPricing, parse_price_list, product_filters, snapshot_date
from providers.base import OfferQuery
from providers.catalog import CatalogProvider
from providers.catalog.client import aws_on_demand_price
from tests.aws.conftest import INSTALLATION
from tests.aws.pricing_data import PUBLISHED, catalog_prices, live_price, product, region_answer
from tests.aws.stubs import _session, stub_config
from tests.plugins.moto import moto_config

REGIONS = ["us-east-1", "us-west-2", "eu-west-1"]
SKUS = {"us-east-1": ["p4d.24xlarge", "p5.48xlarge"], "us-west-2": ["p4d.24xlarge", "p5.48xlarge"],
        "eu-west-1": ["p4d.24xlarge"]}
UNREACHABLE = "http://127.0.0.1:9"  # nothing listens on the discard port


def expect_products(stub: Stubber, region: str, items: list[str], *, token: str | None = None,
                    next_token: str | None = None) -> None:
    """One GetProducts page, asked with exactly the filters AWS applies for us."""
    params: dict[str, Any] = {"ServiceCode": "AmazonEC2", "Filters": product_filters(region),
                              "FormatVersion": "aws_v1", "MaxResults": 100}
    if token:
        params["NextToken"] = token
    answer: dict[str, Any] = {"FormatVersion": "aws_v1", "PriceList": items}
    if next_token:
        answer["NextToken"] = next_token
    stub.add_response("get_products", answer, params)


def fail_products(stub: Stubber, times: int, code: str = "InternalErrorException", status: int = 500) -> None:
    for _ in range(times):
        stub.add_client_error("get_products", service_error_code=code, service_message="We encountered an "
                              "internal error. Please try again.", http_status_code=status)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@asynccontextmanager
async def stubbed_pricing(config: AwsConfig, clock: Clock | None = None
                          ) -> AsyncIterator[tuple[OnDemandPricing, Stubber, Any]]:
    client = PricingClient(config, session=_session())
    pricing = OnDemandPricing(config, client, **({"clock": clock} if clock else {}))
    try:
        raw = await client.client(config.pricing_region)
        stub = Stubber(raw)
        with stub:
            yield pricing, stub, raw
            stub.assert_no_pending_responses()
    finally:
        await client.aclose()


def pricing_config(**overrides: Any) -> AwsConfig:
    return stub_config(**{"regions": REGIONS, "use_pricing_api": True, "max_attempts": 2,
                          "region_timeout_s": 60.0, **overrides})


# --------------------------------------------------------------------------- the answer's shape


def test_the_real_price_list_shape_is_read(shared_data: Path) -> None:
    snapshot = catalog_prices(shared_data)[("us-east-1", "p5.48xlarge")]
    items = [
        product(shared_data, "us-east-1", "p5.48xlarge", live_price(snapshot)),
        product(shared_data, "us-west-2", "p4d.24xlarge", 20.0),  # another region's: not this one's price
    ]
    got = parse_price_list([*items, "{not json"], "us-east-1")
    # The on-demand hourly rate, not the reserved term's lower one in the same item.
    assert got.prices == {"p5.48xlarge": live_price(snapshot)}
    assert got.published == PUBLISHED


def test_regions_all_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from broker.config import Settings

    monkeypatch.setenv("LOCKSTEP_AWS__REGIONS", "all")
    monkeypatch.setenv("LOCKSTEP_AWS__PRICING_CONCURRENCY", "2")
    aws = Settings().aws
    assert aws.regions == "all" and aws.pricing_concurrency == 2
    monkeypatch.setenv("LOCKSTEP_AWS__PRICING_CONCURRENCY", "0")
    with pytest.raises(Exception, match="pricing_concurrency"):
        Settings()


def test_config_regions_all_and_the_pricing_switch() -> None:
    assert AwsConfig(regions="all").all_regions and AwsConfig(regions=["all"]).regions == "all"
    assert AwsConfig(regions="all").home_region == "us-east-1"
    assert AwsConfig(regions=["eu-west-1"]).home_region == "eu-west-1"
    for bad in ("us-east-1", []):
        with pytest.raises(ValueError, match="region"):
            AwsConfig(regions=bad)
    # On by default; off by default where EC2 is something else (moto has no Price List API); explicit wins.
    assert AwsConfig().pricing_enabled
    assert not AwsConfig(endpoint_url="http://127.0.0.1:5000").pricing_enabled
    assert AwsConfig(endpoint_url="http://127.0.0.1:5000", use_pricing_api=True).pricing_enabled
    assert not AwsConfig(use_pricing_api=False).pricing_enabled


# --------------------------------------------------------------------------- live, concurrent, bounded, cached


@pytest.mark.aws
async def test_live_prices_of_three_regions_replace_the_snapshots(aws_moto: str, aws_session: AioSession,
                                                                  shared_data: Path) -> None:
    """EC2 on moto, the Price List stubbed: the book's AWS on-demand rows are the adapter's, at the live
    figures, marked live; the catalog's AWS rows are gone."""
    aws = AwsProvider(moto_config(aws_moto, regions=REGIONS, use_pricing_api=True), installation=INSTALLATION,
                      session=aws_session)
    market = Marketplace({"catalog": CatalogProvider(), "aws": aws})
    query = OfferQuery(gpus=["A100-SXM-40GB", "H100-SXM"], markets=[Market.on_demand])
    expected: dict[tuple[str, str], float] = {}
    async with aws:
        raw = await aws.pricing.client.client("us-east-1")
        barrier = asyncio.Barrier(len(REGIONS))

        async def all_in_flight(**_: Any) -> None:  # the scan fetches its regions together, or never gets past
            await asyncio.wait_for(barrier.wait(), 30)

        raw.meta.events.register("after-call.pricing.GetProducts", all_in_flight)
        stub = Stubber(raw)
        for region in REGIONS:
            items, prices = region_answer(shared_data, region, SKUS[region])
            expect_products(stub, region, items)
            expected.update({(region, sku): usd for sku, usd in prices.items()})
        with stub:
            health = await market.refresh(query)
            stub.assert_no_pending_responses()
        assert health["aws"].ok and health["aws"].notes == []
        offers = market.offers()
        od = [o for o in offers if o.provider == "aws" and o.market is Market.on_demand]
        assert {o.region for o in od} == set(REGIONS)
        for o in od:
            assert o.source is OfferSource.live and market.launchable(o)
            assert o.usd_per_hour == expected[(o.region, o.sku)] != aws_on_demand_price(o.sku, o.region)
            assert o.attrs["price_source"] == "pricing-api"
        assert not [o for o in offers if o.id.startswith("catalog:aws")]
        # Asked again within aws.pricing_refresh_s: no new fetch (the stub holds no more answers).
        await market.refresh(query)
        assert aws.pricing.fetches == 3


async def test_regions_are_priced_concurrently(shared_data: Path) -> None:
    """Each region's call waits at a barrier of three before it returns: only calls in flight together
    get past it (one at a time, the first would wait for ever and the region fall back to the snapshot)."""
    async with stubbed_pricing(pricing_config(pricing_concurrency=4)) as (pricing, stub, raw):
        barrier = asyncio.Barrier(len(REGIONS))

        async def all_in_flight(**_: Any) -> None:
            await asyncio.wait_for(barrier.wait(), 30)  # a guard against a hung test, not a measurement

        raw.meta.events.register("after-call.pricing.GetProducts", all_in_flight)
        expected = {}
        for region in REGIONS:
            items, expected[region] = region_answer(shared_data, region, SKUS[region])
            expect_products(stub, region, items)
        got = await pricing.prices(REGIONS)
    assert {r: p.source for r, p in got.items()} == dict.fromkeys(REGIONS, OfferSource.live)
    assert {r: dict(p.prices) for r, p in got.items()} == expected
    assert pricing.fetches == 3 and pricing.notes() == []


@pytest.mark.parametrize("bound", [1, 2])
async def test_concurrency_is_bounded(shared_data: Path, bound: int) -> None:
    """At most ``pricing_concurrency`` regions in flight, however many are asked for at once."""
    inflight = peak = 0

    def started(**_: Any) -> None:
        nonlocal inflight, peak
        inflight += 1
        peak = max(peak, inflight)

    async def finished(**_: Any) -> None:
        nonlocal inflight
        for _ in range(10):  # let every other call that could start, start
            await asyncio.sleep(0)
        inflight -= 1

    async with stubbed_pricing(pricing_config(pricing_concurrency=bound)) as (pricing, stub, raw):
        raw.meta.events.register("before-parameter-build.pricing.GetProducts", started)
        raw.meta.events.register("after-call.pricing.GetProducts", finished)
        for region in REGIONS:
            expect_products(stub, region, region_answer(shared_data, region, SKUS[region])[0])
        got = await pricing.prices(REGIONS)
    assert all(p.source is OfferSource.live for p in got.values())
    assert peak == bound


async def test_pages_are_followed_and_the_answer_is_cached(shared_data: Path) -> None:
    clock = Clock()
    items, prices = region_answer(shared_data, "us-east-1", SKUS["us-east-1"])
    async with stubbed_pricing(pricing_config(regions=["us-east-1"]), clock) as (pricing, stub, _raw):
        expect_products(stub, "us-east-1", items[:1], next_token="page-2")
        expect_products(stub, "us-east-1", items[1:], token="page-2")
        first = await pricing.region("us-east-1")
        clock.now += timedelta(hours=5)  # within pricing_refresh_s (6 h): from the cache
        again = await pricing.region("us-east-1")
    assert dict(first.prices) == prices and first.published == PUBLISHED
    assert again == first and pricing.fetches == 1
    assert first.lookup("p5.48xlarge") == (prices["p5.48xlarge"], OfferSource.live, clock.now - timedelta(hours=5))


async def test_a_region_asked_for_twice_at_once_is_fetched_once(shared_data: Path) -> None:
    async with stubbed_pricing(pricing_config(regions=["us-east-1"])) as (pricing, stub, _raw):
        expect_products(stub, "us-east-1", region_answer(shared_data, "us-east-1", SKUS["us-east-1"])[0])
        a, b = await asyncio.gather(pricing.region("us-east-1"), pricing.region("us-east-1"))
    assert a == b and a.source is OfferSource.live and pricing.fetches == 1


# --------------------------------------------------------------------------- when it cannot be had


async def test_a_failing_price_list_falls_back_to_the_snapshot_visibly(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    caplog.set_level(logging.WARNING, "providers.aws.pricing")
    async with stubbed_pricing(pricing_config(regions=["us-east-1"]), clock) as (pricing, stub, _raw):
        fail_products(stub, 2)  # max_attempts: 2
        got = await pricing.region("us-east-1")
        clock.now += timedelta(minutes=1)  # within pricing_retry_s: not asked again (no answer is queued)
        again = await pricing.region("us-east-1")
    assert got.source is OfferSource.snapshot and got.observed_at == snapshot_date()
    assert got.lookup("p4d.24xlarge") == (aws_on_demand_price("p4d.24xlarge", "us-east-1"), OfferSource.snapshot,
                                          snapshot_date())
    assert "InternalErrorException" in got.note and again.source is OfferSource.snapshot
    assert pricing.fetches == 1
    [note] = pricing.notes()
    assert note.startswith(f"on-demand prices in us-east-1: snapshot {snapshot_date():%Y-%m-%d} (Price List API:")
    assert any("bundled snapshot" in r.getMessage() and "InternalErrorException" in r.getMessage()
               for r in caplog.records)


async def test_after_a_live_answer_a_failure_keeps_it_tracked_with_its_age(shared_data: Path) -> None:
    clock = Clock()
    items, prices = region_answer(shared_data, "us-west-2", SKUS["us-west-2"])
    async with stubbed_pricing(pricing_config(regions=["us-west-2"]), clock) as (pricing, stub, _raw):
        expect_products(stub, "us-west-2", items)
        live = await pricing.region("us-west-2")
        clock.now += timedelta(hours=7)  # past pricing_refresh_s: fetched again, and that fails
        fail_products(stub, 2, "ThrottlingException", 400)
        got = await pricing.region("us-west-2")
    assert got.source is OfferSource.tracked and got.observed_at == live.observed_at
    assert dict(got.prices) == prices and "ThrottlingException" in got.note
    assert pricing.notes()[0].startswith("on-demand prices in us-west-2: tracked from 2026-12-01 08:00 UTC")


@pytest.mark.aws
async def test_an_unreachable_price_list_marks_the_offers_snapshot(aws_moto: str, aws_session: AioSession,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens at the Price List endpoint: EC2 (moto) still answers, on-demand offers carry the
    snapshot's price marked `snapshot <date>`, the provider's health says why, and they stay launchable."""
    caplog.set_level(logging.WARNING)
    config = moto_config(aws_moto, use_pricing_api=True, pricing_endpoint_url=UNREACHABLE, max_attempts=1)
    aws = AwsProvider(config, installation=INSTALLATION, session=aws_session)
    market = Marketplace({"catalog": CatalogProvider(), "aws": aws})
    async with aws:
        health = await market.refresh(OfferQuery(gpus=["A100-SXM-40GB"]))
    assert health["aws"].ok
    [note] = health["aws"].notes
    assert "us-east-1" in note and "snapshot" in note and "connection failed" in note
    od = [o for o in market.offers() if o.provider == "aws" and o.market is Market.on_demand]
    assert od and not [o for o in market.offers() if o.id.startswith("catalog:aws")]
    for o in od:
        assert o.source is OfferSource.snapshot and o.observed_at == snapshot_date()
        assert o.usd_per_hour == aws_on_demand_price(o.sku, "us-east-1") and market.launchable(o)
        assert o.attrs["price_source"] == "catalog" and "connection failed" in o.attrs["price_note"]
    spot = [o for o in market.offers() if o.market is Market.spot]
    assert spot and all(o.source is OfferSource.live for o in spot)
    # A quote says where each option's price comes from.
    spec = JobSpec.model_validate({"name": "t", "gpu": "A100-SXM-40GB", "gpus": 8, "markets": ["on_demand"],
                                   "workload": {"hours": 1}})
    q = quote(market.book(), spec, now=datetime.now(UTC))
    assert q.options and {o.source_label for o in q.options} == {f"snapshot {snapshot_date():%Y-%m-%d}"}
    assert all(o.source is OfferSource.snapshot and o.observed_at == snapshot_date() for o in q.options)
    assert any("Price List API failed" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- regions: all


@pytest.mark.aws
async def test_regions_all_lists_the_enabled_regions(aws_moto: str, aws_session: AioSession) -> None:
    async with AwsProvider(moto_config(aws_moto, regions="all"), installation=INSTALLATION,
                           session=aws_session) as aws:
        regions = await aws.regions()
        assert await aws.price_regions() == regions
    # moto lists 38 regions and answers the opt-in filter with all of them: the adapter checks each.
    assert {"us-east-1", "us-west-2", "eu-west-1"} <= set(regions)
    assert "ap-east-1" not in regions  # not opted in, on moto's account
    assert regions == sorted(regions)


async def test_regions_all_asks_for_opted_in_regions_only() -> None:
    from tests.aws.stubs import stubbed

    async with stubbed(stub_config(regions="all")) as (aws, stub):
        stub.add_response(
            "describe_regions",
            {"Regions": [
                {"RegionName": "us-east-1", "Endpoint": "ec2.us-east-1.amazonaws.com",
                 "OptInStatus": "opt-in-not-required"},
                {"RegionName": "eu-south-2", "Endpoint": "ec2.eu-south-2.amazonaws.com", "OptInStatus": "opted-in"},
            ]},
            {"Filters": [{"Name": "opt-in-status", "Values": ["opt-in-not-required", "opted-in"]}]},
        )
        assert await aws.regions() == ["eu-south-2", "us-east-1"]
        assert await aws.regions() == ["eu-south-2", "us-east-1"]  # cached: one call


async def test_a_scan_that_cannot_wait_prices_from_the_fallback_and_the_fetch_goes_on(shared_data: Path) -> None:
    """The fetch is held until the test lets it answer: a scan past its budget gets the snapshot, noted; the
    fetch is not cancelled, and once it answers the region is live (from the cache, no second fetch)."""
    items, prices = region_answer(shared_data, "eu-west-1", SKUS["eu-west-1"])
    async with stubbed_pricing(pricing_config(regions=["eu-west-1"])) as (pricing, stub, raw):
        answer = asyncio.Event()

        async def held(**_: Any) -> None:
            await answer.wait()

        raw.meta.events.register("after-call.pricing.GetProducts", held)
        expect_products(stub, "eu-west-1", items)
        fut = pricing.start("eu-west-1")
        done, _ = await asyncio.wait({fut}, timeout=0)  # a scan whose budget is spent
        assert not done
        late = pricing.waiting("eu-west-1")
        assert late.source is OfferSource.snapshot and "still fetching" in late.note
        assert "still fetching" in pricing.notes()[0]
        answer.set()
        got = await fut
        assert got.source is OfferSource.live and dict(got.prices) == prices
        assert (await pricing.region("eu-west-1")) == got and pricing.fetches == 1 and pricing.notes() == []


def test_off_says_so() -> None:
    off = OnDemandPricing(stub_config(use_pricing_api=False), PricingClient(stub_config(), session=_session()))
    assert off.notes() == [f"on-demand prices: snapshot {snapshot_date():%Y-%m-%d} (aws.use_pricing_api is off)"]
    auto = OnDemandPricing(stub_config(), PricingClient(stub_config(), session=_session()))  # endpoint_url is set
    assert "set aws.use_pricing_api: true" in auto.notes()[0]
