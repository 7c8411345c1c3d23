"""The tracker against the local Vast-API server: per-model summaries, spikes, webhook, leader lock."""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter

import pytest

from broker.cli.prices import _alert_row
from broker.config import Settings, TrackerConfig
from broker.gpus import normalise_gpu
from broker.models import Market
from broker.store import Store, open_store
from broker.tracker import Tracker
from providers.vast import VastProvider
from providers.vast.config import VastConfig
from standins.vastapi.server import VastApiServer


def all_offers(cfg: VastConfig) -> VastConfig:
    # The tracker summarises what the search returns: ask for the whole (400-ask) market.
    return cfg.model_copy(update={"search_limit": 1000})


def models_in(server: VastApiServer) -> Counter:
    return Counter(normalise_gpu(o["gpu_name"], o["gpu_ram"] / 1000) for o in server.state.offers.values())


async def test_per_model_summaries_are_stored(
    lite_store: Store, vast_api: VastApiServer, vast_config: VastConfig, clock
) -> None:
    cfg = all_offers(vast_config)
    async with VastProvider(cfg) as vast:
        report = await Tracker(Settings(vast=cfg), lite_store, {"vast": vast}, clock=clock).run_once()
        offers = await vast.offers()
    assert report.errors == []
    expected_models = models_in(vast_api)
    # 9 models × 2 markets (every model has asks taking bids) × 3 stats.
    assert report.sources["vast"].seen == report.sources["vast"].stored == len(expected_models) * 2 * 3
    points = lite_store.price_history(provider="vast")
    assert {p.stat for p in points} == {"min", "p10", "median"}
    assert {p.sku for p in points} == {f"{m}/gpu" for m in expected_models}
    on_demand = {(p.gpu, p.stat): p for p in points if p.market == Market.on_demand}
    for model, n in expected_models.items():
        # Every ask of the model was counted, and the figures are per GPU-hour of its offers.
        assert on_demand[(model, "median")].count == n
        per_gpu = sorted(
            o.usd_per_gpu_hour for o in offers if o.gpu == model and o.market == Market.on_demand
        )
        assert on_demand[(model, "median")].usd_per_hour == pytest.approx(
            statistics.median(per_gpu), abs=1e-6
        )
        assert on_demand[(model, "min")].usd_per_hour == pytest.approx(per_gpu[0], abs=1e-6)
        assert (
            per_gpu[0] <= on_demand[(model, "p10")].usd_per_hour <= on_demand[(model, "median")].usd_per_hour
        )
    h100 = on_demand[("H100-SXM", "median")].usd_per_hour
    assert h100 > on_demand[("RTX-4090", "median")].usd_per_hour  # a sanity check on the market itself

    # The same market polled again: every figure repeats its stored price, nothing new is kept.
    clock.advance(minutes=5)
    async with VastProvider(cfg) as vast:
        again = await Tracker(Settings(vast=cfg), lite_store, {"vast": vast}, clock=clock).run_once()
    assert again.sources["vast"].seen == report.sources["vast"].seen and again.sources["vast"].stored == 0


def scale(server: VastApiServer, model: str, factor: float) -> int:
    n = 0
    for o in server.state.offers.values():
        if normalise_gpu(o["gpu_name"], o["gpu_ram"] / 1000) == model:
            o["dph_base"] = round(o["dph_base"] * factor, 4)
            if o.get("min_bid") is not None:
                o["min_bid"] = round(o["min_bid"] * factor, 4)
            n += 1
    return n


