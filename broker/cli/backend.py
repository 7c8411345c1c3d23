"""Where CLI commands go: the local service (store and providers on this machine) or a Lockstep server.

Job commands use a :class:`Backend`: both kinds expose the same async methods returning the same
models, so each command renders identical output either way. Commands that exist only locally
(tokens, tenants, prices) call the service itself through :func:`with_service`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from broker.cli.app import Context
from broker.models import GpuSummary, Job, JobState, LogLine, Offer, Quote

if TYPE_CHECKING:
    from broker.client import RemoteBackend
    from broker.service import Lockstep
    from policies.offers import OfferFilter

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


def run_async(main: Callable[[], Awaitable[T]]) -> T:
    """``asyncio.run(main())``, with the result handed back outside the task.

    ``asyncio.run`` restores the SIGINT handler on its way out, and the standard library spells the
    handler it replaces (which holds the main task) in an error message it then discards: a task that
    returned a quote would have the whole quote written out as text for nothing (~10 ms on a big one).
    """
    out: list[T] = []

    async def task() -> None:
        out.append(await main())

    asyncio.run(task())
    return out[0]


class Backend(Protocol):
    async def quote(self, spec_data: dict, *, top: int, max_rejected: int | None) -> Quote: ...
    async def offers(self, f: OfferFilter, limit: int | None) -> list[Offer]: ...
    async def gpus(self) -> list[GpuSummary]: ...
    async def submit(self, spec_data: dict, idempotency_key: str | None) -> Job: ...
    async def jobs(self, states: list[JobState] | None, limit: int) -> list[Job]: ...
    async def status(self, job_id: str) -> Job: ...
    async def cancel(self, job_id: str) -> Job: ...
    async def logs(self, job_id: str, tail: int | None) -> list[LogLine]: ...
    # The job's log as it grows, until the job has ended (not found: raised before the first line).
    async def follow_logs(self, job_id: str, tail: int | None) -> AsyncIterator[LogLine]: ...
    async def place(self, job_ids: list[str]) -> None: ...  # one placement pass now (a server's loops do it)
    async def poll(self) -> None: ...  # poll the providers now (likewise)
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

    return run_async(run)


def with_service(ctx: Context, fn: Callable[[Lockstep], Awaitable[T]], *, markets: bool = False,
                 only: list[str] | None = None) -> T:
    """Run one async operation on the local service, always closing it. Without ``markets`` it talks to
    no provider (the store is enough); with it, to every enabled one (``only`` narrows them)."""
    from broker.service import Lockstep

    async def run() -> T:
        svc = Lockstep(ctx.settings, only_providers=only) if markets else Lockstep(ctx.settings, providers={})
        try:
            return await fn(svc)
        finally:
            await svc.aclose()

    return run_async(run)


def with_store_or_server(ctx: Context, local: Callable[[Lockstep], Awaitable[T]],
                         remote: Callable[[RemoteBackend], Awaitable[T]]) -> T:
    """Run ``remote`` on the server when there is one (``--server``/LOCKSTEP_SERVER), else ``local`` on the
    local store's service: commands that exist both ways (tokens, tenants, price history)."""
    if not ctx.server:
        return with_service(ctx, local)
    from broker.client import RemoteBackend

    async def run() -> T:
        backend = RemoteBackend(ctx.server or "", ctx.token)
        try:
            return await remote(backend)
        finally:
            await backend.aclose()

    return run_async(run)


def local_only(ctx: Context, command: str) -> None:
    """Refuse a server for a command that works only here, on the local store or this machine's providers:
    one line, exit 2, rather than silently answering from a store that is not the server's."""
    if ctx.server:
        from broker.errors import SpecError

        raise SpecError("--server", f"`lockstep {command}` works on the local store only, not through a "
                                    "server; run it where the server's store is, without --server or "
                                    "LOCKSTEP_SERVER")


def validated(model: type[M], **fields: Any) -> M:
    """``model`` from command-line values; its first broken rule is a SpecError (exit 2, one line)."""
    from broker.specs import first_error

    try:
        return model(**fields)
    except ValidationError as exc:
        raise first_error(exc) from None
