"""Webhook deliveries: the outbox filled from the event stream, each delivery signed, retried with backoff.

One loop per broker process (``Runtime.start``):

1. **fill**: for each webhook, the events after its cursor that its tenant may see and its kinds match become
   rows of the outbox, and its cursor moves, in one transaction (``Store.fill_outbox``);
2. **send**: due deliveries are leased, POSTed, and marked delivered, rescheduled (the next wait from
   tenacity's exponential backoff with jitter) or failed after ``events.webhook_max_attempts``.

A crash at any point loses nothing: an event is in the outbox before any attempt, and a delivery whose
attempt was cut short is tried again when its lease ends (receivers may see one twice: dedupe on the
``Lockstep-Delivery`` header).

Signature (Stripe's and GitHub's scheme): ``Lockstep-Signature: t=<unix seconds>,v1=<hex>`` where ``hex`` is
HMAC-SHA256 with the webhook's secret over ``"<t>." + body``. A receiver recomputes it, compares in constant
time and refuses a ``t`` too far from its clock (replays). :func:`verify_signature` does exactly that.
"""

from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
from tenacity import RetryCallState, Retrying, wait_exponential, wait_random

from broker.config import EventsConfig
from broker.errors import SpecError

if TYPE_CHECKING:
    from broker.store import Store

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "Lockstep-Signature"
DELIVERY_HEADER = "Lockstep-Delivery"
EVENT_HEADER = "Lockstep-Event"
SIGNATURE_TOLERANCE_S = 300


def sign(secret: str, body: bytes, t: int) -> str:
    """The ``Lockstep-Signature`` header value for ``body`` sent at Unix time ``t``."""
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify_signature(secret: str, body: bytes, header: str, now: float,
                     tolerance_s: float = SIGNATURE_TOLERANCE_S) -> bool:
    """True when ``header`` signs ``body`` with ``secret`` and its time is within ``tolerance_s`` of ``now``."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    try:
        t = int(parts["t"])
    except (KeyError, ValueError):
        return False
    if abs(now - t) > tolerance_s:
        return False
    expected = sign(secret, body, t).split("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


def kinds_match(patterns: list[str], kind: str) -> bool:
    return any(fnmatch.fnmatchcase(kind, p) for p in patterns)


def _public(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.split("%", 1)[0])
    return ip.is_global and not ip.is_multicast


def check_url(url: str, allow_private: bool, field: str = "url") -> None:
    """Refuse a webhook URL the broker must not call: not http(s), credentials in it, or (unless
    ``allow_private``) a host that resolves to a loopback, private, link-local (cloud metadata), shared or
    reserved address. Blocking (name resolution): run it off the event loop."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpecError(field, "must be an http:// or https:// URL with a host")
    if parts.username or parts.password:
        raise SpecError(field, "must not carry credentials (sign with the secret instead)")
    if allow_private:
        return
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80),
                                   type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise SpecError(field, f"host {parts.hostname} does not resolve") from None
    if not infos or not all(_public(str(i[4][0])) for i in infos):
        raise SpecError(field, f"{parts.hostname} is not a public address (events.webhook_allow_private is "
                        "off)")


class Backoff:
    """When the next attempt of a delivery is due: tenacity's exponential backoff with jitter."""

    def __init__(self, cfg: EventsConfig) -> None:
        self._wait = (wait_exponential(multiplier=cfg.webhook_backoff_initial_s, max=cfg.webhook_backoff_max_s)
                      + wait_random(0, cfg.webhook_backoff_initial_s))
        self._retrying = Retrying()

    def after(self, attempts: int) -> float:
        state = RetryCallState(self._retrying, None, (), {})
        state.attempt_number = max(1, attempts)
        return float(self._wait(state))


class WebhookDispatcher:
    def __init__(self, cfg: EventsConfig, store: Store, clock: Callable[[], datetime],
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.cfg, self.store, self.clock = cfg, store, clock
        self.backoff = Backoff(cfg)
        # No redirects: a public URL must not bounce the broker into a private one.
        self._http = httpx.AsyncClient(timeout=cfg.webhook_timeout_s, follow_redirects=False, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def run_forever(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.once()
            except Exception:  # one bad cycle (store down) must not end deliveries for good
                log.exception("webhook cycle failed; trying again")
            try:
                await asyncio.wait_for(stop.wait(), self.cfg.poll_interval_s)
            except TimeoutError:
                pass

    async def once(self) -> int:
        """One fill and one round of sends; returns how many attempts were made."""
        await asyncio.to_thread(self.fill)
        sent = 0
        while True:
            due = await asyncio.to_thread(self.store.claim_deliveries, self.clock(), self.cfg.webhook_lease_s)
            if not due:
                return sent
            await asyncio.gather(*(self._attempt(d) for d in due))
            sent += len(due)

    def fill(self) -> None:
        from broker.store import EventCursor

        for hook_id, tenant, kinds, cursor in self.store.webhook_cursors():
            start = EventCursor.parse(cursor)
            while True:
                events, end = self.store.events_after(start, tenant)
                if end == start:
                    break
                rows = [{"cursor": e.cursor, "kind": e.kind,
                         "body": json.dumps({"webhook_id": hook_id, "event": e.model_dump(mode="json")},
                                            separators=(",", ":"))}
                        for e in events if kinds_match(kinds, e.kind)]
                if not self.store.fill_outbox(hook_id, str(start), str(end), rows, self.clock()):
                    break  # another replica filled it meanwhile
                start = end

    async def _attempt(self, d: dict[str, Any]) -> None:
        body = d["body"].encode()
        status: int | None = None
        error = ""
        try:
            await asyncio.to_thread(check_url, d["url"], self.cfg.webhook_allow_private)  # DNS may have changed
            headers = {"Content-Type": "application/json", DELIVERY_HEADER: d["id"], EVENT_HEADER: d["kind"],
                       # The wall clock, not the service's: the receiver checks it against its own clock.
                       SIGNATURE_HEADER: sign(d["secret"], body, int(time.time())),
                       "User-Agent": "Lockstep-Webhooks/1"}
            resp = await self._http.post(d["url"], content=body, headers=headers)
            status = resp.status_code
            ok = 200 <= status < 300
            if not ok:
                error = f"HTTP {status}"
        except SpecError as exc:
            ok, error = False, str(exc)
        except httpx.HTTPError as exc:
            ok, error = False, f"{type(exc).__name__}"
        attempts = int(d["attempts"]) + 1
        later: datetime | None = None
        if not ok and attempts < self.cfg.webhook_max_attempts:
            later = self.clock() + timedelta(seconds=self.backoff.after(attempts))
        if not ok:
            log.info("webhook delivery %s attempt %d failed: %s", d["id"], attempts, error)
        await asyncio.to_thread(self.store.finish_attempt, d["id"], ok=ok, status=status, error=error,
                                next_attempt_at=later, now=self.clock())
