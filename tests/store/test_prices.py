"""Price history: dedup on ingest, filters, compaction and pruning."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from broker.models import Market, PriceFilter, PricePoint
from broker.store import Store
from broker.store import prices as price_store

from .helpers import T0


def _p(price: float, minutes: float, sku: str = "p5.48xlarge", gpu: str = "H100-SXM", zone: str = "us-east-1a",
       provider: str = "aws", market: Market = Market.spot, region: str = "us-east-1", stat: str = "price",
       count: int | None = None) -> PricePoint:
    return PricePoint(provider=provider, market=market, sku=sku, gpu=gpu, region=region, zone=zone,
                      usd_per_hour=price, at=T0 + timedelta(minutes=minutes), stat=stat, count=count)


def test_dedup_within_and_across_batches(store: Store) -> None:
    n = store.add_price_points([_p(10.0, 0), _p(10.0, 5), _p(12.0, 10), _p(12.0, 15), _p(10.0, 20)])
    assert n == 3
    # Same price as the latest stored point: nothing new. Overlapping old points: ignored.
    assert store.add_price_points([_p(10.0, 25), _p(11.0, 3)]) == 0
    assert store.add_price_points([_p(11.0, 30)]) == 1
    hist = store.price_history(sku="p5.48xlarge")
    assert [(p.usd_per_hour, p.at) for p in hist] == [
        (10.0, T0), (12.0, T0 + timedelta(minutes=10)), (10.0, T0 + timedelta(minutes=20)),
        (11.0, T0 + timedelta(minutes=30)),
    ]
    # Another series with the same price is its own series.
    assert store.add_price_points([_p(11.0, 30, zone="us-east-1b")]) == 1
    assert store.add_price_points([]) == 0


def test_latest_and_last_seen(store: Store) -> None:
    store.add_price_points([_p(10.0, 0), _p(12.0, 10), _p(3.0, 50, provider="vast", region="", zone="")])
    latest = store.latest_price_point("aws", Market.spot, "p5.48xlarge", "us-east-1", "us-east-1a")
    assert latest is not None and latest.usd_per_hour == 12.0 and latest.at == T0 + timedelta(minutes=10)
    assert latest.gpu == "H100-SXM" and latest.at.tzinfo is not None
    assert store.latest_price_point("aws", Market.spot, "p5.48xlarge", "us-east-1", "us-east-1a", stat="min") is None
    assert store.last_seen("aws") == T0 + timedelta(minutes=10)
    assert store.last_seen("aws", region="us-east-1") == T0 + timedelta(minutes=10)
    assert store.last_seen("aws", region="eu-west-1") is None
    assert store.last_seen("vast") == T0 + timedelta(minutes=50)
    assert store.last_seen("nobody") is None


def test_history_filters(store: Store) -> None:
    store.add_price_points([
        _p(10.0, 0), _p(11.0, 60),
        _p(5.0, 0, sku="p4d.24xlarge", gpu="A100-SXM-40GB"),
        _p(2.0, 30, sku="g6e.xlarge", gpu="L40S", market=Market.on_demand),
        _p(3.0, 30, sku="h100nvl", gpu="H100-NVL", provider="vast", region="", zone=""),
        _p(2.5, 30, sku="h100nvl", gpu="H100-NVL", provider="vast", region="", zone="", stat="min", count=12),
    ])
    h100 = store.price_history(gpu="H100")
    assert {p.gpu for p in h100} == {"H100-SXM", "H100-NVL"} and len(h100) == 4
    assert [p.at for p in h100] == sorted(p.at for p in h100)
    assert len(store.price_history(gpu="H100-SXM")) == 2
    assert [p.sku for p in store.price_history(gpu="A100")] == ["p4d.24xlarge"]
    assert [p.sku for p in store.price_history(market=Market.on_demand)] == ["g6e.xlarge"]
    assert len(store.price_history(provider="vast")) == 2
    mins = store.price_history(provider="vast", stat="min")
    assert [(p.usd_per_hour, p.count) for p in mins] == [(2.5, 12)]
    assert len(store.price_history(zone="us-east-1a")) == 4
    assert len(store.price_history(region="us-east-1")) == 4
    window = store.price_history(since=T0 + timedelta(minutes=30), until=T0 + timedelta(minutes=60))
    assert sorted(p.sku for p in window) == ["g6e.xlarge", "h100nvl", "h100nvl"]
    last = store.price_history(gpu="H100-SXM", limit=1)
    assert [p.usd_per_hour for p in last] == [11.0]  # limit keeps the newest


def test_compaction_keeps_last_point_per_bucket(store: Store) -> None:
    # Hour 0: 4 points, hour 1: 2 points, hour 2 (recent): 3 points.
    pts = [_p(10.0 + i, m) for i, m in enumerate([0, 10, 20, 50, 65, 70, 125, 130, 140])]
    pts += [_p(1.0, 0, zone="us-east-1b"), _p(2.0, 5, zone="us-east-1b")]
    assert store.add_price_points(pts) == 11
    deleted = store.compact_prices(older_than=T0 + timedelta(hours=2), bucket_seconds=3600)
    assert deleted == 3 + 1 + 1
    kept = store.price_history(zone="us-east-1a")
    assert [p.usd_per_hour for p in kept] == [13.0, 15.0, 16.0, 17.0, 18.0]
    assert [p.usd_per_hour for p in store.price_history(zone="us-east-1b")] == [2.0]
    assert store.compact_prices(older_than=T0 + timedelta(hours=2)) == 0  # idempotent


def test_prune(store: Store) -> None:
    store.add_price_points([_p(1.0, 0), _p(2.0, 60), _p(3.0, 120)])
    assert store.prune_prices(T0 + timedelta(minutes=90)) == 2
    assert [p.usd_per_hour for p in store.price_history()] == [3.0]


def test_series_columns_hold_the_same_points_as_history(store: Store) -> None:
    store.add_price_points([
        _p(10.0, 0), _p(11.0, 60), _p(12.0, 120),
        _p(9.0, 30, zone="us-east-1b"),
        _p(3.0, 30, sku="h100nvl", gpu="H100-NVL", provider="vast", region="", zone="", count=7),
        _p(5.0, 0, sku="p4d.24xlarge", gpu="A100-SXM-40GB"),
    ])
    series = store.price_series(gpu="H100")
    assert [(s.provider, s.sku, s.zone) for s in series] == [
        ("aws", "p5.48xlarge", "us-east-1a"), ("aws", "p5.48xlarge", "us-east-1b"), ("vast", "h100nvl", ""),
    ]
    assert series[0].usd_per_hour == [10.0, 11.0, 12.0] and series[0].at == sorted(series[0].at)
    assert series[2].count == [7] and series[2].gpu == "H100-NVL"
    flat = store.price_history(gpu="H100")
    assert sorted((p for s in series for p in s.points()), key=lambda p: (p.at, p.zone, p.sku)) == sorted(
        flat, key=lambda p: (p.at, p.zone, p.sku)
    )
    # A window leaves out series with no point in it.
    window = store.price_series(gpu="H100", since=T0 + timedelta(minutes=45))
    assert [(s.zone, s.usd_per_hour) for s in window] == [("us-east-1a", [11.0, 12.0])]
    assert store.price_series(gpu="B200") == []


def test_times_round_trip_to_the_microsecond(store: Store) -> None:
    exact = datetime(2026, 3, 1, 12, 0, 0, 123457, tzinfo=UTC)
    naive = datetime(2026, 3, 1, 12, 0, 1, 999999)  # taken as UTC
    plus2 = datetime(2026, 3, 1, 14, 0, 2, tzinfo=timezone(timedelta(hours=2)))  # 12:00:02 UTC
    pts = [_p(1.0, 0), _p(2.0, 0), _p(3.0, 0)]
    for p, at in zip(pts, (exact, naive, plus2), strict=True):
        p.at = at
    assert store.add_price_points(pts) == 3
    got = [p.at for p in store.price_history()]
    assert got == [exact, naive.replace(tzinfo=UTC), datetime(2026, 3, 1, 12, 0, 2, tzinfo=UTC)]
    assert all(at.tzinfo is UTC for at in got)
    assert store.last_seen("aws") == datetime(2026, 3, 1, 12, 0, 2, tzinfo=UTC)
    assert [p.usd_per_hour for p in store.price_history(since=exact + timedelta(microseconds=1))] == [2.0, 3.0]


def test_reads_past_the_series_id_limit_scan_and_keep_only_matches(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.add_price_points([
        _p(10.0, 0), _p(11.0, 60), _p(9.0, 30, zone="us-east-1b"),
        _p(5.0, 10, sku="p4d.24xlarge", gpu="A100-SXM-40GB"), _p(6.0, 90, sku="p4d.24xlarge", gpu="A100-SXM-40GB"),
    ])
    named = (store.price_history(gpu="H100"), store.price_history(gpu="H100", limit=2), store.price_series(gpu="H100"))
    monkeypatch.setattr(price_store, "_MAX_IDS", 1)  # every read below takes the scanning path
    assert (store.price_history(gpu="H100"), store.price_history(gpu="H100", limit=2),
            store.price_series(gpu="H100")) == named
    assert [p.usd_per_hour for p in named[1]] == [9.0, 11.0]
    assert [p.usd_per_hour for p in store.price_history(limit=2)] == [11.0, 6.0]


def test_a_series_keeps_its_newest_point_and_gpu_after_pruning(store: Store) -> None:
    store.add_price_points([_p(1.0, 0), _p(2.0, 60)])
    store.add_price_points([_p(3.0, 120, gpu="H100-SXM-renamed")])
    assert store.prune_prices(T0 + timedelta(hours=3)) == 3
    latest = store.latest_price_point("aws", Market.spot, "p5.48xlarge", "us-east-1", "us-east-1a")
    assert latest is not None and (latest.usd_per_hour, latest.gpu) == (3.0, "H100-SXM-renamed")
    assert store.add_price_points([_p(3.0, 180)]) == 0  # still deduplicated against it
    assert store.add_price_points([_p(4.0, 180)]) == 1


def test_one_price_filter_or_its_fields_as_keywords(store: Store) -> None:
    store.add_price_points([
        _p(10.0, 0), _p(11.0, 60), _p(12.0, 120), _p(9.0, 30, zone="us-east-1b"),
        _p(3.0, 30, sku="h100nvl", gpu="H100-NVL", provider="vast", region="", zone="", market=Market.on_demand),
    ])
    f = PriceFilter(gpu="H100", market=Market.spot, since=T0 + timedelta(minutes=30), limit=2)
    assert store.price_history(f) == store.price_history(gpu="H100", market="spot", since=f.since, limit=2)
    assert [(p.zone, p.usd_per_hour) for p in store.price_history(f)] == [("us-east-1a", 11.0), ("us-east-1a", 12.0)]
    with pytest.raises(TypeError):
        store.price_history(f, gpu="A100")
    with pytest.raises(ValidationError):
        store.price_history(colour="red")  # every field is PriceFilter's, checked like any other input
    with pytest.raises(ValidationError):
        PriceFilter(since="1700000000")  # times are ISO 8601, never a bare number


def test_series_limit_keeps_the_newest_points_across_series(store: Store) -> None:
    store.add_price_points([_p(10.0, 0), _p(11.0, 60), _p(12.0, 120), _p(9.0, 30, zone="us-east-1b"),
                            _p(8.0, 90, zone="us-east-1b")])
    newest = store.price_series(PriceFilter(gpu="H100", limit=3))
    assert [(s.zone, s.usd_per_hour) for s in newest] == [("us-east-1a", [11.0, 12.0]), ("us-east-1b", [8.0])]
    flat = store.price_history(PriceFilter(gpu="H100", limit=3))
    assert sorted(p.at for s in newest for p in s.points()) == [p.at for p in flat]
