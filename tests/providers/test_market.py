"""The market (broker/market.py) on its own: merge, stale marking, snapshot rows giving way, the query filter.

The providers here are in-memory ones that implement the interface: what is tested is the
market's own logic; the adapters are tested against their real parts by the kit.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from broker.market import Marketplace
from broker.models import Allocation, AllocationStatus, Locality, Market, Offer, OfferSource, Perf, source_label
from policies.book import SOURCES, OfferBook, offer_columns
from providers.base import LaunchRequest, OfferQuery, Provider
from providers.capabilities import Launches, Snapshot

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def offer(market_name: str, sku: str, *, gpu: str = "H100-SXM", price: float = 10.0, region: str = "r1",
          source: OfferSource = OfferSource.live, market: Market = Market.on_demand) -> Offer:
    return Offer(id=f"{source.value}:{market_name}:{sku}:{region}", provider=market_name, market=market, sku=sku,
                 gpu=gpu, gpu_count=8, usd_per_hour=price, locality=Locality(provider=market_name, region=region),
                 source=source, observed_at=T0 - timedelta(days=3) if source is OfferSource.snapshot else T0)


class Memory(Provider):
    """A market in memory: answers what it is given, or fails, or hangs; counts the calls."""

    def __init__(self, name: str, offers: list[Offer]) -> None:
        self.name = name
        self.answer = offers
        self.fail: Exception | None = None
        self.hang = False
        self.queries: list[OfferQuery | None] = []

    async def offers(self, query: OfferQuery | None = None) -> list[Offer]:
        self.queries.append(query)
        if self.hang:
            await asyncio.sleep(3600)
        if self.fail is not None:
            raise self.fail
        return list(self.answer)  # everything, whatever the query: the market must filter


class MemorySnapshot(Memory, Snapshot):
    @property
    def as_of(self) -> datetime:
        return T0 - timedelta(days=3)


def ids(offers: list[Offer]) -> set[str]:
    return {o.id for o in offers}


async def test_merge_keeps_every_provider_and_finds_by_id() -> None:
    a = Memory("a", [offer("a", "x"), offer("a", "y")])
    b = Memory("b", [offer("b", "z")])
    market = Marketplace({"a": a, "b": b}, clock=Clock())
    health = await market.refresh()
    assert health["a"].ok and health["b"].ok and (health["a"].offers, health["b"].offers) == (2, 1)
    assert ids(market.offers()) == ids(a.answer) | ids(b.answer)
    assert market.find("live:b:z:r1") == b.answer[0] and market.find("nope") is None
    assert len(market.book()) == 3
    assert not market.has_snapshot
    assert market.launcher("a") is None and market.launcher("nope") is None  # in-memory markets only list


async def test_a_failing_provider_keeps_its_offers_marked_stale_and_the_others_stand() -> None:
    clock = Clock()
    a = Memory("a", [offer("a", "x")])
    b = Memory("b", [offer("b", "z")])
    market = Marketplace({"a": a, "b": b}, clock=clock)
    await market.refresh()
    clock.now += timedelta(minutes=5)
    a.fail = RuntimeError("region down")
    health = await market.refresh()
    assert not health["a"].ok and health["a"].stale and "region down" in health["a"].last_error
    assert health["a"].age_s == 300.0 and health["a"].last_ok == T0
    assert health["b"].ok and not health["b"].stale
    by_id = {o.id: o for o in market.offers()}
    assert by_id["live:a:x:r1"].stale and not by_id["live:b:z:r1"].stale
    a.fail = None
    await market.refresh()
    assert not any(o.stale for o in market.offers())


async def test_a_provider_that_hangs_times_out_and_goes_stale() -> None:
    slow = Memory("slow", [offer("slow", "x")])
    fast = Memory("fast", [offer("fast", "y")])
    market = Marketplace({"slow": slow, "fast": fast}, timeout_s=0.05, clock=Clock())
    await market.refresh()
    slow.hang = True
    health = await market.refresh()
    assert health["slow"].last_error == "timed out" and health["fast"].ok
    assert {o.id: o.stale for o in market.offers()} == {"live:slow:x:r1": True, "live:fast:y:r1": False}


async def test_snapshot_rows_give_way_to_live_offers_of_the_same_market() -> None:
    catalog = MemorySnapshot("catalog", [
        offer("aws", "p5", source=OfferSource.snapshot),
        offer("vast", "8x-H100", source=OfferSource.snapshot),
    ])
    aws = Memory("aws", [offer("aws", "p5", price=12.0)])
    market = Marketplace({"catalog": catalog, "aws": aws}, clock=Clock())
    assert market.has_snapshot
    await market.refresh()
    # Live AWS answered: its snapshot rows go; Vast is not live here, so its snapshot rows stay.
    assert ids(market.offers()) == {"live:aws:p5:r1", "snapshot:vast:8x-H100:r1"}
    assert market.live_markets() == {"aws"}
    # Live AWS fails: its snapshot rows come back, beside its own offers (kept, marked stale).
    aws.fail = RuntimeError("throttled")
    await market.refresh()
    got = {o.id: o.stale for o in market.offers()}
    assert got == {"live:aws:p5:r1": True, "snapshot:aws:p5:r1": False, "snapshot:vast:8x-H100:r1": False}
    # A live market that answers nothing is not live either.
    aws.fail, aws.answer = None, []
    await market.refresh()
    assert ids(market.offers()) == ids(catalog.answer)


async def test_the_query_is_applied_once_by_the_market_to_every_answer() -> None:
    a = Memory("a", [offer("a", "cheap", price=2.0), offer("a", "dear", price=50.0),
                     offer("a", "a100", gpu="A100-SXM-80GB", price=3.0)])
    b = Memory("b", [offer("b", "spot", price=1.0, market=Market.spot), offer("b", "od", price=4.0)])
    market = Marketplace({"a": a, "b": b}, clock=Clock())
    q = OfferQuery(gpus=["H100-SXM"], max_usd_per_hour=10.0, markets=[Market.on_demand])
    health = await market.refresh(q)
    assert a.queries == [q] and b.queries == [q]  # each provider asked once, with the query to push down
    assert ids(market.offers()) == {"live:a:cheap:r1", "live:b:od:r1"}
    assert (health["a"].offers, health["b"].offers) == (1, 1)  # health counts what the market kept
    await market.refresh()  # no query: nothing filtered
    assert len(market.offers()) == 5


async def test_measured_performance_is_merged_into_the_offers_of_that_sku() -> None:
    measured = Perf(source="probe", tflops_bf16=850.0)

    async def after_refresh() -> None:  # what the service does: measured speed from stored benchmarks
        market.measured = {("a", "x"): measured}

    a = Memory("a", [offer("a", "x"), offer("a", "y")])
    market = Marketplace({"a": a}, clock=Clock(), after_refresh=after_refresh)
    await market.refresh()
    perf = {o.sku: o.perf for o in market.offers()}
    assert perf == {"x": measured, "y": None}


class MemoryLauncher(Memory, Launches):
    """A market in memory that launches (never called here: launchability is what is tested)."""

    async def launch(self, req: LaunchRequest) -> Allocation:
        raise NotImplementedError

    async def poll(self, alloc: Allocation) -> AllocationStatus:
        raise NotImplementedError

    async def release(self, alloc: Allocation) -> None:
        raise NotImplementedError

    async def owned(self) -> list[Allocation]:
        return []


async def test_a_failing_providers_kept_offers_are_tracked_with_their_age() -> None:
    clock = Clock()
    a = Memory("a", [offer("a", "x")])
    market = Marketplace({"a": a}, clock=clock)
    await market.refresh()
    assert [(o.source, o.observed_at) for o in market.offers()] == [(OfferSource.live, T0)]
    clock.now += timedelta(minutes=5)
    a.fail = RuntimeError("down")
    await market.refresh()
    [o] = market.offers()
    assert o.source is OfferSource.tracked and o.stale and o.observed_at == T0
    assert source_label(o.source, o.observed_at, clock.now) == "tracked 5m"
    a.fail = None
    await market.refresh()
    assert [o.source for o in market.offers()] == [OfferSource.live]


async def test_a_live_providers_own_snapshot_priced_rows_stay_and_launch_but_the_catalogs_do_not() -> None:
    """The AWS adapter prices on-demand offers from the snapshot when the Price List API fails: those rows are
    its own (launchable, marked snapshot); the catalog's rows of the same market still give way to them."""
    catalog = MemorySnapshot("catalog", [offer("aws", "p5", source=OfferSource.snapshot),
                                         offer("vast", "8x-H100", source=OfferSource.snapshot)])
    own = offer("aws", "p4d", source=OfferSource.snapshot)
    own = own.model_copy(update={"id": "aws:on_demand:r1:r1a:p4d"})
    aws = MemoryLauncher("aws", [own])
    vast = Memory("vast", [])  # answers nothing: not live for the market, so its snapshot rows stay
    market = Marketplace({"catalog": catalog, "aws": aws, "vast": vast}, clock=Clock())
    await market.refresh()
    got = {o.id: o for o in market.offers()}
    assert set(got) == {own.id, "snapshot:vast:8x-H100:r1"}
    assert market.live_markets() == {"aws"}
    assert market.launchable(got[own.id]) and got[own.id].source is OfferSource.snapshot
    assert not market.launchable(got["snapshot:vast:8x-H100:r1"])  # a snapshot's row: never launched
    # The book carries the source; a quote counts feasible rows per market and source.
    book = market.book()
    assert [SOURCES[c] for c in book["source"].tolist()] == [OfferSource.snapshot] * 2
    bare = OfferBook.from_columns(offer_columns(market.offers()))  # no Offer objects: rows made from columns
    assert {bare.offer(i).source for i in range(len(bare))} == {OfferSource.snapshot}
    tracked = offer("aws", "x").model_copy(update={"source": OfferSource.tracked})
    assert OfferBook.from_columns(offer_columns([tracked])).offer(0).source is OfferSource.tracked
