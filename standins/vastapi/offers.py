"""A deterministic marketplace of Vast.ai offers for the local Vast-API server.

Offers carry the fields of the Vast SDK's ``Offer`` (see shared/vast-api-notes.md) with the units the API uses:
``gpu_ram`` and ``cpu_ram`` in MB (MiB-sized numbers, as Vast reports them), ``inet_*`` in Mbit/s, ``disk_bw`` in
MB/s, ``storage_cost`` in $/GB/month, ``dph_*`` and ``min_bid`` in $/hour, ``duration`` in seconds.

Prices are anchored on SkyPilot's Vast.ai catalog (shared/data/catalogs/vast_vms_v7.csv, skypilot-org/
skypilot-catalog catalogs/v7/vast/vms.csv): the median on-demand price per GPU-hour of each model it lists.
``DEFAULT_ANCHORS`` holds those medians as facts; ``catalog_anchors(path)`` recomputes them from the file (a test
checks the two agree). Models the catalog lacks (A100 PCIE, A100 80GB, H100 PCIE) get an assumed anchor, marked.
"""

from __future__ import annotations

import csv
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class GpuModel:
    vast_name: str  # Vast's gpu_name
    ram_mb: int  # per GPU, as Vast reports it
    catalog_token: str | None  # the GPU part of the catalog's InstanceType, None when it lacks the model
    assumed_usd_per_gpu: float  # used when the catalog lacks the model (or when no catalog is given)
    tflops: float  # datasheet dense bf16, for total_flops and dlperf
    mem_bw_gbps: float
    nvlink_gbps: float = 0.0
    compute_cap: int = 800
    weight: int = 1  # share of the market


# Per-GPU-hour medians from vast_vms_v7.csv (computed by catalog_anchors; see the module docstring).
DEFAULT_ANCHORS: dict[str, float] = {
    "RTX_4090": 0.40,
    "RTX_3090": 0.225,
    "A100_SXM4": 0.7344,
    "H100_SXM": 1.80,
    "L40S": 0.80,
}

MODELS: tuple[GpuModel, ...] = (
    GpuModel("RTX 4090", 24564, "RTX_4090", 0.40, 165.0, 1008.0, compute_cap=890, weight=8),
    GpuModel("RTX 3090", 24576, "RTX_3090", 0.225, 71.0, 936.0, compute_cap=860, weight=5),
    GpuModel("A100 PCIE", 40960, None, 0.65, 312.0, 1555.0, weight=2),  # assumed: not in the catalog
    GpuModel("A100 PCIE", 81920, None, 0.85, 312.0, 1935.0, weight=2),  # assumed
    GpuModel("A100 SXM4", 40960, "A100_SXM4", 0.7344, 312.0, 1555.0, 600.0, weight=2),
    # The catalog's A100 SXM4 rows are 40 GB; 80 GB is assumed at a 35% premium.
    GpuModel("A100 SXM4", 81920, None, 0.99, 312.0, 2039.0, 600.0, weight=3),
    GpuModel("H100 SXM", 81559, "H100_SXM", 1.80, 989.0, 3350.0, 900.0, compute_cap=900, weight=4),
    GpuModel("H100 PCIE", 81559, None, 1.55, 756.0, 2000.0, compute_cap=900, weight=2),  # assumed
    GpuModel("L40S", 46068, "L40S", 0.80, 362.0, 864.0, compute_cap=890, weight=3),
)

# (state/province, country code) pairs as Vast's geolocation reports them: "Texas, US".
PLACES: tuple[tuple[str, str], ...] = (
    ("Texas", "US"), ("California", "US"), ("Oregon", "US"), ("Florida", "US"), ("Utah", "US"),
    ("Quebec", "CA"), ("British Columbia", "CA"), ("Germany", "DE"), ("France", "FR"), ("Slovenia", "SI"),
    ("Czechia", "CZ"), ("Poland", "PL"), ("Norway", "NO"), ("Taiwan", "TW"), ("Thailand", "TH"),
    ("Hong Kong", "HK"), ("Japan", "JP"), ("Spain", "ES"),
)

