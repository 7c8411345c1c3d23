"""Reconciliation: after a crash (or on any start), make the store and the providers agree.

Every provider lists what this installation owns there (by tag, label or job
comment). Then:

(a) what belongs to a live job is adopted (its allocation record completed, or
    written if the crash came between the provider call and the record);
(b) what belongs to no live job — or duplicates a job's allocation — is released;
(c) jobs stuck in ``placing`` go on to ``provisioning`` when they hold an
    allocation, else back to ``pending``; intents the provider never acted on
    are marked failed; ``provisioning``/``running`` jobs whose allocation is gone
    are requeued.

A provider that cannot be listed is left alone: nothing of it is released and
none of its jobs is requeued on a guess.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from broker.errors import ConflictError, NotFoundError, ProviderError
from broker.models import (
    Allocation,
    AllocationState,
    Job,
    JobState,
    QuoteOption,
    utcnow,
)
from broker.store import LIVE_STATES
from providers.base import Provider
from providers.capabilities import Launches

if TYPE_CHECKING:
    from broker.store import Store

log = logging.getLogger(__name__)

HOLDING = (JobState.placing, JobState.provisioning, JobState.running)
LIVE_ALLOC = LIVE_STATES  # the store's definition of a live allocation (its one-live-per-job index)


class ReconcileReport(BaseModel):
    adopted: list[str] = Field(default_factory=list)
    released: list[str] = Field(default_factory=list)
    failed_intents: list[str] = Field(default_factory=list)
    to_provisioning: list[str] = Field(default_factory=list)
    requeued: list[str] = Field(default_factory=list)
    unreachable: dict[str, str] = Field(default_factory=dict)


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
) -> ReconcileReport:
    """Make the store and the providers agree (see the module's doc); returns what was done.

    ``exclusive``: no placement can be running anywhere right now, so every intent and every job in
    placing is a crash's leftover and is resolved at once. Default: at start-up on SQLite (one broker
    process per file). Otherwise (PostgreSQL replicas, or a periodic pass beside this process's own
    placement loop) intents and placing jobs younger than ``stale_after`` are left alone.
    """
    db = asyncio.to_thread
    report = ReconcileReport()
    now = clock()
    single_writer = bool(getattr(store, "is_sqlite", False)) if exclusive is None else exclusive

    def may_be_in_flight(since: datetime) -> bool:
        """A placement this recent may still be running (here or in a replica): not ours to decide."""
        return not single_writer and now - since < stale_after

    owned: dict[str, list[Allocation]] = {}
    for name, p in providers.items():
        if not isinstance(p, Launches):
            continue
        try:
            owned[name] = await p.owned()
        except (ProviderError, OSError) as exc:
            report.unreachable[name] = str(exc)[:200]
            log.warning("reconcile: cannot list %s: %s", name, exc)

    jobs: dict[str, Job | None] = {}

    async def job_of(job_id: str) -> Job | None:
        if job_id not in jobs:
            try:
                jobs[job_id] = await db(store.get_job, job_id)
            except NotFoundError:
                jobs[job_id] = None
        return jobs[job_id]

    async def release(p: Provider, a: Allocation, why: str, record: Allocation | None) -> None:
        try:
            await p.release(a)
        except ProviderError as exc:
            log.warning("reconcile: release of %s at %s failed: %s", a.resource_ids, p.name, exc)
            return
        report.released.append(f"{p.name}:{','.join(a.resource_ids) or a.id} ({why})")
        if record is not None:
            await db(store.update_allocation, record.id, state=AllocationState.released, reason=why)

    # (a) and (b): walk what the providers hold.
    for name, items in owned.items():
        p = providers[name]
        for a in items:
            job = await job_of(a.job_id) if a.job_id else None
            records = await db(store.allocations, a.job_id) if job else []
            mine = next((r for r in records if r.provider == name and _same(a, r)), None)
            live_other = [r for r in records if r.state in LIVE_ALLOC and r is not mine and r.resource_ids]
            if job is None or job.state not in HOLDING:
                state = job.state.value if job else "unknown"
                await release(p, a, f"belongs to no live job (job {a.job_id or '?'} is {state})", mine)
            elif live_other:
                await release(p, a, f"duplicate: job {job.id} already holds {live_other[0].id}", mine)
            elif mine is not None:
                if mine.state is AllocationState.intent and may_be_in_flight(mine.created_at):
                    continue  # a launch in flight (this process's or a replica's): its launcher records it
                update: dict[str, Any] = {"resource_ids": a.resource_ids or mine.resource_ids}
                if mine.state in (AllocationState.intent, AllocationState.failed, AllocationState.unknown):
                    update["state"] = a.state if a.state not in (AllocationState.intent, AllocationState.unknown) \
                        else AllocationState.pending
                try:  # only over what we read: a launcher or the poll loop may have decided since
                    await db(store.update_allocation, mine.id, expected={mine.state}, **update)
                except ConflictError:
                    if (await db(store.get_allocation, mine.id)).state is not mine.state:
                        continue  # decided meanwhile: the next pass looks again
                    # Same state: the job took another live allocation since we read (a replica's).
                    await release(p, a, f"duplicate: job {job.id} holds another live allocation", mine)
                    continue
                report.adopted.append(mine.id)
            else:
                started = a.state in (AllocationState.pending, AllocationState.running, AllocationState.unknown)
                rec = a.model_copy(update={"state": a.state if started else AllocationState.pending})
                try:
                    rec = await db(store.add_allocation, rec)
                except ConflictError:
                    await release(p, a, f"duplicate: job {job.id} holds another live allocation", None)
                    continue
                report.adopted.append(rec.id)

    # (c) intents the provider never acted on.
    for rec in await db(store.live_allocations):
        if rec.state is not AllocationState.intent or rec.provider not in owned:
            continue
        if any(_same(a, rec) for a in owned[rec.provider]):
            continue
        # With replicas, a recent intent is most likely another replica's launch in flight, which our
        # listing of the provider (taken before) cannot show yet, whatever state its job is in by now.
        if may_be_in_flight(rec.created_at):
            continue
        # Look again just before failing it: its launch may have completed since we read it. (Failing
        # a completed one would requeue its job and leak what it launched.)
        current = await db(store.get_allocation, rec.id)
        if current.state is not AllocationState.intent or current.resource_ids:
            continue
        try:  # only if it is still an intent: a launch completing now must win
            await db(store.update_allocation, rec.id, expected={AllocationState.intent},
                     state=AllocationState.failed, reason="launch did not complete before a broker restart")
        except ConflictError:
            continue
        report.failed_intents.append(rec.id)

    # (c) jobs left mid-way.
    for job in await db(store.jobs_in_states, list(HOLDING)):
        if job.state is JobState.placing and may_be_in_flight(job.updated_at):
            continue
        records = await db(store.allocations, job.id)
        live = [r for r in records if r.state in LIVE_ALLOC and r.state is not AllocationState.intent]
        unreachable = any(r.provider in report.unreachable for r in records if r.state in LIVE_ALLOC)
        try:
            if job.state is JobState.placing:
                if live:
                    rec = live[0]
                    placement = QuoteOption.model_validate_json(rec.attrs["option"]) if "option" in rec.attrs \
                        else None
                    await db(store.transition, job.id, JobState.provisioning,
                             f"adopted {rec.provider} allocation {rec.id} after a broker restart",
                             {"allocation": rec.id}, {JobState.placing}, placement=placement)
                    report.to_provisioning.append(job.id)
                elif not unreachable:
                    await db(store.transition, job.id, JobState.pending,
                             "requeued: placement was interrupted by a broker restart", {}, {JobState.placing})
                    report.requeued.append(job.id)
            elif not live and not unreachable:
                if job.state is JobState.running:
                    await db(store.transition, job.id, JobState.preempted, "allocation gone at the provider",
                             {}, {JobState.running}, preemptions=job.preemptions + 1)
                await db(store.transition, job.id, JobState.pending,
                         "requeued: its allocation is gone at the provider", {},
                         {JobState.provisioning, JobState.preempted})
                report.requeued.append(job.id)
        except ConflictError:
            continue
    return report
