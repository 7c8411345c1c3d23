"""HTTP handlers: parse, call the service, render. No business logic here.

``ROUTES`` is the single list the application registers and the OpenAPI
document is generated from, so the two cannot drift apart.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from broker.api.errors import ApiError
from broker.api.events import DeliveryParams, EventParams, get_events
from broker.api.follow import NDJSON_TYPE, follow_ndjson
from broker.api.keys import AUTH, METRICS, OPENAPI, SERVICE, TOKENS
from broker.api.metrics import CONTENT_TYPE
from broker.api.params import (
    JobsParams,
    LogParams,
    OfferParams,
    PriceParams,
    QuoteParams,
    SeriesParams,
    TokensParams,
    parse_body,
    parse_query,
    read_json,
)
from broker.api.schemas import (
    DrainRequest,
    DrainResult,
    ErrorBody,
    Health,
    JobPage,
    ProvidersReport,
    ResumeResult,
    TokenCreated,
)
from broker.errors import ConflictError, NotFoundError, SpecError
from broker.models import (
    GpuSummary,
    Job,
    JobDetail,
    JobSpec,
    LogLine,
    Offer,
    PricePoint,
    PriceSeries,
    Quote,
    Role,
    StreamEvent,
    Tenant,
    TenantCreate,
    TenantPatch,
    TokenCreate,
    TokenInfo,
    Webhook,
    WebhookCreate,
    WebhookDelivery,
)
from broker.specs import parse_spec

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
IDEMPOTENCY_HEADER = "Idempotency-Key"


# --------------------------------------------------------------------------- rendering


def render(data: BaseModel | Sequence[BaseModel], status: int = 200,
           headers: dict[str, str] | None = None) -> web.Response:
    """JSON straight from pydantic's serializer (faster than dumping to dicts first)."""
    if isinstance(data, BaseModel):
        text = data.model_dump_json()
    else:
        text = "[" + ",".join(item.model_dump_json() for item in data) + "]"
    return web.Response(status=status, text=text, content_type="application/json", headers=headers)


ADMIN_ONLY: set[Handler] = set()  # handlers only an admin token may call (the auth middleware checks)
ALLOWED: dict[Handler, frozenset[Role]] = {}  # handlers with their own list of roles (see allowed_roles)
USER_ROLES = frozenset({Role.user, Role.admin})  # who may call a route that says nothing else


def admin_only(handler: Handler) -> Handler:
    ADMIN_ONLY.add(handler)
    return handler


def allow(*roles: Role) -> Callable[[Handler], Handler]:
    """Only tokens of these roles may call the handler (the auth middleware checks)."""

    def mark(handler: Handler) -> Handler:
        ALLOWED[handler] = frozenset(roles)
        return handler

    return mark


def allowed_roles(handler: Handler) -> frozenset[Role]:
    """The roles whose tokens may call ``handler``: its own list, admin alone for an admin-only
    handler, otherwise user and admin. The metrics role is named only where it is allowed."""
    if handler in ALLOWED:
        return ALLOWED[handler]
    return frozenset({Role.admin}) if handler in ADMIN_ONLY else USER_ROLES


def _caller(request: web.Request) -> TokenInfo:
    info: TokenInfo = request[AUTH]
    return info


def _scope(request: web.Request) -> str | None:
    """The tenant whose jobs the caller may see: its own, or all for an admin."""
    return _caller(request).scope


# --------------------------------------------------------------------------- quotes, offers


