"""The store: Lockstep's state in SQLite (default) or PostgreSQL (by URL).

``Store`` is synchronous on purpose: SQLAlchemy Core over a connection pool,
called from async layers with ``asyncio.to_thread``. Callers only ever see the
pydantic models of :mod:`broker.models`; the table classes of
:mod:`broker.tables` stay in here.

Concurrency model:
- SQLite: WAL, ``busy_timeout`` and every write transaction opened with
  ``BEGIN IMMEDIATE`` (one writer at a time, taken up front, so two writers
  never deadlock on a read-then-write upgrade). One process owns the file.
- PostgreSQL: several broker replicas share the database. ``claim_jobs`` uses
  ``SELECT … FOR UPDATE SKIP LOCKED``; ``transition`` locks the job row;
  ``leader_lock`` is a session advisory lock on a dedicated connection.
- A job never holds two live allocations: a unique partial index on
  ``allocations(job_id)`` over the live states, on both backends.

Schema changes are Alembic migrations (broker/migrations); ``migrate()`` runs
them programmatically, no alembic.ini needed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection, Engine, RowMapping
from sqlalchemy.pool import StaticPool

from broker.errors import ConflictError, NotFoundError, SpecError, StoreError
from broker.models import (
    ALLOWED_TRANSITIONS,
    Allocation,
    AllocationState,
    Benchmark,
    Job,
    JobEvent,
    JobState,
    QuoteOption,
    Role,
    Tenant,
    TokenInfo,
    as_utc,
    utcnow,
)
from broker.price_store import PriceStore
from broker.tables import (
    LIVE_ALLOCATION_STATES,
    AllocationRow,
    BenchmarkRow,
    IdempotencyKeyRow,
    JobEventRow,
    JobRow,
    NodeHealthRow,
    SpikeAlertRow,
    TenantRow,
    TokenRow,
)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

JOBS: sa.Table = JobRow.__table__  # type: ignore[attr-defined]
EVENTS: sa.Table = JobEventRow.__table__  # type: ignore[attr-defined]
ALLOCS: sa.Table = AllocationRow.__table__  # type: ignore[attr-defined]
ALERTS: sa.Table = SpikeAlertRow.__table__  # type: ignore[attr-defined]
BENCHES: sa.Table = BenchmarkRow.__table__  # type: ignore[attr-defined]
HEALTH: sa.Table = NodeHealthRow.__table__  # type: ignore[attr-defined]
TENANTS: sa.Table = TenantRow.__table__  # type: ignore[attr-defined]
TOKENS: sa.Table = TokenRow.__table__  # type: ignore[attr-defined]
IDEM: sa.Table = IdempotencyKeyRow.__table__  # type: ignore[attr-defined]

# Job fields that transition()/update_job() may set besides the state.
JOB_FIELDS: frozenset[str] = frozenset(
    {
        "placement",
        "attempts",
        "preemptions",
        "decision",
        "spent_usd",
        "deadline",
        "claimed_by",
        "claimed_at",
        "reason",
    }
)
ALLOCATION_FIELDS: frozenset[str] = frozenset(
    {
        "state",
        "resource_ids",
        "reason",
        "attrs",
        "region",
        "zone",
        "usd_per_hour",
        "offer_id",
        "client_token",
        "nodes",
        "attempt",
    }
)
TENANT_FIELDS: frozenset[str] = frozenset({"monthly_budget_usd", "max_gpus"})
LIVE_STATES: tuple[AllocationState, ...] = tuple(AllocationState(s) for s in LIVE_ALLOCATION_STATES)
# Allocations that cost money while they last (for spend accrual).
BILLING_STATES: tuple[str, ...] = (AllocationState.pending.value, AllocationState.running.value)
TOKEN_PREFIX = "lst_"


def _hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def _advisory_key(name: str) -> int:
    """A stable signed 64-bit key for pg_advisory locks."""
    return int.from_bytes(hashlib.sha256(f"lockstep:{name}".encode()).digest()[:8], "big", signed=True)


def make_engine(url: str) -> Engine:
    """An engine with Lockstep's connection setup for SQLite or PostgreSQL."""
    if url.startswith("sqlite"):
        path = sa.engine.make_url(url).database
        if path and path != ":memory:":
            Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        memory = path in (None, "", ":memory:")
        engine = sa.create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            # An in-memory database lives in one connection: share it (tests, dry runs).
            poolclass=StaticPool if memory else None,
        )

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; fsync at checkpoints
            # Price history indexes outgrow the 2 MB default cache at ~100k points, and ingest
            # then pays for page misses; 64 MB (allocated only as used) keeps them in memory.
            cur.execute("PRAGMA cache_size=-65536")
            # Checkpoint the WAL every ~40 MB rather than every 4 MB: bulk price ingest
            # otherwise pays a checkpoint (and its fsync) on nearly every batch.
            cur.execute("PRAGMA wal_autocheckpoint=10000")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
            conn.exec_driver_sql(f"BEGIN {mode}")

        return engine
    return sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)