CPUS: tuple[tuple[str, int], ...] = (
    ("AMD EPYC 7742 64-Core Processor", 128), ("AMD EPYC 9554 64-Core Processor", 128),
    ("Intel Xeon Gold 6338", 64), ("AMD Ryzen 9 7950X 16-Core Processor", 32),
    ("Intel Core i9-13900K", 32), ("AMD EPYC 7B13 64-Core Processor", 128),
)

# Vast's DLPerf is a score blending compute and memory bandwidth; the generator sets it near this expectation
# (the adapter uses the same formula to report dlperf relative to the datasheet).
DLPERF_SCALE = 3.2


def expected_dlperf(tflops: float, mem_bw_gbps: float, num_gpus: int) -> float:
    return DLPERF_SCALE * (tflops * mem_bw_gbps / 1000.0) ** 0.5 * num_gpus


def catalog_anchors(path: str | Path) -> dict[str, float]:
    """Median on-demand $/GPU-hour per GPU token ("RTX_4090", "H100_SXM"…) of a SkyPilot Vast catalog."""
    per: dict[str, list[float]] = {}
    with open(path, encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            token = row["InstanceType"].split("-")[1]
            count = int(row["AcceleratorCount"])
            if count and row["Price"]:
                per.setdefault(token, []).append(float(row["Price"]) / count)
    return {k: round(statistics.median(v), 4) for k, v in per.items()}


def _anchor(model: GpuModel, anchors: dict[str, float]) -> float:
    if model.catalog_token and model.catalog_token in anchors:
        return anchors[model.catalog_token]
    return model.assumed_usd_per_gpu


def generate_offers(
    seed: int = 7, count: int = 400, anchors: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """``count`` offers, the same for the same seed and anchors. ``dph_total`` is filled in per search."""
    anchors = DEFAULT_ANCHORS if anchors is None else anchors
    rng = random.Random(seed)
    weighted = [m for m in MODELS for _ in range(m.weight)]
    offers: list[dict[str, Any]] = []
    for i in range(count):
        model = rng.choice(weighted)
        big = model.nvlink_gbps > 0 or model.vast_name.startswith(("H100", "A100"))
        num_gpus = rng.choice((1, 2, 4, 8, 8) if big else (1, 1, 2, 2, 4, 8))
        place, code = rng.choice(PLACES)
        cpu_name, host_threads = rng.choice(CPUS)
        # Market prices scatter around the anchor: cheap hosts, premium datacentres.
        per_gpu = _anchor(model, anchors) * rng.uniform(0.8, 1.3)
        dph_base = round(per_gpu * num_gpus, 4)
        datacenter = rng.random() < (0.6 if big else 0.25)
        verified = rng.random() < 0.8
        reliability = round(rng.choice((rng.uniform(0.80, 0.95), rng.uniform(0.95, 0.9999), 0.99))
                            if verified else rng.uniform(0.70, 0.98), 4)
        inet_down = round(rng.choice((rng.uniform(80, 900), rng.uniform(900, 3000), rng.uniform(3000, 10000))), 1)
        inet_up = round(inet_down * rng.uniform(0.3, 1.0), 1)
        bid_ok = rng.random() < 0.85
        dlperf = round(expected_dlperf(model.tflops, model.mem_bw_gbps, num_gpus) * rng.uniform(0.75, 1.05), 3)
        storage_cost = round(rng.uniform(0.08, 0.3), 4)
        disk_space = float(rng.choice((100, 250, 500, 1000, 2000, 4000)))
        cpu_cores_eff = float(max(4, host_threads * num_gpus // 8))
        ask_id = 9_000_000 + i * 17 + rng.randrange(17)
        machine_id = 30_000 + i
        start = 1_780_000_000.0 + rng.randrange(0, 86400 * 60)
        duration = float(rng.randrange(86400 * 3, 86400 * 180))
        offers.append({
            "id": ask_id,
            "ask_contract_id": ask_id,
            "bundle_id": 500_000 + i,
            "bundled_results": None,
            "machine_id": machine_id,
            "host_id": 100_000 + (i * 7) % 311,
            "cluster_id": None,
            "num_gpus": num_gpus,
            "gpu_name": model.vast_name,
            "gpu_ram": model.ram_mb,
            "gpu_total_ram": model.ram_mb * num_gpus,
            "gpu_frac": 1.0,
            "gpu_arch": "nvidia",
            "gpu_lanes": 16,
            "gpu_mem_bw": model.mem_bw_gbps * rng.uniform(0.9, 1.0),
            "gpu_max_power": 450.0 if model.vast_name.startswith("RTX") else 700.0,
            "gpu_max_temp": 87.0,
            "gpu_display_active": False,
            "compute_cap": model.compute_cap,
            "cuda_max_good": rng.choice((12.2, 12.4, 12.6)),
            "bw_nvlink": model.nvlink_gbps if num_gpus > 1 else 0.0,
            "driver_version": rng.choice(("535.104.05", "550.54.15", "560.35.03")),
            "cpu_name": cpu_name,
            "cpu_cores": host_threads,
            "cpu_cores_effective": cpu_cores_eff,
            "cpu_ghz": round(rng.uniform(2.2, 4.5), 2),
            "cpu_ram": int(num_gpus * rng.choice((32, 64, 128)) * 1024),
            "cpu_arch": "amd64",
            "has_avx": 1,
            "mobo_name": rng.choice(("ROMED8-2T", "H12SSL-i", "PRO WS WRX80E-SAGE SE WIFI", "X13DEG-OAD")),
            "os_version": "22.04",
            "pci_gen": rng.choice((4.0, 4.0, 5.0)),
            "pcie_bw": round(rng.uniform(3.0, 25.0), 1),
            "vms_enabled": False,
            "disk_space": disk_space,
            "disk_bw": round(rng.uniform(300, 6000), 1),
            "disk_name": rng.choice(("Samsung SSD 990 PRO 4TB", "INTEL SSDPE2KE032T8", "WDS200T1X0E")),
            "storage_cost": storage_cost,
            "inet_up": inet_up,
            "inet_down": inet_down,
            "inet_up_cost": round(rng.uniform(0.0, 0.02), 4),
            "inet_down_cost": round(rng.uniform(0.0, 0.02), 4),
            "direct_port_count": rng.choice((0, 20, 100, 500)),
            "static_ip": rng.random() < 0.4,
            "public_ipaddr": f"203.0.113.{i % 250 + 1}",  # TEST-NET-3: documentation addresses
            "dph_base": dph_base,
            "min_bid": round(dph_base * rng.uniform(0.35, 0.7), 4) if bid_ok else None,
            "vram_costperhour": round(dph_base / (model.ram_mb / 1024 * num_gpus), 6),
            "credit_discount_max": 0.4,
            "total_flops": round(model.tflops * num_gpus * rng.uniform(0.9, 1.0), 2),
            "dlperf": dlperf,
            "reliability": reliability,
            "reliability2": reliability,
            "reliability_mult": 1.0,
            "expected_reliability": reliability,
            "verified": verified,
            "verification": "verified" if verified else "unverified",
            "vericode": 1 if verified else 0,
            "external": False,
            "hosting_type": 1 if datacenter else 0,
            "datacenter": datacenter,
            "geolocation": f"{place}, {code}",
            "geolocode": 1000 + PLACES.index((place, code)),
            "rentable": True,
            "rented": False,
            "start_date": start,
            "end_date": start + duration,
            "duration": duration,
            "resource_type": "gpu",
        })
    return offers