async def post_quote(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    params = parse_query(request, QuoteParams)
    spec = parse_spec(await read_json(request))
    text = await svc.quote_json(spec, top=params.top, max_rejected=params.max_rejected)
    return web.Response(text=text, content_type="application/json")


async def get_offers(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    params = parse_query(request, OfferParams)
    return render(await svc.offers(params.filter(), params.limit))


async def list_gpus(request: web.Request) -> web.Response:
    return render(await request.app[SERVICE].gpus())


# --------------------------------------------------------------------------- jobs


def _idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    # Visible ASCII only, as the OpenAPI document says: keys travel in logs and other systems' headers.
    if not 1 <= len(key) <= 256 or any(not 0x21 <= ord(c) <= 0x7E for c in key):
        raise ApiError(400, "bad_header", "Idempotency-Key must be 1-256 visible ASCII characters",
                       IDEMPOTENCY_HEADER)
    return key


async def post_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    key = _idempotency_key(request)
    spec = parse_spec(await read_json(request))
    job, created = await svc.submit_job(spec, tenant=_caller(request).tenant, idempotency_key=key)
    return render(job, status=201 if created else 200, headers={"Location": f"/v1/jobs/{job.id}"})


async def list_jobs(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    params = parse_query(request, JobsParams)
    tenant = _scope(request)
    if tenant is None:
        tenant = params.tenant
    try:
        jobs, cursor = await svc.list_jobs(tenant=tenant, states=params.state, limit=params.limit,
                                           cursor=params.cursor)
    except (ConflictError, SpecError):  # the store's words for a cursor it did not issue
        raise ApiError(400, "bad_parameter", "not a cursor returned by GET /v1/jobs", "cursor") from None
    return render(JobPage(jobs=jobs, next_cursor=cursor))


async def get_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    job = await svc.get_job(request.match_info["job_id"], _scope(request))
    allocations = await svc.job_allocations(job.id)
    return render(JobDetail(**dict(job), allocations=allocations))



async def job_logs(request: web.Request) -> web.StreamResponse:
    """One LogLine per line (NDJSON). With ``follow``, a chunked response that stays open while the job runs;
    it ends within a second of its client hanging up or of the server shutting down, whatever the job prints."""
    svc = request.app[SERVICE]
    params = parse_query(request, LogParams)
    job_id, scope = request.match_info["job_id"], _scope(request)
    if not params.follow:
        lines = await svc.job_logs(job_id, scope, tail=params.tail)
        return web.Response(text="".join(ln.model_dump_json() + "\n" for ln in lines), content_type=NDJSON_TYPE)
    lines_in = await svc.follow_logs(job_id, scope, tail=params.tail)  # not found: a 404 before any line
    return await follow_ndjson(request, lines_in, svc.settings.api.log_follow_max_s, f"log stream of job {job_id}")


async def cancel_job(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return render(await svc.cancel(request.match_info["job_id"], _scope(request)))


# --------------------------------------------------------------------------- prices, providers, nodes


async def price_history(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return render(await svc.price_history(parse_query(request, PriceParams)))


async def price_series(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return render(await svc.price_series(parse_query(request, SeriesParams)))


async def providers(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    await svc.ensure_offers()
    return render(ProvidersReport(providers=svc.providers_health(), refreshed_at=svc.offers_refreshed_at))


@admin_only
async def drain_node(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    body = await parse_body(request, DrainRequest)
    result = await svc.drain_node(request.match_info["provider"], request.match_info["node"], body.reason)
    return render(DrainResult.model_validate(result))


@admin_only
async def resume_node(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    result = await svc.resume_node(request.match_info["provider"], request.match_info["node"])
    return render(ResumeResult.model_validate(result))


# --------------------------------------------------------------------------- tokens, tenants


@admin_only
async def create_token(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    info, plaintext = await svc.create_token(await parse_body(request, TokenCreate))
    return render(TokenCreated(**dict(info), token=plaintext), status=201)


@admin_only
async def list_tokens(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    params = parse_query(request, TokensParams)
    return render(await svc.list_tokens(params.tenant))


@admin_only
async def revoke_token(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    token_id = request.match_info["token_id"]
    await svc.revoke_token(token_id)
    request.app[TOKENS].forget(token_id)
    return web.Response(status=204)


@admin_only
async def create_tenant(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return render(await svc.create_tenant(await parse_body(request, TenantCreate)), status=201)


@admin_only
async def list_tenants(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return render(await svc.list_tenants())


async def get_tenant(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    return render(await svc.get_tenant(request.match_info["name"], _scope(request)))


@admin_only
async def patch_tenant(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    patch = await parse_body(request, TenantPatch)
    return render(await svc.update_tenant(request.match_info["name"], patch))


# --------------------------------------------------------------------------- webhooks (events: broker/api/events.py)


async def create_webhook(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    body = await parse_body(request, WebhookCreate)
    caller = _caller(request)
    hook = await svc.create_webhook(body, caller.tenant, caller.role is Role.admin)
    return render(hook, status=201, headers={"Location": f"/v1/webhooks/{hook.id}"})


async def list_webhooks(request: web.Request) -> web.Response:
    return render(await request.app[SERVICE].list_webhooks(_scope(request)))


async def delete_webhook(request: web.Request) -> web.Response:
    await request.app[SERVICE].delete_webhook(request.match_info["webhook_id"], _scope(request))
    return web.Response(status=204)


async def webhook_deliveries(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    params = parse_query(request, DeliveryParams)
    hook_id, scope = request.match_info["webhook_id"], _scope(request)
    if hook_id not in {h.id for h in await svc.list_webhooks(scope)}:
        raise NotFoundError(f"webhook {hook_id} not found")
    return render(await svc.webhook_deliveries(scope, hook_id, params.state, params.limit))


# --------------------------------------------------------------------------- operations


async def healthz(request: web.Request) -> web.Response:
    return render(Health(status="ok"))


async def readyz(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    store_ok, markets_ok, health = await svc.ready()
    ready = store_ok and markets_ok
    reason = "" if ready else ("store unreachable" if not store_ok else "no provider healthy and no catalog")
    return render(Health(status="ready" if ready else "not ready", store=store_ok, providers=health,
                         reason=reason), status=200 if ready else 503)


@allow(Role.admin, Role.metrics)
async def metrics(request: web.Request) -> web.Response:
    svc = request.app[SERVICE]
    counts = await svc.db(request.app[METRICS].snapshot, svc)
    body = request.app[METRICS].render(counts)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(request.app[OPENAPI])


async def docs(request: web.Request) -> web.Response:
    from broker.api.docs import page

    return web.Response(text=page(), content_type="text/html")


# --------------------------------------------------------------------------- the route table

TEXT = "text"  # a response that is Prometheus text, not JSON
HTML = "html"  # a response that is an HTML page
NO_CONTENT = None


@dataclass(frozen=True)
class Lines:
    """A response of newline-delimited JSON documents, one ``model`` a line (application/x-ndjson)."""

    model: type[BaseModel]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    ok: dict[int, Any]  # status → model, TypeAdapter-able type, TEXT or NO_CONTENT
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    errors: tuple[int, ...] = ()  # beyond those implied (auth, body, query, path)
    public: bool = False
    headers: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    docs: bool = False  # the API's description: public unless api.public_docs is false

    @property
    def admin(self) -> bool:
        return self.handler in ADMIN_ONLY

    @property
    def roles(self) -> frozenset[Role]:
        """Who may call it (with a token; a public route answers anyone)."""
        return allowed_roles(self.handler)

    @property
    def operation_id(self) -> str:
        return self.handler.__name__


_IDEM_PARAM = {
    "name": IDEMPOTENCY_HEADER, "in": "header", "required": False,
    "description": "Retry-safe submission: the same key and body return the same job (200); "
                   "the same key with another body is a 409.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 256, "pattern": "^[\\x21-\\x7e]+$"},
}

ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/quotes", post_quote, "Rank offers for a job spec, with reasons for rejections",
          "quotes", {200: Quote}, body=JobSpec, query=QuoteParams),
    Route("GET", "/v1/offers", get_offers, "The offer book, cheapest per GPU-hour first", "quotes",
          {200: list[Offer]}, query=OfferParams),
    Route("GET", "/v1/gpus", list_gpus, "GPU models on offer: markets, regions, units and $/GPU-hour ranges",
          "quotes", {200: list[GpuSummary]}),
    Route("POST", "/v1/jobs", post_job, "Submit a job (idempotent with Idempotency-Key)", "jobs",
          {200: Job, 201: Job}, body=JobSpec, errors=(409,), headers=(_IDEM_PARAM,)),
    Route("GET", "/v1/jobs", list_jobs, "The caller's jobs, newest first, a page at a time", "jobs",
          {200: JobPage}, query=JobsParams),
    Route("GET", "/v1/jobs/{job_id}", get_job, "One job with its events and allocations", "jobs",
          {200: JobDetail}),
    Route("GET", "/v1/jobs/{job_id}/logs", job_logs,
          "A job's log: every node's lines of its current or last attempt, secrets masked; with follow=true "
          "streamed while it runs", "jobs", {200: Lines(LogLine)}, query=LogParams, errors=(502,)),
    Route("DELETE", "/v1/jobs/{job_id}", cancel_job, "Cancel a job and release what it holds", "jobs",
          {200: Job}, errors=(409, 502)),
    Route("GET", "/v1/prices/history", price_history, "Recorded prices, oldest first", "prices",
          {200: list[PricePoint]}, query=PriceParams),
    Route("GET", "/v1/prices/series", price_series,
          "Recorded prices per series in columns (7 days back unless since): what charts read", "prices",
          {200: list[PriceSeries]}, query=SeriesParams),
    Route("GET", "/v1/providers", providers, "Provider health and staleness of their offers", "providers",
          {200: ProvidersReport}),
    Route("POST", "/v1/nodes/{provider}/{node}/drain", drain_node, "Take a node out of service (admin)",
          "providers", {200: DrainResult}, body=DrainRequest, errors=(502,)),
    Route("POST", "/v1/nodes/{provider}/{node}/resume", resume_node,
          "Put a node back in service (admin); idempotent", "providers", {200: ResumeResult}, errors=(502,)),
    Route("POST", "/v1/tokens", create_token, "Create a bearer token for a tenant (admin)", "admin",
          {201: TokenCreated}, body=TokenCreate),
    Route("GET", "/v1/tokens", list_tokens, "List tokens, never their secrets (admin)", "admin",
          {200: list[TokenInfo]}, query=TokensParams),
    Route("DELETE", "/v1/tokens/{token_id}", revoke_token, "Revoke a token (admin)", "admin",
          {204: NO_CONTENT}),
    Route("POST", "/v1/tenants", create_tenant, "Create a tenant with optional caps (admin)", "admin",
          {201: Tenant}, body=TenantCreate, errors=(409,)),
    Route("GET", "/v1/tenants", list_tenants, "List tenants (admin)", "admin", {200: list[Tenant]}),
    Route("GET", "/v1/tenants/{name}", get_tenant, "One tenant: admins any, users their own", "admin",
          {200: Tenant}),
    Route("PATCH", "/v1/tenants/{name}", patch_tenant, "Set a tenant's budget and GPU cap (admin)", "admin",
          {200: Tenant}, body=TenantPatch),
    Route("GET", "/v1/events", get_events,
          "Every job state change (and budget alert, price spike) the caller may see, oldest first, from a cursor; "
          "with follow=true streamed as they happen", "events", {200: Lines(StreamEvent)}, query=EventParams),
    Route("POST", "/v1/webhooks", create_webhook, "Register a webhook for the caller's tenant (signed deliveries)",
          "events", {201: Webhook}, body=WebhookCreate),
    Route("GET", "/v1/webhooks", list_webhooks, "The caller's webhooks (admins: all), never their secrets", "events",
          {200: list[Webhook]}),
    Route("DELETE", "/v1/webhooks/{webhook_id}", delete_webhook, "Delete a webhook and its deliveries", "events",
          {204: NO_CONTENT}),
    Route("GET", "/v1/webhooks/{webhook_id}/deliveries", webhook_deliveries,
          "A webhook's deliveries, newest first: state, attempts, last status and error", "events",
          {200: list[WebhookDelivery]}, query=DeliveryParams),
    Route("GET", "/healthz", healthz, "The process is up", "operations", {200: Health}, public=True),
    Route("GET", "/readyz", readyz, "The store answers and a market is available", "operations",
          {200: Health, 503: Health}, public=True),
    Route("GET", "/metrics", metrics, "Prometheus metrics (admin or metrics role)", "operations", {200: TEXT}),
    Route("GET", "/openapi.json", openapi, "This document", "operations", {200: dict[str, Any]}, docs=True),
    Route("GET", "/docs", docs, "This document as a page to read and try (Swagger UI)", "operations",
          {200: HTML}, docs=True),
)

ERROR_MODEL = ErrorBody
