"""Reconciliation: after a crash (or on any start), make the store and the providers agree.

One pass runs five phases, in this order:

1. **List** (:meth:`_Pass.list_owned`): every provider that can launch lists what this
   installation owns there (by tag, label or job comment).
2. **Settle what they hold** (:meth:`_Pass.settle_held`): what belongs to a live job is
   adopted (its allocation record completed, or written if the crash came between the
   provider call and the record); what belongs to no live job, or duplicates a job's
   allocation, is released.
3. **Fail intents never acted on** (:meth:`_Pass.fail_unacted_intents`): an intent the
   provider shows nothing for is marked failed.
4. **Resolve jobs left mid-way** (:meth:`_Pass.resolve_jobs`): jobs stuck in ``placing``
   go on to ``provisioning`` when they hold an allocation, else back to ``pending``;
   ``provisioning``/``running`` jobs whose allocation is gone are requeued.
5. **Confirm late bookings** (:meth:`_Pass.confirm_billing`): an allocation booked from
   the broker's own span because its market's record could not be read at its end is
   booked again from that record once it can be.

A provider that cannot be listed is left alone: nothing of it is released and
none of its jobs is requeued on a guess. Job state changes go through
broker/lifecycle.py; allocation writes through the ledger (broker/ledger.py).
Adopting a record and failing an intent are the ledger's compare-and-sets on the
allocation's state, so a launcher or the poll loop that decided meanwhile wins.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from broker.errors import ConflictError, NotFoundError, ProviderError
from broker.ledger import BILLING_DUE
from broker.lifecycle import JobLifecycle
from broker.models import HOLDING, Allocation, AllocationState, Job, JobState, utcnow
from broker.store import LIVE_STATES
from providers.base import Provider
from providers.capabilities import Launches

if TYPE_CHECKING:
    from broker.store import Store

log = logging.getLogger(__name__)

LIVE_ALLOC = LIVE_STATES  # the store's definition of a live allocation (its one-live-per-job index)
# How long after its end a booking is checked against its market's record again (sacct's default purge is far
# later; a record still unreadable after a week keeps the broker's own span).
BILLING_RECORD_WINDOW = timedelta(days=7)


class ReconcileReport(BaseModel):
    adopted: list[str] = Field(default_factory=list)
    released: list[str] = Field(default_factory=list)
    failed_intents: list[str] = Field(default_factory=list)
    to_provisioning: list[str] = Field(default_factory=list)
    requeued: list[str] = Field(default_factory=list)
    unreachable: dict[str, str] = Field(default_factory=dict)
    rebooked: list[str] = Field(default_factory=list)  # bookings confirmed against the market's record late


def _same(a: Allocation, b: Allocation) -> bool:
    """Is the provider's allocation ``a`` the one recorded as ``b``?"""
    if set(a.resource_ids) & set(b.resource_ids):
        return True
    if a.client_token and a.client_token == b.client_token:
        return True
    return a.job_id == b.job_id and a.attempt == b.attempt and a.attempt > 0


async def reconcile(
    store: Store,
    providers: Mapping[str, Provider],
    *,
    clock: Callable[[], datetime] = utcnow,
    stale_after: timedelta = timedelta(minutes=5),
    exclusive: bool | None = None,
    lifecycle: JobLifecycle | None = None,
) -> ReconcileReport:
    """Make the store and the providers agree (see the module's doc); returns what was done.

    ``exclusive``: no placement can be running anywhere right now, so every intent and every job in
    placing is a crash's leftover and is resolved at once. Default: at start-up on SQLite (one broker
    process per file). Otherwise (PostgreSQL replicas, or a periodic pass beside this process's own
    placement loop) intents and placing jobs younger than ``stale_after`` are left alone.
    ``lifecycle``: the job state changes to use (one over ``store`` when not given).
    """
    single_writer = store.is_sqlite if exclusive is None else exclusive
    # The lifecycle (and its ledger) knows the providers: how each market bills, and where it keeps its own record.
    life = lifecycle or JobLifecycle(store, providers, clock=clock)
    run = _Pass(store, life, now=clock(), single_writer=single_writer, stale_after=stale_after)
    owned = await run.list_owned(providers)
    await run.settle_held(providers, owned)
    await run.fail_unacted_intents(owned)
    await run.resolve_jobs()
    await run.confirm_billing(providers)
    return run.report


