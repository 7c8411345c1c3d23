"""Query-string models and the body/query parsing helpers handlers share.

A bad query parameter is a 400 naming the parameter; a bad body is a 422
naming the field (400 when it is not JSON at all).
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from broker.api.errors import ApiError
from broker.models import CURSOR_PATTERN, JobState, PriceFilter
from broker.specs import first_error
from policies.offers import OfferFilter

M = TypeVar("M", bound=BaseModel)


class QuoteParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    top: int = Field(default=10, ge=1, le=1000, description="options to return")
    max_rejected: int = Field(default=0, ge=0, le=1_000_000,
                              description="rejected offers to spell out, with their reasons (all are counted in "
                                          "rejected_counts, the summary every quote carries)")


class OfferParams(OfferFilter):
    limit: int | None = Field(default=None, ge=1, le=100_000, description="rows at most")

    def filter(self) -> OfferFilter:
        return OfferFilter.model_validate(self.model_dump(exclude={"limit"}))


class JobsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=1000)
    cursor: str | None = Field(default=None, max_length=83, pattern=CURSOR_PATTERN,
                               description="next_cursor of the previous page")
    state: list[JobState] | None = Field(default=None, description="only jobs in these states")
    tenant: str | None = Field(default=None, max_length=64, description="admin only: one tenant's jobs")


class LogParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tail: int | None = Field(default=None, ge=0, le=100_000, description="only the last N lines (then, with "
                                                                        "follow, every new one)")
    follow: bool = Field(default=False, description="keep the response open and send each new line as the job "
                                                    "prints it, until the job has ended and its last lines are out")


class TokensParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenant: str | None = Field(default=None, max_length=64)


class SeriesParams(PriceFilter):
    """GET /v1/prices/series: the history filters over a window (``since`` defaults to 7 days
    before ``until``, or before now)."""


class PriceParams(PriceFilter):
    """GET /v1/prices/history: the same filters, and at most ``limit`` points (the newest)."""

    limit: int | None = Field(default=1000, ge=1, le=100_000, description="the newest points at most")


@cache
def _list_fields(model: type[BaseModel]) -> frozenset[str]:
    out = set()
    for name, prop in model.model_json_schema()["properties"].items():
        kinds = [prop, *prop.get("anyOf", [])]
        if any(k.get("type") == "array" for k in kinds):
            out.add(name)
    return frozenset(out)


def parse_query(request: web.Request, model: type[M]) -> M:
    """The query string as ``model``; repeated keys fill list fields; unknown keys are ignored."""
    lists = _list_fields(model)
    data: dict[str, Any] = {}
    for name in model.model_fields:
        if name in request.query:
            data[name] = request.query.getall(name) if name in lists else request.query[name]
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = first_error(exc)
        raise ApiError(400, "bad_parameter", err.reason, err.field or None) from None


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class _Twice(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _no_twice(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object with a key written twice is refused: json keeps the last one without a word (as YAML would)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Twice(key)
            seen.add(key)
    return out


async def read_json(request: web.Request) -> Any:
    """The body as JSON. Too large → 413 (aiohttp's client_max_size), not JSON → 400, a key twice in one
    object → 422 naming it."""
    raw = await request.read()
    if not raw:
        raise ApiError(400, "bad_request", "a JSON body is required", "body")
    try:
        return json.loads(raw, parse_constant=_no_constants, object_pairs_hook=_no_twice)
    except _Twice as exc:
        raise ApiError(422, "invalid", f"key {exc.key!r} written twice in one object", exc.key[:64]) from None
    except (ValueError, RecursionError):
        raise ApiError(400, "bad_json", "the body is not valid JSON", "body") from None


async def parse_body(request: web.Request, model: type[M]) -> M:
    data = await read_json(request)
    if not isinstance(data, dict):
        raise ApiError(422, "invalid", "the body must be a JSON object", "body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = first_error(exc)
        raise ApiError(422, "invalid", err.reason, err.field or "body") from None
