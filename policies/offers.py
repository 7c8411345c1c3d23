"""The offer book as users list it: `lockstep offers` / `GET /v1/offers` filters, and the per-GPU
summary of `lockstep gpus` / `GET /v1/gpus`. Pure."""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from broker.gpus import GPU_SPECS, resolve_request
from broker.models import GPU_NAME_SCHEMA, FabricNeed, GpuMarketSummary, GpuSummary, Market, Offer
from policies.book import MARKETS, OfferBook


class OfferFilter(BaseModel):
    model_config = ConfigDict(defer_build=True, extra="forbid", allow_inf_nan=False)

    # The document's names are GPU-shaped ones (GPU_NAME_SCHEMA); known aliases that are not are taken too.
    gpu: Annotated[list[str], WithJsonSchema({"type": "array", "items": GPU_NAME_SCHEMA},
                                             mode="validation")] | None = None
    min_gpus: int | None = Field(default=None, ge=1)
    fabric: FabricNeed | None = None
    market: list[Market] | None = None
    max_price: float | None = Field(default=None, gt=0, description="USD per node-hour")
    provider: list[str] | None = None
    region: str | None = None
    include_stale: bool = True

    @field_validator("gpu")
    @classmethod
    def _gpus(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        out: list[str] = []
        for name in v:
            out.extend(resolve_request(name))  # a GPU-shaped unknown name matches nothing; garbage is an error
        return out


def matches(o: Offer, f: OfferFilter) -> bool:
    return (
        (f.gpu is None or o.gpu in f.gpu)
        and (f.min_gpus is None or o.gpu_count >= f.min_gpus)
        and (f.fabric is None or f.fabric.accepts(o.network.fabric))
        and (f.market is None or o.market in f.market)
        and (f.max_price is None or o.usd_per_hour <= f.max_price)
        and (f.provider is None or o.provider in f.provider)
        and (f.region is None or o.locality.region == f.region)
        and (f.include_stale or not o.stale)
    )


def select(offers: list[Offer], f: OfferFilter, limit: int | None = None) -> list[Offer]:
    """Matching offers, cheapest per GPU-hour first."""
    out = sorted((o for o in offers if matches(o, f)), key=lambda o: (o.usd_per_gpu_hour, o.id))
    return out[:limit] if limit else out


def gpu_summary(book: OfferBook, gpus: list[str] | None = None) -> list[GpuSummary]:
    """Per GPU model in ``book``: markets, regions, offers, GPUs and $/GPU-hour range per market.

    Unhealthy nodes are left out. One pass of numpy over the book's index groups, then a
    loop over the groups (hundreds, not offers). ``gpus``: only these models (as a job names them).
    """
    g = book.groups
    if not len(g):
        return []
    live = ~book["unhealthy"]
    count = np.add.reduceat(live.astype(np.int64), g.start)
    units = np.add.reduceat(np.where(live, book["gpu_count"], 0).astype(np.int64), g.start)
    lo = np.minimum.reduceat(np.where(live, book["price_per_gpu"], np.inf), g.start)
    hi = np.maximum.reduceat(np.where(live, book["price_per_gpu"], -np.inf), g.start)
    mem = np.maximum.reduceat(np.where(live, book["gpu_mem"], 0.0), g.start)
    wanted = None if gpus is None else {m for name in gpus for m in resolve_request(name)}
    acc: dict[str, dict[Market, dict[str, Any]]] = {}
    memory: dict[str, float] = {}
    for k in np.flatnonzero(count).tolist():
        model = book.gpus.names[g.gpu[k]]
        if wanted is not None and model not in wanted:
            continue
        market = MARKETS[g.market[k]]
        m = acc.setdefault(model, {}).setdefault(market, {"offers": 0, "gpus": 0, "lo": np.inf, "hi": 0.0,
                                                          "providers": set(), "regions": set()})
        m["offers"] += int(count[k])
        m["gpus"] += int(units[k])
        m["lo"], m["hi"] = min(m["lo"], float(lo[k])), max(m["hi"], float(hi[k]))
        m["providers"].add(book.providers.names[g.provider[k]])
        if region := book.regions.names[g.region[k]]:
            m["regions"].add(region)
        memory[model] = max(memory.get(model, 0.0), float(mem[k]))
    out = []
    for model, markets in acc.items():
        spec = GPU_SPECS.get(model)
        rows = [GpuMarketSummary(market=market, offers=m["offers"], gpus=m["gpus"],
                                 min_usd_per_gpu_hour=round(m["lo"], 4), max_usd_per_gpu_hour=round(m["hi"], 4),
                                 providers=sorted(m["providers"]), regions=sorted(m["regions"]))
                for market, m in sorted(markets.items(), key=lambda kv: MARKETS.index(kv[0]))]
        out.append(GpuSummary(
            gpu=model, vendor=spec.vendor.value if spec else "", memory_gb=spec.memory_gb if spec else memory[model],
            offers=sum(r.offers for r in rows), gpus=sum(r.gpus for r in rows),
            regions=sorted({reg for r in rows for reg in r.regions}), markets=rows,
        ))
    order = {name: i for i, name in enumerate(GPU_SPECS)}  # the table's order: newest parts first
    return sorted(out, key=lambda s: (order.get(s.gpu, len(order)), s.gpu))