class Store(PriceStore):
    """All persistent state. Thread-safe; one per process is enough."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.dialect = self.engine.dialect.name
        self.is_sqlite = self.dialect == "sqlite"

    def __repr__(self) -> str:
        return f"Store({self.engine.url.render_as_string(hide_password=True)!r})"

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            if write and self.is_sqlite:
                conn.execution_options(sqlite_begin="IMMEDIATE")
            with conn.begin():
                yield conn

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to the newest migration (``alembic upgrade head``); safe to repeat."""
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        with self._tx() as conn:
            self._serialise(conn, "migrate")  # two replicas starting together must not both migrate
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)

    def _serialise(self, conn: Connection, name: str) -> None:
        """Make transactions that call this with ``name`` take turns (PostgreSQL: a transaction-level
        advisory lock, freed at commit or rollback). SQLite's write transactions take turns anyway."""
        if not self.is_sqlite:
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_advisory_key(name))))

    @contextmanager
    def leader_lock(self, name: str) -> Iterator[bool]:
        """Yield True when this process holds the named lock for the duration of the context.

        PostgreSQL: ``pg_try_advisory_lock`` on a dedicated connection, released when the
        context ends (or when the connection dies, so a crashed leader frees it).
        SQLite: always True; a SQLite file has one broker process.
        """
        if self.is_sqlite:
            yield True
            return
        key = _advisory_key(name)
        with self.engine.connect() as conn:
            got = bool(conn.execute(sa.select(sa.func.pg_try_advisory_lock(key))).scalar())
            conn.commit()
            try:
                yield got
            finally:
                if got:
                    try:
                        conn.execute(sa.select(sa.func.pg_advisory_unlock(key)))
                        conn.commit()
                    except sa.exc.DBAPIError:
                        # The connection died: PostgreSQL dropped the lock with the session.
                        conn.invalidate()

    # ------------------------------------------------------------------ jobs: conversion

    @staticmethod
    def _job(row: RowMapping, events: list[JobEvent] | None = None) -> Job:
        return Job.model_validate(
            {
                "id": row["id"],
                "tenant": row["tenant"],
                "spec": row["spec"],
                "state": row["state"],
                "reason": row["reason"],
                "created_at": row["created_at"],
                "updated_at": row["updated_at"],
                "deadline": row["deadline"],
                "attempts": row["attempts"],
                "preemptions": row["preemptions"],
                "placement": row["placement"],
                "spent_usd": row["spent_usd"],
                "decision": row["decision"] or {},
                "events": events or [],
            }
        )

    @staticmethod
    def _event(row: RowMapping) -> JobEvent:
        return JobEvent(
            job_id=row["job_id"],
            at=row["at"],
            from_state=row["from_state"],
            to_state=row["to_state"],
            reason=row["reason"],
            data=row["data"] or {},
        )

    @staticmethod
    def _job_values(fields: dict[str, Any]) -> dict[str, Any]:
        unknown = set(fields) - JOB_FIELDS
        if unknown:
            raise StoreError(f"not job fields: {', '.join(sorted(unknown))}")
        out = dict(fields)
        if "placement" in out:
            p = out["placement"]
            if isinstance(p, QuoteOption):
                out["placement"] = p.model_dump(mode="json")
            elif p is not None:
                out["placement"] = QuoteOption.model_validate(p).model_dump(mode="json")
        if "decision" in out:
            out["decision"] = json.loads(json.dumps(out["decision"] or {}, default=str))
        return out

    def _events_in(self, conn: Connection, job_id: str) -> list[JobEvent]:
        rows = conn.execute(sa.select(EVENTS).where(EVENTS.c.job_id == job_id).order_by(EVENTS.c.id)).mappings()
        return [self._event(r) for r in rows]

    def _insert_event(
        self,
        conn: Connection,
        job_id: str,
        from_state: JobState | None,
        to_state: JobState,
        reason: str,
        data: dict[str, Any] | None,
        at: datetime,
    ) -> None:
        conn.execute(
            EVENTS.insert().values(
                job_id=job_id,
                at=at,
                from_state=from_state.value if from_state else None,
                to_state=to_state.value,
                reason=reason,
                data=json.loads(json.dumps(data or {}, default=str)),
            )
        )

    def _job_row(self, conn: Connection, job_id: str, lock: bool = False) -> RowMapping:
        q = sa.select(JOBS).where(JOBS.c.id == job_id)
        if lock and not self.is_sqlite:
            q = q.with_for_update()
        row = conn.execute(q).mappings().first()
        if row is None:
            raise NotFoundError(f"job {job_id} not found")
        return row

    # ------------------------------------------------------------------ jobs

    def create_job(self, job: Job, idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Store a new job and its first event; returns (job, created).

        With an idempotency key (scoped to the tenant), a repeat with the same spec
        returns the existing job and False; the same key with another spec is a
        ConflictError.
        """
        fingerprint = job.spec.fingerprint()
        try:
            with self._tx() as conn:
                if idempotency_key:
                    existing = self._idem_lookup(conn, job.tenant, idempotency_key, fingerprint)
                    if existing is not None:
                        return existing, False
                self._insert_job(conn, job, fingerprint, idempotency_key)
                return self._job(self._job_row(conn, job.id), self._events_in(conn, job.id)), True
        except sa.exc.IntegrityError as exc:
            # Lost a race on the same key (PostgreSQL), or the job id exists.
            if idempotency_key:
                with self._tx(write=False) as conn:
                    existing = self._idem_lookup(conn, job.tenant, idempotency_key, fingerprint)
                    if existing is not None:
                        return existing, False
            raise ConflictError(f"job {job.id} already exists") from exc

    def _idem_lookup(self, conn: Connection, tenant: str, key: str, fingerprint: str) -> Job | None:
        row = conn.execute(sa.select(IDEM).where(IDEM.c.tenant == tenant, IDEM.c.key == key)).mappings().first()
        if row is None:
            return None
        if row["fingerprint"] != fingerprint:
            raise ConflictError("idempotency key already used for a different job spec")
        return self._job(self._job_row(conn, row["job_id"]), self._events_in(conn, row["job_id"]))

    def _insert_job(self, conn: Connection, job: Job, fingerprint: str, key: str | None) -> None:
        deadline = job.deadline or job.spec.deadline_at(job.created_at)
        conn.execute(
            JOBS.insert().values(
                id=job.id,
                tenant=job.tenant,
                state=job.state.value,
                reason=job.reason,
                spec=job.spec.model_dump(mode="json"),
                fingerprint=fingerprint,
                placement=job.placement.model_dump(mode="json") if job.placement else None,
                decision=json.loads(json.dumps(job.decision, default=str)),
                gpus=job.spec.gpus,
                created_at=job.created_at,
                updated_at=job.updated_at,
                deadline=deadline,
                attempts=job.attempts,
                preemptions=job.preemptions,
                spent_usd=job.spent_usd,
            )
        )
        self._insert_event(conn, job.id, None, job.state, job.reason or "submitted", None, job.created_at)
        if key:
            conn.execute(
                IDEM.insert().values(
                    tenant=job.tenant, key=key, fingerprint=fingerprint, job_id=job.id, created_at=utcnow()
                )
            )

    def get_job(self, job_id: str, tenant: str | None = None) -> Job:
        """The job with its events; NotFoundError when absent or another tenant's."""
        with self._tx(write=False) as conn:
            row = self._job_row(conn, job_id)
            if tenant is not None and row["tenant"] != tenant:
                raise NotFoundError(f"job {job_id} not found")
            return self._job(row, self._events_in(conn, job_id))

    def list_jobs(
        self,
        tenant: str | None = None,
        states: list[JobState] | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[Job], str | None]:
        """Newest first, without events; returns (jobs, cursor of the next page or None)."""
        q = sa.select(JOBS)
        if tenant is not None:
            q = q.where(JOBS.c.tenant == tenant)
        if states:
            q = q.where(JOBS.c.state.in_([JobState(s).value for s in states]))
        if cursor:
            at, last_id = self._decode_cursor(cursor)
            q = q.where(sa.or_(JOBS.c.created_at < at, sa.and_(JOBS.c.created_at == at, JOBS.c.id < last_id)))
        limit = max(1, min(int(limit), 1000))
        q = q.order_by(JOBS.c.created_at.desc(), JOBS.c.id.desc()).limit(limit + 1)
        with self._tx(write=False) as conn:
            rows = list(conn.execute(q).mappings())
        jobs = [self._job(r) for r in rows[:limit]]
        nxt = None
        if len(rows) > limit:
            last = jobs[-1]
            nxt = base64.urlsafe_b64encode(json.dumps([last.created_at.isoformat(), last.id]).encode()).decode()
        return jobs, nxt

    @staticmethod
    def _decode_cursor(cursor: str) -> tuple[datetime, str]:
        try:
            at, last_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
            return as_utc(datetime.fromisoformat(at)), str(last_id)
        except (ValueError, TypeError) as exc:
            raise SpecError("cursor", "not a cursor returned by list_jobs") from exc

    def transition(
        self,
        job_id: str,
        to_state: JobState,
        reason: str = "",
        data: dict[str, Any] | None = None,
        expected: set[JobState] | None = None,
        **fields: Any,
    ) -> Job:
        """Move a job to ``to_state`` and record the event, atomically.

        ConflictError when the move is not in ALLOWED_TRANSITIONS or the job's
        current state is not in ``expected``. Extra ``fields`` (placement,
        attempts, preemptions, decision, spent_usd, claimed_by…) are set too.
        """
        to_state = JobState(to_state)
        values = self._job_values(fields)
        with self._tx() as conn:
            row = self._job_row(conn, job_id, lock=True)
            current = JobState(row["state"])
            if expected is not None and current not in expected:
                raise ConflictError(
                    f"job {job_id} is {current.value}, expected {'/'.join(sorted(s.value for s in expected))}"
                )
            if to_state not in ALLOWED_TRANSITIONS[current]:
                raise ConflictError(f"job {job_id}: {current.value} → {to_state.value} is not allowed")
            now = utcnow()
            values.update(state=to_state.value, reason=reason, updated_at=now)
            conn.execute(JOBS.update().where(JOBS.c.id == job_id).values(**values))
            self._insert_event(conn, job_id, current, to_state, reason, data, now)
            return self._job(self._job_row(conn, job_id), self._events_in(conn, job_id))

    def update_job(self, job_id: str, **fields: Any) -> Job:
        """Set job fields without a state change (no event)."""
        values = self._job_values(fields)
        with self._tx() as conn:
            self._job_row(conn, job_id, lock=True)
            values["updated_at"] = utcnow()
            conn.execute(JOBS.update().where(JOBS.c.id == job_id).values(**values))
            return self._job(self._job_row(conn, job_id), self._events_in(conn, job_id))

    def events(self, job_id: str) -> list[JobEvent]:
        with self._tx(write=False) as conn:
            self._job_row(conn, job_id)
            return self._events_in(conn, job_id)

    def claim_jobs(self, worker: str, limit: int = 10, states: Sequence[JobState] = (JobState.pending,)) -> list[Job]:
        """Atomically move up to ``limit`` jobs (oldest first) to placing, claimed by ``worker``.

        PostgreSQL: FOR UPDATE SKIP LOCKED, so replicas never claim the same job and
        never wait on each other. SQLite: inside BEGIN IMMEDIATE (single writer).
        """
        claimable = [JobState(s).value for s in states if JobState.placing in ALLOWED_TRANSITIONS[JobState(s)]]
        if not claimable or limit <= 0:
            return []
        q = (
            sa.select(JOBS.c.id, JOBS.c.state)
            .where(JOBS.c.state.in_(claimable))
            .order_by(JOBS.c.created_at, JOBS.c.id)
            .limit(limit)
        )
        if not self.is_sqlite:
            q = q.with_for_update(skip_locked=True)
        with self._tx() as conn:
            picked = list(conn.execute(q))
            now = utcnow()
            out: list[Job] = []
            for job_id, state in picked:
                conn.execute(
                    JOBS.update()
                    .where(JOBS.c.id == job_id)
                    .values(
                        state=JobState.placing.value,
                        reason=f"claimed by {worker}",
                        updated_at=now,
                        claimed_by=worker,
                        claimed_at=now,
                    )
                )
                self._insert_event(
                    conn,
                    job_id,
                    JobState(state),
                    JobState.placing,
                    f"claimed by {worker}",
                    {"worker": worker},
                    now,
                )
                out.append(self._job(self._job_row(conn, job_id), self._events_in(conn, job_id)))
            return out

    def jobs_in_states(self, states: Iterable[JobState]) -> list[Job]:
        """Jobs in any of ``states`` (without events), oldest first."""
        values = [JobState(s).value for s in states]
        if not values:
            return []
        with self._tx(write=False) as conn:
            rows = conn.execute(
                sa.select(JOBS).where(JOBS.c.state.in_(values)).order_by(JOBS.c.created_at, JOBS.c.id)
            ).mappings()
            return [self._job(r) for r in rows]

    # ------------------------------------------------------------------ allocations

    @staticmethod
    def _alloc(row: RowMapping) -> Allocation:
        return Allocation(
            id=row["id"],
            job_id=row["job_id"],
            attempt=row["attempt"],
            provider=row["provider"],
            offer_id=row["offer_id"],
            state=row["state"],
            client_token=row["client_token"],
            resource_ids=row["resource_ids"] or [],
            nodes=row["nodes"],
            region=row["region"],
            zone=row["zone"],
            usd_per_hour=row["usd_per_hour"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            reason=row["reason"],
            attrs=row["attrs"] or {},
        )

    def add_allocation(self, alloc: Allocation) -> Allocation:
        """Record an allocation (the intent, before the provider is called).

        ConflictError when the id exists or the job already holds a live allocation.
        """
        values = alloc.model_dump(mode="python")
        values["state"] = AllocationState(values["state"]).value
        try:
            with self._tx() as conn:
                self._job_row(conn, alloc.job_id)
                conn.execute(ALLOCS.insert().values(**values))
                return self._alloc(self._alloc_row(conn, alloc.id))
        except sa.exc.IntegrityError as exc:
            raise ConflictError(
                f"allocation {alloc.id}: the id exists or job {alloc.job_id} already holds a live allocation"
            ) from exc

    def _alloc_row(self, conn: Connection, alloc_id: str) -> RowMapping:
        row = conn.execute(sa.select(ALLOCS).where(ALLOCS.c.id == alloc_id)).mappings().first()
        if row is None:
            raise NotFoundError(f"allocation {alloc_id} not found")
        return row

    def update_allocation(
        self, alloc_id: str, *, expected: Iterable[AllocationState] | None = None, **fields: Any
    ) -> Allocation:
        """Set allocation fields. With ``expected``, only if the allocation is still in one of those
        states (compare-and-set, atomic on both backends); otherwise ``ConflictError`` and nothing
        changes. Two writers deciding on one allocation (a launch completing, a reconcile failing
        its intent) then cannot overwrite each other."""
        unknown = set(fields) - ALLOCATION_FIELDS
        if unknown:
            raise StoreError(f"not allocation fields: {', '.join(sorted(unknown))}")
        values = dict(fields)
        if "state" in values:
            values["state"] = AllocationState(values["state"]).value
        if "resource_ids" in values:
            values["resource_ids"] = [str(r) for r in values["resource_ids"] or []]
        values["updated_at"] = utcnow()
        q = ALLOCS.update().where(ALLOCS.c.id == alloc_id)
        states = sorted({AllocationState(s).value for s in expected or ()})
        if expected is not None:
            q = q.where(ALLOCS.c.state.in_(states))
        try:
            with self._tx() as conn:
                self._alloc_row(conn, alloc_id)
                if not conn.execute(q.values(**values)).rowcount:
                    now = self._alloc_row(conn, alloc_id)["state"]  # after the UPDATE: what it lost to
                    raise ConflictError(f"allocation {alloc_id} is {now}, not {' or '.join(states)}: changed meanwhile")
                return self._alloc(self._alloc_row(conn, alloc_id))
        except sa.exc.IntegrityError as exc:
            raise ConflictError(f"allocation {alloc_id}: its job already holds another live allocation") from exc

    def get_allocation(self, alloc_id: str) -> Allocation:
        with self._tx(write=False) as conn:
            return self._alloc(self._alloc_row(conn, alloc_id))

    def allocations(self, job_id: str | None = None, states: list[AllocationState] | None = None) -> list[Allocation]:
        q = sa.select(ALLOCS)
        if job_id is not None:
            q = q.where(ALLOCS.c.job_id == job_id)
        if states is not None:
            q = q.where(ALLOCS.c.state.in_([AllocationState(s).value for s in states]))
        with self._tx(write=False) as conn:
            return [self._alloc(r) for r in conn.execute(q.order_by(ALLOCS.c.created_at, ALLOCS.c.id)).mappings()]

    def live_allocations(self) -> list[Allocation]:
        """Allocations that may still hold provider resources: intent, pending, running or unknown."""
        return self.allocations(states=list(LIVE_STATES))

    def find_allocation(self, provider: str, resource_id: str) -> Allocation | None:
        """The newest allocation of ``provider`` whose resource_ids contain ``resource_id``."""
        # JSON arrays are not portably indexable; a LIKE on the JSON text narrows, Python confirms.
        needle = json.dumps(resource_id).replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        q = (
            sa.select(ALLOCS)
            .where(ALLOCS.c.provider == provider)
            .where(sa.cast(ALLOCS.c.resource_ids, sa.Text).like(f"%{needle}%", escape="\\"))
            .order_by(ALLOCS.c.created_at.desc())
        )
        with self._tx(write=False) as conn:
            for row in conn.execute(q).mappings():
                if resource_id in (row["resource_ids"] or []):
                    return self._alloc(row)
        return None

    # ------------------------------------------------------------------ spike alerts

    def add_alert(self, series: dict[str, Any], start: datetime, peak: float, baseline: float) -> int:
        with self._tx() as conn:
            res = conn.execute(
                ALERTS.insert().values(
                    series=json.loads(json.dumps(series, default=str)),
                    start=start,
                    peak=peak,
                    baseline=baseline,
                )
            )
            return int(res.inserted_primary_key[0])

    def update_alert(self, alert_id: int, *, peak: float | None = None, end: datetime | None = None) -> None:
        """Raise an alert's peak (never lowers it) and/or close it at ``end``."""
        values: dict[str, Any] = {}
        if peak is not None:
            values["peak"] = sa.case((ALERTS.c.peak < peak, peak), else_=ALERTS.c.peak)
        if end is not None:
            values["end"] = end
        q = ALERTS.update().where(ALERTS.c.id == alert_id)
        with self._tx() as conn:
            if values:
                n = conn.execute(q.values(**values)).rowcount
            else:
                n = len(conn.execute(sa.select(ALERTS.c.id).where(ALERTS.c.id == alert_id)).all())
        if not n:
            raise NotFoundError(f"alert {alert_id} not found")

    def alerts(self, open_only: bool = False, since: datetime | None = None) -> list[dict[str, Any]]:
        """Alerts newest first, as dicts (id, series, start, end, peak, baseline).

        ``since`` keeps alerts active at or after that time (started since, or ended since, or open).
        """
        q = sa.select(ALERTS)
        if open_only:
            q = q.where(ALERTS.c.end.is_(None))
        if since is not None:
            q = q.where(sa.or_(ALERTS.c.start >= since, ALERTS.c.end.is_(None), ALERTS.c.end >= since))
        with self._tx(write=False) as conn:
            rows = conn.execute(q.order_by(ALERTS.c.start.desc(), ALERTS.c.id.desc())).mappings()
            return [dict(r) for r in rows]

    # ------------------------------------------------------------------ benchmarks, node health

    def add_benchmark(self, b: Benchmark) -> int:
        with self._tx() as conn:
            res = conn.execute(
                BENCHES.insert().values(
                    provider=b.provider,
                    target=b.target,
                    gpu=b.gpu,
                    healthy=b.healthy,
                    measured_at=b.measured_at,
                    body=b.model_dump(mode="json"),
                )
            )
            return int(res.inserted_primary_key[0])

    def benchmarks(
        self, provider: str | None = None, target: str | None = None, latest_only: bool = True
    ) -> list[Benchmark]:
        """Benchmarks newest first; with ``latest_only`` one per (provider, target)."""
        q = sa.select(BENCHES.c.provider, BENCHES.c.target, BENCHES.c.body)
        if provider is not None:
            q = q.where(BENCHES.c.provider == provider)
        if target is not None:
            q = q.where(BENCHES.c.target == target)
        q = q.order_by(BENCHES.c.measured_at.desc(), BENCHES.c.id.desc())
        out: list[Benchmark] = []
        seen: set[tuple[str, str]] = set()
        with self._tx(write=False) as conn:
            for prov, tgt, body in conn.execute(q):
                if latest_only:
                    if (prov, tgt) in seen:
                        continue
                    seen.add((prov, tgt))
                out.append(Benchmark.model_validate(body))
        return out

    def _insert_fn(self) -> Any:
        return sqlite_dialect.insert if self.is_sqlite else pg_dialect.insert

    def set_node_health(self, provider: str, node: str, healthy: bool, reason: str = "") -> None:
        stmt = self._insert_fn()(HEALTH).values(
            provider=provider, node=node, healthy=healthy, reason=reason, updated_at=utcnow()
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=["provider", "node"],
            set_={
                "healthy": stmt.excluded.healthy,
                "reason": stmt.excluded.reason,
                "updated_at": stmt.excluded.updated_at,
            },
        )
        with self._tx() as conn:
            conn.execute(stmt)

    def unhealthy_nodes(self, provider: str | None = None) -> dict[tuple[str, str], str]:
        q = sa.select(HEALTH.c.provider, HEALTH.c.node, HEALTH.c.reason).where(HEALTH.c.healthy.is_(False))
        if provider is not None:
            q = q.where(HEALTH.c.provider == provider)
        with self._tx(write=False) as conn:
            return {(p, n): r for p, n, r in conn.execute(q)}

    # ------------------------------------------------------------------ tenants and tokens

    @staticmethod
    def _tenant(row: RowMapping) -> Tenant:
        return Tenant(
            name=row["name"],
            monthly_budget_usd=row["monthly_budget_usd"],
            max_gpus=row["max_gpus"],
            created_at=row["created_at"],
        )

    @staticmethod
    def _token(row: RowMapping) -> TokenInfo:
        return TokenInfo(
            id=row["id"],
            tenant=row["tenant"],
            role=row["role"],
            created_at=row["created_at"],
            revoked=row["revoked"],
            label=row["label"],
        )

    def create_tenant(self, t: Tenant) -> Tenant:
        try:
            with self._tx() as conn:
                conn.execute(TENANTS.insert().values(**t.model_dump()))
        except sa.exc.IntegrityError as exc:
            raise ConflictError(f"tenant {t.name} already exists") from exc
        return self.get_tenant(t.name)

    def get_tenant(self, name: str) -> Tenant:
        with self._tx(write=False) as conn:
            row = conn.execute(sa.select(TENANTS).where(TENANTS.c.name == name)).mappings().first()
        if row is None:
            raise NotFoundError(f"tenant {name} not found")
        return self._tenant(row)

    def list_tenants(self) -> list[Tenant]:
        with self._tx(write=False) as conn:
            return [self._tenant(r) for r in conn.execute(sa.select(TENANTS).order_by(TENANTS.c.name)).mappings()]

    def update_tenant(self, name: str, **fields: Any) -> Tenant:
        unknown = set(fields) - TENANT_FIELDS
        if unknown:
            raise StoreError(f"not tenant fields: {', '.join(sorted(unknown))}")
        with self._tx() as conn:
            n = conn.execute(TENANTS.update().where(TENANTS.c.name == name).values(**fields)).rowcount if fields else 1
        if not n:
            raise NotFoundError(f"tenant {name} not found")
        return self.get_tenant(name)

    def create_token(self, tenant: str, role: Role = Role.user, label: str = "") -> tuple[TokenInfo, str]:
        """A new API token; the plaintext is returned once and only its SHA-256 is stored."""
        plaintext = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token_id = "tok_" + secrets.token_hex(8)
        ensure = (
            self._insert_fn()(TENANTS)
            .values(name=tenant, created_at=utcnow())
            .on_conflict_do_nothing(index_elements=["name"])
        )
        with self._tx() as conn:
            conn.execute(ensure)
            conn.execute(
                TOKENS.insert().values(
                    id=token_id,
                    tenant=tenant,
                    role=Role(role).value,
                    token_hash=_hash_token(plaintext),
                    label=label,
                    created_at=utcnow(),
                    revoked=False,
                )
            )
            row = conn.execute(sa.select(TOKENS).where(TOKENS.c.id == token_id)).mappings().one()
        return self._token(row), plaintext

    def verify_token(self, plaintext: str) -> TokenInfo | None:
        """The token's info, or None when unknown or revoked (one indexed lookup)."""
        digest = _hash_token(plaintext)
        with self._tx(write=False) as conn:
            row = conn.execute(sa.select(TOKENS).where(TOKENS.c.token_hash == digest)).mappings().first()
        # The lookup is by hash, so timing reveals nothing of the plaintext; compare anyway, in constant time.
        if row is None or not hmac.compare_digest(row["token_hash"], digest) or row["revoked"]:
            return None
        return self._token(row)

    def list_tokens(self, tenant: str | None = None) -> list[TokenInfo]:
        q = sa.select(TOKENS)
        if tenant is not None:
            q = q.where(TOKENS.c.tenant == tenant)
        with self._tx(write=False) as conn:
            return [self._token(r) for r in conn.execute(q.order_by(TOKENS.c.created_at, TOKENS.c.id)).mappings()]

    def revoke_token(self, token_id: str) -> None:
        with self._tx() as conn:
            n = conn.execute(TOKENS.update().where(TOKENS.c.id == token_id).values(revoked=True)).rowcount
        if not n:
            raise NotFoundError(f"token {token_id} not found")

    # ------------------------------------------------------------------ operations

    def ping(self) -> bool:
        """True when the database answers (readiness probes)."""
        with self._tx(write=False) as conn:
            conn.execute(sa.text("SELECT 1"))
        return True

    def counts(self) -> dict[str, Any]:
        """For metrics: jobs by state, placements made (transitions to provisioning), and
        allocations as (provider, state, count) rows."""
        with self._tx(write=False) as conn:
            by_state = dict(conn.execute(sa.select(JOBS.c.state, sa.func.count()).group_by(JOBS.c.state)).all())
            placements = conn.execute(
                sa.select(sa.func.count()).select_from(EVENTS).where(EVENTS.c.to_state == JobState.provisioning.value)
            ).scalar_one()
            allocs = conn.execute(
                sa.select(ALLOCS.c.provider, ALLOCS.c.state, sa.func.count()).group_by(
                    ALLOCS.c.provider, ALLOCS.c.state
                )
            ).all()
        return {"jobs": by_state, "placements": placements, "allocations": [tuple(r) for r in allocs]}

    # ------------------------------------------------------------------ spend and usage

    def tenant_spend(self, tenant: str, since: datetime, now: datetime | None = None) -> float:
        """USD a tenant has spent since ``since``.

        The sum of ``spent_usd`` of the tenant's jobs updated since then (what the
        job layer has booked), plus the accrued cost of its allocations that are
        billing now (pending or running): ``usd_per_hour`` × hours from
        max(allocation created, since) to now. The job layer books an attempt's cost
        into ``spent_usd`` when the allocation ends, so nothing is counted twice.
        """
        now = as_utc(now or utcnow())
        since = as_utc(since)
        with self._tx(write=False) as conn:
            booked = conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(JOBS.c.spent_usd), 0.0)).where(
                    JOBS.c.tenant == tenant, JOBS.c.updated_at >= since
                )
            ).scalar()
            live = conn.execute(
                sa.select(ALLOCS.c.usd_per_hour, ALLOCS.c.created_at)
                .join(JOBS, JOBS.c.id == ALLOCS.c.job_id)
                .where(JOBS.c.tenant == tenant, ALLOCS.c.state.in_(BILLING_STATES))
            ).all()
        accrued = 0.0
        for usd_per_hour, created_at in live:
            start = max(as_utc(created_at), since)
            accrued += usd_per_hour * max((now - start).total_seconds(), 0.0) / 3600.0
        return float(booked or 0.0) + accrued

    def gpus_held(self, tenant: str) -> int:
        """GPUs of the tenant's jobs that hold resources now (provisioning or running)."""
        with self._tx(write=False) as conn:
            value = conn.execute(
                sa.select(sa.func.coalesce(sa.func.sum(JOBS.c.gpus), 0)).where(
                    JOBS.c.tenant == tenant,
                    JOBS.c.state.in_([JobState.provisioning.value, JobState.running.value]),
                )
            ).scalar()
        return int(value or 0)

    def job_usage(self, since: datetime | None = None, now: datetime | None = None) -> list[dict[str, Any]]:
        """Per job created since ``since``: tenant, state, gpus, gpu_hours, spent_usd, created_at.

        GPU-hours are the job's GPUs × the hours its allocations lasted (created to
        last update when ended; to now while live), for rent/hybrid/own advice.
        """
        now = as_utc(now or utcnow())
        jq = sa.select(JOBS.c.id, JOBS.c.tenant, JOBS.c.state, JOBS.c.gpus, JOBS.c.spent_usd, JOBS.c.created_at)
        if since is not None:
            jq = jq.where(JOBS.c.created_at >= since)
        aq = sa.select(ALLOCS.c.job_id, ALLOCS.c.state, ALLOCS.c.created_at, ALLOCS.c.updated_at)
        if since is not None:
            aq = aq.join(JOBS, JOBS.c.id == ALLOCS.c.job_id).where(JOBS.c.created_at >= since)
        with self._tx(write=False) as conn:
            jobs = conn.execute(jq.order_by(JOBS.c.created_at, JOBS.c.id)).all()
            allocs = conn.execute(aq).all()
        hours: dict[str, float] = {}
        for job_id, state, created_at, updated_at in allocs:
            if state == AllocationState.intent.value:
                continue  # never reached the provider
            end = now if state in LIVE_ALLOCATION_STATES else as_utc(updated_at)
            hours[job_id] = hours.get(job_id, 0.0) + max((end - as_utc(created_at)).total_seconds(), 0) / 3600
        return [
            {
                "job_id": jid,
                "tenant": tenant,
                "state": state,
                "gpus": gpus,
                "hours": hours.get(jid, 0.0),
                "gpu_hours": gpus * hours.get(jid, 0.0),
                "spent_usd": spent,
                "created_at": as_utc(created),
            }
            for jid, tenant, state, gpus, spent, created in jobs
        ]


def open_store(url: str, migrate: bool = True) -> Store:
    """A Store on ``url``, migrated to the newest schema unless ``migrate`` is False."""
    store = Store(url)
    if migrate:
        store.migrate()
    return store


__all__ = ["MIGRATIONS_DIR", "Store", "make_engine", "open_store"]
