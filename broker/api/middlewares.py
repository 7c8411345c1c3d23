"""aiohttp middlewares: errors (outermost, also counts requests), then auth and rate limits.

Order matters: the error middleware wraps everything so a refused token, a
body too large or an unknown route all answer in the same JSON shape.
"""

from __future__ import annotations

import logging
import time

from aiohttp import web
from aiohttp.typedefs import Handler

from broker.api.auth import is_admin, retry_after
from broker.api.errors import ApiError, error_response, from_http, from_lockstep
from broker.api.handlers import ADMIN_ONLY, ROUTES
from broker.api.keys import AUTH, LIMITER, METRICS, TOKENS
from broker.errors import LockstepError

log = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset(r.path for r in ROUTES if r.public)  # the route table says which


def route_name(request: web.Request) -> str:
    """The route template (/v1/jobs/{id}), never the raw path: ids must not explode label sets."""
    route = request.match_info.route
    resource = route.resource if route is not None else None
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except ApiError as exc:
        status = exc.status
        return error_response(exc.status, exc.code, exc.message, exc.field, exc.headers)
    except LockstepError as exc:
        err = from_lockstep(exc)
        if err.status >= 500:
            log.warning("%s %s failed: %s", request.method, route_name(request), type(exc).__name__)
        status = err.status
        return error_response(err.status, err.code, err.message, err.field, err.headers)
    except web.HTTPException as exc:
        if exc.status < 400:  # redirects and the like pass through untouched
            status = exc.status
            raise
        err = from_http(exc)
        status = err.status
        return error_response(err.status, err.code, err.message, err.field, err.headers)
    except Exception:
        # The traceback is for the operator's log; the client gets a fixed message.
        log.exception("unhandled error in %s %s", request.method, route_name(request))
        status = 500
        return error_response(500, "internal", "internal error")
    finally:
        metrics = request.app.get(METRICS)
        if metrics is not None:
            elapsed = time.perf_counter() - started
            metrics.observe_request(route_name(request), request.method, status, elapsed)


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="lockstep"'}


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in PUBLIC_PATHS:
        return await handler(request)
    plaintext = _bearer(request)
    if plaintext is None:
        raise ApiError(401, "unauthorized", "a bearer token is required (Authorization: Bearer <token>)",
                       headers=_CHALLENGE)
    if len(plaintext) > 512:
        raise ApiError(401, "unauthorized", "invalid or revoked token", headers=_CHALLENGE)
    info = await request.app[TOKENS].lookup(plaintext)
    if info is None:
        raise ApiError(401, "unauthorized", "invalid or revoked token", headers=_CHALLENGE)
    wait = request.app[LIMITER].take(info.tenant)
    if wait > 0:
        raise ApiError(429, "rate_limited", f"tenant {info.tenant} is over its request rate",
                       headers={"Retry-After": retry_after(wait)})
    route_handler = request.match_info.handler
    if route_handler in ADMIN_ONLY and not is_admin(info):
        raise ApiError(403, "forbidden", "this endpoint needs an admin token")
    request[AUTH] = info
    return await handler(request)
