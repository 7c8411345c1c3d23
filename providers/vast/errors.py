"""Vast.ai answers → the broker.errors hierarchy.

401/403 → ProviderAuthError; the daily search quota 429 → QuotaError (it resets at
midnight UTC: not retried); other 429 and 5xx → :class:`~providers.retry.Throttled`
(transient, with the server's Retry-After); other 4xx → :class:`Refused`, which the
provider turns into CapacityError where the ask is gone. Messages carry the status and
Vast's error code only; the key travels in the Authorization header and nowhere else.
"""

from __future__ import annotations

import re

import httpx

from broker.errors import BadRequestError, ProviderAuthError, QuotaError, TransientError
from providers.retry import Throttled, retry_after_seconds

PROVIDER = "vast"
_QUOTA = re.compile(r"quota", re.IGNORECASE)
# Vast's error codes for an ask that can no longer be rented as asked.
GONE_CODES = frozenset({"no_such_ask", "ask_not_available", "bid_too_low", "insufficient_disk"})


class Refused(BadRequestError):
    """A 4xx answer other than auth and throttling; callers turn some into CapacityError."""

    def __init__(self, message: str, status: int, error: str) -> None:
        super().__init__(PROVIDER, message, error or f"http_{status}")
        self.status = status
        self.error = error


def raise_for(resp: httpx.Response, what: str) -> None:
    """Map a non-2xx answer; always raises."""
    status = resp.status_code
    error = ""
    try:
        payload = resp.json()
        if isinstance(payload, dict):
            error = str(payload.get("error") or "")[:64]
            text = f"{error} {payload.get('msg') or ''}"
        else:
            text = ""
    except ValueError:
        text = ""
    if status in (401, 403):
        raise ProviderAuthError(PROVIDER, f"{what}: HTTP {status}, the API key was refused", error or f"http_{status}")
    if status == 429 and _QUOTA.search(text):
        raise QuotaError(PROVIDER, f"{what}: HTTP 429, daily search quota used up (resets 00:00 UTC)",
                         error or "daily_quota")
    if status == 429 or status >= 500:
        raise Throttled(PROVIDER, f"{what}: HTTP {status}", error or f"http_{status}",
                        retry_after_seconds(resp.headers.get("Retry-After")))
    raise Refused(f"{what}: HTTP {status}", status, error)


def transport_error(exc: httpx.HTTPError, what: str) -> TransientError:
    if isinstance(exc, httpx.TimeoutException):
        return TransientError(PROVIDER, f"{what}: timed out", "timeout")
    return TransientError(PROVIDER, f"{what}: {type(exc).__name__}", "network")
