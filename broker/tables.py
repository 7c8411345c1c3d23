"""SQLModel table classes: the database shape of Lockstep's state.

Only broker/store/ and the migrations use these; every other layer sees the
pydantic models of broker/models.py. The store talks to these tables through
SQLAlchemy Core (``Model.__table__``) so bulk paths stay fast and rows convert
to domain models in one place.

Conventions:
- Enum values are stored as short strings, not database enums, so adding a
  state is a code change and not a type migration on PostgreSQL.
- Timestamps are UTC. :class:`UTCDateTime` stores them as ``timestamptz`` on
  PostgreSQL and as naive UTC text on SQLite (which sorts correctly), and always
  hands back timezone-aware UTC datetimes.
- Nested pydantic models (JobSpec, placement, decisions) are JSON columns,
  written with ``model_dump(mode="json")``.
- Any change here needs a new migration under broker/migrations/versions;
  tests/store checks that the migrated schema matches these classes.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator
from sqlmodel import Field, SQLModel

# Integer primary keys: BIGINT on PostgreSQL, INTEGER (the rowid alias, so it
# autoincrements) on SQLite.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

# Allocation states that still hold (or may hold) provider resources.
# A preempted allocation holds nothing: the provider took it back, so it is not live.
LIVE_ALLOCATION_STATES: tuple[str, ...] = ("intent", "pending", "running", "unknown")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in, timezone-aware UTC out, on both backends."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            # SQLite has no time zones: store naive UTC so text order is time order.
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    # On SQLite, skip SQLAlchemy's regex-based DATETIME conversion: the C ``isoformat`` /
    # ``fromisoformat`` write and read the very same text ("YYYY-MM-DD HH:MM:SS.ffffff")
    # several times faster, which matters when reading tens of thousands of price points.

    def bind_processor(self, dialect: sa.Dialect) -> Any:
        if dialect.name != "sqlite":
            return super().bind_processor(dialect)

        def process(value: datetime | None) -> str | None:
            if value is None:
                return None
            if value.tzinfo is not None:
                value = value.astimezone(UTC).replace(tzinfo=None)
            return value.isoformat(" ", "microseconds")

        return process

    def result_processor(self, dialect: sa.Dialect, coltype: Any) -> Any:
        if dialect.name != "sqlite":
            return super().result_processor(dialect, coltype)

        def process(value: str | datetime | None) -> datetime | None:
            if value is None:
                return None
            if isinstance(value, str):
                value = datetime.fromisoformat(value)
            return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

        return process


def _ts(index: bool = False, nullable: bool = False) -> Any:
    return Field(sa_column=sa.Column(UTCDateTime(), nullable=nullable, index=index))


class JSONOr(TypeDecorator[Any]):
    """JSON that reads a NULL (SQL or JSON) back as an empty ``dict`` or ``list``, so rows validate straight
    into the domain models, whose collections are never None."""

    impl = sa.JSON()
    cache_ok = True

    def __init__(self, empty: type[dict[str, Any]] | type[list[Any]]) -> None:
        super().__init__()
        self.empty = empty

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> Any:
        return self.empty() if value is None else value


def _json(empty: type[dict[str, Any]] | type[list[Any]] | None = None) -> Any:
    return Field(sa_column=sa.Column(sa.JSON() if empty is None else JSONOr(empty), nullable=True))


class JobRow(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (
        sa.Index("ix_jobs_tenant_created", "tenant", "created_at", "id"),
        sa.Index("ix_jobs_state_created", "state", "created_at"),
    )

    id: str = Field(sa_column=sa.Column(sa.String(64), primary_key=True))
    tenant: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    state: str = Field(sa_column=sa.Column(sa.String(16), nullable=False))
    reason: str = Field(sa_column=sa.Column(sa.Text(), nullable=False, server_default=""))
    spec: dict[str, Any] = Field(sa_column=sa.Column(sa.JSON(), nullable=False))
    fingerprint: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    placement: dict[str, Any] | None = _json()
    decision: dict[str, Any] | None = _json(dict)
    gpus: int = Field(sa_column=sa.Column(sa.Integer(), nullable=False))
    created_at: datetime = _ts(index=True)
    updated_at: datetime = _ts(index=True)
    deadline: datetime | None = _ts(index=True, nullable=True)
    claimed_by: str | None = Field(default=None, sa_column=sa.Column(sa.String(128), nullable=True, index=True))
    claimed_at: datetime | None = _ts(nullable=True)
    attempts: int = Field(sa_column=sa.Column(sa.Integer(), nullable=False, server_default="0"))
    preemptions: int = Field(sa_column=sa.Column(sa.Integer(), nullable=False, server_default="0"))
    spent_usd: float = Field(sa_column=sa.Column(sa.Float(), nullable=False, server_default="0"))


class JobEventRow(SQLModel, table=True):
    __tablename__ = "job_events"
    __table_args__ = (sa.Index("ix_job_events_job_id", "job_id", "id"),)

    id: int | None = Field(default=None, sa_column=sa.Column(BigId, primary_key=True, autoincrement=True))
    job_id: str = Field(
        sa_column=sa.Column(sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    )
    at: datetime = _ts()
    from_state: str | None = Field(default=None, sa_column=sa.Column(sa.String(16), nullable=True))
    to_state: str = Field(sa_column=sa.Column(sa.String(16), nullable=False))
    reason: str = Field(sa_column=sa.Column(sa.Text(), nullable=False, server_default=""))
    data: dict[str, Any] | None = _json(dict)


class AllocationRow(SQLModel, table=True):
    __tablename__ = "allocations"
    __table_args__ = (
        sa.Index("ix_allocations_job_id", "job_id"),
        sa.Index("ix_allocations_state", "state"),
        sa.Index("ix_allocations_provider", "provider"),
        # A job never holds two live allocations: enforced by the database, on both backends.
        sa.Index(
            "uq_allocations_one_live_per_job",
            "job_id",
            unique=True,
            sqlite_where=sa.text("state IN ('intent','pending','running','unknown')"),
            postgresql_where=sa.text("state IN ('intent','pending','running','unknown')"),
        ),
    )

    id: str = Field(sa_column=sa.Column(sa.String(64), primary_key=True))
    job_id: str = Field(
        sa_column=sa.Column(sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    )
    attempt: int = Field(sa_column=sa.Column(sa.Integer(), nullable=False, server_default="0"))
    provider: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    offer_id: str = Field(sa_column=sa.Column(sa.String(256), nullable=False, server_default=""))
    state: str = Field(sa_column=sa.Column(sa.String(16), nullable=False))
    client_token: str = Field(sa_column=sa.Column(sa.String(128), nullable=False, server_default=""))
    resource_ids: list[str] | None = _json(list)
    nodes: int = Field(sa_column=sa.Column(sa.Integer(), nullable=False, server_default="1"))
    region: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, server_default=""))
    zone: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, server_default=""))
    usd_per_hour: float = Field(sa_column=sa.Column(sa.Float(), nullable=False, server_default="0"))
    created_at: datetime = _ts()
    updated_at: datetime = _ts()
    reason: str = Field(sa_column=sa.Column(sa.Text(), nullable=False, server_default=""))
    attrs: dict[str, str] | None = _json(dict)
    # Booked once, when it ended (docs/runtime.md, "Spend"): NULL until then.
    cost_usd: float | None = Field(default=None, sa_column=sa.Column(sa.Float(), nullable=True))
    billed_s: float | None = Field(default=None, sa_column=sa.Column(sa.Float(), nullable=True))
    ended_at: datetime | None = _ts(index=True, nullable=True)


class JobLogRow(SQLModel, table=True):
    """The last of a node's log, kept when its allocation ended (the machine, and the market's copy of the log,
    go with the release). Secret values are masked before it is written."""

    __tablename__ = "job_logs"
    __table_args__ = (sa.Index("ix_job_logs_job_id", "job_id"),)

    allocation_id: str = Field(
        sa_column=sa.Column(sa.String(64), sa.ForeignKey("allocations.id", ondelete="CASCADE"), primary_key=True)
    )
    rank: int = Field(sa_column=sa.Column(sa.Integer(), primary_key=True))
    job_id: str = Field(
        sa_column=sa.Column(sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    )
    text: str = Field(sa_column=sa.Column(sa.Text(), nullable=False))
    truncated: bool = Field(sa_column=sa.Column(sa.Boolean(), nullable=False, server_default=sa.false()))
    archived_at: datetime = _ts()


class PriceSeriesRow(SQLModel, table=True):
    """One price series (provider, market, sku, region, zone, stat), with its newest stored point.

    Points refer to their series by id, so history rows stay four numbers wide; the newest
    point here serves dedup on ingest and ``last_seen`` in one read, and outlives pruning.
    """

    __tablename__ = "price_series"
    __table_args__ = (
        sa.UniqueConstraint("provider", "market", "sku", "region", "zone", "stat", name="uq_price_series_key"),
        sa.Index("ix_price_series_gpu", "gpu"),
        sa.Index("ix_price_series_provider_region", "provider", "region"),
    )

    id: int | None = Field(default=None, sa_column=sa.Column(BigId, primary_key=True, autoincrement=True))
    provider: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    market: str = Field(sa_column=sa.Column(sa.String(16), nullable=False))
    sku: str = Field(sa_column=sa.Column(sa.String(128), nullable=False))
    region: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, server_default=""))
    zone: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, server_default=""))
    stat: str = Field(sa_column=sa.Column(sa.String(16), nullable=False, server_default="price"))
    gpu: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, server_default=""))
    # The newest stored point: microseconds since the epoch (UTC), price and offer count.
    last_at: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger(), nullable=True))
    last_usd: float | None = Field(default=None, sa_column=sa.Column(sa.Float(), nullable=True))
    last_count: int | None = Field(default=None, sa_column=sa.Column(sa.Integer(), nullable=True))


class PricePointRow(SQLModel, table=True):
    """Price history, clustered by (series, time).

    The primary key is the only index: one B-tree to maintain on ingest, and "one GPU
    model over a window" is a range scan per matching series. On SQLite the table is
    WITHOUT ROWID, so the key *is* the table. Time is integer microseconds since the
    epoch (UTC): an 8-byte key that compares and converts faster than text. No foreign
    key to price_series: the check would cost a lookup per inserted point, and series
    are never deleted.
    """

    __tablename__ = "price_points"
    __table_args__ = (
        sa.PrimaryKeyConstraint("series_id", "at_us", name="pk_price_points"),
        {"sqlite_with_rowid": False},
    )

    series_id: int = Field(sa_column=sa.Column(sa.BigInteger(), nullable=False))
    at_us: int = Field(sa_column=sa.Column(sa.BigInteger(), nullable=False))
    usd_per_hour: float = Field(sa_column=sa.Column(sa.Float(), nullable=False))
    count: int | None = Field(default=None, sa_column=sa.Column(sa.Integer(), nullable=True))


class SpikeAlertRow(SQLModel, table=True):
    __tablename__ = "spike_alerts"
    __table_args__ = (sa.Index("ix_spike_alerts_start", "start"), sa.Index("ix_spike_alerts_end", "end"))

    id: int | None = Field(default=None, sa_column=sa.Column(BigId, primary_key=True, autoincrement=True))
    series: dict[str, Any] = Field(sa_column=sa.Column(sa.JSON(), nullable=False))
    start: datetime = _ts()
    end: datetime | None = _ts(nullable=True)
    peak: float = Field(sa_column=sa.Column(sa.Float(), nullable=False))
    baseline: float = Field(sa_column=sa.Column(sa.Float(), nullable=False))


class BenchmarkRow(SQLModel, table=True):
    __tablename__ = "benchmarks"
    __table_args__ = (sa.Index("ix_benchmarks_provider_target_at", "provider", "target", "measured_at"),)

    id: int | None = Field(default=None, sa_column=sa.Column(BigId, primary_key=True, autoincrement=True))
    provider: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    target: str = Field(sa_column=sa.Column(sa.String(256), nullable=False))
    gpu: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, server_default=""))
    healthy: bool = Field(sa_column=sa.Column(sa.Boolean(), nullable=False))
    measured_at: datetime = _ts()
    # The whole Benchmark, so new figures need no migration.
    body: dict[str, Any] = Field(sa_column=sa.Column(sa.JSON(), nullable=False))


class NodeHealthRow(SQLModel, table=True):
    __tablename__ = "node_health"

    provider: str = Field(sa_column=sa.Column(sa.String(64), primary_key=True))
    node: str = Field(sa_column=sa.Column(sa.String(256), primary_key=True))
    healthy: bool = Field(sa_column=sa.Column(sa.Boolean(), nullable=False, index=True))
    reason: str = Field(sa_column=sa.Column(sa.Text(), nullable=False, server_default=""))
    updated_at: datetime = _ts()


class TenantRow(SQLModel, table=True):
    __tablename__ = "tenants"

    name: str = Field(sa_column=sa.Column(sa.String(64), primary_key=True))
    monthly_budget_usd: float | None = Field(default=None, sa_column=sa.Column(sa.Float(), nullable=True))
    max_gpus: int | None = Field(default=None, sa_column=sa.Column(sa.Integer(), nullable=True))
    created_at: datetime = _ts()
    # What happens to running jobs once the budget is spent (BudgetAction), and the budget alert last sent
    # ("YYYY-MM:percent", so each level is sent once a month): migration 0007.
    on_budget_exhausted: str = Field(default="signal_then_stop", sa_column=sa.Column(
        sa.String(32), nullable=False, server_default="signal_then_stop"))
    budget_alert: str = Field(default="", sa_column=sa.Column(sa.String(32), nullable=False, server_default=""))


class TokenRow(SQLModel, table=True):
    __tablename__ = "tokens"

    id: str = Field(sa_column=sa.Column(sa.String(32), primary_key=True))
    tenant: str = Field(
        sa_column=sa.Column(
            sa.String(64), sa.ForeignKey("tenants.name", ondelete="CASCADE"), nullable=False, index=True
        )
    )
    role: str = Field(sa_column=sa.Column(sa.String(16), nullable=False))
    # SHA-256 hex of the plaintext; the plaintext is never stored.
    token_hash: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, unique=True))
    label: str = Field(sa_column=sa.Column(sa.String(256), nullable=False, server_default=""))
    created_at: datetime = _ts()
    revoked: bool = Field(sa_column=sa.Column(sa.Boolean(), nullable=False, server_default=sa.false()))


class IdempotencyKeyRow(SQLModel, table=True):
    __tablename__ = "idempotency_keys"

    # Keys are scoped per tenant (two tenants may pick the same key).
    tenant: str = Field(sa_column=sa.Column(sa.String(64), primary_key=True))
    key: str = Field(sa_column=sa.Column(sa.String(256), primary_key=True))
    fingerprint: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    job_id: str = Field(
        sa_column=sa.Column(sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False)
    )
    created_at: datetime = _ts()


class WebhookRow(SQLModel, table=True):
    """A tenant's webhook; ``cursor`` is the event stream position its outbox has been filled to."""

    __tablename__ = "webhooks"

    id: str = Field(sa_column=sa.Column(sa.String(32), primary_key=True))
    tenant: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, index=True))
    url: str = Field(sa_column=sa.Column(sa.Text(), nullable=False))
    kinds: list[str] = Field(sa_column=sa.Column(sa.JSON(), nullable=False))
    # The signing key has to be usable (HMAC), so it is kept, and never returned by the API.
    secret: str = Field(sa_column=sa.Column(sa.String(256), nullable=False))
    cursor: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    created_at: datetime = _ts()


