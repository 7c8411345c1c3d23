#!/usr/bin/env python3
"""Compile providers/data/catalog.json, the price snapshot shipped with Lockstep.

The catalog lets `lockstep quote` work on a machine with no credentials and no
network. It holds FACTS extracted from public data (a price, a spec), never a
copy of the input files: several inputs come with no licence, so we keep
numbers, not rows.

Inputs (default: ../shared/data, see its PROVENANCE.md):
- catalogs/aws_vms_v7_p-family_excerpt.csv  SkyPilot catalog v7 (skypilot-org/skypilot-catalog
  @001367d2): AWS p-family on-demand price per region, spot price per AZ id.
- catalogs/vast_vms_v7.csv                   SkyPilot's Vast.ai catalog (same repo): $/h per GPU
  model and count.
- aws/moto_instance_types_all_gpu.json       DescribeInstanceTypes records (moto 5.2.5, Apache-2.0):
  GPU model/count/memory, vCPU, RAM, EFA, NetworkPerformance.
- aws/moto_instance_type_offerings_gpu_*.json  which regions offer which types (we keep the region list).
- spot/aws-spot-prices-2022-05-31-gpu.tsv    DescribeSpotPriceHistory records of 2022-05-31
  (ericpauley/aws-spot-price-history): median Linux/UNIX spot price per type and AZ id.
- the AWS_LIST_PRICES table below: public AWS on-demand list prices.

The output is deterministic: same inputs, same bytes (sorted keys, fixed
compile date, rounded floats). Run from the project root:

    python scripts/compile_catalog.py [--data ../shared/data] [--out providers/data/catalog.json]
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from broker.gpus import normalise_gpu
from providers.aws import instance_types as aws_types
from providers.aws.instance_types import NVLINK_FAMILIES, family_of

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data"
DEFAULT_OUT = ROOT / "providers" / "data" / "catalog.json"

COMPILED = "2026-11-29"  # fixed, so that recompiling the same inputs gives the same bytes
SCHEMA = 1

# Instance families the catalog describes (the GPU families a broker quotes for training/inference).
FAMILIES = ("g4dn", "g5", "g6", "g6e", "p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en")

# AWS on-demand LIST prices, Linux, USD per instance-hour, as published on
# https://aws.amazon.com/ec2/pricing/on-demand/ (and the instance type pages,
# e.g. https://aws.amazon.com/ec2/instance-types/g5/, /g6/, /g6e/, /p3/). These are
# list prices before any discount, savings plan or later price change; the same
# in us-east-1 and us-west-2 for these families. Where the SkyPilot catalog has a
# price for a type and region, that price is used instead.
_LIST_US = {
    "g4dn.xlarge": 0.526, "g4dn.2xlarge": 0.752, "g4dn.4xlarge": 1.204, "g4dn.8xlarge": 2.176,
    "g4dn.12xlarge": 3.912, "g4dn.16xlarge": 4.352, "g4dn.metal": 7.824,
    "g5.xlarge": 1.006, "g5.2xlarge": 1.212, "g5.4xlarge": 1.624, "g5.8xlarge": 2.448,
    "g5.12xlarge": 5.672, "g5.16xlarge": 4.096, "g5.24xlarge": 8.144, "g5.48xlarge": 16.288,
    "g6.xlarge": 0.8048, "g6.2xlarge": 0.9776, "g6.4xlarge": 1.3232, "g6.8xlarge": 2.0144,
    "g6.12xlarge": 4.6016, "g6.16xlarge": 3.3968, "g6.24xlarge": 6.6752, "g6.48xlarge": 13.3504,
    "g6e.xlarge": 1.861, "g6e.2xlarge": 2.24208, "g6e.4xlarge": 3.00424, "g6e.8xlarge": 4.52856,
    "g6e.12xlarge": 10.49264, "g6e.16xlarge": 7.57719, "g6e.24xlarge": 15.06559, "g6e.48xlarge": 30.13118,
    "p3.2xlarge": 3.06, "p3.8xlarge": 12.24, "p3.16xlarge": 24.48,
    "p3dn.24xlarge": 31.212, "p4d.24xlarge": 32.7726, "p4de.24xlarge": 40.96575,
    "p5.48xlarge": 98.32, "p5en.48xlarge": 84.8,
}
AWS_LIST_PRICES: dict[str, dict[str, float]] = {
    sku: {"us-east-1": usd, "us-west-2": usd} for sku, usd in _LIST_US.items()
}

# p3 is not in moto's GPU table; its specs from https://aws.amazon.com/ec2/instance-types/p3/
# (V100 16 GB, NVLink). Other types take their specs from the moto records.
P3_SPECS: dict[str, dict[str, Any]] = {
    "p3.2xlarge": {"gpus": 1, "vcpus": 8, "ram_gb": 61.0, "network": "Up to 10 Gigabit"},
    "p3.8xlarge": {"gpus": 4, "vcpus": 32, "ram_gb": 244.0, "network": "10 Gigabit"},
    "p3.16xlarge": {"gpus": 8, "vcpus": 64, "ram_gb": 488.0, "network": "25 Gigabit"},
}

# AZ id prefix → region (AWS AZ ids are stable across accounts, AZ names are not,
# which is why spot records and SkyPilot use ids like use1-az4; we keep them as zone names).
AZ_ID_REGIONS: dict[str, str] = {
    "use1": "us-east-1", "use2": "us-east-2", "usw1": "us-west-1", "usw2": "us-west-2",
    "cac1": "ca-central-1", "sae1": "sa-east-1",
    "euc1": "eu-central-1", "euw1": "eu-west-1", "euw2": "eu-west-2", "euw3": "eu-west-3",
    "eun1": "eu-north-1",
    "apne1": "ap-northeast-1", "apne2": "ap-northeast-2", "apne3": "ap-northeast-3",
    "aps1": "ap-south-1", "apse1": "ap-southeast-1", "apse2": "ap-southeast-2", "apse3": "ap-southeast-3",
}

# Vast.ai offers are single machines reached over the public internet; SkyPilot's
# catalog says nothing of their network, so we assume a typical 1 Gbit/s uplink.
VAST_ASSUMED_GBPS = 1.0

SPOT_TSV_DATE = "2022-05-31"
SOURCES = [
    {"id": "skypilot-aws-v7", "what": "AWS p-family on-demand prices per region and spot prices per AZ id",
     "from": "github.com/skypilot-org/skypilot-catalog catalogs/v7/aws/vms.csv @001367d2"},
    {"id": "skypilot-vast-v7", "what": "Vast.ai $/h per GPU model and count, regions",
     "from": "github.com/skypilot-org/skypilot-catalog catalogs/v7/vast/vms.csv @001367d2"},
    {"id": "moto-ec2", "what": "EC2 DescribeInstanceTypes specs and instance type offerings",
     "from": "moto 5.2.5 wheel (Apache-2.0), regenerated by moto from real AWS answers"},
    {"id": "aws-spot-2022-05-31", "what": "median Linux/UNIX spot price per type and AZ id, 2022-05-31",
     "from": "github.com/ericpauley/aws-spot-price-history (DescribeSpotPriceHistory records)"},
    {"id": "aws-list-price", "what": "AWS on-demand list prices (g4dn, g5, g6, g6e, p3 and others)",
     "from": "aws.amazon.com/ec2/pricing/on-demand/ (public list prices, Linux, before discounts)"},
]
NOTES = [
    "Facts compiled from public data; not a copy of the source files.",
    "Spot zones are AWS AZ ids (e.g. use1-az4), kept as they are: AZ names differ per account.",
    "Spot prices from skypilot-aws-v7 win over older aws-spot-2022-05-31 medians for the same type and zone.",
    "On-demand prices are list prices; bills may be lower (savings plans) or differ after price changes.",
    f"Vast.ai network bandwidth is not in the data: assumed {VAST_ASSUMED_GBPS:g} Gbit/s ethernet.",
    "Vast.ai vCPU and RAM are not given: SkyPilot lists every Vast row as 32 vCPU / 64 GiB (a placeholder).",
]


def _r(x: float, nd: int = 6) -> float:
    """Round for stable output (float noise from medians must not change the bytes)."""
    return round(float(x), nd)


def parse_network_gbps(text: str) -> float:
    """The adapter's parser ('4x 100 Gigabit' → 400), but an unparsed figure stops the compile."""
    gbps = aws_types.parse_network_gbps(text)
    if not gbps:
        raise ValueError(f"unparsed NetworkPerformance {text!r}")
    return gbps


