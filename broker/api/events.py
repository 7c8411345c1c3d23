"""The event stream route and the query models of the event and webhook routes (handlers in broker/api/handlers.py
call the service, broker/service/events.py).

``GET /v1/events`` answers NDJSON, one :class:`~broker.models.StreamEvent` a line, each with the cursor to
resume from after it; the ``Lockstep-Cursor`` header says where the page ended (past other tenants' events
too), so a poller that got no line still moves on. With ``follow=true`` the response stays open and each
new event is sent as the store gets it, for at most ``api.log_follow_max_s``.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from broker.api.keys import AUTH, SERVICE
from broker.api.params import parse_query
from broker.errors import LockstepError
from broker.models import DeliveryState, Role, TokenInfo

log = logging.getLogger(__name__)
NDJSON_TYPE = "application/x-ndjson"
CURSOR_HEADER = "Lockstep-Cursor"


class EventParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since: str | None = Field(default=None, pattern=r"^(now|\d{1,18}-\d{1,18})$",
                              description="resume after this cursor (a line's 'cursor', or the Lockstep-Cursor "
                                          "header); 'now': only events from now on; absent: from the oldest kept")
    follow: bool = Field(default=False, description="keep the response open and send each new event")
    limit: int = Field(default=500, ge=1, le=5000, description="without follow: events in this page at most")


class DeliveryParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state: DeliveryState | None = Field(default=None, description="only deliveries in this state")
    limit: int = Field(default=100, ge=1, le=1000)


def _caller(request: web.Request) -> TokenInfo:
    info: TokenInfo = request[AUTH]
    return info


def _scope(request: web.Request) -> str | None:
    info = _caller(request)
    return None if info.role is Role.admin else info.tenant


async def get_events(request: web.Request) -> web.StreamResponse:
    svc = request.app[SERVICE]
    params = parse_query(request, EventParams)
    scope = _scope(request)
    if not params.follow:
        events, end = await svc.events(params.since, scope, params.limit)
        return web.Response(text="".join(e.model_dump_json() + "\n" for e in events), content_type=NDJSON_TYPE,
                            headers={CURSOR_HEADER: end})
    events_in = await svc.follow_events(params.since, scope)
    resp = web.StreamResponse(headers={"Content-Type": NDJSON_TYPE, "Cache-Control": "no-store",
                                       "X-Accel-Buffering": "no"})
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    try:
        try:
            async with asyncio.timeout(svc.settings.api.log_follow_max_s):
                async for e in events_in:
                    await resp.write((e.model_dump_json() + "\n").encode())
        except TimeoutError:
            pass  # the client follows again from its last cursor
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the client went away
    except LockstepError as exc:  # once lines went out, an error can no longer be a status: the stream ends
        log.warning("event stream ended early: %s", type(exc).__name__)
    finally:
        await events_in.aclose()  # type: ignore[attr-defined]
    return resp
