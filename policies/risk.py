"""Interruption risk: preemptions per hour, from what we saw and from real traces. Pure, no I/O, no clock.

- :func:`trace_preemption_rate` turns a spot availability or preemption trace
  (``{"metadata": {"gap_seconds": N}, "data": [count, ...]}``, as in the
  "Can't Be Late" traces) into preemptions per instance-hour: every drop of the
  count is that many instances lost, over the instance-hours the trace held.
- :func:`preemption_rates` gives the router its ``(provider, zone, sku) → rate``
  map: preempted allocations over spot allocation-hours per zone and type,
  blended with a prior that grows with the price volatility of that series
  (a market whose price jumps is one where capacity is being reclaimed).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from broker.models import Allocation, AllocationState, Market
from policies.book import DEFAULT_SPOT_PREEMPTIONS_PER_HOUR

__all__ = [
    "DEFAULT_PREEMPTIONS_PER_HOUR",
    "RiskKey",
    "TraceRate",
    "allocation_sku",
    "preemption_rates",
    "trace_preemption_rate",
]

DEFAULT_PREEMPTIONS_PER_HOUR = DEFAULT_SPOT_PREEMPTIONS_PER_HOUR  # the offer book's default, one number
PRIOR_HOURS = 24.0  # the prior weighs as much as a day of observed allocation-hours
VOLATILITY_WEIGHT = 10.0  # prior × (1 + weight × volatility per sqrt(hour))

RiskKey = tuple[str, str, str]  # (provider, zone, sku)

_ENDED = frozenset(
    {AllocationState.succeeded, AllocationState.failed, AllocationState.preempted, AllocationState.released}
)


@dataclass(frozen=True, slots=True)
class TraceRate:
    preemptions: int  # instances lost (sum of the drops of the count)
    instance_hours: float  # hours × instances held, over the trace
    hours: float  # length of the trace

    @property
    def per_hour(self) -> float:
        """Preemptions per instance-hour (0.0 when the trace never held an instance)."""
        return self.preemptions / self.instance_hours if self.instance_hours > 0 else 0.0


def trace_preemption_rate(trace: Mapping[str, Any]) -> TraceRate:
    """Preemptions per instance-hour of one trace.

    Each tick ``i`` holds ``data[i]`` instances for ``gap_seconds``; a fall from
    one tick to the next is that many preemptions (for availability traces: that
    many instances that could no longer be had).
    """
    gap = float((trace.get("metadata") or {}).get("gap_seconds") or 0)
    if gap <= 0:
        raise ValueError("trace metadata.gap_seconds must be positive")
    data = [max(0, int(x)) for x in trace.get("data") or []]
    drops = sum(a - b for a, b in itertools.pairwise(data) if b < a)
    held = sum(data) * gap / 3600.0
    return TraceRate(preemptions=drops, instance_hours=held, hours=len(data) * gap / 3600.0)


def allocation_sku(alloc: Allocation) -> str:
    """The instance type / SKU of an allocation, from its attrs or its offer id."""
    sku = alloc.attrs.get("instance_type") or alloc.attrs.get("sku") or ""
    if not sku and alloc.offer_id.count(":") >= 4:  # "provider:market:region:zone:sku"
        sku = alloc.offer_id.rsplit(":", 1)[-1]
    return sku


def _is_spot(alloc: Allocation) -> bool:
    market = alloc.attrs.get("market", "")
    return (
        market == Market.spot.value
        or alloc.state is AllocationState.preempted
        or f":{Market.spot.value}:" in alloc.offer_id
        or alloc.offer_id.endswith(f":{Market.spot.value}")
    )


def preemption_rates(
    allocations: Iterable[Allocation],
    now: datetime,
    *,
    volatility: Mapping[RiskKey, float] | None = None,
    base_rate: float = DEFAULT_PREEMPTIONS_PER_HOUR,
    prior_hours: float = PRIOR_HOURS,
    volatility_weight: float = VOLATILITY_WEIGHT,
) -> dict[RiskKey, float]:
    """Preemptions per allocation-hour per (provider, zone, sku), for ``OfferBook.build(preemption_rates=)``.

    rate = (preempted + prior × prior_hours) / (allocation-hours + prior_hours), with
    prior = base_rate × (1 + volatility_weight × volatility of the series). With no
    allocations the rate is the prior; with many, the observations dominate.
    An allocation's hours run from its creation to its last update once it ended,
    to ``now`` while live; ``intent`` (never reached the provider) counts nothing.
    """
    volatility = volatility or {}
    hours: dict[RiskKey, float] = {}
    lost: dict[RiskKey, int] = {}
    for a in allocations:
        if a.state is AllocationState.intent or not _is_spot(a):
            continue
        sku = allocation_sku(a)
        if not sku:
            continue
        key = (a.provider, a.zone, sku)
        end = a.updated_at if a.state in _ENDED else now
        held = max(0.0, (end - a.created_at).total_seconds() / 3600.0) * max(1, a.nodes)
        hours[key] = hours.get(key, 0.0) + held
        if a.state in (AllocationState.preempted, AllocationState.draining):  # draining: taken at its notice
            lost[key] = lost.get(key, 0) + 1
    out: dict[RiskKey, float] = {}
    for key in set(hours) | set(volatility):
        prior = base_rate * (1.0 + volatility_weight * max(0.0, volatility.get(key, 0.0)))
        out[key] = (lost.get(key, 0) + prior * prior_hours) / (hours.get(key, 0.0) + prior_hours)
    return out
