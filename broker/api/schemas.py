"""Request and response bodies of the HTTP API that are not domain models.

Domain models (JobSpec, Quote, Job, Offer, and the tenant and token requests
with their rules) are served as they are; the few shapes only the API has
(errors, pages, a drain's answer) live here, so the OpenAPI document is
generated from the same classes the handlers use.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from broker.models import Job, ProviderHealth, TokenInfo


class ErrorDetail(BaseModel):
    code: str = Field(description="machine-readable: bad_request, invalid_spec, unauthorized, not_found, ...")
    message: str
    field: str | None = Field(default=None, description="the offending field (dotted path), if known")


class ErrorBody(BaseModel):
    error: ErrorDetail


class JobPage(BaseModel):
    jobs: list[Job]
    next_cursor: str | None = Field(default=None, description="pass as ?cursor= for the next page")


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=1000)


class DrainResult(BaseModel):
    provider: str
    node: str
    healthy: bool
    reason: str
    drained: bool


class ResumeResult(BaseModel):
    provider: str
    node: str
    healthy: bool
    resumed: bool = Field(description="resumed at its provider (false: the provider does not drain nodes or "
                                      "is no longer configured; only Lockstep's flag was cleared)")


class TokenCreated(TokenInfo):
    token: str = Field(description="the bearer token; shown once, only its hash is stored")


class ProvidersReport(BaseModel):
    providers: dict[str, ProviderHealth]
    refreshed_at: datetime | None = None


class Health(BaseModel):
    status: str
    store: bool | None = None
    providers: dict[str, bool] = Field(default_factory=dict)
    reason: str = ""
