"""What the broker has seen of each spot market, as the spot plan's input (policies.spot).

The plan (``policies.placement.decide`` and ``rebalance``) needs a market's availability history:
one bool per interval of :data:`GAP_SECONDS`. The broker builds it from what the store holds of that
market — (provider, zone or region, SKU) — over the week before a job's submission and since:

- a spot allocation that ran: spot could be had from ``running_since`` to its end;
- a spot allocation preempted (or gone at the provider): spot went at its last update;
- a spot launch refused for capacity (a failed intent whose ``error_kind`` is ``capacity``): gone then;
- between observations, a market is as it was last seen.

Price points say nothing about availability: a cloud publishes its spot price whether or not
capacity is there, and the store keeps a point only when the price changes (not when a
marketplace's offer count does). Nothing observed: the plan's prior alone.

The simulator's ``lockstep`` learns the same model from a recorded trace (broker/simulate/deadline.py);
``policies.spot.observed_market`` is where the broker's observations become that model.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from broker.models import Allocation, AllocationState, Market, QuoteOption
from policies.spot import MODEL_WINDOW_HOURS, Observation, SpotMarket, observed_market

if TYPE_CHECKING:
    from broker.store import Store

GAP_SECONDS = 360.0  # one interval of a market's history: the plan's default step (0.1 h)
CACHE_S = 5.0  # a market's observations are read at most this often, on the broker's clock (a pass shares them)

MarketKey = tuple[str, str, str]  # (provider, zone or region, sku)


def market_key(option: QuoteOption) -> MarketKey:
    return option.provider, option.zone or option.region, option.sku


def _where(a: Allocation) -> str:
    return a.zone or a.region


def allocation_observations(allocs: list[Allocation], key: MarketKey, now: datetime) -> list[Observation]:
    """What the allocations of one market say about its spot availability."""
    provider, where, sku = key
    out: list[Observation] = []
    for a in allocs:
        if a.provider != provider or a.attrs.get("market") != Market.spot.value or a.attrs.get("sku") != sku \
                or _where(a) != where:
            continue
        since = a.attrs.get("running_since")
        if since:
            live = a.state in (AllocationState.pending, AllocationState.running, AllocationState.unknown)
            out.append(Observation(datetime.fromisoformat(since), now if live else a.updated_at, True))
        if a.state in (AllocationState.preempted, AllocationState.draining):  # draining: spot went at its notice
            out.append(Observation(a.updated_at, a.updated_at, False))
        elif a.state is AllocationState.failed and a.attrs.get("error_kind") == "capacity":
            out.append(Observation(a.updated_at, a.updated_at, False))
    return out


class SpotMarkets:
    """Reads (and briefly caches) the observations of the spot markets jobs are placed on."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._cache: dict[tuple[MarketKey, datetime], tuple[datetime, list[Allocation]]] = {}

    def observations(self, key: MarketKey, since: datetime, now: datetime) -> list[Observation]:
        """Blocking (store reads): call it off the event loop."""
        day = since.replace(hour=0, minute=0, second=0, microsecond=0)  # one read serves a day of submissions
        cached = self._cache.get((key, day))
        if cached is None or not timedelta(0) <= now - cached[0] < timedelta(seconds=CACHE_S):
            if len(self._cache) > 256:
                self._cache.clear()
            cached = (now, self.store.provider_allocations(key[0], day))
            self._cache[(key, day)] = cached
        return allocation_observations(cached[1], key, now)

    def market(self, option: QuoteOption, *, submitted: datetime, deadline: datetime, now: datetime) -> SpotMarket:
        """The spot plan's view of ``option``'s market for a job submitted at ``submitted``. Blocking."""
        since = submitted - timedelta(hours=MODEL_WINDOW_HOURS)
        obs = self.observations(market_key(option), since, now)
        return observed_market(obs, now=now, submitted=submitted,
                               deadline_hours=(deadline - submitted).total_seconds() / 3600.0,
                               gap_seconds=GAP_SECONDS)
