"""Vast.ai asks → offers, and the search that finds them. Pure: no I/O.

- Every ask is one machine: ``max_nodes=1``, ``colocation=node``, fabric ``ethernet`` at the machine's internet
  speed (the slower of up and down, in Gbit/s), since that is all two Vast machines share.
- ``usd_per_hour`` is the whole node with the job's disk: ``dph_total`` less the storage the API priced in for
  ``allocated_storage``, plus ``storage_cost`` ($/GB/month) for ``query.disk_gb``. The search sends
  ``allocated_storage = disk_gb``, so the API's price filter compares like with like.
- An ask that takes bids gives a second offer, market ``spot``, at ``min_bid`` plus the same storage.
- ``gpu_ram`` and ``cpu_ram`` are MB on the wire (the CLI multiplies GB by 1000 before sending), so memory is
  MB / 1000: anything that passes the pushed-down ``gpu_ram`` filter also passes the router's GB check.
- ``dlperf`` (Vast's DL performance score) becomes ``Perf(source="dlperf")`` with ``relative`` = dlperf over a
  datasheet expectation, ``DLPERF_SCALE * sqrt(bf16 TFLOP/s * memory TB/s)`` per GPU: DLPerf blends compute and
  memory bandwidth, so a geometric mean of the two datasheet figures tracks it across generations. It is a prior
  from the host's self-test, not our own measurement.
- The search pushes every constraint it can down in the API's own operators; what it cannot express (a model it
  cannot spell, a price cap across both markets) it leaves to the market's filter, never dropping a match.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

from broker.gpus import GPU_SPECS, normalise_gpu
from broker.models import Colocate, Fabric, IntraNode, Locality, Market, Network, Offer, Perf
from providers.base import OfferQuery
from providers.vast.config import VastConfig

log = logging.getLogger(__name__)

PROVIDER = "vast"
HOURS_PER_MONTH = 730.0
DEFAULT_STORAGE_GB = 5.0  # what the API prices in when allocated_storage is not sent
DLPERF_SCALE = 3.2  # calibrated so an RTX 4090 at datasheet scores about 41, as on the market

# Vast's gpu_name spellings of each canonical model (Vast names the board; memory tells A100 40/80 apart).
VAST_NAMES: dict[str, tuple[str, ...]] = {
    "B200": ("B200",),
    "H200": ("H200", "H200 NVL"),
    "H100-SXM": ("H100 SXM",),
    "H100-NVL": ("H100 NVL",),
    "H100-PCIe": ("H100 PCIE",),
    "A100-SXM-80GB": ("A100 SXM4",),
    "A100-SXM-40GB": ("A100 SXM4",),
    "A100-PCIe-80GB": ("A100 PCIE", "A100X"),
    "A100-PCIe-40GB": ("A100 PCIE",),
    "L40S": ("L40S",),
    "L40": ("L40",),
    "L4": ("L4",),
    "A40": ("A40",),
    "A10": ("A10",),
    "RTX-6000-Ada": ("RTX 6000Ada",),
    "RTX-A6000": ("RTX A6000",),
    "RTX-5090": ("RTX 5090",),
    "RTX-4090": ("RTX 4090",),
    "RTX-3090": ("RTX 3090",),
    "V100-32GB": ("Tesla V100",),
    "V100-16GB": ("Tesla V100",),
    "T4": ("Tesla T4",),
    "K80": ("Tesla K80",),
}

_COUNTRY = re.compile(r"^[A-Za-z]{2}$")


def num(value: Any, default: float = 0.0) -> float:
    """A number the API may send as a number, a string or null."""
    if value is None or value == "":
        return default
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return out if math.isfinite(out) else default


def expected_dlperf(model: str, num_gpus: int) -> float | None:
    spec = GPU_SPECS.get(model)
    if spec is None:
        return None
    return DLPERF_SCALE * math.sqrt(spec.tflops_bf16 * spec.mem_bw_gbps / 1000.0) * num_gpus


# Country names Vast's geolocation has been seen to spell out instead of the code.
COUNTRY_NAMES: dict[str, str] = {
    "united states": "US", "usa": "US", "canada": "CA", "germany": "DE", "france": "FR", "united kingdom": "GB",
    "uk": "GB", "netherlands": "NL", "sweden": "SE", "norway": "NO", "finland": "FI", "poland": "PL",
    "czechia": "CZ", "czech republic": "CZ", "spain": "ES", "italy": "IT", "slovenia": "SI", "japan": "JP",
    "taiwan": "TW", "hong kong": "HK", "thailand": "TH", "singapore": "SG", "south korea": "KR", "korea": "KR",
    "australia": "AU", "india": "IN", "brazil": "BR", "israel": "IL", "vietnam": "VN", "china": "CN",
}


def country_of(geolocation: Any) -> str:
    """The offer's region: the ISO country code in Vast's geolocation, upper case ('Texas, US' → 'US';
    'US, California' → 'US'; 'Germany' → 'DE'); '' when none can be read.

    A Vast region is a country: it is what Vast's search filters on (``geolocation in [...]``), what a job's
    ``regions`` name, and with the site ``vast`` what a data location names (``vast:US``)."""
    if not isinstance(geolocation, str) or not geolocation.strip():
        return ""
    parts = [p.strip() for p in geolocation.split(",") if p.strip()]
    for part in reversed(parts):  # Vast puts the code last ("Texas, US"); some rows put it first
        if _COUNTRY.match(part):
            return part.upper()
    for part in reversed(parts):
        if part.lower() in COUNTRY_NAMES:
            return COUNTRY_NAMES[part.lower()]
    return ""


def wanted_markets(q: OfferQuery) -> tuple[bool, bool]:
    """(on-demand wanted, spot wanted)."""
    if q.markets is None:
        return True, True
    return Market.on_demand in q.markets, Market.spot in q.markets


def search_query(config: VastConfig, query: OfferQuery | None = None) -> dict[str, Any]:
    """The body of ``POST /api/v0/bundles/`` for ``query``: every constraint the API can apply itself."""
    q = query or OfferQuery()
    want_od, want_spot = wanted_markets(q)
    body: dict[str, Any] = {
        "rentable": {"eq": True},
        "rented": {"eq": False},
        "external": {"eq": False},
    }
    if config.verified_only:
        body["verified"] = {"eq": True}
    if q.gpus:
        names = [VAST_NAMES.get(g, ()) for g in q.gpus]
        if all(names):  # a model we cannot spell for Vast: do not push down (never return fewer)
            body["gpu_name"] = {"in": sorted({n for group in names for n in group})}
    if q.min_gpus_per_node:
        body["num_gpus"] = {"gte": q.min_gpus_per_node}
    if q.min_gpu_memory_gb:
        body["gpu_ram"] = {"gte": q.min_gpu_memory_gb * 1000.0}  # GB → MB, as the CLI sends it
    floor = max(q.min_reliability or 0.0, config.min_reliability)
    if floor > 0:
        body["reliability"] = {"gte": floor}
    if config.min_inet_down_mbps > 0:
        body["inet_down"] = {"gte": config.min_inet_down_mbps}
    if q.disk_gb:
        body["disk_space"] = {"gte": q.disk_gb}
    codes = sorted({r.upper() for r in q.regions or [] if _COUNTRY.match(r)})
    if codes:
        body["geolocation"] = {"in": codes}
    bid_only = want_spot and not want_od
    if q.max_usd_per_hour is not None:
        # With both markets, an ask that takes no bids may still be cheap enough on demand: no push-down.
        if bid_only:
            body["min_bid"] = {"lte": q.max_usd_per_hour}
        elif not want_spot:
            body["dph_total"] = {"lte": q.max_usd_per_hour}
    body["order"] = [["min_bid" if bid_only else "dph_total", "asc"]]
    body["type"] = "bid" if bid_only else "on-demand"
    body["limit"] = config.search_limit
    if q.disk_gb:
        body["allocated_storage"] = q.disk_gb
    return body


def normalise(config: VastConfig, raw: dict[str, Any], q: OfferQuery, want_od: bool, want_spot: bool) -> list[Offer]:
    """One ask of a search answer → its on-demand offer and, if it takes bids, its spot offer."""
    gpu_name = str(raw.get("gpu_name") or "")
    num_gpus = int(num(raw.get("num_gpus")))
    mem_gb = round(num(raw.get("gpu_ram")) / 1000.0, 2)
    model = normalise_gpu(gpu_name, mem_gb or None)
    ask_id = raw.get("id")
    if model is None or ask_id is None or num_gpus < 1:
        log.debug("vast: skipping ask %s (%r × %s)", ask_id, gpu_name, num_gpus)
        return []
    disk = q.disk_gb if q.disk_gb is not None else DEFAULT_STORAGE_GB
    storage_h = num(raw.get("storage_cost")) * disk / HOURS_PER_MONTH
    if raw.get("storage_total_cost") is not None:
        compute_h = num(raw.get("dph_total")) - num(raw.get("storage_total_cost"))
    else:
        compute_h = num(raw.get("dph_base"), num(raw.get("dph_total")))
    inet_down = num(raw.get("inet_down"))
    inet_up = num(raw.get("inet_up"))
    dlperf = num(raw.get("dlperf"))
    expect = expected_dlperf(model, num_gpus)
    perf = None
    if dlperf > 0 and expect:
        perf = Perf(source="dlperf", relative=round(dlperf / expect, 3))
    nvlink = num(raw.get("bw_nvlink")) > 0 and num_gpus > 1
    locality = Locality(provider=PROVIDER, region=country_of(raw.get("geolocation")),
                        host=str(raw.get("machine_id") or ""))
    network = Network(
        intra=IntraNode.nvlink if nvlink else IntraNode.pcie,
        fabric=Fabric.ethernet,
        fabric_gbps=round(min(inet_up, inet_down) / 1000.0, 3),
        inet_down_mbps=inet_down or None,
        inet_up_mbps=inet_up or None,
    )
    min_bid = raw.get("min_bid")
    attrs = {
        "ask_id": str(ask_id),
        "machine_id": str(raw.get("machine_id") or ""),
        "host_id": str(raw.get("host_id") or ""),
        "vast_gpu_name": gpu_name,
        "geolocation": str(raw.get("geolocation") or ""),
        "public_ipaddr": str(raw.get("public_ipaddr") or ""),  # a machine's address, for a multi-machine job
        "pcie_bw": str(num(raw.get("pcie_bw"))),
        "disk_bw": str(num(raw.get("disk_bw"))),
        "dlperf": str(dlperf),
        "verified": str(bool(raw.get("verified"))).lower(),
        "dph_total": str(num(raw.get("dph_total"))),
        "storage_cost": str(num(raw.get("storage_cost"))),
    }
    if min_bid is not None:
        attrs["min_bid"] = str(num(min_bid))
    egress = raw.get("inet_up_cost")
    common: dict[str, Any] = dict(
        provider=PROVIDER, sku=f"{num_gpus}x-{model}", gpu=model, gpu_count=num_gpus,
        gpu_memory_gb=mem_gb, vcpus=int(num(raw.get("cpu_cores_effective"))),
        ram_gb=round(num(raw.get("cpu_ram")) / 1000.0, 2), disk_gb=num(raw.get("disk_space")),
        max_nodes=1, colocation=Colocate.node, locality=locality, network=network,
        reliability=num(raw.get("reliability"), num(raw.get("reliability2"))) if (
            raw.get("reliability") is not None or raw.get("reliability2") is not None) else None,
        perf=perf,
        egress_usd_per_gb=num(egress) if egress is not None else config.egress_usd_per_gb,
    )
    out: list[Offer] = []
    if want_od:
        out.append(Offer(id=f"vast:{ask_id}", market=Market.on_demand,
                         usd_per_hour=round(max(compute_h, 0.0) + storage_h, 6),
                         attrs=attrs, **common))
    if want_spot and min_bid is not None:
        out.append(Offer(id=f"vast:{ask_id}:spot", market=Market.spot, interruptible=True,
                         usd_per_hour=round(num(min_bid) + storage_h, 6),
                         attrs=dict(attrs), **common))
    return out
