"""The offer book: offers from every provider, refreshed concurrently, never blocking placement.

Each provider is asked with its own timeout. A provider that fails or times
out keeps its last offers, marked stale with their age, and its health says
why; the others stand. Readers always get the last complete snapshot (a
refresh swaps it in atomically), so placement never waits on a slow market.

A refresh with a query filters every provider's answer with
:func:`providers.base.matches`, here and nowhere else (providers may answer more
than asked). A snapshot provider's rows (the bundled catalog's) give way to the
offers of a provider that answers for the same market; the offers a failing
provider keeps are ``tracked`` (``Offer.source``) with their age. Only offers of a
provider that launches, made by it, are launchable (:meth:`Marketplace.launchable`).

Each provider has a circuit breaker (:class:`CircuitBreaker`) over its calls: offer refreshes here,
launches (broker/router.py) and polls (broker/loops.py). After ``failures`` consecutive failed calls it
opens: the provider is not called at all until a half-open probe, one call, after a backoff that doubles
each time the probe fails. A refused credential (``ProviderAuthError``) leaves it unusable until its
configuration changes (a restart, or a credential file it reads being replaced). A provider that keeps
failing then costs a number of calls that grows with the logarithm of the outage's length, not with it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TypeVar

from broker.errors import BadRequestError, CapacityError, ProviderAuthError, ProviderError, QuotaError
from broker.models import (  # the health models are re-exported: they were defined here
    CircuitInfo,
    CircuitState,
    Offer,
    OfferSource,
    Perf,
    ProviderHealth,
    utcnow,
)
from policies.assembly import combine, is_assembled, member_ids
from policies.book import PRUNE_MIN_ROWS, OfferBook
from providers.base import OfferQuery, Provider, matches
from providers.capabilities import AssemblesNodes, Launches, Snapshot

log = logging.getLogger(__name__)
T = TypeVar("T")


# The numbers /metrics reports for each state (lockstep_provider_circuit_state): higher is worse.
CIRCUIT_CODES = {CircuitState.closed: 0, CircuitState.half_open: 1, CircuitState.open: 2,
                 CircuitState.auth_failed: 3}


@dataclass(frozen=True)
class CircuitPolicy:
    """When a circuit opens (``failures`` consecutive failed calls) and how long it stays open (``backoff_s``,
    doubled at each reopening, at most ``backoff_max_s``)."""

    failures: int = 3
    backoff_s: float = 30.0
    backoff_max_s: float = 1800.0

    def backoff(self, opened: int) -> timedelta:
        return timedelta(seconds=min(self.backoff_s * 2.0 ** min(opened, 60), self.backoff_max_s))


class CircuitOpen(ProviderError):
    """A call not made: the provider's circuit is open (or its credentials were refused)."""


def _verdict(exc: BaseException | None) -> str:
    """What a call's outcome says about the provider: ``ok`` (it answered: a refusal of this offer, this
    request or over an account limit included), ``auth`` (credentials refused), ``failed`` (no answer:
    throttled, 5xx, timed out, an adapter's bug), or ``none`` (cancelled, not made: no verdict)."""
    if exc is None or isinstance(exc, CapacityError | BadRequestError | QuotaError):
        return "ok"
    if isinstance(exc, ProviderAuthError):
        return "auth"
    if isinstance(exc, Exception) and not isinstance(exc, CircuitOpen):
        return "failed"
    return "none"


class CircuitTicket:
    """Leave to make one call (see :meth:`CircuitBreaker.acquire`): ``record`` its outcome; ``release``
    when the call was not made after all (a probe's slot is freed without a verdict)."""

    def __init__(self, breaker: CircuitBreaker, probe: bool) -> None:
        self.breaker, self.probe, self.done = breaker, probe, False

    def record(self, exc: BaseException | None) -> None:
        if not self.done:
            self.done = True
            self.breaker._record(self, _verdict(exc), exc)

    def release(self) -> None:
        self.record(asyncio.CancelledError())