async def test_a_price_spike_is_stored_posted_and_cleared(
    lite_store: Store, vast_api: VastApiServer, vast_config: VastConfig, webhook, clock
) -> None:
    cfg = all_offers(vast_config)
    settings = Settings(vast=cfg, tracker=TrackerConfig(webhook_url=f"{webhook.url}/hook"))
    async with VastProvider(cfg) as vast:
        tracker = Tracker(settings, lite_store, {"vast": vast}, clock=clock)
        first = await tracker.run_once()
        assert first.spikes_opened == 0 and webhook.received == []

        assert scale(vast_api, "RTX-4090", 3.0) == 114  # every 4090 host triples its price
        clock.advance(minutes=5)
        spiked = await tracker.run_once()
        assert spiked.spikes_opened == 2 and spiked.spikes_closed == 0  # on-demand and bid medians
        opened = lite_store.alerts(open_only=True)
        assert {(a["series"]["market"], a["series"]["sku"], a["series"]["stat"]) for a in opened} == {
            ("on_demand", "RTX-4090/gpu", "median"),
            ("spot", "RTX-4090/gpu", "median"),
        }
        for a in opened:
            assert a["peak"] / a["baseline"] == pytest.approx(3.0, rel=0.02)
        assert [e["event"] for e in webhook.received] == ["spike_opened", "spike_opened"]
        assert {e["series"]["gpu"] for e in webhook.received} == {"RTX-4090"}
        assert all(e["ratio"] > settings.tracker.spike_multiple for e in webhook.received)

        scale(vast_api, "RTX-4090", 1.5)  # the spike climbs on: the same alerts stay open
        clock.advance(minutes=5)
        climbed = await tracker.run_once()
        assert climbed.spikes_opened == 0 and climbed.spikes_closed == 0 and len(webhook.received) == 2
        for a in lite_store.alerts(open_only=True):
            assert a["peak"] / a["baseline"] == pytest.approx(4.5, rel=0.02)  # the stored peak follows the climb
            assert _alert_row(a)["ratio"] == pytest.approx(4.5, rel=0.02)

        scale(vast_api, "RTX-4090", 1 / 4.5)  # back to (about) the old prices
        clock.advance(minutes=5)
        cleared = await tracker.run_once()
    assert cleared.spikes_closed == 2 and cleared.spikes_opened == 0
    assert lite_store.alerts(open_only=True) == []
    assert [a["end"] is not None for a in lite_store.alerts()] == [True, True]
    assert [e["event"] for e in webhook.received] == ["spike_opened"] * 2 + ["spike_closed"] * 2


async def test_a_failing_webhook_does_not_break_tracking(
    lite_store: Store, vast_api: VastApiServer, vast_config: VastConfig, webhook, clock
) -> None:
    cfg = all_offers(vast_config)
    settings = Settings(vast=cfg, tracker=TrackerConfig(webhook_url=f"{webhook.url}/broken"))
    async with VastProvider(cfg) as vast:
        tracker = Tracker(settings, lite_store, {"vast": vast}, clock=clock)
        await tracker.run_once()
        scale(vast_api, "H100-SXM", 2.0)
        clock.advance(minutes=5)
        report = await tracker.run_once()
    assert report.spikes_opened == 2 and report.webhook_failures == 2
    assert report.sources["vast"].stored > 0 and report.errors == []
    assert webhook.broken_calls == 2 * 3  # each event tried 3 times (5xx is transient), then given up
    assert len(lite_store.alerts(open_only=True)) == 2  # the alerts are stored all the same


async def test_two_trackers_on_one_postgresql_poll_once_between_them(
    pg_database, vast_api: VastApiServer, vast_config: VastConfig, clock
) -> None:
    url = pg_database()
    store_a, store_b = open_store(url), Store(url)
    settings = Settings(vast=vast_config, tracker=TrackerConfig(interval_s=3600))
    try:
        async with VastProvider(vast_config) as vast_a, VastProvider(vast_config) as vast_b:
            a = Tracker(settings, store_a, {"vast": vast_a}, clock=clock)
            b = Tracker(settings, store_b, {"vast": vast_b}, clock=clock)
            stop_a = asyncio.Event()
            task_a = asyncio.create_task(a.run_forever(stop_a))
            await asyncio.wait_for(a.polled.wait(), 60)
            assert a.leading and a.runs == 1
            searches = len(vast_api.state.searches())
            assert searches == 1

            skipped = await b.run_once()  # A holds the lock: B must not poll
            assert skipped.leader is False and skipped.sources == {}
            assert len(vast_api.state.searches()) == searches

            stop_a.set()
            await asyncio.wait_for(task_a, 60)  # A stops and lets the lock go
            assert not a.leading
            took_over = await b.run_once()
            assert took_over.leader is True and took_over.sources["vast"].seen > 0
            assert len(vast_api.state.searches()) == searches + 1
    finally:
        store_a.close()
        store_b.close()