def region_of_az_id(az_id: str) -> str | None:
    return AZ_ID_REGIONS.get(az_id.split("-az", 1)[0])


# --------------------------------------------------------------------------- AWS specs


def aws_specs(data: Path) -> dict[str, dict[str, Any]]:
    """Instance type → spec facts, from moto's DescribeInstanceTypes records (p3 from P3_SPECS)."""
    records = json.loads((data / "aws" / "moto_instance_types_all_gpu.json").read_text())
    out: dict[str, dict[str, Any]] = {}
    for sku, rec in records.items():
        fam = family_of(sku)
        if fam not in FAMILIES:
            continue
        gpu = rec["GpuInfo"]["Gpus"][0]
        mem_gb = gpu["MemoryInfo"]["SizeInMiB"] / 1024
        canon = normalise_gpu(gpu["Name"], mem_gb)
        if canon is None or not gpu["Count"]:
            continue  # fractional GPU types (g6f) or a model the broker does not know
        net = rec["NetworkInfo"]
        perf = net["NetworkPerformance"]
        stated = parse_network_gbps(perf)
        burst = perf.lower().startswith("up to")
        cards = net.get("NetworkCards") or []
        # "Up to X" is a burst figure; multi-node traffic gets the baseline.
        baseline = float(cards[0]["BaselineBandwidthInGbps"]) if burst and cards else stated
        out[sku] = {
            "gpu": canon,
            "gpus": int(gpu["Count"]),
            "gpu_memory_gb": _r(mem_gb, 1),
            "vcpus": int(rec["VCpuInfo"]["DefaultVCpus"]),
            "ram_gb": _r(rec["MemoryInfo"]["SizeInMiB"] / 1024, 1),
            "local_disk_gb": float(rec.get("InstanceStorageInfo", {}).get("TotalSizeInGB", 0)),
            "efa": bool(net.get("EfaSupported", False)),
            "network_performance": perf,
            "network_gbps": stated,
            "network_baseline_gbps": baseline,
            "nvlink": fam in NVLINK_FAMILIES and gpu["Count"] > 1,
            "spot_supported": "spot" in rec.get("SupportedUsageClasses", []),
            "spec_source": "moto-ec2",
        }
    v100 = normalise_gpu("V100", 16)
    for sku, s in P3_SPECS.items():
        stated = parse_network_gbps(s["network"])
        out[sku] = {
            "gpu": v100, "gpus": s["gpus"], "gpu_memory_gb": 16.0, "vcpus": s["vcpus"], "ram_gb": s["ram_gb"],
            "local_disk_gb": 0.0, "efa": False, "network_performance": s["network"], "network_gbps": stated,
            "network_baseline_gbps": stated, "nvlink": s["gpus"] > 1, "spot_supported": True,
            "spec_source": "aws-instance-type-page",
        }
    return out


