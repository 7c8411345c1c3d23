"""Jobs: accept, list, read, cancel, and place or poll them now (the CLI without a server does)."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING

from broker.errors import NoFeasibleOption, ProviderError
from broker.models import (
    DEFAULT_TENANT,
    HOLDING,
    TERMINAL_STATES,
    Allocation,
    AllocationState,
    Job,
    JobSpec,
    JobState,
    OfferSource,
)
from broker.service.runtime import Runtime, SnapshotVerdict, new_job_id
from providers.registry import how_to_enable

if TYPE_CHECKING:  # policies.book loads numpy: commands that never rank (tokens, jobs) must not pay for it
    from policies.book import OfferBook

MAX_HINTS = 100_000  # job ids kept for the placement loop's quick passes (broker/loops.py)

log = logging.getLogger(__name__)


class JobsService(Runtime):
    async def submit(self, spec: JobSpec, *, tenant: str = DEFAULT_TENANT, idempotency_key: str | None = None) -> Job:
        """Accept a job: once this returns, the job is in the store and survives a crash."""
        job, _ = await self.submit_job(spec, tenant=tenant, idempotency_key=idempotency_key)
        return job

    async def submit_job(self, spec: JobSpec, *, tenant: str = DEFAULT_TENANT,
                         idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Like :meth:`submit`, and says whether the job is new (False: an idempotent repeat).

        The API answers 201 for a new job and 200 for a repeat, so it needs the flag
        that ``submit`` drops.
        """
        now = self.clock()
        warning = await self.snapshot_only_warning(spec, now)
        job = Job(id=new_job_id(), tenant=tenant, spec=spec, deadline=spec.deadline_at(now), created_at=now,
                  updated_at=now, reason=warning, decision={"warning": warning} if warning else {})
        if warning:
            # The submitter has the warning (the job's reason, the API's answer); the server's log notes it
            # at INFO: at WARNING, every submission to a snapshot-only book wrote a line, about a fifth of a
            # submission's time in the event loop (bench/api.py, profiled).
            log.info("job %s (%s): %s", job.id, spec.name, warning)
        job, created = await self._submissions.write(job, idempotency_key)
        if created:
            if len(self.submitted_ids) < MAX_HINTS:
                self.submitted_ids.add(job.id)
            self.job_submitted.set()
        return job, created

    async def snapshot_only_warning(self, spec: JobSpec, now: datetime) -> str:
        """'' unless every option that fits ``spec`` now is a snapshot price; then a warning naming what to
        configure (or why a configured market is not live), or — with ``broker.snapshot_only_jobs: refuse``
        and no market configured that could run it — NoFeasibleOption.

        A job nothing fits at all is accepted as before: the placement loop says why it waits."""
        await self.ensure_offers()
        book = self.market.book(unhealthy_hosts=await self.unhealthy_nodes(),
                                preemption_rates=self.preemption_rates())
        # One verdict per spec and book a second, not one per submission (the API's quotes do the same): the
        # ranking, the markets' health and the message are worked out once for a burst of identical specs.
        warning, refusal = self._snapshot_verdicts.get(book, spec.model_dump_json(),
                                                       lambda: self._snapshot_verdict(book, spec, now))
        if refusal is not None:
            raise NoFeasibleOption(*refusal)
        return warning

    def _snapshot_verdict(self, book: OfferBook, spec: JobSpec, now: datetime) -> SnapshotVerdict:
        """The warning ('' for none) for ``spec`` on ``book``, or the refusal's message and reasons."""
        from policies.ranking import quote as rank_quote

        by_market = rank_quote(book, spec, now=now, top=1, max_rejected=0).feasible_sources
        snapshot = OfferSource.snapshot.value
        if not by_market or any(src != snapshot for counts in by_market.values() for src in counts):
            return "", None
        markets = sorted(by_market)
        rows = sum(sum(c.values()) for c in by_market.values())
        missing = [m for m in markets if self.market.launcher(m) is None]
        configure = "; ".join(f"{m}: {how_to_enable(m) or 'not a market Lockstep launches on'}" for m in missing)
        health = self.market.health()
        why = []
        for m in markets:
            h = health.get(m)
            if m in missing or h is None:
                continue
            if not h.ok:
                why.append(f"{m} did not answer its last refresh ({h.last_error or h.circuit.reason or 'no answer'})")
            else:
                why.append(f"{m}: " + ("; ".join(h.notes) or "no live offer of it fits"))
        if len(missing) == len(markets) and self.settings.broker.snapshot_only_jobs == "refuse":
            return "", (f"{spec.name}: all {rows} offers that fit are rows of the bundled price snapshot "
                        f"({', '.join(markets)}), which prices jobs but runs none, and no market that could run it "
                        f"is configured; configure one — {configure} (`lockstep quote` shows what it would cost)",
                        {"snapshot_only": rows})
        lines = [f"every option that fits is a snapshot price ({', '.join(markets)}), not a live market's", *why]
        if missing:
            lines.append(f"not configured, so it cannot run there — {configure}")
        return "warning: " + "; ".join(lines), None

    async def list_jobs(self, *, tenant: str | None = None, states: list[JobState] | None = None, limit: int = 50,
                        cursor: str | None = None) -> tuple[list[Job], str | None]:
        jobs, nxt = await self.db(self.store.list_jobs, tenant, states, limit, cursor)
        return await self._with_accruing(jobs), nxt

    async def get_job(self, job_id: str, tenant: str | None = None) -> Job:
        job = await self.db(self.store.get_job, job_id, tenant)
        return (await self._with_accruing([job]))[0]

    async def _with_accruing(self, jobs: list[Job]) -> list[Job]:
        """The jobs, each holding an allocation with what it has cost so far (``accruing_usd``)."""
        holding = [j.id for j in jobs if j.state in HOLDING]
        if not holding:
            return jobs
        acc = await self.db(self.store.accruing, holding, self.clock())
        return [j.model_copy(update={"accruing_usd": acc[j.id]}) if j.id in acc else j for j in jobs]

    async def job_allocations(self, job_id: str) -> list[Allocation]:
        return await self.db(self.store.allocations, job_id)

    async def release_allocation(self, alloc: Allocation, reason: str) -> Allocation:
        """Give an allocation back to its provider and record it (its last log kept, its cost booked);
        already-gone counts as released."""
        if self.market.launcher(alloc.provider) is None:
            raise ProviderError(alloc.provider, "provider not configured; cannot release " + alloc.id)
        await self.broker.lifecycle.release(alloc, reason, raise_errors=True)
        return await self.db(self.store.get_allocation, alloc.id)

    async def cancel(self, job_id: str, tenant: str | None = None, reason: str = "cancelled by user") -> Job:
        """Cancel a job and release everything it holds. Cancelling a finished job changes nothing."""
        job = await self.get_job(job_id, tenant)
        if job.state in TERMINAL_STATES:
            return job
        from broker.lifecycle import JobLifecycle

        job = await JobLifecycle(self.store).cancel(job_id, reason)
        for alloc in await self.db(self.store.allocations, job_id):
            if alloc.state in (AllocationState.released, AllocationState.failed, AllocationState.succeeded):
                continue
            try:
                await self.release_allocation(alloc, reason)
            except ProviderError as exc:  # the reconciler retries releases of cancelled jobs
                log.warning("release of %s for cancelled job %s failed: %s", alloc.id, job_id, exc)
        return await self.get_job(job_id, tenant)

    async def place_now(self, job_ids: list[str] | None = None) -> None:
        """One placement pass in this process (the CLI without a server uses it)."""
        await self.ensure_offers()
        await self.broker.place_pending(job_ids)

    async def poll_now(self) -> None:
        await self.broker.poll_once()
