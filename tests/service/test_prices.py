"""Prices through the service: the series window, and spikes by the tracker's one rule and settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.config import Settings, TrackerConfig
from broker.errors import SpecError
from broker.models import Market, PriceFilter, PricePoint
from broker.service import Lockstep
from broker.store import Store

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def _points(market: Market, stat: str = "price", prices: tuple[float, ...] = (10, 10.5, 10, 10.2, 30, 31, 10),
            start: datetime = NOW - timedelta(hours=10)) -> list[PricePoint]:
    return [PricePoint(provider="p", market=market, sku=f"{market.value}-{stat}", gpu="H100-SXM", stat=stat,
                       usd_per_hour=price, at=start + timedelta(hours=i)) for i, price in enumerate(prices)]


async def test_spikes_follow_the_trackers_rule_and_settings(store: Store) -> None:
    store.add_price_points(_points(Market.spot) + _points(Market.reserved) + _points(Market.on_demand, "min")
                           + _points(Market.on_demand, "median"))
    svc = Lockstep(Settings(db_url=store.url), providers={}, store=store, clock=lambda: NOW)
    series = await svc.price_series(PriceFilter(gpu="H100"))
    spikes = {s.sku: [(sp.peak, sp.baseline) for sp in found] for s in series for found in [svc.spikes([s])[s.key]]}
    # The baseline is the median of the change-only points before the jump: 10, 10.5, 10, 10.2.
    assert spikes == {"spot-price": [(31.0, pytest.approx(10.1))], "on_demand-median": [(31.0, pytest.approx(10.1))],
                      "reserved-price": [], "on_demand-min": []}
    strict = Lockstep(Settings(db_url=store.url, tracker=TrackerConfig(spike_multiple=4.0, clear_multiple=2.0)),
                      providers={}, store=store)
    assert all(not found for found in strict.spikes(series).values())  # a 3× jump is not a spike at 4×


async def test_series_reads_a_week_unless_told(store: Store) -> None:
    store.add_price_points(_points(Market.spot, prices=(5.0, 6.0), start=NOW - timedelta(days=9))
                           + _points(Market.spot, prices=(7.0,), start=NOW - timedelta(days=1)))
    svc = Lockstep(Settings(db_url=store.url), providers={}, store=store, clock=lambda: NOW)
    assert [s.usd_per_hour for s in await svc.price_series(PriceFilter())] == [[7.0]]
    assert [s.usd_per_hour for s in await svc.price_series(PriceFilter(since=NOW - timedelta(days=10)))] == [
        [5.0, 6.0, 7.0]]
    assert [s.usd_per_hour for s in await svc.price_series(PriceFilter(until=NOW - timedelta(days=5)))] == [
        [5.0, 6.0]]


def test_replay_rule_settings_default_to_the_trackers_and_are_checked(tmp_path) -> None:
    svc = Lockstep(Settings(tracker=TrackerConfig(spike_multiple=2.0, clear_multiple=1.5, window=3)), providers={})
    f = tmp_path / "prices.tsv"
    rows = [("use1-az1", "p5.48xlarge", "Linux/UNIX", price, f"2026-03-01T{h:02d}:00:00Z")
            for h, price in enumerate((10, 10, 10, 25, 10))]
    f.write_text("".join("\t".join(map(str, r)) + "\n" for r in rows))
    result = svc.replay(f)
    assert (result.multiple, result.clear, result.window, len(result.records)) == (2.0, 1.5, 3, 5)
    assert [(s["peak"], s["baseline"]) for s in result.spikes] == [(25.0, 10.0)]
    assert svc.replay(f, multiple=3.0).spikes == []
    with pytest.raises(SpecError, match="multiple"):
        svc.replay(f, multiple=1.0)
    with pytest.raises(SpecError, match="clear"):
        svc.replay(f, multiple=2.0, clear=2.5)
