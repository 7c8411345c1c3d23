"""Webhooks and their outbox in the store.

A webhook's ``cursor`` says how far in the event stream its outbox has been filled. Filling writes the
deliveries of a page of events and moves the cursor in one transaction, under the webhook's row lock, so
two replicas never fill the same page twice (and the (webhook, event cursor) key refuses a duplicate if
they did). A delivery is taken for an attempt with a lease (``lease_until``): a broker killed mid-attempt
leaves a row whose lease runs out, and the next sender tries it again — at least once, never lost.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from broker.errors import NotFoundError
from broker.models import DeliveryState, Webhook, WebhookDelivery
from broker.store.engine import Database
from broker.tables import WebhookDeliveryRow, WebhookRow, table_of

HOOKS = table_of(WebhookRow)
DELIVERIES = table_of(WebhookDeliveryRow)
PUBLIC_HOOK = (HOOKS.c.id, HOOKS.c.tenant, HOOKS.c.url, HOOKS.c.kinds, HOOKS.c.created_at)  # never the secret


def _hook(row: Any) -> Webhook:
    return Webhook.model_validate(row, from_attributes=True)


def _delivery(row: Any) -> WebhookDelivery:
    return WebhookDelivery.model_validate(row, from_attributes=True)


class WebhookStore(Database):
    """Webhooks, their signing secrets and their deliveries."""

    def create_webhook(self, tenant: str, url: str, kinds: list[str], secret: str, cursor: str,
                       now: datetime) -> Webhook:
        hook_id = "wh_" + secrets.token_hex(8)
        with self._tx() as conn:
            conn.execute(HOOKS.insert().values(id=hook_id, tenant=tenant, url=url, kinds=kinds, secret=secret,
                                               cursor=cursor, created_at=now))
        return Webhook(id=hook_id, tenant=tenant, url=url, kinds=kinds, created_at=now)

    def list_webhooks(self, tenant: str | None = None) -> list[Webhook]:
        q = sa.select(*PUBLIC_HOOK).order_by(HOOKS.c.created_at, HOOKS.c.id)
        if tenant is not None:
            q = q.where(HOOKS.c.tenant == tenant)
        with self._tx(write=False) as conn:
            return [_hook(r) for r in conn.execute(q)]

    def delete_webhook(self, hook_id: str, tenant: str | None = None) -> None:
        """Delete it and its deliveries; NotFoundError when absent or another tenant's."""
        q = HOOKS.delete().where(HOOKS.c.id == hook_id)
        if tenant is not None:
            q = q.where(HOOKS.c.tenant == tenant)
        with self._tx() as conn:
            conn.execute(DELIVERIES.delete().where(DELIVERIES.c.webhook_id == hook_id,
                                                   *([DELIVERIES.c.tenant == tenant] if tenant else [])))
            if not conn.execute(q).rowcount:
                raise NotFoundError(f"webhook {hook_id} not found")

    def webhook_cursors(self) -> list[tuple[str, str, list[str], str]]:
        """Every webhook as (id, tenant, kinds, cursor): what filling the outbox needs."""
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(HOOKS.c.id, HOOKS.c.tenant, HOOKS.c.kinds, HOOKS.c.cursor))
            return [(r.id, r.tenant, list(r.kinds), r.cursor) for r in rows]

    def fill_outbox(self, hook_id: str, expected: str, cursor: str, deliveries: Sequence[dict[str, Any]],
                    now: datetime) -> bool:
        """Write ``deliveries`` (each: cursor, kind, body) and move the webhook's cursor from ``expected`` to
        ``cursor``, atomically; False (nothing written) when its cursor is no longer ``expected``."""
        with self._tx() as conn:
            q = sa.select(HOOKS.c.cursor, HOOKS.c.tenant).where(HOOKS.c.id == hook_id)
            row = conn.execute(q if self.is_sqlite else q.with_for_update()).first()
            if row is None or row.cursor != expected:
                return False
            if deliveries:
                rows = [{"id": "dl_" + secrets.token_hex(10), "webhook_id": hook_id, "tenant": row.tenant,
                         "cursor": d["cursor"], "kind": d["kind"], "body": d["body"],
                         "state": DeliveryState.pending.value, "attempts": 0, "next_attempt_at": now,
                         "last_error": "", "created_at": now} for d in deliveries]
                conn.execute(self._insert_fn()(DELIVERIES).values(rows).on_conflict_do_nothing())
            conn.execute(HOOKS.update().where(HOOKS.c.id == hook_id).values(cursor=cursor))
        return True

    def claim_deliveries(self, now: datetime, lease_s: float, limit: int = 50) -> list[dict[str, Any]]:
        """Pending deliveries due by ``now`` and not leased to another sender, leased for ``lease_s``; each
        as a dict with its webhook's url and secret (for the sender only)."""
        due = (sa.select(DELIVERIES.c.id)
               .where(DELIVERIES.c.state == DeliveryState.pending.value, DELIVERIES.c.next_attempt_at <= now,
                      sa.or_(DELIVERIES.c.lease_until.is_(None), DELIVERIES.c.lease_until <= now))
               .order_by(DELIVERIES.c.next_attempt_at, DELIVERIES.c.created_at, DELIVERIES.c.cursor)
               .limit(limit))
        # Most rounds find nothing due: a read says so without taking SQLite's write lock (submissions wait on it).
        with self._tx(write=False) as conn:
            if conn.execute(due.limit(1)).first() is None:
                return []
        with self._tx() as conn:
            ids = [r.id for r in conn.execute(due if self.is_sqlite else due.with_for_update(skip_locked=True))]
            if not ids:
                return []
            conn.execute(DELIVERIES.update().where(DELIVERIES.c.id.in_(ids))
                         .values(lease_until=now + timedelta(seconds=lease_s)))
            rows = conn.execute(
                sa.select(DELIVERIES.c.id, DELIVERIES.c.webhook_id, DELIVERIES.c.kind, DELIVERIES.c.body,
                          DELIVERIES.c.attempts, HOOKS.c.url, HOOKS.c.secret)
                .join(HOOKS, HOOKS.c.id == DELIVERIES.c.webhook_id)
                .where(DELIVERIES.c.id.in_(ids))).mappings()
            return [dict(r) for r in rows]

    def finish_attempt(self, delivery_id: str, *, ok: bool, status: int | None, error: str,
                       next_attempt_at: datetime | None, now: datetime) -> None:
        """Record one attempt: delivered, another attempt at ``next_attempt_at``, or failed (None)."""
        values: dict[str, Any] = {"attempts": DELIVERIES.c.attempts + 1, "last_status": status,
                                  "last_error": error[:500], "lease_until": None}
        if ok:
            values.update(state=DeliveryState.delivered.value, delivered_at=now, last_error="")
        elif next_attempt_at is None:
            values.update(state=DeliveryState.failed.value)
        else:
            values.update(next_attempt_at=next_attempt_at)
        with self._tx() as conn:
            conn.execute(DELIVERIES.update().where(DELIVERIES.c.id == delivery_id).values(**values))

    def list_deliveries(self, tenant: str | None = None, webhook_id: str | None = None,
                        state: DeliveryState | None = None, limit: int = 100) -> list[WebhookDelivery]:
        """Deliveries newest first."""
        q = sa.select(DELIVERIES).order_by(DELIVERIES.c.created_at.desc(), DELIVERIES.c.cursor.desc()).limit(limit)
        if tenant is not None:
            q = q.where(DELIVERIES.c.tenant == tenant)
        if webhook_id is not None:
            q = q.where(DELIVERIES.c.webhook_id == webhook_id)
        if state is not None:
            q = q.where(DELIVERIES.c.state == state.value)
        with self._tx(write=False) as conn:
            return [_delivery(r) for r in conn.execute(q)]
