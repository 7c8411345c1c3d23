"""The allocation ledger: the one home of money. Every write of an allocation row goes through here —
the intent (with its attempt counter), the launch, a failed launch, what a poll saw, the release and the
booking of its billed time and cost — each a compare-and-set on the allocation's state where two writers
(a launcher, a reconcile, a poll, a replica) may decide on the same row.

The router, reconciliation and the lifecycle call it; tests/test_architecture.py checks that no other
module of the broker writes allocation rows. docs/crash-safety.md says why each write is where it is.

Billed time follows the market's own billing, not the broker's polls: an allocation accrues only once its
market started it (``running_since``: the market's own start where its poll reports one, else the first
poll that saw it running), never while it waits in the market's queue; at its end, a market that keeps its
own record (:class:`~providers.capabilities.KeepsBillingRecord`, Slurm's start and end times) is asked for
the span, which is then what is booked, per the market's granularity (``Provider.billing``). Where that record
cannot be read at the end (the market's API failing just then), the broker's own span is booked and marked
(``BILLING_DUE``); reconciliation asks again (``confirm_billing``) and books the difference once it can.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from broker.errors import ConflictError, ProviderError
from broker.models import Allocation, AllocationState, JobSpec, Notice, billing_start, utcnow
from providers.base import Provider
from providers.capabilities import KeepsBillingRecord

if TYPE_CHECKING:
    from broker.store import Store
    from broker.store.jobs import LaunchRecord

log = logging.getLogger(__name__)

RELEASING = "releasing_at"  # attrs: when a release call began that has not been recorded yet (a crash's trace)
STOP_AT = "stop_at"  # attrs: a stop for cost was signalled; the machines are released at this moment
STOP_REASON = "stop_reason"  # attrs: why (a budget spent, the job's max_cost_usd)
NOTICE_AT = "notice_at"  # attrs: when the market's interruption notice was heard (the allocation is draining)
NOTICE_DEADLINE = "notice_deadline"  # attrs: when the market said it takes the machine
BILLING_DUE = "billing_due"  # attrs: booked from the broker's own span; the market's record is still to be read
# Allocation states in which the provider no longer runs anything for the job.
ENDED = (AllocationState.released, AllocationState.failed, AllocationState.succeeded, AllocationState.preempted)


@dataclass(frozen=True)
class _Booking:
    """What an ended allocation is booked: its end, billed seconds and cost; ``due``: the market's record could
    not be read, so these are the broker's own."""

    end: datetime
    billed_s: float
    cost: float
    due: bool
    from_record: bool = False  # the market's own record was read (and is what is booked)


