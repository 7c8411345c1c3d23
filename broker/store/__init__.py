"""The store: Lockstep's state in SQLite (default) or PostgreSQL (by URL).

``Store`` is one facade over the store's aggregates, each a module of its own on one engine:

- :mod:`broker.store.engine`: the engine and its sessions, migrations, the leader lock;
- :mod:`broker.store.jobs`: jobs, their events and allocations; spend and usage;
- :mod:`broker.store.tenants`: tenants and API tokens;
- :mod:`broker.store.nodes`: benchmarks and node health;
- :mod:`broker.store.prices`: price history and spike alerts;
- :mod:`broker.store.events`: the event stream (job events and spike alerts, by id);
- :mod:`broker.store.webhooks`: webhooks and their delivery outbox.

It is synchronous on purpose: SQLAlchemy Core over a connection pool, called from async
layers with ``asyncio.to_thread``. Callers only ever see the pydantic models of
:mod:`broker.models` (rows become models with ``model_validate(row, from_attributes=True)``);
the table classes of :mod:`broker.tables` stay in here.

Concurrency model:
- SQLite: WAL, ``busy_timeout`` and every write transaction opened with
  ``BEGIN IMMEDIATE`` (one writer at a time, taken up front, so two writers
  never deadlock on a read-then-write upgrade). One process owns the file.
- PostgreSQL: several broker replicas share the database. ``transition`` locks the
  job row (``SELECT … FOR UPDATE``), which is how a replica claims a pending job;
  ``leader_lock`` is a session advisory lock on a dedicated connection.
- A job never holds two live allocations: a unique partial index on
  ``allocations(job_id)`` over the live states, on both backends.

Schema changes are Alembic migrations (broker/migrations); ``migrate()`` runs
them programmatically, no alembic.ini needed.
"""

from __future__ import annotations

from broker.store.engine import MIGRATIONS_DIR, Database, make_engine
from broker.store.events import EventCursor, EventStore
from broker.store.jobs import LIVE_STATES, JobStore
from broker.store.nodes import NodeStore
from broker.store.prices import PriceStore
from broker.store.tenants import TenantStore
from broker.store.webhooks import WebhookStore


class Store(JobStore, TenantStore, NodeStore, PriceStore, EventStore, WebhookStore):
    """All persistent state: every aggregate over one engine. Thread-safe; one per process is enough."""


def open_store(url: str, migrate: bool = True) -> Store:
    """A Store on ``url``, migrated to the newest schema unless ``migrate`` is False."""
    store = Store(url)
    if migrate:
        store.migrate()
    return store


__all__ = ["LIVE_STATES", "MIGRATIONS_DIR", "Database", "EventCursor", "Store", "make_engine", "open_store"]
