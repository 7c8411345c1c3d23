"""The catalog's rows → offers, normalised once per (path, max_cluster_nodes).

Offers carry the market they describe (``provider="aws"`` or ``"vast"``),
``source=snapshot`` and the snapshot's date in ``observed_at``, so the market
drops them where that market answers live and the router never launches them.
``attrs["source"]`` names the snapshot (``"catalog"``); ``attrs["as_of"]`` the
date a row's price was observed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from broker.models import Colocate, Fabric, IntraNode, Locality, Market, Network, Offer, OfferSource
from providers.catalog.client import load_catalog

CATALOG_SOURCE = "catalog"
DEFAULT_MAX_CLUSTER_NODES = 16  # nodes in one cluster placement group we are willing to promise

# GPU models whose boards link multi-GPU machines with NVLink (SXM/HGX parts).
# Vast names the board (H100_SXM vs H100_NVL); the rest are PCIe cards.
_VAST_NVLINK_MODELS = frozenset({"H100-SXM", "A100-SXM-40GB", "A100-SXM-80GB", "H200", "B200"})


def as_of(catalog: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(catalog["compiled"]).replace(tzinfo=UTC)


def _aws_offers(catalog: dict[str, Any], max_cluster_nodes: int) -> list[Offer]:
    aws = catalog["aws"]
    observed = as_of(catalog)
    out: list[Offer] = []
    for sku, info in aws["instance_types"].items():
        # EFA types get their full bandwidth as an RDMA fabric; the others only their
        # sustained ethernet bandwidth. Cluster placement groups work for any type.
        fabric = Fabric.efa if info["efa"] else Fabric.ethernet
        gbps = info["network_gbps"] if info["efa"] else info["network_baseline_gbps"]
        network = Network(intra=IntraNode.nvlink if info["nvlink"] else IntraNode.pcie,
                          fabric=fabric, fabric_gbps=float(gbps))
        common: dict[str, Any] = {
            "provider": "aws", "sku": sku, "gpu": info["gpu"], "gpu_count": info["gpus"],
            "gpu_memory_gb": info["gpu_memory_gb"], "vcpus": info["vcpus"], "ram_gb": info["ram_gb"],
            "disk_gb": info["local_disk_gb"], "max_nodes": max_cluster_nodes, "colocation": Colocate.cluster,
            "network": network, "egress_usd_per_gb": aws["egress_usd_per_gb"], "observed_at": observed,
            "source": OfferSource.snapshot,
        }
        for region, row in info["on_demand"].items():
            out.append(Offer(
                id=f"catalog:aws:{sku}:{region}:on_demand", market=Market.on_demand,
                usd_per_hour=row["usd_per_hour"], locality=Locality(provider="aws", region=region),
                attrs={"source": CATALOG_SOURCE, "as_of": catalog["compiled"], "price_source": row["source"]},
                **common,
            ))
        for zone, row in info["spot"].items():
            out.append(Offer(
                id=f"catalog:aws:{sku}:{zone}:spot", market=Market.spot, interruptible=True,
                usd_per_hour=row["usd_per_hour"],
                locality=Locality(provider="aws", region=row["region"], zone=zone),
                attrs={"source": CATALOG_SOURCE, "as_of": row.get("as_of", catalog["compiled"]),
                       "price_source": row["source"], "zone_kind": "az-id"},
                **common,
            ))
    return out


def _vast_offers(catalog: dict[str, Any]) -> list[Offer]:
    vast = catalog["vast"]
    observed = as_of(catalog)
    out: list[Offer] = []
    for model, counts in vast["gpus"].items():
        for count, row in counts.items():
            n = int(count)
            # Single machines over the public internet: no multi-node locality at all.
            nvlink = model in _VAST_NVLINK_MODELS and n > 1
            network = Network(intra=IntraNode.nvlink if nvlink else IntraNode.pcie,
                              fabric=Fabric.ethernet, fabric_gbps=float(vast["assumed_fabric_gbps"]))
            out.append(Offer(
                id=f"catalog:vast:{model}:{n}x", provider="vast", market=Market.on_demand,
                sku=f"{n}x-{model}", gpu=model, gpu_count=n, gpu_memory_gb=row["gpu_memory_gb"],
                usd_per_hour=round(row["median_usd_per_gpu_hour"] * n, 6),
                max_nodes=1, colocation=Colocate.node, locality=Locality(provider="vast"), network=network,
                egress_usd_per_gb=vast["egress_usd_per_gb"], observed_at=observed, source=OfferSource.snapshot,
                attrs={"source": CATALOG_SOURCE, "as_of": catalog["compiled"], "price_stat": "median",
                       "min_usd_per_hour": str(round(row["min_usd_per_gpu_hour"] * n, 6)),
                       "listings": str(row["listings"]), "regions": "; ".join(row["regions"])},
            ))
    return out


@lru_cache(maxsize=8)
def catalog_offers(
    path: str | None = None, max_cluster_nodes: int = DEFAULT_MAX_CLUSTER_NODES
) -> tuple[Offer, ...]:
    """All catalog offers, normalised once and cached (an immutable tuple; do not mutate the offers)."""
    catalog = load_catalog(path)
    return tuple(_aws_offers(catalog, max_cluster_nodes) + _vast_offers(catalog))
