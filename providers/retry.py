"""The one retry policy of every outbound call Lockstep makes (markets, and the tracker's webhook).

Only :class:`~broker.errors.TransientError` is retried (throttled, 5xx, timeout,
connection lost); every other error is an answer. Attempts are bounded; the wait
between them is exponential with full jitter (a random time up to
``initial * 2**n``, capped at ``max_wait``), so many clients backing off at once
spread out. A :class:`Throttled` error that says how long to wait (HTTP
``Retry-After``) is waited for instead, up to ``retry_after_max``. Built on tenacity.

Callers map their transport's failures to the error hierarchy inside the retried
function; the last error is re-raised as it is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from email.utils import parsedate_to_datetime
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_random_exponential

from broker.errors import TransientError
from broker.models import utcnow

T = TypeVar("T")

__all__ = ["Throttled", "backoff", "retry_after_seconds", "retrying", "with_retries"]


class Throttled(TransientError):
    """A transient refusal that named how long to wait (HTTP 429/503 with ``Retry-After``)."""

    def __init__(self, provider: str, message: str, code: str = "", retry_after: float | None = None) -> None:
        super().__init__(provider, message, code)
        self.retry_after = retry_after


def retry_after_seconds(header: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header: a number of seconds or an HTTP date; None when unreadable."""
    if not header:
        return None
    try:
        return max(0.0, float(header))
    except ValueError:
        pass
    try:
        return max(0.0, (parsedate_to_datetime(header) - utcnow()).total_seconds())
    except (TypeError, ValueError):
        return None


def backoff(
    *, initial: float = 0.2, max_wait: float = 5.0, retry_after_max: float = 30.0
) -> Callable[[RetryCallState], float]:
    """Seconds to wait before the next attempt: the server's hint when it gave one, else full jitter."""
    jitter = wait_random_exponential(multiplier=initial, max=max_wait)

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, Throttled) and exc.retry_after is not None:
            return min(exc.retry_after, retry_after_max)
        return float(jitter(state))

    return wait


def retrying(
    attempts: int, *, initial: float = 0.2, max_wait: float = 5.0, retry_after_max: float = 30.0
) -> AsyncRetrying:
    """The policy as a tenacity loop, for a block of several calls retried together::

        async for attempt in retrying(config.max_attempts):
            with attempt:
                ...
    """
    return AsyncRetrying(
        stop=stop_after_attempt(max(1, attempts)),
        wait=backoff(initial=initial, max_wait=max_wait, retry_after_max=retry_after_max),
        retry=retry_if_exception_type(TransientError),
        reraise=True,
    )


async def with_retries(fn: Callable[[], Awaitable[T]], policy: AsyncRetrying) -> T:
    """``await fn()``, retried under ``policy`` (from :func:`retrying`); the last error is raised as it is."""
    async for attempt in policy:
        with attempt:
            return await fn()
    raise AssertionError("unreachable")  # pragma: no cover
