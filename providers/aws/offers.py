"""EC2 GPU types, places and prices → offers. Pure: no I/O.

A type sold in an AZ is an on-demand offer at its list price (from the bundled
catalog) and a spot offer at the AZ's latest spot price. With placement groups
on and a type that supports the cluster strategy, nodes are promised together
at ``cluster`` level; otherwise EC2 only promises "same AZ".
"""

from __future__ import annotations

from broker.config import AwsConfig
from broker.models import Colocate, Fabric, Locality, Market, Network, Offer
from providers.aws.instance_types import GpuType
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
    on_demand: dict[str, float | None],
    region: str,
    *,
    provider: str,
) -> list[Offer]:
    """On-demand and spot offers of each type in each AZ it is sold in (``on_demand``: list price by type)."""
    out: list[Offer] = []
    for sku in sorted(zones):
        t = types[sku]
        for zone in zones[sku]:
            od = on_demand.get(sku)
            if od is not None:
                out.append(make_offer(config, t, region, zone, Market.on_demand, od, provider=provider))
            price = spot.get((sku, zone))
            if price is not None:
                out.append(make_offer(config, t, region, zone, Market.spot, price, provider=provider))
    return out