class _Pass:
    """One reconciliation pass: its moment, its report, and the jobs it has read."""

    def __init__(self, store: Store, lifecycle: JobLifecycle, *, now: datetime, single_writer: bool,
                 stale_after: timedelta) -> None:
        self.store = store
        self.lifecycle = lifecycle
        self.now = now
        self.single_writer = single_writer
        self.stale_after = stale_after
        self.report = ReconcileReport()
        self._jobs: dict[str, Job | None] = {}

    def may_be_in_flight(self, since: datetime) -> bool:
        """A placement this recent may still be running (here or in a replica): not ours to decide."""
        return not self.single_writer and self.now - since < self.stale_after

    async def job_of(self, job_id: str) -> Job | None:
        """The job (read once a pass), or None when the store has no such job."""
        if job_id not in self._jobs:
            try:
                self._jobs[job_id] = await asyncio.to_thread(self.store.get_job, job_id)
            except NotFoundError:
                self._jobs[job_id] = None
        return self._jobs[job_id]

    async def release(self, p: Launches, a: Allocation, why: str, record: Allocation | None) -> None:
        """Give ``a`` back to ``p``; once it is gone, record ``record`` (if any) as released. A failed
        release changes nothing: the next pass tries again."""
        try:
            await p.release(a)
        except ProviderError as exc:
            log.warning("reconcile: release of %s at %s failed: %s", a.resource_ids, p.name, exc)
            return
        self.report.released.append(f"{p.name}:{','.join(a.resource_ids) or a.id} ({why})")
        if record is not None:  # recorded, and its cost booked (once: a crash may have ended it half-way)
            # Billing stopped now, at this release: not at the mark of an earlier release a crash cut short
            # before the machine went (it was still listed, so that one never took it).
            await self.lifecycle.ended(record, AllocationState.released, why, ended_at=self.lifecycle.clock())

    # ------------------------------------------------------------------ 1. list
    async def list_owned(self, providers: Mapping[str, Provider]) -> dict[str, list[Allocation]]:
        """What each launching provider holds for this installation. One that cannot be listed is named in
        the report's ``unreachable`` and left out: nothing of it is decided on a guess."""
        owned: dict[str, list[Allocation]] = {}
        for name, p in providers.items():
            if not isinstance(p, Launches):
                continue
            try:
                owned[name] = await p.owned()
            except (ProviderError, OSError) as exc:
                self.report.unreachable[name] = str(exc)[:200]
                log.warning("reconcile: cannot list %s: %s", name, exc)
        return owned

    # ------------------------------------------------------------------ 2. adopt or release what they hold
    async def settle_held(self, providers: Mapping[str, Provider], owned: Mapping[str, list[Allocation]]) -> None:
        """Walk what the providers hold: adopt what a live job owns, release the rest."""
        for name, items in owned.items():
            p = providers[name]
            assert isinstance(p, Launches)  # list_owned lists launching providers only
            for a in items:
                await self.settle_one(name, p, a)

    async def settle_one(self, name: str, p: Launches, a: Allocation) -> None:
        """One allocation ``p`` (configured as ``name``) holds: release it when its job is not live or
        already holds another live allocation; else adopt it (complete its record, or write the one a crash
        never wrote)."""
        job = await self.job_of(a.job_id) if a.job_id else None
        records = await asyncio.to_thread(self.store.allocations, a.job_id) if job else []
        mine = next((r for r in records if r.provider == name and _same(a, r)), None)
        live_other = [r for r in records if r.state in LIVE_ALLOC and r is not mine and r.resource_ids]
        if mine is not None and mine.state is AllocationState.draining and job is not None:
            return  # superseded at a notice, checkpointing: the poll follows it to its end (broker/lifecycle.py)
        if job is None or job.state not in HOLDING:
            state = job.state.value if job else "unknown"
            await self.release(p, a, f"belongs to no live job (job {a.job_id or '?'} is {state})", mine)
        elif live_other:
            await self.release(p, a, f"duplicate: job {job.id} already holds {live_other[0].id}", mine)
        elif mine is not None:
            await self.adopt_into(p, a, job, mine)
        else:
            await self.adopt_unrecorded(p, a, job)

    async def adopt_into(self, p: Launches, a: Allocation, job: Job, mine: Allocation) -> None:
        """Complete the record ``mine`` with what the provider shows (``a``), unless its launch may still be
        in flight; over what we read only, since a launcher or the poll loop may have decided since."""
        if mine.state is AllocationState.intent and self.may_be_in_flight(mine.created_at):
            return  # a launch in flight (this process's or a replica's): its launcher records it
        try:
            await self.lifecycle.ledger.adopt(mine, a)
        except ConflictError:
            if (await asyncio.to_thread(self.store.get_allocation, mine.id)).state is not mine.state:
                return  # decided meanwhile: the next pass looks again
            # Same state: the job took another live allocation since we read (a replica's).
            await self.release(p, a, f"duplicate: job {job.id} holds another live allocation", mine)
            return
        self.report.adopted.append(mine.id)

    async def adopt_unrecorded(self, p: Launches, a: Allocation, job: Job) -> None:
        """Write the record a crash between the provider call and its record never wrote; when the job took
        another live allocation meanwhile (the store allows one), release this one instead."""
        try:
            rec = await self.lifecycle.ledger.record_found(a)
        except ConflictError:
            await self.release(p, a, f"duplicate: job {job.id} holds another live allocation", None)
            return
        self.report.adopted.append(rec.id)

    # ------------------------------------------------------------------ 3. intents never acted on
    async def fail_unacted_intents(self, owned: Mapping[str, list[Allocation]]) -> None:
        """Mark failed every intent its (listed) provider shows nothing for, once it cannot be a launch in
        flight; only if it is still an intent, so a launch completing now wins."""
        for rec in await asyncio.to_thread(self.store.live_allocations):
            if rec.state is not AllocationState.intent or rec.provider not in owned:
                continue
            if any(_same(a, rec) for a in owned[rec.provider]):
                continue
            # With replicas, a recent intent is most likely another replica's launch in flight, which our
            # listing of the provider (taken before) cannot show yet, whatever state its job is in by now.
            if self.may_be_in_flight(rec.created_at):
                continue
            # Look again just before failing it: its launch may have completed since we read it. (Failing
            # a completed one would requeue its job and leak what it launched.)
            current = await asyncio.to_thread(self.store.get_allocation, rec.id)
            if current.state is not AllocationState.intent or current.resource_ids:
                continue
            if await self.lifecycle.ledger.fail_intent(rec.id, "launch did not complete before a broker restart"):
                self.report.failed_intents.append(rec.id)

    # ------------------------------------------------------------------ 4. jobs left mid-way
    async def resolve_jobs(self) -> None:
        """Every job in placing, provisioning or running: see :meth:`resolve_job`."""
        for job in await asyncio.to_thread(self.store.jobs_in_states, list(HOLDING)):
            if job.state is JobState.placing and self.may_be_in_flight(job.updated_at):
                continue
            try:
                await self.resolve_job(job)
            except ConflictError:
                continue  # another writer moved it first

    async def resolve_job(self, job: Job) -> None:
        """A job left in placing goes on to provisioning when it holds a live allocation, else back to
        pending; a provisioning or running job with no live allocation record left is requeued. A job with
        a live record (an intent included) at a provider that could not be listed is not requeued."""
        records = await asyncio.to_thread(self.store.allocations, job.id)
        live = [r for r in records if r.state in LIVE_ALLOC and r.state is not AllocationState.intent]
        unreachable = any(r.provider in self.report.unreachable for r in records if r.state in LIVE_ALLOC)
        if job.state is JobState.placing:
            if live:
                await self.lifecycle.adopt(job.id, live[0])
                self.report.to_provisioning.append(job.id)
            elif not unreachable:
                await self.lifecycle.requeue_interrupted(job.id)
                self.report.requeued.append(job.id)
        elif not live and not unreachable:
            await self.lifecycle.requeue_lost(job)
            self.report.requeued.append(job.id)

    # ------------------------------------------------------------------ 5. bookings confirmed late
    async def confirm_billing(self, providers: Mapping[str, Provider]) -> None:
        """Book again, from the market's record, what was booked from the broker's own span because that record
        could not be read at the allocation's end (the ledger's ``BILLING_DUE``), for a week after its end."""
        ledger = self.lifecycle.ledger
        due = await asyncio.to_thread(self.store.billing_due, BILLING_DUE, self.now - BILLING_RECORD_WINDOW)
        for alloc in due:
            if alloc.provider in providers and alloc.provider not in self.report.unreachable \
                    and await ledger.confirm_billing(alloc):
                self.report.rebooked.append(alloc.id)
