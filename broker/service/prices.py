"""Prices: recorded history (points or series in columns), the spikes in it, the tracker's alerts,
a tracker run, and replays of recorded spot prices through the spike rule.

The spike rule and which series it watches are :mod:`policies.spikes`, with the tracker's settings
(``tracker.spike_multiple``, ``clear_multiple``, ``window``): a chart shows the spikes the tracker flags.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.errors import SpecError
from broker.models import PriceFilter, PricePoint, PriceSeries, SeriesKey, Spike
from broker.service.runtime import Runtime

if TYPE_CHECKING:
    from broker.price_replay import SpotRecord
    from broker.tracker import TrackReport

SERIES_WINDOW = timedelta(days=7)  # price_series reads this far back unless told ``since``


@dataclass(frozen=True)
class Replay:
    """Recorded spot prices run through the spike rule: the records, the rule's settings and the spikes."""

    records: list[SpotRecord]
    multiple: float
    clear: float
    window: int
    spikes: list[dict[str, Any]]


def series_spikes(series: list[PriceSeries], tracker: Any) -> dict[SeriesKey, list[Spike]]:
    """The spikes in each series by the tracker's rule and settings (``tracker``: the ``tracker`` section);
    none in a series the tracker does not watch (owned and reserved rates, a marketplace's min and p10)."""
    from policies.spikes import detect_spikes, watched

    return {
        s.key: detect_spikes(list(zip(s.at, s.usd_per_hour, strict=True)), tracker.spike_multiple,
                             tracker.clear_multiple, tracker.window) if watched(s.market.value, s.stat) else []
        for s in series
    }


def spike_stat_series(series: list[PriceSeries]) -> list[PriceSeries]:
    """The series whose stat the spike rule watches (prices and marketplace medians): what a chart of
    spikes shows when no stat is asked for."""
    from policies.spikes import SPIKE_STATS

    return [s for s in series if s.stat in SPIKE_STATS]


class PricesService(Runtime):
    async def price_history(self, f: PriceFilter) -> list[PricePoint]:
        """Stored points matching ``f``, oldest first; ``f.limit`` keeps the newest."""
        return await self.db(self.store.price_history, f)

    async def price_series(self, f: PriceFilter) -> list[PriceSeries]:
        """Stored history per series, in columns; ``since`` defaults to seven days before ``until``
        (or before now)."""
        if f.since is None:
            f = f.model_copy(update={"since": (f.until if f.until is not None else self.clock()) - SERIES_WINDOW})
        return await self.db(self.store.price_series, f)

    def spikes(self, series: list[PriceSeries]) -> dict[SeriesKey, list[Spike]]:
        """The spikes in each series by the tracker's rule and settings (see :func:`series_spikes`)."""
        return series_spikes(series, self.settings.tracker)

    async def alerts(self, open_only: bool = False, since: datetime | None = None) -> list[dict[str, Any]]:
        """The spikes the tracker flagged, newest first (see ``Store.alerts``)."""
        return await self.db(self.store.alerts, open_only, since)

    async def track_once(self) -> TrackReport:
        """One tracker run, unless another tracker holds the leader lock (then ``leader`` is False)."""
        return await self.tracker.run_once()

    async def track_until(self, stop: asyncio.Event) -> None:
        """A tracker run every ``tracker.interval_s`` while this process leads, until ``stop`` is set."""
        await self.tracker.run_forever(stop)

    def replay(self, path: str | Path, multiple: float | None = None, clear: float | None = None,
               window: int | None = None) -> Replay:
        """Recorded spot prices (a DescribeSpotPriceHistory JSON or a TSV file) through the spike rule;
        the rule's settings default to the tracker's."""
        from broker.price_replay import load_records, replay

        t = self.settings.tracker
        m = multiple if multiple is not None else t.spike_multiple
        c = clear if clear is not None else min(t.clear_multiple, m)
        w = window or t.window
        if m <= 1.0:
            raise SpecError("multiple", "must be above 1")
        if not 0 < c <= m:
            raise SpecError("clear", "must be above 0 and at most the multiple")
        records = load_records(path)
        return Replay(records, m, c, w, replay(records, m, c, w))
