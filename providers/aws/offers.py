"""EC2 GPU types, places and prices → offers. Pure: no I/O.

A type sold in an AZ is an on-demand offer at its list price (from the Price List
API, or the bundled snapshot, as :class:`~providers.aws.pricing.OnDemandPrices` says)
and a spot offer at the AZ's latest spot price (live). With placement groups
on and a type that supports the cluster strategy, nodes are promised together
at ``cluster`` level; otherwise EC2 only promises "same AZ".
"""

from __future__ import annotations

from datetime import datetime

from broker.models import Colocate, Fabric, Locality, Market, Network, Offer, OfferSource, utcnow
from providers.aws.config import AwsConfig
from providers.aws.instance_types import GpuType
from providers.aws.pricing import OnDemandPrices
from providers.base import OfferQuery


def offer_id(provider: str, market: Market | str, region: str, zone: str, sku: str) -> str:
    return f"{provider}:{Market(market).value}:{region}:{zone}:{sku}"


def query_accepts(t: GpuType, query: OfferQuery | None) -> bool:
    """Push-down: is a type worth asking EC2 about (its zones, its prices) for this query?"""
    if query is None:
        return True
    if query.gpus and t.gpu not in query.gpus:
        return False
    if query.min_gpus_per_node and t.gpu_count < query.min_gpus_per_node:
        return False
    return not (query.min_gpu_memory_gb and t.gpu_memory_gb + 0.5 < query.min_gpu_memory_gb)


def make_offer(
    config: AwsConfig,
    t: GpuType,
    region: str,
    zone: str,
    market: Market,
    usd_per_hour: float,
    *,
    provider: str,
    max_nodes: int | None = None,
    cluster: str = "",
    attrs: dict[str, str] | None = None,
    source: OfferSource = OfferSource.live,
    observed_at: datetime | None = None,
) -> Offer:
    """One EC2 offer (``provider`` is "aws" or "reserved", which share the shape)."""
    clustered = t.cluster_placement and config.placement_groups
    return Offer(
        id=offer_id(provider, market, region, zone, t.sku),
        provider=provider,
        market=market,
        sku=t.sku,
        gpu=t.gpu,
        gpu_count=t.gpu_count,
        gpu_memory_gb=t.gpu_memory_gb,
        vcpus=t.vcpus,
        ram_gb=t.ram_gb,
        disk_gb=t.disk_gb,
        usd_per_hour=max(0.0, usd_per_hour),
        interruptible=market is Market.spot,
        max_nodes=max_nodes or config.max_cluster_nodes,
        # Without a placement group EC2 only promises "same AZ".
        colocation=Colocate.cluster if clustered or cluster else Colocate.zone,
        locality=Locality(provider=provider, region=region, zone=zone, cluster=cluster),
        network=Network(
            intra=t.intra,
            fabric=Fabric.efa if t.efa else Fabric.ethernet,
            fabric_gbps=t.network_gbps,
        ),
        egress_usd_per_gb=config.egress_usd_per_gb,
        source=source,
        observed_at=observed_at or utcnow(),
        attrs={
            "instance_type": t.sku,
            "efa_interfaces": str(t.efa_interfaces),
            "network_cards": str(t.network_cards),
            **(attrs or {}),
        },
    )


def zone_offers(
    config: AwsConfig,
    types: dict[str, GpuType],
    zones: dict[str, list[str]],
    spot: dict[tuple[str, str], float],
    on_demand: OnDemandPrices | None,
    region: str,
    *,
    provider: str,
) -> list[Offer]:
    """On-demand and spot offers of each type in each AZ it is sold in (``on_demand``: the region's list
    prices and where they come from; None: no on-demand offers)."""
    out: list[Offer] = []
    for sku in sorted(zones):
        t = types[sku]
        od = on_demand.lookup(sku) if on_demand is not None else None
        for zone in zones[sku]:
            if od is not None:
                price, source, observed = od
                attrs = {"price_source": "pricing-api" if source is not OfferSource.snapshot else "catalog"}
                if source is not OfferSource.live and on_demand is not None and on_demand.note:
                    attrs["price_note"] = on_demand.note[:200]
                out.append(make_offer(config, t, region, zone, Market.on_demand, price, provider=provider,
                                      source=source, observed_at=observed, attrs=attrs))
            spot_price = spot.get((sku, zone))
            if spot_price is not None:
                out.append(make_offer(config, t, region, zone, Market.spot, spot_price, provider=provider))
    return out
