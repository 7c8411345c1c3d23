"""A followed NDJSON answer (``?follow=true`` on a job's log and on the event stream): a chunked response that
stays open while lines come, and ends within a second of its client hanging up, of the server shutting down
or of ``max_s``, however quiet the source is (a quiet stream writes nothing, so nothing else would notice)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from pydantic import BaseModel

from broker.errors import LockstepError

log = logging.getLogger(__name__)
NDJSON_TYPE = "application/x-ndjson"


def client_gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


def server_stopping(request: web.Request) -> bool:
    # aiohttp marks each connection closing (Server.pre_shutdown) before it waits for handlers to finish:
    # a follow that waited for its source would hold SIGTERM's shutdown for up to its whole timeout.
    return bool(getattr(request.protocol, "_close", False))


async def until_done_or_gone(request: web.Request, task: asyncio.Task[None], max_s: float) -> bool:
    """True when ``task`` finished; False when the client hung up, the server is stopping or ``max_s`` passed.
    Looks twice a second."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_s
    while True:
        left = deadline - loop.time()
        if left <= 0:
            return False
        done, _ = await asyncio.wait({task}, timeout=min(0.5, left))
        if done:
            return True
        if client_gone(request) or server_stopping(request):
            return False


async def follow_ndjson(request: web.Request, items: AsyncIterator[BaseModel], max_s: float,
                        what: str) -> web.StreamResponse:
    """Send each of ``items`` as a line until it ends, the client hangs up, the server stops or ``max_s``
    passes; the client follows again (from its last line) if it wants more. ``what`` names it in the log."""
    resp = web.StreamResponse(headers={"Content-Type": NDJSON_TYPE, "Cache-Control": "no-store",
                                       "X-Accel-Buffering": "no"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)

    async def pump() -> None:
        async for item in items:
            await resp.write((item.model_dump_json() + "\n").encode())

    task = asyncio.get_running_loop().create_task(pump())
    try:
        ended = await until_done_or_gone(request, task, max_s)
        if ended:
            task.result()  # the source ended and its last lines are out (or an error, below)
            await resp.write_eof()
        elif client_gone(request):
            pass  # nobody is left to read the rest
        else:  # max_s, or the server is stopping
            await resp.write_eof()
    except ConnectionResetError:
        pass  # the client went away mid-write
    except LockstepError as exc:  # once lines went out, an error can no longer be a status: the stream ends
        log.warning("%s ended early: %s", what, type(exc).__name__)
    finally:
        if not task.done():
            task.cancel()
        with contextlib.suppress(BaseException):
            await task
        await items.aclose()  # type: ignore[attr-defined]
    return resp
