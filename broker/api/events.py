"""The event stream route and the query models of the event and webhook routes (handlers in broker/api/handlers.py
call the service, broker/service/events.py).

``GET /v1/events`` answers NDJSON, one :class:`~broker.models.StreamEvent` a line, each with the cursor to
resume from after it; the ``Lockstep-Cursor`` header says where the page ended (past other tenants' events
too), so a poller that got no line still moves on. With ``follow=true`` the response stays open and each
new event is sent as the store gets it, for at most ``api.log_follow_max_s``; it ends within a second of its
client hanging up or of the server stopping, however quiet the stream (broker/api/follow.py).
"""

from __future__ import annotations

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from broker.api.follow import NDJSON_TYPE, follow_ndjson
from broker.api.keys import AUTH, SERVICE
from broker.api.params import parse_query
from broker.models import DeliveryState, TokenInfo

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
    return _caller(request).scope


async def get_events(request: web.Request) -> web.StreamResponse:
    svc = request.app[SERVICE]
    params = parse_query(request, EventParams)
    scope = _scope(request)
    if not params.follow:
        events, end = await svc.events(params.since, scope, params.limit)
        return web.Response(text="".join(e.model_dump_json() + "\n" for e in events), content_type=NDJSON_TYPE,
                            headers={CURSOR_HEADER: end})
    events_in = await svc.follow_events(params.since, scope)  # a bad cursor: a 400 before any line
    return await follow_ndjson(request, events_in, svc.settings.api.log_follow_max_s, "event stream")
