"""Price spikes: pure functions over (time, price) series. No I/O, no clock.

The rule (documented in docs/tracker.md):

- The *baseline* of a point is the median of the last ``window`` points before it
  that were not themselves inside a spike (a spike must not raise its own bar).
- A spike *opens* at the first point whose price is above ``multiple × baseline``,
  once at least ``min_points`` points make the baseline.
- While open, the baseline is frozen at its opening value; the *peak* is the
  highest price seen. The spike *closes* at the first point whose price falls
  below ``clear_multiple × baseline`` (hysteresis: ``clear_multiple`` below
  ``multiple`` keeps a price hovering near the threshold from flapping).

Series are change-only (the store keeps a point only when the price changes), so
``window`` counts price changes, not polls.

:class:`SpikeDetector` is the incremental form the tracker uses between runs:
resume it from the stored history and the open alert, feed it new points, read
the events. :func:`detect_spikes` runs one over a whole series. :func:`watched` says which series
the rule applies to (the prices and marketplace medians of spot and on-demand markets).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from broker.models import Market, Spike  # Spike: a model the shells show

__all__ = [
    "SPIKE_MARKETS",
    "SPIKE_STATS",
    "Spike",
    "SpikeDetector",
    "SpikeEvent",
    "detect_spikes",
    "volatility_per_hour",
    "watched",
]

# Which series the rule watches, for the tracker's alerts and for every chart of spikes alike.
SPIKE_STATS = frozenset({"price", "median"})  # min/p10 of a marketplace jump when one cheap host leaves
SPIKE_MARKETS = frozenset({Market.spot.value, Market.on_demand.value})  # owned/reserved rates are config


def watched(market: str, stat: str) -> bool:
    """True for a series (by its market and stat) the spike rule applies to."""
    return stat in SPIKE_STATS and market in SPIKE_MARKETS


@dataclass(frozen=True, slots=True)
class SpikeEvent:
    kind: str  # "opened" | "closed"
    at: datetime
    price: float
    spike: Spike


class SpikeDetector:
    """The spike rule as a state machine over one series, fed point by point in time order.

    ``history`` seeds the baseline window (oldest first, points outside any spike);
    ``open_spike`` resumes a spike left open by an earlier run.
    """

    def __init__(
        self,
        multiple: float,
        clear_multiple: float,
        window: int,
        *,
        min_points: int = 1,
        history: Iterable[float] = (),
        open_spike: Spike | None = None,
    ) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        if multiple <= 1.0 or clear_multiple <= 0 or clear_multiple > multiple:
            raise ValueError("need multiple > 1 and 0 < clear_multiple <= multiple")
        self.multiple = multiple
        self.clear_multiple = clear_multiple
        self.window = window
        self.min_points = max(1, min(min_points, window))
        self._recent: deque[float] = deque((p for p in history if p > 0), maxlen=window)
        self.open: Spike | None = open_spike
        self.spikes: list[Spike] = []  # closed during this detector's life, and the open one at the end

    def baseline(self) -> float | None:
        if len(self._recent) < self.min_points:
            return None
        return float(statistics.median(self._recent))

    def update(self, at: datetime, price: float) -> SpikeEvent | None:
        """Feed one point; returns the event it caused, if any."""
        if price <= 0 or math.isnan(price):
            return None  # not a price (a utilisation of 0, a bad record): no opinion
        if self.open is not None:
            spike = self.open
            if price < self.clear_multiple * spike.baseline:
                closed = Spike(spike.start, at, spike.peak, spike.baseline)
                self.open = None
                self.spikes.append(closed)
                self._recent.append(price)
                return SpikeEvent("closed", at, price, closed)
            if price > spike.peak:
                self.open = Spike(spike.start, None, price, spike.baseline)
            return None
        base = self.baseline()
        if base is not None and price > self.multiple * base:
            self.open = Spike(at, None, price, base)
            return SpikeEvent("opened", at, price, self.open)
        self._recent.append(price)
        return None

    def finish(self) -> list[Spike]:
        """All spikes seen, the open one (end=None) last."""
        return [*self.spikes, *([self.open] if self.open is not None else [])]


def detect_spikes(
    series: Sequence[tuple[datetime, float]],
    multiple: float,
    clear_multiple: float,
    window: int,
    *,
    min_points: int = 1,
) -> list[Spike]:
    """Spikes of one series of (time, price) points (sorted here by time)."""
    det = SpikeDetector(multiple, clear_multiple, window, min_points=min_points)
    for at, price in sorted(series, key=lambda p: p[0]):
        det.update(at, price)
    return det.finish()


def volatility_per_hour(series: Sequence[tuple[datetime, float]]) -> float:
    """Realised volatility: sqrt(sum of squared log returns / hours covered).

    Time-aware on purpose: change-only series skip flat stretches, so a
    per-point standard deviation would overstate a price that moves once a week.
    0.0 for a flat series or fewer than two points.
    """
    pts = sorted(((at, p) for at, p in series if p > 0), key=lambda x: x[0])
    if len(pts) < 2:
        return 0.0
    hours = (pts[-1][0] - pts[0][0]).total_seconds() / 3600.0
    if hours <= 0:
        return 0.0
    sq = sum(math.log(b / a) ** 2 for (_, a), (_, b) in itertools.pairwise(pts))
    return math.sqrt(sq / hours)
