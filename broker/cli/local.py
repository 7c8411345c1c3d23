"""The local backend: the service object over this machine's store and providers."""

from __future__ import annotations

from collections.abc import AsyncIterator

from broker.config import Settings
from broker.models import GpuSummary, Job, JobState, LogLine, Offer, Quote
from broker.service import Lockstep
from broker.specs import parse_spec
from policies.offers import OfferFilter


class LocalBackend:
    def __init__(self, settings: Settings, providers: list[str] | None = None, need_store: bool = False) -> None:
        self.svc = Lockstep(settings, only_providers=providers)
        if need_store:
            _ = self.svc.store

    async def quote(self, spec_data: dict, *, top: int, max_rejected: int | None) -> Quote:
        return await self.svc.quote(parse_spec(spec_data), top=top, max_rejected=max_rejected)

    async def offers(self, f: OfferFilter, limit: int | None) -> list[Offer]:
        return await self.svc.offers(f, limit)

    async def gpus(self) -> list[GpuSummary]:
        return await self.svc.gpus()

    async def submit(self, spec_data: dict, idempotency_key: str | None) -> Job:
        return await self.svc.submit(parse_spec(spec_data), idempotency_key=idempotency_key)

    async def jobs(self, states: list[JobState] | None, limit: int) -> list[Job]:
        jobs, _ = await self.svc.list_jobs(states=states, limit=limit)
        return jobs

    async def status(self, job_id: str) -> Job:
        return await self.svc.get_job(job_id)

    async def cancel(self, job_id: str) -> Job:
        return await self.svc.cancel(job_id)

    async def logs(self, job_id: str, tail: int | None) -> list[LogLine]:
        await self.svc.get_job(job_id)  # not found before touching providers
        await self.svc.poll_now()  # no server moves the job along: look at its market first, as status does
        return await self.svc.job_logs(job_id, tail=tail)

    async def follow_logs(self, job_id: str, tail: int | None) -> AsyncIterator[LogLine]:
        return await self.svc.follow_logs(job_id, tail=tail, drive=True)

    async def place(self, job_ids: list[str]) -> None:
        await self.svc.place_now(job_ids)

    async def poll(self) -> None:
        await self.svc.poll_now()

    async def aclose(self) -> None:
        await self.svc.aclose()
