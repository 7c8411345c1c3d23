"""Jobs: accept, list, read, cancel, and place or poll them now (the CLI without a server does)."""

from __future__ import annotations

import logging

from broker.errors import ProviderError
from broker.models import TERMINAL_STATES, Allocation, AllocationState, Job, JobSpec, JobState
from broker.service.runtime import Runtime, new_job_id

MAX_HINTS = 100_000  # job ids kept for the placement loop's quick passes (broker/loops.py)

log = logging.getLogger(__name__)


class JobsService(Runtime):
    async def submit(self, spec: JobSpec, *, tenant: str = "default", idempotency_key: str | None = None) -> Job:
        """Accept a job: once this returns, the job is in the store and survives a crash."""
        job, _ = await self.submit_job(spec, tenant=tenant, idempotency_key=idempotency_key)
        return job

    async def submit_job(self, spec: JobSpec, *, tenant: str = "default",
                         idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Like :meth:`submit`, and says whether the job is new (False: an idempotent repeat).

        The API answers 201 for a new job and 200 for a repeat, so it needs the flag
        that ``submit`` drops.
        """
        now = self.clock()
        job = Job(id=new_job_id(), tenant=tenant, spec=spec, deadline=spec.deadline_at(now), created_at=now,
                  updated_at=now)
        job, created = await self._submissions.write(job, idempotency_key)
        if created:
            if len(self.submitted_ids) < MAX_HINTS:
                self.submitted_ids.add(job.id)
            self.job_submitted.set()
        return job, created

    async def list_jobs(self, *, tenant: str | None = None, states: list[JobState] | None = None, limit: int = 50,
                        cursor: str | None = None) -> tuple[list[Job], str | None]:
        return await self.db(self.store.list_jobs, tenant, states, limit, cursor)

    async def get_job(self, job_id: str, tenant: str | None = None) -> Job:
        return await self.db(self.store.get_job, job_id, tenant)

    async def job_allocations(self, job_id: str) -> list[Allocation]:
        return await self.db(self.store.allocations, job_id)

    async def release_allocation(self, alloc: Allocation, reason: str) -> Allocation:
        """Give an allocation back to its provider and record it; already-gone counts as released."""
        provider = self.market.launcher(alloc.provider)
        if provider is None:
            raise ProviderError(alloc.provider, "provider not configured; cannot release " + alloc.id)
        if alloc.resource_ids or alloc.state is not AllocationState.intent:
            await provider.release(alloc)
        return await self.db(self.store.update_allocation, alloc.id, state=AllocationState.released, reason=reason)

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