class CircuitBreaker:
    """One provider's circuit: closed → open after ``policy.failures`` consecutive failures → half-open
    (one probe) once its backoff has passed → closed on the probe's success, open again (twice as long) on
    its failure. ``auth_failed`` after refused credentials, until ``credentials()`` (the identity of what
    the provider's configuration reads its credentials from) changes. The backoff starts over once the
    circuit has stayed closed as long as its last backoff."""

    def __init__(self, name: str, policy: CircuitPolicy | None = None, *,
                 clock: Callable[[], datetime] = utcnow,
                 credentials: Callable[[], object] | None = None) -> None:
        self.name = name
        self.policy = policy or CircuitPolicy()
        self.clock = clock
        self.credentials = credentials or (lambda: None)
        self.state = CircuitState.closed
        self.failures = 0
        self.opened = 0
        self.since: datetime | None = None
        self.next_probe_at: datetime | None = None
        self.closed_at: datetime | None = None
        self.reason = ""
        self._probing = False
        self._refused_credentials: object = None

    def admits(self) -> bool:
        """Would a call be let through now? (No side effect: :meth:`acquire` takes the leave.)"""
        if self.state is CircuitState.closed:
            return True
        if self.state is CircuitState.auth_failed:
            return self.credentials() != self._refused_credentials
        if self.state is CircuitState.half_open:
            return not self._probing
        return self.next_probe_at is None or self.clock() >= self.next_probe_at

    def acquire(self) -> CircuitTicket | None:
        """Leave for one call, or None (the circuit is open). Past an open circuit's backoff (or after its
        credentials changed) the first caller gets the one probe; the others wait for its outcome."""
        if self.state is CircuitState.closed:
            return CircuitTicket(self, probe=False)
        if not self.admits():
            return None
        if self.state is not CircuitState.half_open:
            log.info("provider %s: circuit half-open, probing", self.name)
            self._enter(CircuitState.half_open)
        self._probing = True
        return CircuitTicket(self, probe=True)

    def describe(self) -> str:
        """Why calls are refused, for a job's reasons (the failure itself is in :meth:`info`)."""
        if self.state is CircuitState.auth_failed:
            return f"{self.name}: credentials refused; unusable until its configuration changes"
        at = f"; next probe at {self.next_probe_at:%Y-%m-%d %H:%M:%S} UTC" if self.next_probe_at else ""
        return f"{self.name}: circuit {self.state.value.replace('_', '-')} after {self.failures} failed calls{at}"

    def info(self) -> CircuitInfo:
        return CircuitInfo(state=self.state, failures=self.failures, opened=self.opened, since=self.since,
                           next_probe_at=self.next_probe_at if self.state is CircuitState.open else None,
                           reason=self.reason)

    def _enter(self, state: CircuitState) -> None:
        self.state, self.since = state, self.clock()

    def _record(self, ticket: CircuitTicket, verdict: str, exc: BaseException | None) -> None:
        if ticket.probe:
            self._probing = False
        now = self.clock()
        if verdict == "ok":
            if self.state is not CircuitState.closed:
                log.info("provider %s: circuit closed", self.name)
                self._enter(CircuitState.closed)
                self.closed_at = now
            elif self.opened and self.closed_at is not None and \
                    now - self.closed_at >= self.policy.backoff(self.opened - 1):
                self.opened = 0  # closed long enough: the next outage starts with the first backoff again
            self.failures, self.next_probe_at = 0, None
            return
        if verdict == "none":
            if self.state is CircuitState.half_open and not self._probing:
                self._enter(CircuitState.open)  # the probe was not made: due again at once
            return
        self.reason = (str(exc) or type(exc).__name__)[:300]
        if verdict == "auth":
            if self.state is not CircuitState.auth_failed:
                log.warning("provider %s: credentials refused; not called again until its configuration "
                            "changes: %s", self.name, self.reason)
            self._enter(CircuitState.auth_failed)
            self._refused_credentials = self.credentials()
            self.failures += 1
            self.next_probe_at = None
            return
        self.failures += 1
        if self.state is CircuitState.auth_failed:
            return  # a call from before the refusal: it changes nothing
        if (self.state is CircuitState.half_open and ticket.probe) or \
                (self.state is CircuitState.closed and self.failures >= self.policy.failures):
            backoff = self.policy.backoff(self.opened)
            self.opened += 1
            self.next_probe_at = now + backoff
            self._enter(CircuitState.open)
            log.warning("provider %s: circuit open after %d failed calls (last: %s); next probe in %.0f s",
                        self.name, self.failures, self.reason, backoff.total_seconds())

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``fn()`` under this circuit: CircuitOpen when it is open, the outcome recorded otherwise."""
        ticket = self.acquire()
        if ticket is None:
            raise CircuitOpen(self.name, self.describe().removeprefix(f"{self.name}: "))
        try:
            result = await fn()
        except BaseException as exc:
            ticket.record(exc)
            raise
        ticket.record(None)
        return result


class Marketplace:
    def __init__(
        self,
        providers: Mapping[str, Provider],
        *,
        timeout_s: float = 30.0,
        clock: Callable[[], datetime] = utcnow,
        on_refresh: Callable[[str, bool, float], None] | None = None,
        after_refresh: Callable[[], Awaitable[None]] | None = None,
        circuit: CircuitPolicy | None = None,
        credentials: Callable[[str], object] | None = None,
    ) -> None:
        """``circuit``: when each provider's circuit opens and for how long; ``credentials(name)``: the
        identity of what that provider's configuration reads its credentials from (a refused provider is
        probed again when it changes)."""
        self.providers = dict(providers)
        self.timeout_s = timeout_s
        self.clock = clock
        self.on_refresh = on_refresh  # metrics hook: (provider, ok, seconds)
        # Measured performance by (provider, host) or (provider, sku): beats the datasheet and priors.
        # The service refreshes it (from stored benchmarks) in ``after_refresh``.
        self.measured: dict[tuple[str, str], Perf] = {}
        self.after_refresh = after_refresh
        self._offers: dict[str, list[Offer]] = {name: [] for name in self.providers}
        self._health: dict[str, ProviderHealth] = {name: ProviderHealth(name=name) for name in self.providers}
        self.circuits: dict[str, CircuitBreaker] = {
            name: CircuitBreaker(name, circuit, clock=clock,
                                 credentials=functools.partial(credentials, name) if credentials else None)
            for name in self.providers
        }
        self._book: OfferBook | None = None
        self._base_book: OfferBook | None = None  # columns and index, built once per refresh
        self._snapshot: list[Offer] | None = None  # merged offers of the last refresh
        self._by_id: dict[str, Offer] = {}
        self._origin: dict[str, str] = {}  # offer id → the provider whose answer it came in
        self._book_key: object = None
        self._lock = asyncio.Lock()
        self.refreshed_at: datetime | None = None

    def launcher(self, name: str) -> Launches | None:
        """The provider ``name`` if it launches (typed for launch/poll/release/owned), else None."""
        p = self.providers.get(name)
        return p if isinstance(p, Launches) else None

    @property
    def has_snapshot(self) -> bool:
        """A provider answers from a snapshot (no network needed): quotes work with every live market down."""
        return any(isinstance(p, Snapshot) for p in self.providers.values())

    async def _refresh_one(self, name: str, provider: Provider, query: OfferQuery | None) -> None:
        health = self._health[name]
        circuit = self.circuits[name]
        started = time.perf_counter()

        async def attempt() -> list[Offer]:
            health.last_attempt = self.clock()
            return await asyncio.wait_for(provider.offers(query), self.timeout_s)

        try:
            offers = await circuit.call(attempt)
        except CircuitOpen as exc:  # not called: its last offers stand, stale
            health.ok, health.last_error = False, str(exc)[:500]
            return
        except Exception as exc:  # a market failing must not take the others down
            elapsed = time.perf_counter() - started
            reason = "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
            log.warning("provider %s refresh failed: %s", name, reason)
            health.ok, health.last_error, health.latency_s = False, reason[:500], elapsed
            if self.on_refresh:
                self.on_refresh(name, False, elapsed)
            return
        elapsed = time.perf_counter() - started
        if query is not None:
            offers = [o for o in offers if matches(o, query)]
        self._offers[name] = offers
        notes = provider.notes()
        for note in set(notes) - set(health.notes):  # logged when they appear, not at every refresh
            log.info("provider %s: %s", name, note)
        health.notes = notes
        health.ok, health.last_error, health.latency_s = True, "", elapsed
        health.last_ok, health.offers = self.clock(), len(offers)
        if self.on_refresh:
            self.on_refresh(name, True, elapsed)

    async def refresh(self, query: OfferQuery | None = None) -> dict[str, ProviderHealth]:
        """Ask every provider at once; returns their health. Concurrent callers share one refresh."""
        async with self._lock:
            await asyncio.gather(*(self._refresh_one(n, p, query) for n, p in self.providers.items()))
            if self.after_refresh is not None:
                try:
                    await self.after_refresh()
                except Exception:  # benchmarks and risk improve quotes; they never fail a refresh
                    log.exception("after-refresh hook")
            self.refreshed_at = self.clock()
            self._book = self._base_book = None
            self._snapshot = None
        return self.health()

    def _with_measured(self, o: Offer) -> Offer:
        perf = None
        if o.locality.host:
            perf = self.measured.get((o.provider, o.locality.host))
        if perf is None:
            perf = self.measured.get((o.provider, o.sku))
        if perf is None or (o.perf is not None and o.perf.source != "dlperf" and perf.source == "dlperf"):
            return o
        return o.model_copy(update={"perf": perf})

    def health(self) -> dict[str, ProviderHealth]:
        now = self.clock()
        for h in self._health.values():
            h.age_s = (now - h.last_ok).total_seconds() if h.last_ok else None
            h.stale = not h.ok
            h.circuit = self.circuits[h.name].info()
        return {n: h.model_copy() for n, h in self._health.items()}

    def offers(self) -> list[Offer]:
        """All offers; those of a provider whose last refresh failed are marked stale.

        Snapshot offers of a market that answers live (e.g. the catalog's AWS list
        prices when the AWS adapter answers) are dropped: live beats a snapshot.
        Merged once per refresh and shared by the book, ``find`` and listings.
        """
        if self._snapshot is None:
            self._snapshot = self._merge()
            self._by_id = {o.id: o for o in self._snapshot}
        return list(self._snapshot)

    def live_markets(self) -> set[str]:
        """Markets (``Offer.provider``) a provider of their own answered for in its last refresh (whatever the
        source of a price in its answer): a snapshot's rows of these markets give way."""
        return {
            o.provider
            for name, offers in self._offers.items()
            if self._health[name].ok and not isinstance(self.providers[name], Snapshot)
            for o in offers
        }

    def _merge(self) -> list[Offer]:
        live = self.live_markets()
        out: list[Offer] = []
        origin: dict[str, str] = {}
        for name, offers in self._offers.items():
            stale = not self._health[name].ok
            snapshot = isinstance(self.providers[name], Snapshot)
            for o in offers:
                if snapshot and o.provider in live:
                    continue
                if self.measured:
                    o = self._with_measured(o)
                if stale and not o.stale:  # its provider did not answer: the last answer, tracked
                    update: dict[str, object] = {"stale": True}
                    if o.source is OfferSource.live:
                        update["source"] = OfferSource.tracked
                    o = o.model_copy(update=update)
                origin[o.id] = name
                out.append(o)
        self._origin = origin
        return out

    def launchable(self, offer: Offer) -> bool:
        """Can ``offer`` be launched: it came from a provider that launches, under its own name (a snapshot's
        row of that market cannot, whatever its source)."""
        self.offers()
        if is_assembled(offer.id):  # several machines of one provider that can rent them together
            members = member_ids(offer.id)
            return isinstance(self.providers.get(offer.provider), AssemblesNodes) and all(
                self._origin.get(m) == offer.provider for m in members) and self.launcher(offer.provider) is not None
        name = self._origin.get(offer.id)
        return name == offer.provider and self.launcher(name) is not None

    def book(
        self,
        *,
        unhealthy_hosts: Mapping[tuple[str, str], str] | None = None,
        preemption_rates: Mapping[tuple[str, str, str], float] | None = None,
    ) -> OfferBook:
        """The columnar book of the current snapshot: built once per refresh; node health and spot
        risk are swapped in (two columns) when they change."""
        key = (self.refreshed_at, tuple(sorted((unhealthy_hosts or {}).items())),
               tuple(sorted((preemption_rates or {}).items())))
        if self._base_book is None:
            # Whose single machines the ranking may assemble into multi-node options: by capability.
            self._base_book = replace(OfferBook.build(self.offers()), assemblers=frozenset(
                name for name, p in self.providers.items() if isinstance(p, AssemblesNodes)))
        if self._book is None or key != self._book_key:
            self._book = self._base_book.with_health(unhealthy_hosts, preemption_rates)
            self._book_key = key
            if len(self._book) >= PRUNE_MIN_ROWS:
                # Fold the new book by shape (policies/book.py, PrunedView) off the event loop, now: at a
                # million offers it takes a second or more, which the first `gpu: any` quote would otherwise
                # spend holding up every request. numpy lets go of the GIL in the sorts that cost most; a
                # quote that comes first folds it itself (the same view; whichever is kept is right).
                threading.Thread(target=self._book.pruned, name="lockstep-fold-book", daemon=True).start()
        return self._book

    def find(self, offer_id: str) -> Offer | None:
        """The current snapshot's offer by id; an assembled offer (policies/assembly.py) is made again from its
        machines, or None when one of them has left the market."""
        self.offers()
        if is_assembled(offer_id):
            members = [self._by_id.get(i) for i in member_ids(offer_id)]
            return combine([m for m in members if m is not None]) if all(members) and len(members) > 1 else None
        return self._by_id.get(offer_id)

    async def aclose(self) -> None:
        for p in self.providers.values():
            try:
                await p.aclose()
            except Exception:  # closing must go on for the others
                log.exception("closing provider %s", p.name)
