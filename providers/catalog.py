"""The bundled price catalog: real offers from a snapshot shipped with the package.

`lockstep quote` and dry runs must work on a fresh machine with no credentials
and no network. This read-only provider answers ``offers()`` from
``providers/data/catalog.json`` (compiled by ``scripts/compile_catalog.py`` from
public data; see the file's ``sources``). Its offers carry the market they
describe (``provider="aws"`` or ``"vast"``) and ``attrs["source"] == "catalog"``,
so nobody mistakes them for launchable live offers.

The file is parsed once per path and the offers normalised once per
(path, max_cluster_nodes): a quote builds on ``offers()``, so it must be cheap.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources
from typing import Any

from broker.models import Colocate, Fabric, IntraNode, Locality, Market, Network, Offer
from providers.base import OfferQuery, Provider, matches

CATALOG_SOURCE = "catalog"
DEFAULT_MAX_CLUSTER_NODES = 16  # nodes in one cluster placement group we are willing to promise

# GPU models whose boards link multi-GPU machines with NVLink (SXM/HGX parts).
# Vast names the board (H100_SXM vs H100_NVL); the rest are PCIe cards.
_VAST_NVLINK_MODELS = frozenset({"H100-SXM", "A100-SXM-40GB", "A100-SXM-80GB", "H200", "B200"})


@lru_cache(maxsize=8)
def load_catalog(path: str | None = None) -> dict:
    """The parsed catalog file (cached per path). ``None``: the one shipped in the package.

    The returned dict is shared: treat it as read-only.
    """
    if path is None:
        text = resources.files("providers").joinpath("data", "catalog.json").read_text(encoding="utf-8")
    else:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    return json.loads(text)


def _aws_type(sku: str) -> dict[str, Any] | None:
    return load_catalog()["aws"]["instance_types"].get(sku)


def aws_on_demand_price(sku: str, region: str) -> float | None:
    """On-demand $/h of an AWS instance type in a region, from the bundled catalog; None if unknown."""
    info = _aws_type(sku)
    row = info["on_demand"].get(region) if info else None
    return float(row["usd_per_hour"]) if row else None


def aws_spot_price(sku: str, zone: str) -> float | None:
    """Spot $/h of an AWS instance type in a zone (an AZ id such as ``use1-az4``); None if unknown."""
    info = _aws_type(sku)
    row = info["spot"].get(zone) if info else None
    return float(row["usd_per_hour"]) if row else None


_INFO_KEYS = ("gpu", "gpus", "gpu_memory_gb", "vcpus", "ram_gb", "efa", "network_gbps", "nvlink")


def aws_instance_info(sku: str) -> dict | None:
    """Specs of an AWS GPU instance type: gpu, gpus, gpu_memory_gb, vcpus, ram_gb, efa, network_gbps, nvlink.

    Also ``network_baseline_gbps`` (sustained bandwidth; lower than ``network_gbps``
    for "Up to N Gigabit" types) and ``local_disk_gb``. None if the type is not in the catalog.
    """
    info = _aws_type(sku)
    if info is None:
        return None
    out = {k: info[k] for k in _INFO_KEYS}
    out["network_baseline_gbps"] = info["network_baseline_gbps"]
    out["local_disk_gb"] = info["local_disk_gb"]
    return out


def vast_typical_price(gpu: str, gpus: int = 1) -> float | None:
    """Typical (median) Vast.ai $/h for a machine with ``gpus`` GPUs of model ``gpu``.

    ``gpu`` is a canonical name or any spelling :func:`broker.gpus.normalise_gpu` knows.
    When no machine with exactly that count was seen, the per-GPU median over all
    counts of the model times ``gpus``. None if the model was not seen on Vast.
    """
    from broker.gpus import normalise_gpu

    model = gpu if gpu in load_catalog()["vast"]["gpus"] else normalise_gpu(gpu)
    counts = load_catalog()["vast"]["gpus"].get(model or "")
    if not counts or gpus < 1:
        return None
    row = counts.get(str(gpus))
    if row is not None:
        return round(row["median_usd_per_gpu_hour"] * gpus, 6)
    per_gpu = sorted(r["median_usd_per_gpu_hour"] for r in counts.values())
    mid = len(per_gpu) // 2
    median = per_gpu[mid] if len(per_gpu) % 2 else (per_gpu[mid - 1] + per_gpu[mid]) / 2
    return round(median * gpus, 6)


# --------------------------------------------------------------------------- normalisation


def _as_of(catalog: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(catalog["compiled"]).replace(tzinfo=UTC)


def _aws_offers(catalog: dict[str, Any], max_cluster_nodes: int) -> list[Offer]:
    aws = catalog["aws"]
    observed = _as_of(catalog)
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
    observed = _as_of(catalog)
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
                egress_usd_per_gb=vast["egress_usd_per_gb"], observed_at=observed,
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


class CatalogProvider(Provider):
    """Read-only provider over the bundled catalog (``can_launch`` is False)."""

    name = "catalog"

    def __init__(self, path: str | None = None, max_cluster_nodes: int = DEFAULT_MAX_CLUSTER_NODES) -> None:
        if max_cluster_nodes < 1:
            raise ValueError("max_cluster_nodes must be at least 1")
        self.path = path
        self.max_cluster_nodes = max_cluster_nodes

    async def offers(self, query: OfferQuery | None = None) -> list[Offer]:
        everything = catalog_offers(self.path, self.max_cluster_nodes)
        if query is None:
            return list(everything)
        return [o for o in everything if matches(o, query)]
