"""Where CLI commands go: the local store and providers, or a Lockstep server.

Both backends expose the same async methods returning the same models, so each
command renders identical output either way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from broker.cli.app import Context
from broker.models import GpuSummary, Job, JobState, Offer, Quote
from policies.offers import OfferFilter

T = TypeVar("T")


class Backend(Protocol):
    async def quote(self, spec_data: dict, *, top: int, max_rejected: int | None) -> Quote: ...
    async def offers(self, f: OfferFilter, limit: int | None) -> list[Offer]: ...
    async def gpus(self) -> list[GpuSummary]: ...
    async def submit(self, spec_data: dict, idempotency_key: str | None) -> Job: ...
    async def jobs(self, states: list[JobState] | None, limit: int) -> list[Job]: ...
    async def status(self, job_id: str) -> Job: ...
    async def cancel(self, job_id: str) -> Job: ...
    async def aclose(self) -> None: ...


def open_backend(ctx: Context, providers: list[str] | None = None, *, need_store: bool = False) -> Backend:
    if ctx.server:
        from broker.client import RemoteBackend

        return RemoteBackend(ctx.server, ctx.token)
    from broker.cli.local import LocalBackend

    return LocalBackend(ctx.settings, providers=providers, need_store=need_store)


def with_backend(ctx: Context, fn: Callable[[Backend], Awaitable[T]], *, providers: list[str] | None = None,
                 need_store: bool = False) -> T:
    """Open the backend, run one async operation on it, always close it."""

    async def run() -> T:
        backend = open_backend(ctx, providers, need_store=need_store)
        try:
            return await fn(backend)
        finally:
            await backend.aclose()

    return asyncio.run(run())
