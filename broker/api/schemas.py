"""Request and response bodies of the HTTP API that are not domain models.

Domain models (JobSpec, Quote, Job, Offer, ...) are served as they are; the
few shapes only the API has (errors, pages, token and tenant requests) live
here so the OpenAPI document is generated from the same classes the handlers use.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

from broker.market import ProviderHealth
from broker.models import Allocation, Job, Role, TokenInfo

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
# JSON true/false are not numbers: strict, so a boolean budget is a 422 as the schema says.
StrictUsd = Annotated[float, Strict()]
StrictCount = Annotated[int, Strict()]


class ErrorDetail(BaseModel):
    code: str = Field(description="machine-readable: bad_request, invalid_spec, unauthorized, not_found, ...")
    message: str
    field: str | None = Field(default=None, description="the offending field (dotted path), if known")


class ErrorBody(BaseModel):
    error: ErrorDetail


class JobPage(BaseModel):
    jobs: list[Job]
    next_cursor: str | None = Field(default=None, description="pass as ?cursor= for the next page")


class JobDetail(Job):
    """A job with its events (always) and the allocations providers handed out for it."""

    allocations: list[Allocation] = Field(default_factory=list)


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=1000)


class DrainResult(BaseModel):
    provider: str
    node: str
    healthy: bool
    reason: str
    drained: bool


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(pattern=NAME_PATTERN)
    role: Role = Role.user
    label: str = Field(default="", max_length=256)


class TokenCreated(TokenInfo):
    token: str = Field(description="the bearer token; shown once, only its hash is stored")


class TenantCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(pattern=NAME_PATTERN)
    monthly_budget_usd: StrictUsd | None = Field(default=None, ge=0, le=1e12)
    max_gpus: StrictCount | None = Field(default=None, ge=0, le=1_000_000)


class TenantPatch(BaseModel):
    """Only the fields present are changed; null clears a cap."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    monthly_budget_usd: StrictUsd | None = Field(default=None, ge=0, le=1e12)
    max_gpus: StrictCount | None = Field(default=None, ge=0, le=1_000_000)


class ProvidersReport(BaseModel):
    providers: dict[str, ProviderHealth]
    refreshed_at: datetime | None = None


class Health(BaseModel):
    status: str
    store: bool | None = None
    providers: dict[str, bool] = Field(default_factory=dict)
    reason: str = ""