class WebhookDeliveryRow(SQLModel, table=True):
    """The outbox: one event for one webhook, written before any attempt, kept after (delivered or failed)."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        sa.UniqueConstraint("webhook_id", "cursor", name="uq_webhook_deliveries_event"),
        sa.Index("ix_webhook_deliveries_due", "state", "next_attempt_at"),
    )

    id: str = Field(sa_column=sa.Column(sa.String(32), primary_key=True))
    webhook_id: str = Field(
        sa_column=sa.Column(sa.String(32), sa.ForeignKey("webhooks.id", ondelete="CASCADE"), nullable=False)
    )
    tenant: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    cursor: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    kind: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    body: str = Field(sa_column=sa.Column(sa.Text(), nullable=False))
    state: str = Field(sa_column=sa.Column(sa.String(16), nullable=False))
    attempts: int = Field(sa_column=sa.Column(sa.Integer(), nullable=False, server_default="0"))
    next_attempt_at: datetime | None = _ts(nullable=True)
    lease_until: datetime | None = _ts(nullable=True)
    last_status: int | None = Field(default=None, sa_column=sa.Column(sa.Integer(), nullable=True))
    last_error: str = Field(sa_column=sa.Column(sa.Text(), nullable=False, server_default=""))
    created_at: datetime = _ts()
    delivered_at: datetime | None = _ts(nullable=True)


metadata = SQLModel.metadata


def table_of(row: type[SQLModel]) -> sa.Table:
    """The Core table of a table class, typed (SQLModel does not declare ``__table__``)."""
    return metadata.tables[str(row.__tablename__)]
