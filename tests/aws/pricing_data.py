"""Price List API answers shaped like AWS's own, derived from the shared data.

A GetProducts item is a JSON document in a string: ``product`` (its attributes, as
the Price List names them), ``terms`` (``OnDemand`` and ``Reserved``, each term's
``priceDimensions`` with ``pricePerUnit.USD``), ``publicationDate``. The specs come from
``shared/data/aws/moto_instance_types_all_gpu.json`` (DescribeInstanceTypes records) and
the on-demand figures from SkyPilot's catalog excerpt (``shared/data/catalogs``), which
is also what the bundled snapshot holds; :func:`live_price` moves them so a test can
tell a live price from the snapshot's.
"""

from __future__ import annotations

import csv
import hashlib
import json
from functools import cache
from pathlib import Path
from typing import Any

# The Price List's location names and usage-type prefixes of the regions the tests use (as AWS spells them).
LOCATIONS = {
    "us-east-1": ("US East (N. Virginia)", ""),
    "us-west-2": ("US West (Oregon)", "USW2-"),
    "eu-west-1": ("EU (Ireland)", "EU-"),
    "ap-south-1": ("Asia Pacific (Mumbai)", "APS3-"),
}
ON_DEMAND_TERM = "JRTCKXETXF"  # the on-demand offer term code of every Price List product
HOURLY_RATE = "6YS6EN2CT7"  # its hourly rate code
RESERVED_TERM = "4NA7Y494T4"  # a 1-year no-upfront reserved term
PUBLISHED = "2026-11-27T21:35:04Z"


def live_price(snapshot_usd: float) -> float:
    """A live figure distinct from the snapshot's (two thirds of it), so a test can tell which one an offer has."""
    return round(snapshot_usd * 2 / 3, 4)


@cache
def catalog_prices(shared_data: Path) -> dict[tuple[str, str], float]:
    """(region, instance type) → on-demand $/h from the shared catalog excerpt."""
    out: dict[tuple[str, str], float] = {}
    with open(shared_data / "catalogs" / "aws_vms_v7_p-family_excerpt.csv", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if row["Price"]:
                out[(row["Region"], row["InstanceType"])] = float(row["Price"])
    return out


@cache
def _types(shared_data: Path) -> dict[str, Any]:
    with open(shared_data / "aws" / "moto_instance_types_all_gpu.json", encoding="utf-8") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def product(shared_data: Path, region: str, sku: str, usd: float, *, sku_code: str = "") -> str:
    """One GetProducts item for a Linux, shared-tenancy, on-demand instance type."""
    t = _types(shared_data)[sku]
    location, prefix = LOCATIONS[region]
    gpus = t["GpuInfo"]["Gpus"][0]
    code = sku_code or hashlib.sha1(f"{region}/{sku}".encode()).hexdigest()[:16].upper()
    rate = f"{code}.{ON_DEMAND_TERM}.{HOURLY_RATE}"
    doc = {
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {
                "enhancedNetworkingSupported": "Yes",
                "memory": f"{t['MemoryInfo']['SizeInMiB'] // 1024:,} GiB",
                "vcpu": str(t["VCpuInfo"]["DefaultVCpus"]),
                "capacitystatus": "Used",
                "locationType": "AWS Region",
                "instanceFamily": "GPU instance",
                "operatingSystem": "Linux",
                "regionCode": region,
                "servicename": "Amazon Elastic Compute Cloud",
                "gpuMemory": f"{t['GpuInfo']['TotalGpuMemoryInMiB'] // 1024} GB",
                "instanceType": sku,
                "tenancy": "Shared",
                "usagetype": f"{prefix}BoxUsage:{sku}",
                "networkPerformance": t["NetworkInfo"]["NetworkPerformance"],
                "servicecode": "AmazonEC2",
                "licenseModel": "No License required",
                "currentGeneration": "Yes",
                "preInstalledSw": "NA",
                "location": location,
                "marketoption": "OnDemand",
                "operation": "RunInstances",
                "availabilityzone": "NA",
                "gpu": str(gpus["Count"]),
            },
            "sku": code,
        },
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": {
                f"{code}.{ON_DEMAND_TERM}": {
                    "priceDimensions": {
                        rate: {
                            "unit": "Hrs",
                            "endRange": "Inf",
                            "description": f"${usd:.4f} per On Demand Linux {sku} Instance Hour",
                            "appliesTo": [],
                            "rateCode": rate,
                            "beginRange": "0",
                            "pricePerUnit": {"USD": f"{usd:.10f}"},
                        }
                    },
                    "sku": code,
                    "effectiveDate": "2026-11-01T00:00:00Z",
                    "offerTermCode": ON_DEMAND_TERM,
                    "termAttributes": {},
                }
            },
            "Reserved": {  # a reserved term's hourly rate is lower: the parser must not take it
                f"{code}.{RESERVED_TERM}": {
                    "priceDimensions": {
                        f"{code}.{RESERVED_TERM}.6YS6EN2CT7": {
                            "unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": [],
                            "description": f"Linux/UNIX (Amazon VPC), {sku} reserved instance applied",
                            "rateCode": f"{code}.{RESERVED_TERM}.6YS6EN2CT7",
                            "pricePerUnit": {"USD": f"{usd * 0.6:.10f}"},
                        }
                    },
                    "sku": code, "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": RESERVED_TERM,
                    "termAttributes": {"LeaseContractLength": "1yr", "OfferingClass": "standard",
                                       "PurchaseOption": "No Upfront"},
                }
            },
        },
        "version": "20261127213504",
        "publicationDate": PUBLISHED,
    }
    return json.dumps(doc)


def region_answer(shared_data: Path, region: str, skus: list[str]) -> tuple[list[str], dict[str, float]]:
    """A region's GetProducts items for ``skus`` at their live figures, and those figures."""
    snapshot = catalog_prices(shared_data)
    prices = {sku: live_price(snapshot[(region, sku)]) for sku in skus}
    return [product(shared_data, region, sku, usd) for sku, usd in prices.items()], prices
