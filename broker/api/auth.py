"""Bearer tokens → (tenant, role), and a token bucket per tenant.

Verification hits the store once per token per ``cache_s`` seconds: a hot
client must not cost a database round trip per request. Revocation through the
API drops the cached entry at once; a revocation made elsewhere (the CLI on
the store) takes effect within ``cache_s``.

Unknown tokens cost a lookup each, so a client address sending many is limited (429). A valid token from
that address must never pay for its neighbour (one NAT, one gateway: every user is one address): a throttled
request is let through to the lookup when its token's hash is among the live tokens' hashes, read from the
store no earlier than the request arrived (one read shared by every waiting request, at most one per
``known_every_s``), so the flood costs one small read a second, not one lookup per request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from broker.models import Role, TokenInfo

log = logging.getLogger(__name__)


def token_key(plaintext: str) -> str:
    # Cache keys are hashes, so the plaintext is not kept in memory longer than the request.
    return hashlib.sha256(plaintext.encode()).hexdigest()


class TokenCache:
    def __init__(self, verify: Callable[[str], Awaitable[TokenInfo | None]], cache_s: float,
                 clock: Callable[[], float] = time.monotonic, *,
                 known: Callable[[], Awaitable[Collection[str]]] | None = None, known_every_s: float = 1.0) -> None:
        self._verify = verify
        self._cache_s = cache_s
        self._clock = clock
        self._entries: dict[str, tuple[TokenInfo, float]] = {}
        self._load_known = known
        self._known_every_s = known_every_s
        self._known: Collection[str] = frozenset()
        self._known_read_at = -math.inf  # when the last read of the hashes began
        self._reading: asyncio.Task[None] | None = None
        self._reading_since = -math.inf  # when the read in flight was asked for

    async def may_be_valid(self, plaintext: str) -> bool:
        """Is this token among the live ones, as the store says no earlier than now? False without ``known``.
        Callers share one read of the hashes; reads start at most once per ``known_every_s``."""
        if self._load_known is None:
            return False
        key, asked = token_key(plaintext), self._clock()
        while True:
            task = self._reading
            if task is None or task.done():
                task = self._reading = asyncio.get_running_loop().create_task(self._read_known())
                self._reading_since = self._clock()
            since = self._reading_since
            await asyncio.shield(task)
            if since >= asked:  # that read began after this request arrived: a token made before it is there
                return key in self._known

    async def _read_known(self) -> None:
        wait = self._known_read_at + self._known_every_s - self._clock()
        if wait > 0:
            await asyncio.sleep(wait)
        self._known_read_at = self._clock()
        assert self._load_known is not None
        try:
            self._known = frozenset(await self._load_known())
        except Exception as exc:  # the store did not answer: no token is known this round (a 429, not a 500)
            log.warning("reading the live tokens failed: %s", type(exc).__name__)
            self._known = frozenset()

    def cached(self, plaintext: str) -> TokenInfo | None:
        """The token's info when a lookup is cached and fresh (no database round trip), else None."""
        hit = self._entries.get(token_key(plaintext))
        return hit[0] if hit is not None and hit[1] > self._clock() else None

    async def lookup(self, plaintext: str) -> TokenInfo | None:
        key = token_key(plaintext)
        now = self._clock()
        hit = self._entries.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        info = await self._verify(plaintext)
        if info is None:  # unknown or revoked: never cached, so a new token works at once
            self._entries.pop(key, None)
            return None
        if self._cache_s > 0:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[key] = (info, now + self._cache_s)
        return info

    def forget(self, token_id: str) -> None:
        for key, (info, _) in list(self._entries.items()):
            if info.id == token_id:
                del self._entries[key]


@dataclass
class _Bucket:
    tokens: float
    at: float


class RateLimiter:
    """A token bucket per key (a tenant; a client address for unknown tokens): ``rate_per_s`` sustained,
    ``burst`` at once."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = max(rate_per_s, 1e-9)
        self.burst = max(burst, 1)
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def take(self, tenant: str) -> float:
        """0 when the request may go; otherwise the seconds until it could."""
        now = self._clock()
        b = self._buckets.get(tenant)
        if b is None:
            if len(self._buckets) >= 10_000:  # keyed by client address too: forget the buckets that are full
                self._buckets = {k: v for k, v in self._buckets.items()
                                 if v.tokens + (now - v.at) * self.rate < self.burst}
            b = self._buckets[tenant] = _Bucket(float(self.burst), now)
        b.tokens = min(float(self.burst), b.tokens + (now - b.at) * self.rate)
        b.at = now
        if b.tokens >= 1.0:
            b.tokens -= 1.0
            return 0.0
        return (1.0 - b.tokens) / self.rate

    def give_back(self, key: str) -> None:
        """Return what one :meth:`take` took (the request turned out not to count)."""
        b = self._buckets.get(key)
        if b is not None:
            b.tokens = min(float(self.burst), b.tokens + 1.0)


def retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


def is_admin(info: TokenInfo) -> bool:
    return info.role is Role.admin
