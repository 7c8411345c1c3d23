"""The dashboard's handlers: read the session, call the service, render a page. A user sees its tenant's jobs and
spend; an admin sees every tenant's. Nothing here reaches past the service (tests/test_architecture.py).

The session: the API token itself, in a cookie that is HttpOnly (no script reads it), SameSite=Strict (no other
site's page sends it: no cross-site request forgery) and Secure when served over HTTPS, scoped to the dashboard's
path. Each request checks it as the API checks a bearer token (the same token cache), so revoking the token ends
the session at once.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

from aiohttp import web

from broker.api.keys import SERVICE, TOKENS
from broker.dashboard.templates import CSS, ENV, LOG_JS
from broker.errors import LockstepError, NotFoundError
from broker.models import Job, PriceFilter, Role, TokenInfo, as_utc, utcnow
from policies.offers import OfferFilter

log = logging.getLogger(__name__)
PREFIX = "/ui"
COOKIE = "lockstep_session"
SESSION_DAYS = 7
COLORS = ("#0b5cad", "#a40e26", "#116329", "#8250df", "#bc4c00", "#1b7c83", "#57606a", "#cf222e")


def _when(at: datetime | None) -> str:
    return as_utc(at).strftime("%Y-%m-%d %H:%M:%S UTC") if at else ""


def _age(at: datetime | None) -> str:
    if at is None:
        return ""
    s = max(0.0, (utcnow() - as_utc(at)).total_seconds())
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h" if s < 172800 else f"{s / 86400:.0f} d"


def _usd(x: float | None) -> str:
    """Dollars: cents from a dollar up, four decimals below (a minute on a small GPU costs less than a cent)."""
    if x is None:
        return ""
    return f"{x:,.2f}" if abs(x) >= 1 or x == 0 else f"{x:.4f}"


def _where(job: Job) -> str:
    p = job.placement
    if p is None:
        return ""
    return f"{p.provider} {p.market.value} {p.sku} {p.region or p.zone}".strip()


def _page(template: str, who: TokenInfo | None, status: int = 200, **ctx: Any) -> web.Response:
    html = ENV.get_template(template).render(prefix=PREFIX, who=who, when=_when, age=_age, where=_where, usd=_usd,
                                               **ctx)
    return web.Response(text=html, status=status, content_type="text/html",
                        headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY",
                                 "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                                                            "frame-ancestors 'none'"})


async def _who(request: web.Request) -> TokenInfo | None:
    token = request.cookies.get(COOKIE, "")
    if not token or len(token) > 512:
        return None
    tokens = request.app[TOKENS]
    info = tokens.cached(token) or await tokens.lookup(token)
    return info if info is not None and info.role in (Role.user, Role.admin) else None



def _to_login() -> web.HTTPFound:
    return web.HTTPFound(f"{PREFIX}/login")


async def _session(request: web.Request) -> TokenInfo:
    who = await _who(request)
    if who is None:
        raise _to_login()
    return who


# --------------------------------------------------------------------------- login


async def login_form(request: web.Request) -> web.Response:
    return _page("login.html", None, title="Log in")


async def login(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    token = str(form.get("token", "")).strip()
    info = await request.app[SERVICE].verify_token(token) if token and len(token) <= 512 else None
    if info is None or info.role not in (Role.user, Role.admin):
        return _page("login.html", None, status=401, title="Log in", error="That token is unknown, revoked, or may "
                                                                            "not use the dashboard.")
    resp = web.HTTPFound(f"{PREFIX}/")
    resp.set_cookie(COOKIE, token, max_age=SESSION_DAYS * 86400, path=PREFIX, httponly=True, samesite="Strict",
                    secure=request.secure)
    log.info("dashboard: tenant %s logged in (token %s)", info.tenant, info.id)
    raise resp


async def logout(request: web.Request) -> web.StreamResponse:
    resp = web.HTTPFound(f"{PREFIX}/login")
    resp.del_cookie(COOKIE, path=PREFIX)
    raise resp


# --------------------------------------------------------------------------- pages


async def jobs(request: web.Request) -> web.Response:
    who = await _session(request)
    svc = request.app[SERVICE]
    listed, _ = await svc.list_jobs(tenant=who.scope, limit=100)
    return _page("jobs.html", who, title="Jobs", jobs=listed, scope=who.scope)


async def job(request: web.Request) -> web.Response:
    who = await _session(request)
    svc = request.app[SERVICE]
    try:
        found = await svc.get_job(request.match_info["job_id"], who.scope)
    except NotFoundError:
        raise web.HTTPNotFound(text="job not found") from None
    allocations = await svc.job_allocations(found.id)
    return _page("job.html", who, title=f"Job {found.spec.name} ({found.id})", job=found, allocations=allocations)


async def job_log(request: web.Request) -> web.StreamResponse:
    """The job's log as NDJSON, following while it runs (what the job page's script reads)."""
    who = await _who(request)
    if who is None:
        raise web.HTTPUnauthorized(text="log in first")
    svc = request.app[SERVICE]
    try:
        lines = await svc.follow_logs(request.match_info["job_id"], who.scope, tail=2000)
    except NotFoundError:
        raise web.HTTPNotFound(text="job not found") from None
    except LockstepError as exc:
        raise web.HTTPBadGateway(text=str(exc)) from None
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store",
                                       "X-Accel-Buffering": "no"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    try:
        async with asyncio.timeout(svc.settings.api.log_follow_max_s):
            async for ln in lines:
                await resp.write((ln.model_dump_json() + "\n").encode())
        await resp.write_eof()
    except (TimeoutError, ConnectionResetError, LockstepError):
        pass  # the page says the stream ended; reloading follows again
    finally:
        await lines.aclose()
    return resp


async def tenants(request: web.Request) -> web.Response:
    who = await _session(request)
    svc = request.app[SERVICE]
    shown = await svc.list_tenants() if who.role is Role.admin else [await _own_tenant(svc, who)]
    return _page("tenants.html", who, title="Spend this month", tenants=shown)


async def _own_tenant(svc: Any, who: TokenInfo) -> Any:
    from broker.models import Tenant

    try:
        return await svc.get_tenant(who.tenant, who.tenant)
    except NotFoundError:  # a token's tenant need not have caps set: spend still shows
        return Tenant(name=who.tenant)


async def offers(request: web.Request) -> web.Response:
    who = await _session(request)
    svc = request.app[SERVICE]
    gpu = request.query.get("gpu", "").strip()[:64] or None
    await svc.ensure_offers()
    try:
        f = OfferFilter(gpu=[gpu]) if gpu else OfferFilter()
        listed = await svc.offers(f, 200)
    except (LockstepError, ValueError):
        listed = []
    try:
        summary = await svc.gpus([gpu] if gpu else None)
    except (LockstepError, ValueError):
        summary = []
    return _page("offers.html", who, title="Offers", offers=listed, gpus=summary, gpu=gpu)


async def prices(request: web.Request) -> web.Response:
    who = await _session(request)
    svc = request.app[SERVICE]
    gpu = request.query.get("gpu", "").strip()[:64] or "H100"
    try:
        series = await svc.price_series(PriceFilter(gpu=gpu))
    except (LockstepError, ValueError):
        series = []
    return _page("prices.html", who, title="Price history", gpu=gpu, chart=_chart(series))


def _chart(series: list[Any], w: int = 960, h: int = 360) -> dict[str, Any] | None:
    """An SVG line chart of up to eight series (the cheapest at their last point), drawn on the server."""
    series = sorted((s for s in series if s.at), key=lambda s: s.usd_per_hour[-1])[:len(COLORS)]
    if not series:
        return None
    t0 = min(as_utc(s.at[0]) for s in series)
    t1 = max(as_utc(s.at[-1]) for s in series)
    lo = min(min(s.usd_per_hour) for s in series)
    hi = max(max(s.usd_per_hour) for s in series)
    span = max((t1 - t0).total_seconds(), 1.0)
    rng = (hi - lo) or max(hi, 1.0) * 0.1
    x = lambda at: 50 + (w - 60) * (as_utc(at) - t0).total_seconds() / span  # noqa: E731
    y = lambda v: 10 + (h - 40) * (1 - (v - lo) / rng)  # noqa: E731
    lines = [{"color": COLORS[i], "label": f"{s.provider} {s.market.value} {s.sku} {s.zone or s.region} "
                                           f"(now {s.usd_per_hour[-1]:.2f} $/h)",
              "points": " ".join(f"{x(at):.1f},{y(v):.1f}" for at, v in zip(s.at, s.usd_per_hour, strict=True))}
             for i, s in enumerate(series)]
    return {"w": w, "h": h, "top": hi, "bottom": lo, "start": _when(t0), "end": _when(t1), "lines": lines}


async def providers(request: web.Request) -> web.Response:
    who = await _session(request)
    svc = request.app[SERVICE]
    await svc.ensure_offers()
    return _page("providers.html", who, title="Providers", providers=svc.providers_health())


async def css(request: web.Request) -> web.Response:
    return web.Response(text=CSS, content_type="text/css", headers={"Cache-Control": "max-age=300"})


async def log_js(request: web.Request) -> web.Response:
    return web.Response(text=LOG_JS, content_type="application/javascript", headers={"Cache-Control": "max-age=300"})


PAGES: tuple[tuple[str, str, Any], ...] = (
    ("GET", "/login", login_form), ("POST", "/login", login), ("POST", "/logout", logout),
    ("GET", "/", jobs), ("GET", "/jobs/{job_id}", job), ("GET", "/jobs/{job_id}/log", job_log),
    ("GET", "/tenants", tenants), ("GET", "/offers", offers), ("GET", "/prices", prices),
    ("GET", "/providers", providers), ("GET", "/static/ui.css", css), ("GET", "/static/log.js", log_js),
)
