"""Offers and nodes → the PricePoints the tracker stores. Pure: data in, points out.

- Marketplace offers (Vast.ai: many hosts selling one GPU model) are summarised
  per market and GPU model as *per-GPU* hourly prices: ``stat`` ``min``, ``p10``
  and ``median``, each with ``count`` = offers seen. ``sku`` is ``"<model>/gpu"``
  so nobody reads a per-GPU figure as a node price.
- Owned and reserved capacity is a rate, not a market: one ``stat="price"``
  point per (market, sku, region, zone) at the whole-node rate.
- On-prem utilisation per GPU model: ``stat="utilisation"``, and
  ``usd_per_hour`` holds the *fraction* of GPUs allocated (0.0–1.0) over healthy
  nodes, with ``count`` = the GPUs counted. It is not a price: readers must check
  ``stat`` before summing dollars.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import Protocol

from broker.models import Market, Offer, PricePoint

__all__ = ["SUMMARY_STATS", "market_summaries", "percentile", "rate_points", "utilisation_points"]

SUMMARY_STATS: tuple[str, ...] = ("min", "p10", "median")
UTILISATION = "utilisation"


class NodeLike(Protocol):
    """A pool's node as providers.capabilities.NodeUsage gives it."""

    @property
    def gpu(self) -> str | None: ...  # canonical model; None when not one (a MIG slice)

    @property
    def gpus_total(self) -> int: ...

    @property
    def gpus_used(self) -> int: ...

    @property
    def healthy(self) -> bool: ...


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (as numpy's default) of an ascending, non-empty list; q in [0, 100]."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def market_summaries(provider: str, offers: Iterable[Offer], at: datetime) -> list[PricePoint]:
    """Per (market, GPU model): min, p10 and median per-GPU $/h of spot and on-demand offers."""
    groups: dict[tuple[Market, str], list[float]] = {}
    for o in offers:
        if o.market not in (Market.spot, Market.on_demand) or o.gpu_count < 1 or o.usd_per_hour <= 0:
            continue
        groups.setdefault((o.market, o.gpu), []).append(o.usd_per_gpu_hour)
    out: list[PricePoint] = []
    for (market, gpu), prices in sorted(groups.items()):
        prices.sort()
        figures = {"min": prices[0], "p10": percentile(prices, 10), "median": percentile(prices, 50)}
        for stat in SUMMARY_STATS:
            out.append(
                PricePoint(
                    provider=provider,
                    market=market,
                    sku=f"{gpu}/gpu",
                    gpu=gpu,
                    usd_per_hour=round(figures[stat], 6),
                    at=at,
                    stat=stat,
                    count=len(prices),
                )
            )
    return out


def _node_gpus(o: Offer) -> int:
    # Owned offers may sell the free part of a node; the rate is for the whole node.
    try:
        return max(1, int(o.attrs.get("configured_gpus") or o.gpu_count))
    except ValueError:
        return max(1, o.gpu_count)


def rate_points(provider: str, offers: Iterable[Offer], at: datetime) -> list[PricePoint]:
    """Whole-node rate of owned and reserved offers, one point per (market, sku, region, zone)."""
    best: dict[tuple[Market, str, str, str], tuple[float, str]] = {}
    for o in offers:
        if o.market not in (Market.owned, Market.reserved):
            continue
        rate = o.usd_per_gpu_hour * _node_gpus(o) if o.gpu_count else o.usd_per_hour
        key = (o.market, o.sku, o.region, o.zone)
        if key not in best or rate < best[key][0]:
            best[key] = (rate, o.gpu)
    return [
        PricePoint(
            provider=provider,
            market=market,
            sku=sku,
            gpu=gpu,
            region=region,
            zone=zone,
            usd_per_hour=round(rate, 6),
            at=at,
        )
        for (market, sku, region, zone), (rate, gpu) in sorted(best.items())
    ]


def utilisation_points(provider: str, cluster: str, nodes: Iterable[NodeLike], at: datetime) -> list[PricePoint]:
    """Share of GPUs allocated per GPU model over healthy nodes."""
    totals: dict[str, list[int]] = {}
    for n in nodes:
        if not n.healthy or n.gpus_total <= 0:
            continue
        model = n.gpu
        if not model:
            continue
        t = totals.setdefault(model, [0, 0])
        t[0] += min(n.gpus_used, n.gpus_total)
        t[1] += n.gpus_total
    return [
        PricePoint(
            provider=provider,
            market=Market.owned,
            sku=model,
            gpu=model,
            region=cluster,
            usd_per_hour=round(used / total, 4),
            at=at,
            stat=UTILISATION,
            count=total,
        )
        for model, (used, total) in sorted(totals.items())
    ]