def aws_offered_regions(data: Path) -> dict[str, list[str]]:
    """Instance type → regions whose offerings list it (moto's offerings files)."""
    regions: dict[str, set[str]] = defaultdict(set)
    for path in sorted((data / "aws").glob("moto_instance_type_offerings_gpu_*.json")):
        for region, rows in json.loads(path.read_text()).items():
            for row in rows:
                regions[row["InstanceType"]].add(region)
    return {sku: sorted(r) for sku, r in regions.items()}


# --------------------------------------------------------------------------- AWS prices


def skypilot_aws(data: Path) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """(on-demand: sku → region → $/h, spot: sku → AZ id → $/h) from the SkyPilot excerpt.

    Real quirks handled: empty Price (p5e) or SpotPrice means "not known", and p4de
    is listed twice per zone under two GPU names (the same prices; we keep the lowest spot).
    """
    on_demand: dict[str, dict[str, float]] = defaultdict(dict)
    spot: dict[str, dict[str, float]] = defaultdict(dict)
    with (data / "catalogs" / "aws_vms_v7_p-family_excerpt.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            sku, region, az = row["InstanceType"], row["Region"], row["AvailabilityZone"]
            if row["Price"].strip():
                on_demand[sku][region] = _r(float(row["Price"]))
            if row["SpotPrice"].strip() and az:
                price = _r(float(row["SpotPrice"]))
                spot[sku][az] = min(price, spot[sku].get(az, price))
    return dict(on_demand), dict(spot)


def spot_tsv_medians(data: Path) -> dict[str, dict[str, tuple[float, int]]]:
    """sku → AZ id → (median Linux/UNIX spot $/h, samples) from the 2022-05-31 price history."""
    samples: dict[tuple[str, str], list[float]] = defaultdict(list)
    with (data / "spot" / "aws-spot-prices-2022-05-31-gpu.tsv").open(newline="") as fh:
        for az, sku, product, price, _ts in csv.reader(fh, delimiter="\t"):
            if product == "Linux/UNIX":
                samples[(sku, az)].append(float(price))
    out: dict[str, dict[str, tuple[float, int]]] = defaultdict(dict)
    for (sku, az), prices in samples.items():
        out[sku][az] = (_r(statistics.median(prices)), len(prices))
    return dict(out)


def compile_aws(data: Path) -> dict[str, Any]:
    specs = aws_specs(data)
    offered = aws_offered_regions(data)
    sky_od, sky_spot = skypilot_aws(data)
    tsv_spot = spot_tsv_medians(data)
    types: dict[str, Any] = {}
    for sku in sorted(specs):
        info = dict(specs[sku])
        on_demand: dict[str, dict[str, Any]] = {}
        for region, usd in AWS_LIST_PRICES.get(sku, {}).items():
            on_demand[region] = {"usd_per_hour": _r(usd), "source": "aws-list-price"}
        for region, usd in sky_od.get(sku, {}).items():
            on_demand[region] = {"usd_per_hour": usd, "source": "skypilot-aws-v7"}
        spot: dict[str, dict[str, Any]] = {}
        for az, (usd, n) in tsv_spot.get(sku, {}).items():
            region = region_of_az_id(az)
            if region:
                spot[az] = {"region": region, "usd_per_hour": usd, "source": "aws-spot-2022-05-31",
                            "as_of": SPOT_TSV_DATE, "samples": n}
        for az, usd in sky_spot.get(sku, {}).items():
            region = region_of_az_id(az)
            if region:
                spot[az] = {"region": region, "usd_per_hour": usd, "source": "skypilot-aws-v7"}
        if not on_demand and not spot and sku not in offered:
            continue
        info["on_demand"] = dict(sorted(on_demand.items()))
        info["spot"] = dict(sorted(spot.items()))
        info["offered_regions"] = offered.get(sku, [])
        types[sku] = info
    return {"egress_usd_per_gb": 0.09, "instance_types": types}


# --------------------------------------------------------------------------- Vast


def _vast_model(instance_type: str, mem_gb: float) -> str | None:
    """'2x-H100_SXM-32-65536' → 'H100-SXM'. The InstanceType keeps SXM/NVL apart; AcceleratorName does not."""
    parts = instance_type.split("-")
    name = "-".join(parts[1:-2]) if len(parts) >= 4 else instance_type
    return normalise_gpu(name, mem_gb)


def compile_vast(data: Path) -> dict[str, Any]:
    groups: dict[tuple[str, int], dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    unknown: set[str] = set()
    with (data / "catalogs" / "vast_vms_v7.csv").open(newline="") as fh:
        for row in csv.DictReader(fh):
            count = int(float(row["AcceleratorCount"]))
            info = ast.literal_eval(row["GpuInfo"])  # a Python dict literal, as SkyPilot writes it
            mem_gb = info["TotalGpuMemoryInMiB"] / count / 1024
            model = _vast_model(row["InstanceType"], mem_gb)
            if model is None:
                unknown.add(row["AcceleratorName"])
                continue
            g = groups[(model, count)]
            g["per_gpu"].append(float(row["Price"]) / count)
            g["mem"].append(mem_gb)
            # "Texas, US, NA" → keep country and continent codes (the state/city is noise for placement).
            bits = [b.strip() for b in row["Region"].split(",")]
            g["regions"].append(", ".join(b for b in bits[-2:] if b))
    gpus: dict[str, dict[str, Any]] = defaultdict(dict)
    for (model, count), g in sorted(groups.items()):
        gpus[model][str(count)] = {
            "min_usd_per_gpu_hour": _r(min(g["per_gpu"])),
            "median_usd_per_gpu_hour": _r(statistics.median(g["per_gpu"])),
            "gpu_memory_gb": _r(statistics.median(g["mem"]), 1),
            "regions": sorted(set(g["regions"])),
            "listings": len(g["per_gpu"]),
        }
    return {
        "egress_usd_per_gb": 0.0,
        "assumed_fabric_gbps": VAST_ASSUMED_GBPS,
        "gpus": {m: dict(sorted(c.items(), key=lambda kv: int(kv[0]))) for m, c in sorted(gpus.items())},
        "omitted_models": sorted(unknown),
    }


# --------------------------------------------------------------------------- main


def compile_catalog(data: Path) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "compiled": COMPILED,
        "sources": SOURCES,
        "notes": NOTES,
        "aws": compile_aws(data),
        "vast": compile_vast(data),
    }


def render(catalog: dict[str, Any]) -> str:
    return json.dumps(catalog, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the shared data folder")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write catalog.json")
    args = ap.parse_args(argv)
    if not args.data.is_dir():
        print(f"error: data folder {args.data} not found", file=sys.stderr)
        return 2
    text = render(compile_catalog(args.data))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    cat = json.loads(text)
    print(f"wrote {args.out}: {len(cat['aws']['instance_types'])} AWS types, "
          f"{sum(len(c) for c in cat['vast']['gpus'].values())} Vast GPU model/count rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
