"""The catalog file: the bundled snapshot of real AWS and Vast prices, and lookups into it.

``providers/data/catalog.json`` is compiled by ``scripts/compile_catalog.py`` from
public data (see the file's ``sources``). It is parsed once per path. The AWS
adapter prices on-demand offers from it and the tracker names GPU types with it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any


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
