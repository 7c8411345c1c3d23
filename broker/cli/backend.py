"""Where CLI commands go: one way to the service, the SDK's client (broker/sdk.py).

- With ``--server URL`` (``LOCKSTEP_SERVER``): that server.
- Without: the per-user background broker of this store (broker/cli/localbroker.py), started by the first
  command that needs it (the job commands) and reused by the rest.

Each command renders the same models either way. Two narrow exceptions run in this process instead, where no
broker is needed and none is up: ``quote``/``offers``/``gpus`` (they read the offer book and write nothing;
with ``--provider`` a quote is made over those providers alone), and ``tokens``/``tenants`` (one short
write to the store; through the broker whenever it is up, so the store keeps one writer). Commands that
exist only on this machine (``serve``, ``prices track``, ``burnin``, …) call the service through
:func:`with_service`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ValidationError

from broker.cli.app import Context

if TYPE_CHECKING:
    from broker.cli.local import LocalMarket
    from broker.sdk import AsyncClient
    from broker.service import Lockstep

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


def open_client(ctx: Context, *, start: bool) -> AsyncClient | None:
    """The client of the server, or of this store's background broker (started when ``start``); None when no
    server is given, none is up and ``start`` is false."""
    if ctx.server:
        from broker.sdk import AsyncClient

        return AsyncClient(ctx.server, ctx.token)
    info = ctx.local_broker(start=start)
    if info is None:
        return None  # (httpx and the SDK not even imported: an in-process quote does without them)
    from broker.sdk import AsyncClient

    # On loopback a refused connection means the broker is gone: say so at once rather than back off.
    return AsyncClient(info.url, info.token, retries=1)


def with_client(ctx: Context, fn: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """Run one async operation on the service (the server, or the background broker, started if need be)."""

    async def run() -> T:
        client = open_client(ctx, start=True)
        assert client is not None
        async with client:
            return await fn(client)

    return run_async(run)


def with_market(ctx: Context, remote: Callable[[AsyncClient], Awaitable[T]],
                local: Callable[[LocalMarket], Awaitable[T]], *, providers: list[str] | None = None) -> T:
    """A read of the offer book: through the server or a broker that is up; otherwise (or with ``providers``,
    a book of those providers alone) in this process, starting nothing."""

    async def run() -> T:
        client = open_client(ctx, start=False) if ctx.server or not providers else None
        if client is not None:
            async with client:
                return await remote(client)
        from broker.cli.local import LocalMarket

        market = LocalMarket(ctx.settings, providers)
        try:
            return await local(market)
        finally:
            await market.aclose()

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
                         remote: Callable[[AsyncClient], Awaitable[T]]) -> T:
    """``remote`` on the server or the background broker when one is there, else ``local`` on the store's
    service: commands that exist both ways (tokens, tenants, price history)."""

    async def run() -> T | None:
        client = open_client(ctx, start=False)
        if client is None:
            return None
        async with client:
            return await remote(client)

    if ctx.server or ctx.local_broker(start=False) is not None:
        return run_async(run)  # type: ignore[return-value]
    return with_service(ctx, local)


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
