"""Turning every failure into the one JSON error shape: {"error": {"code", "message", "field"}}.

Messages come from Lockstep's own exceptions (which never carry secrets) or
from fixed texts; a traceback goes to the log, never to the client.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from aiohttp import web

from broker.errors import LockstepError

# aiohttp's own HTTP errors (unknown route, wrong method, body too large...) by status.
_HTTP_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "rate_limited",
}


class ApiError(Exception):
    """An error the API answers on purpose, with its status, code and (maybe) the field."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = dict(headers or {})


def error_response(status: int, code: str, message: str, field: str | None = None,
                   headers: Mapping[str, str] | None = None) -> web.Response:
    body = {"error": {"code": code, "message": message, "field": field}}
    return web.Response(status=status, text=json.dumps(body), content_type="application/json",
                        headers=dict(headers or {}))


def from_lockstep(exc: LockstepError) -> ApiError:
    """The HTTP face of a domain error: each class carries its status, code and field (broker/errors.py)."""
    return ApiError(exc.http_status, exc.api_code, exc.public_message, exc.api_field)


def from_http(exc: web.HTTPException) -> ApiError:
    status = exc.status
    kept = ("allow", "retry-after", "www-authenticate")
    headers = {k: v for k, v in exc.headers.items() if k.lower() in kept}
    message = exc.reason
    if status == 413:
        message = "request body too large"
    return ApiError(status, _HTTP_CODES.get(status, "http_error"), message, "body" if status == 413 else None,
                    headers)
