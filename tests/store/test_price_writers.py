"""Two processes' stores writing the same price series at once (PostgreSQL: several replicas)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from datetime import timedelta

from broker.models import Market, PricePoint
from broker.store import Store

from .helpers import T0

SERIES = [("spot", "us-east-1a"), ("spot", "us-east-1b"), ("on_demand", "us-east-1a"), ("on_demand", "us-east-1b")]


def _points(start: int, n: int, reverse: bool = False) -> list[PricePoint]:
    """Minutes start..start+n of four series in two markets (so two lock groups), the price changing
    every minute; ``reverse`` lists the series the other way round."""
    return [
        PricePoint(provider="aws", market=Market(market), sku="p5.48xlarge", gpu="H100-SXM", region="us-east-1",
                   zone=zone, usd_per_hour=10.0 + (m % 7), at=T0 + timedelta(minutes=m))
        for market, zone in (SERIES[::-1] if reverse else SERIES)
        for m in range(start, start + n)
    ]


def test_concurrent_writers_of_one_series_neither_fail_nor_duplicate(pg_database: Callable[[], str]) -> None:
    url = pg_database()
    stores = [Store(url) for _ in range(2)]
    stores[0].migrate()
    # Overlapping batches: both writers see new series (created concurrently) and the same minutes.
    # The second writer meets the series in the opposite order (row locks taken in batch order deadlocked).
    batches = [[_points(0, 300), _points(200, 300)], [_points(100, 300, True), _points(250, 300, True)]]
    stored = [0, 0]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def write(i: int) -> None:
        try:
            barrier.wait()
            for batch in batches[i]:
                stored[i] += stores[i].add_price_points(batch)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        for market, zone in SERIES:
            hist = stores[0].price_history(market=market, zone=zone)
            ats = [p.at for p in hist]
            assert ats == sorted(set(ats)), "a minute stored twice or out of order"
            prices = [p.usd_per_hour for p in hist]
            assert all(a != b for a, b in itertools.pairwise(prices)), "a repeated price was stored"
            assert ats[0] == T0 and ats[-1] == T0 + timedelta(minutes=549)
        assert sum(stored) == len(stores[0].price_history())
    finally:
        for s in stores:
            s.close()
