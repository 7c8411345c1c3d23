"""The event stream and webhooks: what happened to a tenant's jobs (and the market), read from the store, as a
page, as a followed stream resumable from a cursor, or pushed to a tenant's webhooks (broker/webhooks.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from broker.errors import SpecError
from broker.models import DeliveryState, StreamEvent, Webhook, WebhookCreate, WebhookDelivery
from broker.service.runtime import Runtime

if TYPE_CHECKING:
    from broker.store import EventCursor

log = logging.getLogger(__name__)


class EventsService(Runtime):
    # ------------------------------------------------------------------ the stream
    async def _cursor(self, since: str | None) -> EventCursor:
        from broker.store import EventCursor

        if since is None or since == "":
            return EventCursor()
        if since == "now":
            return await self.db(self.store.events_end)
        return EventCursor.parse(since)

    async def events(self, since: str | None = None, tenant: str | None = None,
                     limit: int = 500) -> tuple[list[StreamEvent], str]:
        """Events after ``since`` (a cursor from an earlier event, ``now``, or None: from the start) that
        ``tenant`` may see (None: all), and the cursor to ask from next."""
        start = await self._cursor(since)
        events, end = await self.db(self.store.events_after, start, tenant, limit)
        return events, str(end)

    async def follow_events(self, since: str | None = None, tenant: str | None = None) -> AsyncIterator[StreamEvent]:
        """The events after ``since``, then each new one as the store gets it, until the caller stops.
        Bad ``since`` fails here, before anything is sent."""
        start = await self._cursor(since)
        return self._stream_from(start, tenant)

    async def _stream_from(self, start: EventCursor, tenant: str | None) -> AsyncIterator[StreamEvent]:
        cursor = start
        while True:
            events, end = await self.db(self.store.events_after, cursor, tenant, 500)
            for e in events:
                yield e
            if end == cursor:
                await asyncio.sleep(self.settings.events.poll_interval_s)
            cursor = end

    # ------------------------------------------------------------------ webhooks
    async def create_webhook(self, body: WebhookCreate, caller_tenant: str, admin: bool) -> Webhook:
        """A webhook for the caller's tenant (an admin may name another); events from now on are delivered."""
        from broker.webhooks import check_url

        if body.tenant is not None and body.tenant != caller_tenant and not admin:
            raise SpecError("tenant", "only an admin may register a webhook for another tenant")
        tenant = body.tenant or caller_tenant
        await self.db(check_url, body.url, self.settings.events.webhook_allow_private)
        end = await self.db(self.store.events_end)
        hook = await self.db(self.store.create_webhook, tenant, body.url, body.kinds, body.secret, str(end),
                             self.clock())
        log.info("webhook %s created for tenant %s", hook.id, tenant)
        return hook

    async def list_webhooks(self, tenant: str | None = None) -> list[Webhook]:
        return await self.db(self.store.list_webhooks, tenant)

    async def delete_webhook(self, hook_id: str, tenant: str | None = None) -> None:
        await self.db(self.store.delete_webhook, hook_id, tenant)
        log.info("webhook %s deleted", hook_id)

    async def webhook_deliveries(self, tenant: str | None = None, webhook_id: str | None = None,
                                 state: DeliveryState | None = None, limit: int = 100) -> list[WebhookDelivery]:
        return await self.db(self.store.list_deliveries, tenant, webhook_id, state, limit)

    async def deliver_webhooks_now(self) -> int:
        """One round of outbox filling and delivery attempts (tests, ``lockstep`` tools); returns attempts."""
        return await self.webhooks.once()
