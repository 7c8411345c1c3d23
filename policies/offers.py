"""Matching offers against the filters of `lockstep offers` / `GET /v1/offers`. Pure."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from broker.gpus import accepted_models
from broker.models import FabricNeed, Market, Offer


class OfferFilter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu: list[str] | None = None
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
            models = accepted_models(name)
            if models is None:
                raise ValueError(f"unknown GPU model {name!r}")
            out.extend(models)
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
