"""EC2 instance-type records → what Lockstep needs to know of a GPU node type.

Pure functions over DescribeInstanceTypes / DescribeSpotPriceHistory shapes: no
I/O, so they are tested directly on the real records in shared/data/aws.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from broker.gpus import normalise_gpu
from broker.models import IntraNode

# Families whose multi-GPU sizes join their GPUs with NVLink/NVSwitch; the
# other GPU families (g4dn, g5, g6, g6e…) put their GPUs on PCIe.
NVLINK_FAMILIES: frozenset[str] = frozenset(
    {"p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "p6-b300", "p6e-gb200"}
)

# Instance-type filter for DescribeInstanceTypes: every NVIDIA GPU family is p* or g*
# (trn/inf/dl carry NeuronInfo or Habana cards, not GpuInfo of a GPU we can rank).
GPU_TYPE_PATTERNS: tuple[str, ...] = ("p*", "g*")

_NETPERF_RE = re.compile(r"(?:(\d+)\s*x\s*)?(\d+(?:\.\d+)?)\s*(Gigabit|Megabit)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class GpuType:
    """One GPU instance type, normalised."""

    sku: str
    gpu: str  # canonical model (broker.gpus)
    gpu_count: int
    gpu_memory_gb: float  # per GPU
    vcpus: int
    ram_gb: float
    disk_gb: float
    efa: bool
    efa_interfaces: int
    network_gbps: float
    network_cards: int
    cluster_placement: bool
    intra: IntraNode

    @property
    def family(self) -> str:
        return family_of(self.sku)


def family_of(sku: str) -> str:
    return sku.split(".", 1)[0]


def parse_network_gbps(text: str | None) -> float:
    """'3200 Gigabit' → 3200, '4x 100 Gigabit' → 400, 'Up to 25 Gigabit' → 25, unknown → 0."""
    if not text:
        return 0.0
    m = _NETPERF_RE.search(text)
    if not m:
        return 0.0
    links = int(m.group(1)) if m.group(1) else 1
    value = float(m.group(2)) * links
    return value / 1000.0 if m.group(3).lower() == "megabit" else value


def parse_instance_type(rec: Mapping[str, Any]) -> GpuType | None:
    """A DescribeInstanceTypes record → GpuType, or None when it has no whole GPU we know."""
    gpu_info = rec.get("GpuInfo") or {}
    gpus = gpu_info.get("Gpus") or []
    if not gpus:
        return None
    first = gpus[0]
    count = sum(int(g.get("Count", 0)) for g in gpus)
    if count < 1:  # fractional GPU types (g6f) share a card: not a node we can place on
        return None
    mem_gb = float((first.get("MemoryInfo") or {}).get("SizeInMiB", 0)) / 1024.0
    model = normalise_gpu(str(first.get("Name", "")), mem_gb or None)
    if model is None:
        return None
    net = rec.get("NetworkInfo") or {}
    sku = str(rec["InstanceType"])
    gbps = parse_network_gbps(net.get("NetworkPerformance"))
    if not gbps:  # some records carry only per-card figures
        gbps = sum(float(c.get("PeakBandwidthInGbps", 0)) for c in net.get("NetworkCards") or [])
    strategies = (rec.get("PlacementGroupInfo") or {}).get("SupportedStrategies") or []
    nvlink = family_of(sku) in NVLINK_FAMILIES and count > 1
    return GpuType(
        sku=sku,
        gpu=model,
        gpu_count=count,
        gpu_memory_gb=round(mem_gb, 1),
        vcpus=int((rec.get("VCpuInfo") or {}).get("DefaultVCpus", 0)),
        ram_gb=round(float((rec.get("MemoryInfo") or {}).get("SizeInMiB", 0)) / 1024.0, 1),
        disk_gb=float((rec.get("InstanceStorageInfo") or {}).get("TotalSizeInGB", 0)),
        efa=bool(net.get("EfaSupported")),
        efa_interfaces=int((net.get("EfaInfo") or {}).get("MaximumEfaInterfaces", 0)),
        network_gbps=gbps,
        network_cards=int(net.get("MaximumNetworkCards", 1) or 1),
        cluster_placement="cluster" in strategies,
        intra=IntraNode.nvlink if nvlink else IntraNode.pcie,
    )


def latest_spot_prices(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], float]:
    """DescribeSpotPriceHistory rows → {(instance type, AZ): latest price}."""
    best: dict[tuple[str, str], tuple[datetime | str, float]] = {}
    for row in rows:
        key = (str(row["InstanceType"]), str(row["AvailabilityZone"]))
        at = row.get("Timestamp") or ""
        try:
            price = float(row["SpotPrice"])
        except (KeyError, TypeError, ValueError):
            continue
        seen = best.get(key)
        if seen is None or _later(at, seen[0]):
            best[key] = (at, price)
    return {k: v[1] for k, v in best.items()}


def _later(a: datetime | str, b: datetime | str) -> bool:
    if isinstance(a, datetime) and isinstance(b, datetime):
        return a > b
    return str(a) > str(b)