class Ledger:
    """Every allocation write over one store; ``providers`` say how each market bills (and, where it keeps
    one, its own record of the billed time)."""

    def __init__(self, store: Store, providers: Mapping[str, Provider] | None = None, *,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.store = store
        self.providers: Mapping[str, Provider] = providers if providers is not None else {}
        self.clock = clock

    # ------------------------------------------------------------------ placement
    async def begin_attempt(self, job_id: str, build: Callable[[int], Allocation]) -> Allocation:
        """Count the job's next attempt and write its intent (``build(attempt)``) in one transaction, before
        the provider is called: a crash after the call is then always recoverable, and an attempt's token is
        never reused."""
        alloc: Allocation = await asyncio.to_thread(self.store.open_attempt, job_id, build)
        return alloc

    async def launched(self, intent: Allocation, got: Allocation, *, reason: str, data: dict[str, Any],
                       spec: JobSpec | None = None, **job_fields: Any) -> LaunchRecord:
        """Record a launch that went through over its intent, and its job placing → provisioning, in one
        transaction; what a reconcile (or a cancel) decided meanwhile is reported, never overwritten.
        ``spec``: the job's, as the caller holds it (the moved job is built with it, not read back)."""
        state = got.state if got.state not in (AllocationState.intent, AllocationState.unknown) else \
            AllocationState.pending
        fields = {"state": state, "resource_ids": got.resource_ids, "zone": got.zone or intent.zone,
                  "attrs": {**intent.attrs, **got.attrs}}
        record: LaunchRecord = await asyncio.to_thread(self.store.record_launch, intent.id, fields, intent.job_id,
                                                       reason, data, spec=spec, **job_fields)
        return record

    async def fail_intent(self, alloc_id: str, reason: str, attrs: Mapping[str, str] | None = None) -> bool:
        """An intent whose launch did not happen (a refusal, an error; or, from reconciliation, a launch the
        provider shows nothing for): failed, only if it is still an intent. False when another writer decided
        first (a launch completing wins over a reconcile; a reconcile's verdict over a late launcher)."""
        fields: dict[str, Any] = {"state": AllocationState.failed, "reason": reason}
        if attrs is not None:
            fields["attrs"] = dict(attrs)
        try:
            await asyncio.to_thread(self.store.update_allocation, alloc_id, expected={AllocationState.intent},
                                    **fields)
        except ConflictError:
            return False
        return True

    async def orphaned(self, alloc_id: str, resource_ids: list[str], reason: str) -> bool:
        """A launch that completed after a reconcile gave its intent up: recorded released (with what it got,
        so that nobody adopts it) before it is given back. False when it was adopted after all."""
        try:
            await asyncio.to_thread(self.store.update_allocation, alloc_id, expected={AllocationState.failed},
                                    state=AllocationState.released, resource_ids=resource_ids, reason=reason)
        except ConflictError:
            return False
        return True

    # ------------------------------------------------------------------ reconciliation
    async def adopt(self, record: Allocation, found: Allocation) -> None:
        """Complete ``record`` with what its provider shows (``found``), over the state we read (ConflictError
        when another writer changed it since)."""
        update: dict[str, Any] = {"resource_ids": found.resource_ids or record.resource_ids}
        if record.state in (AllocationState.intent, AllocationState.failed, AllocationState.unknown):
            update["state"] = found.state if found.state not in (AllocationState.intent, AllocationState.unknown) \
                else AllocationState.pending
        await asyncio.to_thread(self.store.update_allocation, record.id, expected={record.state}, **update)

    async def record_found(self, found: Allocation) -> Allocation:
        """Write the record a crash between a provider call and its record never wrote (ConflictError when the
        job holds another live allocation)."""
        started = found.state in (AllocationState.pending, AllocationState.running, AllocationState.unknown)
        rec = found.model_copy(update={"state": found.state if started else AllocationState.pending})
        written: Allocation = await asyncio.to_thread(self.store.add_allocation, rec)
        return written

    # ------------------------------------------------------------------ what a poll saw
    async def observe(self, alloc: Allocation, state: AllocationState, reason: str, hosts: list[str],
                      started_at: datetime | None = None, usd_per_hour: float | None = None) -> Allocation:
        """Record what a poll answered: the hosts, the state while it is live (an allocation that ended stays
        live here until it is given back and booked: a crash before that leaves it for the next poll), the
        market's own price where it reports one (``usd_per_hour``), and when its billing began — the market's
        own start (``started_at``) where it reports one, else now, the first time it is seen running. Written
        only when something changed."""
        attrs = dict(alloc.attrs)
        if hosts:
            attrs["hosts"] = ",".join(hosts)
        if started_at is not None:  # the market's own start: what it bills from
            attrs["running_since"] = started_at.isoformat()
        elif state is AllocationState.running and "running_since" not in attrs:
            attrs["running_since"] = self.clock().isoformat()
        recorded = alloc.state if state in ENDED else state
        why = reason or alloc.reason
        # The market's own price, where it reports one, is what the time is billed at.
        price = usd_per_hour if usd_per_hour is not None else alloc.usd_per_hour
        if recorded is alloc.state and attrs == alloc.attrs and price == alloc.usd_per_hour:
            return alloc  # the reason alone is not worth a write per poll
        await asyncio.to_thread(self.store.update_allocation, alloc.id, state=recorded, attrs=attrs, reason=why,
                                usd_per_hour=price)
        return alloc.model_copy(update={"state": recorded, "attrs": attrs, "reason": why, "usd_per_hour": price})

    async def stop_requested(self, alloc: Allocation, at: datetime, reason: str) -> Allocation:
        """A job told to stop for its cost (signalled): its machines are released at ``at`` unless it ends
        first."""
        attrs = {**alloc.attrs, STOP_AT: at.isoformat(), STOP_REASON: reason}
        await asyncio.to_thread(self.store.update_allocation, alloc.id, attrs=attrs)
        return alloc.model_copy(update={"attrs": attrs})

    async def supersede(self, alloc: Allocation, notice: Notice, reason: str) -> Allocation:
        """A running allocation its market gave notice on: ``draining`` (no longer its job's live allocation,
        so the replacement may be placed at once), the notice's deadline kept; only if it is still running
        (ConflictError when another writer decided first)."""
        attrs = {**alloc.attrs, NOTICE_AT: (notice.seen_at or self.clock()).isoformat()}
        if notice.deadline is not None:
            attrs[NOTICE_DEADLINE] = notice.deadline.isoformat()
        await asyncio.to_thread(self.store.update_allocation, alloc.id, expected={AllocationState.running},
                                state=AllocationState.draining, attrs=attrs, reason=reason)
        return alloc.model_copy(update={"state": AllocationState.draining, "attrs": attrs, "reason": reason})

    # ------------------------------------------------------------------ the end
    async def releasing(self, alloc: Allocation) -> Allocation:
        """Mark the moment a release call begins (``releasing_at``), before the call: a crash after the machine
        is gone but before its end is recorded then books up to this moment, not up to a restart."""
        if not alloc.resource_ids or RELEASING in alloc.attrs:
            return alloc
        attrs = {**alloc.attrs, RELEASING: self.clock().isoformat()}
        await asyncio.to_thread(self.store.update_allocation, alloc.id, attrs=attrs)
        return alloc.model_copy(update={"attrs": attrs})

    async def release_failed(self, alloc: Allocation) -> Allocation:
        """The release call failed: the mark is cleared, the allocation stays live (reconciliation retries)."""
        if RELEASING not in alloc.attrs:
            return alloc
        attrs = {k: v for k, v in alloc.attrs.items() if k != RELEASING}
        await asyncio.to_thread(self.store.update_allocation, alloc.id, attrs=attrs)
        return alloc.model_copy(update={"attrs": attrs})

    async def book_end(self, alloc: Allocation, state: AllocationState, reason: str,
                       ended_at: datetime | None = None) -> Allocation:
        """Record an allocation that no longer holds anything as ``state`` and book its cost once: its price ×
        its billed time, rounded per its market's granularity. The billed time is the market's own record where
        it keeps one; else from when it started billing (``running_since``, or its launch for one that ended
        before any poll saw it run) to its release (``ended_at``) — or to when a release a crash interrupted began.
        Nothing is booked for an allocation that never reached the provider, or that its market never started.
        A record that cannot be read now leaves the booking marked ``BILLING_DUE`` (see ``confirm_billing``)."""
        current = await asyncio.to_thread(self.store.get_allocation, alloc.id)
        attrs = {**current.attrs, **alloc.attrs}
        # ``ended_at``: a release call just returned (the market stopped billing now); else the moment a release
        # a crash interrupted began, or now.
        end = ended_at or (datetime.fromisoformat(attrs[RELEASING]) if RELEASING in attrs else self.clock())
        held = current.model_copy(update={"resource_ids": current.resource_ids or alloc.resource_ids,
                                          "attrs": attrs})
        booking = await self._billed(held, end, ask_market=current.cost_usd is None)
        if booking.due:
            attrs[BILLING_DUE] = "1"
        done, booked = await asyncio.to_thread(
            self.store.end_allocation, alloc.id, state=state, reason=reason, ended_at=booking.end,
            cost_usd=booking.cost, billed_s=booking.billed_s, attrs=attrs if booking.due else None)
        if booked and booking.cost:
            log.info("allocation %s of job %s ended: %.0f s billed, $%.4f", alloc.id, alloc.job_id,
                     booking.billed_s, booking.cost)
        return done

    async def confirm_billing(self, alloc: Allocation) -> bool:
        """Book an allocation marked ``BILLING_DUE`` again from its market's record, now that it may be read:
        the difference goes to its job's spend, and the mark goes. False while the record still cannot be read
        (the mark stays for the next pass) or when another writer confirmed it first."""
        if BILLING_DUE not in alloc.attrs or alloc.cost_usd is None or alloc.ended_at is None:
            return False
        booking = await self._billed(alloc, alloc.ended_at, ask_market=True)
        if not booking.from_record:  # still unreadable, or no market here to ask: the booking stands, marked
            return False
        attrs = {k: v for k, v in alloc.attrs.items() if k != BILLING_DUE}
        rebooked = await asyncio.to_thread(
            self.store.rebook_allocation, alloc.id, was_usd=alloc.cost_usd, cost_usd=booking.cost,
            billed_s=booking.billed_s, ended_at=booking.end, attrs=attrs)
        if rebooked:
            log.info("allocation %s of job %s: the market's record books %.0f s, $%.4f (was $%.4f)", alloc.id,
                     alloc.job_id, booking.billed_s, booking.cost, alloc.cost_usd)
        return rebooked

    async def _billed(self, alloc: Allocation, end: datetime, *, ask_market: bool) -> _Booking:
        """What ``alloc`` (its resource ids and attrs complete), ended at ``end`` by the broker's own view, is
        billed: the market's record where it keeps one and ``ask_market``, else the broker's own span."""
        provider = self.providers.get(alloc.provider)
        billing = provider.billing if provider is not None else Provider.billing
        launched = bool(alloc.resource_ids)
        seconds = (end - billing_start(alloc.created_at, alloc.attrs)).total_seconds() if launched else 0.0
        due = from_record = False
        if launched and ask_market and isinstance(provider, KeepsBillingRecord):
            try:
                span = await provider.billed_span(alloc)
            except (ProviderError, OSError) as exc:  # the market cannot say now: the broker's own view, for now
                log.warning("billing record of %s not read (asked again later): %s", alloc.id, exc)
                span, due = None, True
            if span is not None and span.start is None:
                launched, from_record = False, True  # queued, never run: the market billed nothing
            elif span is not None and span.start is not None:
                end = span.end or end
                seconds = (end - span.start).total_seconds()
                from_record = True
        billed = billing.billed_seconds(seconds) if launched else 0.0
        return _Booking(end=end, billed_s=billed, cost=alloc.usd_per_hour * billed / 3600.0, due=due,
                        from_record=from_record)
