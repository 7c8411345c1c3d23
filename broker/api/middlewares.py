"""aiohttp middlewares: errors (outermost, also counts requests), then auth and rate limits, then the body.

Order matters: the error middleware wraps everything so a refused token, a
body too large or an unknown route all answer in the same JSON shape.

Bodies are read here, once, before the handler, with ``api.body_timeout_s``: a client that declares a
body and sends it slowly (or never) gets a 408 instead of holding a request open; one that declares more
than ``api.max_body_bytes`` gets a 413 before a byte is read. A client that hangs up mid-body is no
server error: it is counted with status 499 (nginx's "client closed request") and logged in one line; the
access log says 499 too.

A path or query value holding a character no store can keep (NUL: PostgreSQL's text cannot hold it) is a
400 naming the parameter before any handler runs, on every route: it must never reach a query and come back
as a 500. A NUL in a header is refused by aiohttp's parser; its traceback is logged as one INFO line instead.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler

from broker.api.auth import retry_after
from broker.api.docs import STATIC_PREFIX
from broker.api.errors import ApiError, error_response, from_http, from_lockstep
from broker.api.handlers import ADMIN_ONLY, ROUTES, allowed_roles
from broker.api.keys import AUTH, BAD_TOKENS, LIMITER, METRICS, SERVICE, TOKENS
from broker.errors import LockstepError

log = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset(r.path for r in ROUTES if r.public)  # the route table says which
DASHBOARD = "/ui"
DOC_PATHS = frozenset(r.path for r in ROUTES if r.docs)  # public too, unless api.public_docs is false
CLIENT_CLOSED = 499  # the status a request is counted with when its client hung up before it was answered


class ClientGone(Exception):
    """The client closed the connection before its request was read: nobody is left to answer."""


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _unstorable(text: str) -> bool:
    """NUL (PostgreSQL's text cannot hold it) or a lone surrogate (no UTF-8 encoding)."""
    return _UNSTORABLE.search(text) is not None


def refuse_unstorable(request: web.Request) -> None:
    """400 naming the first path parameter, query key or query value a store could not hold."""
    for name, value in request.match_info.items():
        if _unstorable(value):
            raise ApiError(400, "bad_parameter", "a character no store can hold (NUL or a lone surrogate)", name)
    if route_name(request) == "unmatched" and _unstorable(request.path):
        raise ApiError(400, "bad_parameter", "a character no store can hold (NUL or a lone surrogate)", "path")
    for key, value in request.query.items():
        if _unstorable(key) or _unstorable(value):
            field = key if not _unstorable(key) else "query"
            raise ApiError(400, "bad_parameter", "a character no store can hold (NUL or a lone surrogate)",
                           field[:64])


class _ParseErrorsAreInfo(logging.Filter):
    """aiohttp logs a request its parser refused (a NUL in a header, a bad request line) as an ERROR with a
    traceback: any client could write ERROR lines at will and page whoever watches them. It is bad input,
    answered 400 by aiohttp: one INFO line naming the reason."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500:
            reason = " ".join(str(exc.message).split())[:200]
            record.msg, record.args = "refused a malformed request (%s %s)", (exc.code, reason)
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
        return True


logging.getLogger("aiohttp.server").addFilter(_ParseErrorsAreInfo())


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
        refuse_unstorable(request)
        resp = await handler(request)
        status = resp.status
        return resp
    except ApiError as exc:
        status = exc.status
        resp = error_response(exc.status, exc.code, exc.message, exc.field, exc.headers)
        if resp.headers.get("Connection", "").lower() == "close":
            resp.force_close()  # the rest of its body is not read: this connection serves no other request
        return resp
    except ClientGone:
        log.info("%s %s: the client closed the connection before sending its body", request.method,
                 route_name(request))
        status = CLIENT_CLOSED
        # Never delivered; its status is what the access log writes, as the metrics do.
        return error_response(CLIENT_CLOSED, "client_closed", "client closed the connection")
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
    if request.path in PUBLIC_PATHS or request.path == DASHBOARD or request.path.startswith(DASHBOARD + "/"):
        return await handler(request)  # the dashboard checks its own session cookie (broker/dashboard/pages.py)
    if (request.path in DOC_PATHS or request.path.startswith(STATIC_PREFIX + "/")) \
            and request.app[SERVICE].settings.api.public_docs:
        return await handler(request)
    plaintext = _bearer(request)
    if plaintext is None:
        raise ApiError(401, "unauthorized", "a bearer token is required (Authorization: Bearer <token>)",
                       headers=_CHALLENGE)
    if len(plaintext) > 512:
        raise ApiError(401, "unauthorized", "invalid or revoked token", headers=_CHALLENGE)
    tokens = request.app[TOKENS]
    info = tokens.cached(plaintext)
    if info is None:
        # Each unknown token costs a database lookup: past a few, a client address waits before its next one.
        # The limit is on lookups begun, taken before the lookup (a flood sent at once is not all in flight
        # before the first of it fails); a token the lookup finds gives its share back.
        strangers, address = request.app[BAD_TOKENS], request.remote or ""
        wait = strangers.take(address)
        # Over its limit, this address's request goes on only with a token the store knows (never a 429 for
        # a valid token because of a neighbour's flood), at the cost of one shared read a second.
        if wait > 0 and not await tokens.may_be_valid(plaintext):
            raise ApiError(429, "rate_limited", "too many requests with unknown or revoked tokens from this address",
                           headers={"Retry-After": retry_after(wait)})
        info = await tokens.lookup(plaintext)
        if info is None:
            raise ApiError(401, "unauthorized", "invalid or revoked token", headers=_CHALLENGE)
        if wait == 0:
            strangers.give_back(address)
    wait = request.app[LIMITER].take(info.tenant)
    if wait > 0:
        raise ApiError(429, "rate_limited", f"tenant {info.tenant} is over its request rate",
                       headers={"Retry-After": retry_after(wait)})
    route_handler = request.match_info.handler
    if info.role not in allowed_roles(route_handler):
        if route_handler in ADMIN_ONLY:
            raise ApiError(403, "forbidden", "this endpoint needs an admin token")
        raise ApiError(403, "forbidden", f"a token with the {info.role.value} role may not call this endpoint")
    request[AUTH] = info
    return await handler(request)


@web.middleware
async def body_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Read the request's body before its handler: refused by its declared length, bounded in time."""
    if request.body_exists:
        api = request.app[SERVICE].settings.api
        declared = request.content_length
        if declared is not None and declared > api.max_body_bytes:
            raise ApiError(413, "payload_too_large",
                           f"request body too large: {declared} bytes declared, at most {api.max_body_bytes}",
                           "body", {"Connection": "close"})
        try:
            async with asyncio.timeout(api.body_timeout_s):
                await request.read()  # kept by the request: the handler's read() and json() use it
        except TimeoutError:
            raise ApiError(408, "request_timeout", f"the request body did not arrive within {api.body_timeout_s:g} s",
                           "body", {"Connection": "close"}) from None
        except ConnectionResetError:
            raise ClientGone() from None
    return await handler(request)
