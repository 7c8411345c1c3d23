"""Jobs and allocations in the store: jobs with their events and idempotency keys, the allocations
providers handed out for them, and what they cost (spend, GPUs held, usage).

Rows become :class:`~broker.models.Job`, :class:`~broker.models.JobEvent` and
:class:`~broker.models.Allocation` through ``model_validate(row, from_attributes=True)``: the table
columns carry the models' field names (broker/tables.py), so there is no mapper to keep in step.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Row

from broker.errors import ConflictError, LockstepError, NotFoundError, SpecError, StoreError
from broker.models import (
    ALLOWED_TRANSITIONS,
    CURSOR_PATTERN,
    Allocation,
    AllocationState,
    Job,
    JobEvent,
    JobSpec,
    JobState,
    QuoteOption,
    accrues,
    as_utc,
    billing_start,
    utcnow,
)
from broker.store.engine import Database, JSONText
from broker.tables import (
    LIVE_ALLOCATION_STATES,
    AllocationRow,
    IdempotencyKeyRow,
    JobEventRow,
    JobLogRow,
    JobRow,
    table_of,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

JOBS = table_of(JobRow)
EVENTS = table_of(JobEventRow)
ALLOCS = table_of(AllocationRow)
IDEM = table_of(IdempotencyKeyRow)
LOGS = table_of(JobLogRow)
# Statements built once (SQLAlchemy then compiles each once): a statement built per call with its values
# inlined costs more to build and to key its compiled-SQL cache than the write itself. A placement's five
# (COUNT_ATTEMPT, INSERT_ALLOC, LAUNCH_ALLOC, _move_if's, INSERT_EVENT) are compiled once per engine and run as
# driver SQL (Database._prepare, _run): SQLAlchemy's per-statement path cost several times the driver's execute.
INSERT_JOB = JOBS.insert()
INSERT_EVENT = EVENTS.insert()
INSERT_IDEM = IDEM.insert()
INSERT_ALLOC = ALLOCS.insert()
EVENT_KEYS = ("job_id", "at", "from_state", "to_state", "reason", "data")  # what _insert_event writes
SELECT_JOB = sa.select(JOBS).where(JOBS.c.id == sa.bindparam("job_key"))
SELECT_JOB_LOCKED = SELECT_JOB.with_for_update()
SELECT_EVENTS = sa.select(EVENTS).where(EVENTS.c.job_id == sa.bindparam("job_key")).order_by(EVENTS.c.id)
SELECT_ALLOC = sa.select(ALLOCS).where(ALLOCS.c.id == sa.bindparam("alloc_key"))
# UPDATEs whose SET clause comes from the parameters' keys (compiled once per set of keys).
UPDATE_JOB = JOBS.update().where(JOBS.c.id == sa.bindparam("job_key"))
UPDATE_ALLOC = ALLOCS.update().where(ALLOCS.c.id == sa.bindparam("alloc_key"))
UPDATE_ALLOC_IF = UPDATE_ALLOC.where(ALLOCS.c.state.in_(sa.bindparam("alloc_states", expanding=True)))

# The batch claim (claim_many): pending → placing for the jobs still pending, their rows returned by the UPDATE.
CLAIM_JOBS = (JOBS.update()
              .where(JOBS.c.id.in_(sa.bindparam("job_ids", expanding=True)), JOBS.c.state == JobState.pending.value)
              .values(state=JobState.placing.value, claimed_by=sa.bindparam("worker"),
                      claimed_at=sa.bindparam("claimed_at"), reason=sa.bindparam("why"),
                      updated_at=sa.bindparam("now"))
              .returning(*JOBS.c))

# The attempt counter, counted by the UPDATE itself (on PostgreSQL it takes the row's lock): no read first.
COUNT_ATTEMPT = (JOBS.update().where(JOBS.c.id == sa.bindparam("job_key"))
                 .values(attempts=JOBS.c.attempts + 1, updated_at=sa.bindparam("now"))
                 .returning(JOBS.c.attempts))
# The launch's allocation write: a compare-and-set on ``intent``, returning the state it wrote (no read-back).
LAUNCH_ALLOC = UPDATE_ALLOC.where(ALLOCS.c.state == AllocationState.intent.value).returning(ALLOCS.c.state)
# A job's move placing → provisioning as one conditional UPDATE (on PostgreSQL the row lock is taken and the
# state checked again under it, as SELECT ... FOR UPDATE then a check would), returning the row as written
# without its spec (the caller holds it: a job's spec never changes after submission).
JOB_COLUMNS_BUT_SPEC = [c for c in JOBS.c if c.name != "spec"]
assert JobState.provisioning in ALLOWED_TRANSITIONS[JobState.placing]  # what _move_placed does without asking


@functools.cache
def _move_if(from_state: JobState, keys: frozenset[str]) -> tuple[Any, list[sa.Column[Any]]]:
    """``UPDATE jobs SET <keys> WHERE id = :job_key AND state = from_state RETURNING <the rest but spec>``, and the
    columns it returns, built once per set of keys (a placement's are always the same few): what it sets is known
    without reading it back."""
    rest = [c for c in JOB_COLUMNS_BUT_SPEC if c.name not in keys]
    return (JOBS.update().where(JOBS.c.id == sa.bindparam("job_key"), JOBS.c.state == from_state.value)
            .values({k: sa.bindparam(f"v_{k}") for k in keys}).returning(*rest)), rest


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
LIVE_STATES: tuple[AllocationState, ...] = tuple(AllocationState(s) for s in LIVE_ALLOCATION_STATES)
# Allocations that may be billing now: live ones the market started, and a draining one (superseded at the
# market's notice, checkpointing until its deadline).
BILLING_STATES: tuple[str, ...] = (AllocationState.pending.value, AllocationState.running.value,
                                   AllocationState.draining.value)
# What the poll loop follows: the live allocations and the draining ones (to their end, to be booked).
FOLLOWED_STATES: tuple[AllocationState, ...] = (*LIVE_STATES, AllocationState.draining)
ID_CHUNK = 500  # ids per IN (...) list: under SQLite's and PostgreSQL's bind parameter limits


@dataclass(frozen=True)
class LaunchRecord:
    """What :meth:`JobStore.record_launch` wrote, or found another writer had decided: the allocation's state
    now, whether this launch's record won over its intent, and the job as moved (None when it was not: see
    ``job_state``)."""

    alloc_state: AllocationState
    recorded: bool
    job: Job | None
    job_state: JobState


def _job(row: Row[Any] | dict[str, Any], events: list[JobEvent] | None = None) -> Job:
    job = Job.model_validate(row, from_attributes=True)
    if events:
        job.events = events
    return job


def _jobs_sharing_specs(rows: Iterable[Row[Any]]) -> list[Job]:
    """Jobs from rows, each distinct spec (by its stored fingerprint) validated once: a sweep or a batch
    of one spec reads as one spec parse, not one per job. Jobs of one spec then share the JobSpec object
    (models are not changed in place here: a changed spec is a ``model_copy``)."""
    specs: dict[str, JobSpec] = {}
    out = []
    for r in rows:
        spec = specs.get(r.fingerprint)
        if spec is None:
            job = _job(r)
            specs[r.fingerprint] = job.spec
        else:
            job = _job({**r._mapping, "spec": spec})
        out.append(job)
    return out


def _alloc(row: Row[Any]) -> Allocation:
    return Allocation.model_validate(row, from_attributes=True)


class JobStore(Database):
    """Jobs, their events and allocations; spend and usage."""

    # ------------------------------------------------------------------ jobs: rows

    @staticmethod
    def _job_values(fields: dict[str, Any], read: dict[str, Any] | None = None) -> dict[str, Any]:
        """Checked job fields, their JSON as stored. With ``read`` (for a :class:`Prepared` statement): the JSON
        fields are serialised here, once (:class:`JSONText`), and ``read`` gets each as it reads back."""
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
            if read is not None and out["placement"] is not None:  # JSON-native (mode="json"): reads back as it is
                read["placement"] = out["placement"]
                out["placement"] = JSONText(json.dumps(out["placement"]))
        if "decision" in out:
            text = json.dumps(out["decision"] or {}, default=str)
            out["decision"] = json.loads(text)
            if read is not None:
                read["decision"], out["decision"] = out["decision"], JSONText(text)
        return out

    def _events_in(self, conn: Connection, job_id: str) -> list[JobEvent]:
        rows = conn.execute(SELECT_EVENTS, {"job_key": job_id})
        return [JobEvent.model_validate(r, from_attributes=True) for r in rows]

    def _insert_event(
        self,
        conn: Connection,
        job_id: str,
        from_state: JobState | None,
        to_state: JobState,
        reason: str,
        data: dict[str, Any] | None,
        at: datetime,
    ) -> JobEvent:
        """Write one event; returns it as stored."""
        text = json.dumps(data, default=str) if data else "{}"
        stored = json.loads(text) if data else {}
        self._run(  # one statement, compiled once for this engine, run as driver SQL
            conn,
            self._prepare(INSERT_EVENT, EVENT_KEYS),
            {
                "job_id": job_id,
                "at": at,
                "from_state": from_state.value if from_state else None,
                "to_state": to_state.value,
                "reason": reason,
                "data": JSONText(text),  # serialised once
            },
        )
        return JobEvent(job_id=job_id, at=as_utc(at), from_state=from_state, to_state=to_state, reason=reason,
                        data=stored)

    def _job_row(self, conn: Connection, job_id: str, lock: bool = False) -> Row[Any]:
        q = SELECT_JOB_LOCKED if lock and not self.is_sqlite else SELECT_JOB
        row = conn.execute(q, {"job_key": job_id}).first()
        if row is None:
            raise NotFoundError(f"job {job_id} not found")
        return row

    def _full_job(self, conn: Connection, job_id: str) -> Job:
        return _job(self._job_row(conn, job_id), self._events_in(conn, job_id))

    # ------------------------------------------------------------------ jobs

    def create_job(self, job: Job, idempotency_key: str | None = None) -> tuple[Job, bool]:
        """Store a new job and its first event; returns (job, created).

        With an idempotency key (scoped to the tenant), a repeat with the same spec
        returns the existing job and False; the same key with another spec is a
        ConflictError.

        One short write transaction (SQLite: behind this process's other writers, never behind a
        provider call); the new job is returned as written, not read back.
        """
        spec_json = job.spec.model_dump(mode="json")
        fingerprint = job.spec.fingerprint(spec_json)
        try:
            with self._tx() as conn:
                if idempotency_key:
                    existing = self._idem_lookup(conn, job.tenant, idempotency_key, fingerprint)
                    if existing is not None:
                        return existing, False
                return self._insert_job(conn, job, spec_json, fingerprint, idempotency_key), True
        except sa.exc.IntegrityError as exc:
            # Lost a race on the same key (PostgreSQL), or the job id exists.
            if idempotency_key:
                with self._tx(write=False) as conn:
                    existing = self._idem_lookup(conn, job.tenant, idempotency_key, fingerprint)
                    if existing is not None:
                        return existing, False
            raise ConflictError(f"job {job.id} already exists") from exc

    def create_jobs(self, items: Sequence[tuple[Job, str | None]]) -> list[tuple[Job, bool] | LockstepError]:
        """:meth:`create_job` for many submissions in one transaction (a group commit): per item, what
        ``create_job`` would return, or the error it would raise. Same rules: a key repeated with the same
        spec (in the store or earlier in ``items``) gives the first job and False; with another spec, a
        ConflictError for that item alone. When the batch cannot be written as one (another writer won a
        race on a key, an id exists), each item is written on its own, so no item fails for another's sake.
        """
        if len(items) == 1:
            return [self._create_one(*items[0])]
        out: list[tuple[Job, bool] | LockstepError] = []
        jobs: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        keys: list[dict[str, Any]] = []
        mine: dict[tuple[str, str], tuple[str, int]] = {}  # keys used earlier in this batch → (fingerprint, item)
        try:
            with self._tx() as conn:
                for job, key in items:  # in order, as one after the other would: a repeat sees the first
                    spec_json = job.spec.model_dump(mode="json")
                    fingerprint = job.spec.fingerprint(spec_json)
                    if key:
                        earlier = mine.get((job.tenant, key))
                        if earlier is not None:
                            first = out[earlier[1]]
                            out.append(ConflictError("idempotency key already used for a different job spec")
                                       if earlier[0] != fingerprint else
                                       (first[0], False) if isinstance(first, tuple) else first)
                            continue
                        try:
                            existing = self._idem_lookup(conn, job.tenant, key, fingerprint)
                        except ConflictError as exc:
                            out.append(exc)
                            continue
                        if existing is not None:
                            out.append((existing, False))
                            continue
                        mine[(job.tenant, key)] = (fingerprint, len(out))
                    row, event, idem, written = self._job_rows(job, spec_json, fingerprint, key)
                    jobs.append(row)
                    events.append(event)
                    if idem is not None:
                        keys.append(idem)
                    out.append((written, True))
                # One statement per table for the whole batch (executemany).
                if jobs:
                    conn.execute(INSERT_JOB, jobs)
                    conn.execute(INSERT_EVENT, events)
                if keys:
                    conn.execute(INSERT_IDEM, keys)
        except sa.exc.IntegrityError:
            return [self._create_one(job, key) for job, key in items]
        return out

    def _create_one(self, job: Job, key: str | None) -> tuple[Job, bool] | LockstepError:
        try:
            return self.create_job(job, key)
        except LockstepError as exc:
            return exc

    def _idem_lookup(self, conn: Connection, tenant: str, key: str, fingerprint: str) -> Job | None:
        row = conn.execute(sa.select(IDEM).where(IDEM.c.tenant == tenant, IDEM.c.key == key)).first()
        if row is None:
            return None
        if row.fingerprint != fingerprint:
            raise ConflictError("idempotency key already used for a different job spec")
        return self._full_job(conn, row.job_id)

    def _job_rows(self, job: Job, spec_json: dict[str, Any], fingerprint: str,
                  key: str | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None, Job]:
        """A new job's row, its first event's, its idempotency key's (or None), and the job as stored."""
        deadline = job.deadline or job.spec.deadline_at(job.created_at)
        decision = json.loads(json.dumps(job.decision, default=str)) if job.decision else {}
        row = {
            "id": job.id,
            "tenant": job.tenant,
            "state": job.state.value,
            "reason": job.reason,
            "spec": spec_json,
            "fingerprint": fingerprint,
            "placement": job.placement.model_dump(mode="json") if job.placement else None,
            "decision": decision,
            "gpus": job.spec.gpus,
            "created_at": job.created_at,
            "updated_at": job.updated_at,
            "deadline": deadline,
            "attempts": job.attempts,
            "preemptions": job.preemptions,
            "spent_usd": job.spent_usd,
        }
        reason = job.reason or "submitted"
        event = {"job_id": job.id, "at": job.created_at, "from_state": None, "to_state": job.state.value,
                 "reason": reason, "data": {}}
        idem = None
        if key:
            idem = {"tenant": job.tenant, "key": key, "fingerprint": fingerprint, "job_id": job.id,
                    "created_at": utcnow()}
        stored = job.model_copy(update={
            "deadline": deadline, "decision": decision, "created_at": as_utc(job.created_at),
            "updated_at": as_utc(job.updated_at),
            "events": [JobEvent(job_id=job.id, at=job.created_at, to_state=job.state, reason=reason)],
        })
        return row, event, idem, stored

    def _insert_job(self, conn: Connection, job: Job, spec_json: dict[str, Any], fingerprint: str,
                    key: str | None) -> Job:
        """Insert the job, its first event and its idempotency key; returns the job as stored."""
        row, event, idem, stored = self._job_rows(job, spec_json, fingerprint, key)
        conn.execute(INSERT_JOB, row)
        conn.execute(INSERT_EVENT, event)
        if idem is not None:
            conn.execute(INSERT_IDEM, idem)
        return stored

    def get_job(self, job_id: str, tenant: str | None = None) -> Job:
        """The job with its events; NotFoundError when absent or another tenant's."""
        with self._tx(write=False) as conn:
            row = self._job_row(conn, job_id)
            if tenant is not None and row.tenant != tenant:
                raise NotFoundError(f"job {job_id} not found")
            return _job(row, self._events_in(conn, job_id))

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
            rows = conn.execute(q).all()
        jobs = [_job(r) for r in rows[:limit]]
        nxt = None
        if len(rows) > limit:
            last = jobs[-1]
            nxt = f"{(as_utc(last.created_at) - _EPOCH) // timedelta(microseconds=1)}.{last.id}"
        return jobs, nxt

    @staticmethod
    def _decode_cursor(cursor: str) -> tuple[datetime, str]:
        """Any text of CURSOR_PATTERN is a place in the keyset (jobs created before it), so the API's
        document can say exactly which cursors it accepts (issue 23)."""
        m = re.fullmatch(CURSOR_PATTERN, cursor)
        if m is None:
            raise SpecError("cursor", "not a cursor returned by list_jobs")
        return _EPOCH + timedelta(microseconds=int(m.group(1))), m.group(2)

    def transition(
        self,
        job_id: str,
        to_state: JobState,
        reason: str = "",
        data: dict[str, Any] | None = None,
        expected: set[JobState] | None = None,
        *,
        events: bool = True,
        **fields: Any,
    ) -> Job:
        """Move a job to ``to_state`` and record the event, atomically (``events``: see :meth:`_move_in`).

        ConflictError when the move is not in ALLOWED_TRANSITIONS or the job's
        current state is not in ``expected``. Extra ``fields`` (placement,
        attempts, preemptions, decision, spent_usd, claimed_by…) are set too.

        This is how a broker claims a job: ``transition(id, placing, expected={pending},
        claimed_by=worker)`` locks the job's row (PostgreSQL ``FOR UPDATE``), so of two
        replicas claiming the same job one wins and the other gets a ConflictError.
        """
        values = self._job_values(fields)
        with self._tx() as conn:
            return self._move_in(conn, job_id, JobState(to_state), reason, data, expected, values, events=events)

    def _move_in(self, conn: Connection, job_id: str, to_state: JobState, reason: str, data: dict[str, Any] | None,
                 expected: set[JobState] | None, values: dict[str, Any], *, events: bool = True) -> Job:
        """:meth:`transition` inside the caller's transaction (``values``: checked job fields). With
        ``events`` False the job comes back with only the event this move wrote, not its history (one read
        fewer: the writers of a placement do not need it)."""
        row = self._job_row(conn, job_id, lock=True)
        current = JobState(row.state)
        if expected is not None and current not in expected:
            raise ConflictError(
                f"job {job_id} is {current.value}, expected {'/'.join(sorted(s.value for s in expected))}"
            )
        if to_state not in ALLOWED_TRANSITIONS[current]:
            raise ConflictError(f"job {job_id}: {current.value} → {to_state.value} is not allowed")
        now = utcnow()
        values = {**values, "state": to_state.value, "reason": reason, "updated_at": now}
        history = self._events_in(conn, job_id) if events else []
        conn.execute(UPDATE_JOB, {"job_key": job_id, **values})
        event = self._insert_event(conn, job_id, current, to_state, reason, data, now)
        # The job as now stored: the row read under the lock with these values on top (not read again).
        after = {**row._mapping, **{k: as_utc(v) if isinstance(v, datetime) else v for k, v in values.items()}}
        return _job(after, [*history, event])

    def claim_many(self, job_ids: Sequence[str], worker: str, at: datetime) -> list[Job]:
        """Claim every job of ``job_ids`` still pending for ``worker`` (pending → placing, with its event), in one
        transaction: one conditional UPDATE (on PostgreSQL it takes each row's lock, so of two replicas claiming
        the same job one wins), its rows returned by the UPDATE itself (no read-back), one INSERT of the events.
        Returns the jobs it claimed (without their history), in the order asked."""
        if not job_ids:
            return []
        now = utcnow()
        reason = f"claimed by {worker}"
        with self._tx() as conn:
            rows = conn.execute(CLAIM_JOBS, {"job_ids": list(job_ids), "worker": worker, "claimed_at": at,
                                             "why": reason, "now": now}).all()
            if rows:
                conn.execute(INSERT_EVENT, [{"job_id": r.id, "at": now, "from_state": JobState.pending.value,
                                             "to_state": JobState.placing.value, "reason": reason,
                                             "data": {"worker": worker}} for r in rows])
        order = {job_id: i for i, job_id in enumerate(job_ids)}
        jobs = _jobs_sharing_specs(sorted(rows, key=lambda r: order.get(r.id, 0)))
        for job in jobs:
            job.events = [JobEvent(job_id=job.id, at=as_utc(now), from_state=JobState.pending,
                                   to_state=JobState.placing, reason=reason, data={"worker": worker})]
        return jobs

    def update_job(self, job_id: str, **fields: Any) -> Job:
        """Set job fields without a state change (no event)."""
        values = self._job_values(fields)
        with self._tx() as conn:
            self._job_row(conn, job_id, lock=True)
            values["updated_at"] = utcnow()
            conn.execute(UPDATE_JOB, {"job_key": job_id, **values})
            return self._full_job(conn, job_id)

    def next_attempt(self, job_id: str) -> int:
        """Count one more launch attempt of the job, in one short write; returns the new count."""
        with self._tx() as conn:
            row = self._job_row(conn, job_id, lock=True)
            attempt = int(row.attempts) + 1
            conn.execute(UPDATE_JOB, {"job_key": job_id, "attempts": attempt, "updated_at": utcnow()})
            return attempt

    def events(self, job_id: str) -> list[JobEvent]:
        with self._tx(write=False) as conn:
            self._job_row(conn, job_id)
            return self._events_in(conn, job_id)

    def jobs_in_states(self, states: Iterable[JobState], ids: Iterable[str] | None = None) -> list[Job]:
        """Jobs in any of ``states`` (without events), oldest first; with ``ids``, only those of them."""
        values = [JobState(s).value for s in states]
        if not values:
            return []
        q = sa.select(JOBS).where(JOBS.c.state.in_(values))
        if ids is None:
            with self._tx(write=False) as conn:
                return _jobs_sharing_specs(conn.execute(q.order_by(JOBS.c.created_at, JOBS.c.id)))
        wanted = list(dict.fromkeys(ids))
        rows: list[Row[Any]] = []
        with self._tx(write=False) as conn:
            for i in range(0, len(wanted), ID_CHUNK):
                rows.extend(conn.execute(q.where(JOBS.c.id.in_(wanted[i:i + ID_CHUNK]))))
        rows.sort(key=lambda r: (as_utc(r.created_at), r.id))
        return _jobs_sharing_specs(rows)

    def job_heads(self, state: JobState, changed_since: datetime | None = None) -> list[tuple[str, datetime]]:
        """(id, updated_at) of the jobs in ``state``, oldest first: what a placement pass looks over
        before it reads in full only the jobs it will try (no spec parsed, no model built). With
        ``changed_since``: only those updated since then (new, requeued, or noted)."""
        q = sa.select(JOBS.c.id, JOBS.c.updated_at).where(JOBS.c.state == JobState(state).value)
        if changed_since is not None:
            q = q.where(JOBS.c.updated_at >= changed_since)
        q = q.order_by(JOBS.c.created_at, JOBS.c.id)
        with self._tx(write=False) as conn:
            return [(r[0], r[1]) for r in conn.execute(q)]

    def note_reasons(self, reasons: dict[str, str], state: JobState = JobState.pending) -> int:
        """Set why each job waits (``{job id: reason}``), in one transaction; only jobs still in ``state``
        (a job moved meanwhile keeps what its mover wrote). No event. Returns how many changed."""
        if not reasons:
            return 0
        now = utcnow()
        q = (JOBS.update().where(JOBS.c.id == sa.bindparam("job_id"), JOBS.c.state == JobState(state).value)
             .values(reason=sa.bindparam("why"), updated_at=now))
        with self._tx() as conn:
            res = conn.execute(q, [{"job_id": k, "why": v} for k, v in reasons.items()])
        return int(res.rowcount or 0)

    # ------------------------------------------------------------------ allocations

    def add_allocation(self, alloc: Allocation) -> Allocation:
        """Record an allocation (the intent, before the provider is called).

        ConflictError when the id exists or the job already holds a live allocation.
        """
        values = alloc.model_dump(mode="python")
        values["state"] = AllocationState(values["state"]).value
        try:
            with self._tx() as conn:
                self._job_row(conn, alloc.job_id)
                conn.execute(INSERT_ALLOC, values)
            return alloc.model_copy(update={"state": AllocationState(values["state"]),  # as written
                                            "created_at": as_utc(alloc.created_at),
                                            "updated_at": as_utc(alloc.updated_at)})
        except sa.exc.IntegrityError as exc:
            raise ConflictError(
                f"allocation {alloc.id}: the id exists or job {alloc.job_id} already holds a live allocation"
            ) from exc

    def open_attempt(self, job_id: str, build: Callable[[int], Allocation]) -> Allocation:
        """Count one more launch attempt of the job and write its intent (``build(attempt)``), in one
        transaction: a crash leaves both or neither, so an attempt's token never reaches a provider
        unrecorded, and is never reused. Two statements: the counter is counted by its UPDATE (``RETURNING``,
        under the row's lock on PostgreSQL), then the intent's INSERT. Returns the intent as written (not read
        back).

        ConflictError when the job already holds a live allocation (nothing is written then)."""
        try:
            with self._tx() as conn:
                counted = self._run(conn, self._prepare(COUNT_ATTEMPT, returns=[JOBS.c.attempts]),
                                    {"job_key": job_id, "now": utcnow()})
                if counted is None:
                    raise NotFoundError(f"job {job_id} not found")
                alloc = build(int(counted["attempts"]))
                values = alloc.model_dump(mode="python")
                values["state"] = AllocationState(values["state"]).value
                self._run(conn, self._prepare(INSERT_ALLOC, tuple(values)), values)
        except sa.exc.IntegrityError as exc:
            raise ConflictError(f"job {job_id} already holds a live allocation") from exc
        return alloc.model_copy(update={"created_at": as_utc(alloc.created_at), "updated_at": as_utc(alloc.updated_at)})

    def record_launch(self, alloc_id: str, fields: dict[str, Any], job_id: str, reason: str,
                      data: dict[str, Any], *, spec: JobSpec | None = None, **job_fields: Any) -> LaunchRecord:
        """A launch that went through: its intent becomes the launched allocation (``fields``, a compare-and-set
        on ``intent``) and its job moves placing → provisioning (``reason``, ``data``, ``job_fields``), in one
        transaction. What another writer decided meanwhile stands and is reported instead: a reconcile that
        gave the intent up (then the job is not moved), one that adopted it, a cancel or requeue of the job.

        Three statements when the launch wins (the usual case): the allocation's conditional UPDATE, the job's
        (``WHERE state = 'placing'``, its row returned), the event's INSERT; nothing is read back. Rows are read
        only to say what another writer decided. ``spec``: the job's spec as the caller holds it (the moved job
        is built with it, not from the stored JSON)."""
        values = {**fields, "updated_at": utcnow()}
        if "state" in values:
            values["state"] = AllocationState(values["state"]).value
        if "resource_ids" in values:
            values["resource_ids"] = [str(r) for r in values["resource_ids"] or []]
        read: dict[str, Any] = {}
        job_values = self._job_values(job_fields, read)
        try:
            with self._tx() as conn:
                wrote = self._run(conn, self._prepare(LAUNCH_ALLOC, tuple(values), returns=[ALLOCS.c.state]),
                                  {"alloc_key": alloc_id, **values})
                won = wrote is not None
                if wrote is not None:
                    state = AllocationState(wrote["state"])
                else:  # another writer decided first: what did it decide?
                    row = self._alloc_row(conn, alloc_id)
                    state = AllocationState(row.state)
                    if state is AllocationState.failed and not row.resource_ids:
                        # given up by a reconcile (its job requeued): the launch belongs to nobody
                        return LaunchRecord(state, False, None, JobState(self._job_row(conn, job_id).state))
                job = self._move_placed(conn, job_id, reason, data, job_values, read, spec)
                if job is None:  # moved by another writer meanwhile (a cancel, a requeue)
                    return LaunchRecord(state, won, None, JobState(self._job_row(conn, job_id).state))
                return LaunchRecord(state, won, job, job.state)
        except sa.exc.IntegrityError as exc:
            raise ConflictError(f"allocation {alloc_id}: its job already holds another live allocation") from exc

    def _move_placed(self, conn: Connection, job_id: str, reason: str, data: dict[str, Any] | None,
                     values: dict[str, Any], read: dict[str, Any], spec: JobSpec | None) -> Job | None:
        """placing → provisioning inside the caller's transaction, as one conditional UPDATE and the event's
        INSERT; the job as written (with only this event), or None when it is no longer placing. ``values``:
        from :meth:`_job_values` with ``read`` (what its JSON fields read back as)."""
        now = utcnow()
        values = {**values, "state": JobState.provisioning.value, "reason": reason, "updated_at": now}
        stmt, rest = _move_if(JobState.placing, frozenset(values))
        got = self._run(conn, self._prepare(stmt, returns=rest),
                        {"job_key": job_id, **{f"v_{k}": v for k, v in values.items()}})
        if got is None:
            return None
        event = self._insert_event(conn, job_id, JobState.placing, JobState.provisioning, reason, data, now)
        # The row as now stored: what the UPDATE returned, with what it set on top (not read back).
        got.update({k: as_utc(v) if isinstance(v, datetime) else v for k, v in values.items()}, **read)
        got["spec"] = spec if spec is not None else self._job_row(conn, job_id).spec
        return _job(got, [event])

    def _alloc_row(self, conn: Connection, alloc_id: str) -> Row[Any]:
        row = conn.execute(SELECT_ALLOC, {"alloc_key": alloc_id}).first()
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
        states = sorted({AllocationState(s).value for s in expected or ()})
        q, params = UPDATE_ALLOC, {"alloc_key": alloc_id, **values}
        if expected is not None:
            q, params["alloc_states"] = UPDATE_ALLOC_IF, states
        try:
            with self._tx() as conn:
                self._alloc_row(conn, alloc_id)
                if not conn.execute(q, params).rowcount:
                    now = self._alloc_row(conn, alloc_id).state  # after the UPDATE: what it lost to
                    raise ConflictError(f"allocation {alloc_id} is {now}, not {' or '.join(states)}: changed meanwhile")
                return _alloc(self._alloc_row(conn, alloc_id))
        except sa.exc.IntegrityError as exc:
            raise ConflictError(f"allocation {alloc_id}: its job already holds another live allocation") from exc

    def get_allocation(self, alloc_id: str) -> Allocation:
        with self._tx(write=False) as conn:
            return _alloc(self._alloc_row(conn, alloc_id))

    def allocations(self, job_id: str | None = None, states: list[AllocationState] | None = None) -> list[Allocation]:
        q = sa.select(ALLOCS)
        if job_id is not None:
            q = q.where(ALLOCS.c.job_id == job_id)
        if states is not None:
            q = q.where(ALLOCS.c.state.in_([AllocationState(s).value for s in states]))
        with self._tx(write=False) as conn:
            return [_alloc(r) for r in conn.execute(q.order_by(ALLOCS.c.created_at, ALLOCS.c.id))]

    def held_offer_ids(self) -> set[str]:
        """Offers that live allocations (intent, pending, running or unknown) and draining ones (still on their
        machines until the market takes them) are on: ids only, no models."""
        q = sa.select(ALLOCS.c.offer_id).where(ALLOCS.c.state.in_([s.value for s in FOLLOWED_STATES])).distinct()
        with self._tx(write=False) as conn:
            return {r[0] for r in conn.execute(q)}

    def provider_allocations(self, provider: str, since: datetime) -> list[Allocation]:
        """``provider``'s allocations changed at ``since`` or later, oldest first (what a market's history reads)."""
        q = (sa.select(ALLOCS).where(ALLOCS.c.provider == provider).where(ALLOCS.c.updated_at >= since)
             .order_by(ALLOCS.c.created_at, ALLOCS.c.id))
        with self._tx(write=False) as conn:
            return [_alloc(r) for r in conn.execute(q)]

    def live_allocations(self) -> list[Allocation]:
        """Allocations that may still hold provider resources: intent, pending, running or unknown."""
        return self.allocations(states=list(LIVE_STATES))

    def followed_allocations(self) -> list[Allocation]:
        """What the poll loop follows: the live allocations and the draining ones (superseded at a notice)."""
        return self.allocations(states=list(FOLLOWED_STATES))

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
            for row in conn.execute(q):
                if resource_id in row.resource_ids:
                    return _alloc(row)
        return None

    def end_allocation(self, alloc_id: str, *, state: AllocationState, reason: str, ended_at: datetime,
                       cost_usd: float, billed_s: float,
                       attrs: dict[str, str] | None = None) -> tuple[Allocation, bool]:
        """Record an allocation as ended (``state``) and book its cost into its job, in one transaction.

        The cost is booked only while the allocation has none (``cost_usd IS NULL``): a second end of the same
        record (a retried release, a reconcile after a crash) changes its state and reason, never the spend.
        ``attrs``: written with the booking (only by the call that books). Returns the allocation and whether
        this call booked it.
        """
        now = utcnow()
        with self._tx() as conn:
            row = self._alloc_row(conn, alloc_id)
            values: dict[str, Any] = {"state": AllocationState(state).value, "reason": reason, "updated_at": now}
            booked = False
            if row.cost_usd is None:
                book = ALLOCS.update().where(ALLOCS.c.id == alloc_id, ALLOCS.c.cost_usd.is_(None)).values(
                    cost_usd=cost_usd, billed_s=billed_s, ended_at=ended_at,
                    **({"attrs": attrs} if attrs is not None else {}))
                booked = bool(conn.execute(book).rowcount)
                if booked and cost_usd:
                    self._job_row(conn, row.job_id, lock=True)
                    conn.execute(JOBS.update().where(JOBS.c.id == row.job_id).values(
                        spent_usd=JOBS.c.spent_usd + cost_usd))
            try:
                conn.execute(ALLOCS.update().where(ALLOCS.c.id == alloc_id).values(**values))
            except sa.exc.IntegrityError as exc:
                raise ConflictError(f"allocation {alloc_id}: its job already holds another live allocation") from exc
            return _alloc(self._alloc_row(conn, alloc_id)), booked

    # ------------------------------------------------------------------ logs kept past the machine

    def rebook_allocation(self, alloc_id: str, *, was_usd: float, cost_usd: float, billed_s: float,
                          ended_at: datetime, attrs: dict[str, str]) -> bool:
        """Book an ended allocation again (its market's record read late): its cost, billed time, end and attrs,
        and the difference into its job's spend, in one transaction — only while it is still booked at
        ``was_usd`` (compare-and-set: two passes confirming one booking move the spend once). ``updated_at``
        stays: the spot plan reads an ended allocation's last change as when it ended."""
        with self._tx() as conn:
            row = self._alloc_row(conn, alloc_id)
            done = conn.execute(ALLOCS.update().where(ALLOCS.c.id == alloc_id, ALLOCS.c.cost_usd == was_usd).values(
                cost_usd=cost_usd, billed_s=billed_s, ended_at=ended_at, attrs=attrs)).rowcount
            if done and cost_usd != was_usd:
                self._job_row(conn, row.job_id, lock=True)
                conn.execute(JOBS.update().where(JOBS.c.id == row.job_id).values(
                    spent_usd=JOBS.c.spent_usd + (cost_usd - was_usd)))
            return bool(done)

    def billing_due(self, key: str, since: datetime) -> list[Allocation]:
        """Ended allocations since ``since`` whose attrs hold ``key`` (the ledger's mark of a booking still to be
        checked against its market's record), oldest first."""
        q = (sa.select(ALLOCS).where(ALLOCS.c.ended_at >= since, ALLOCS.c.cost_usd.is_not(None),
                                     sa.cast(ALLOCS.c.attrs, sa.Text).like(f'%"{key}"%'))
             .order_by(ALLOCS.c.ended_at, ALLOCS.c.id))
        with self._tx(write=False) as conn:
            return [_alloc(r) for r in conn.execute(q) if key in (r.attrs or {})]

    def archive_log(self, alloc_id: str, rank: int, text: str, *, truncated: bool = False) -> None:
        """Keep (or replace) node ``rank``'s log of an allocation. The caller has masked secret values."""
        values = {"text": text, "truncated": truncated, "archived_at": utcnow()}
        with self._tx() as conn:
            job_id = self._alloc_row(conn, alloc_id).job_id
            stmt = self._insert_fn()(LOGS).values(allocation_id=alloc_id, rank=rank, job_id=job_id, **values)
            conn.execute(stmt.on_conflict_do_update(index_elements=["allocation_id", "rank"], set_=values))

    def archived_logs(self, alloc_id: str) -> dict[int, str]:
        """The kept logs of an allocation by rank ({} when none was kept)."""
        with self._tx(write=False) as conn:
            rows = conn.execute(sa.select(LOGS.c.rank, LOGS.c.text).where(LOGS.c.allocation_id == alloc_id)
                                .order_by(LOGS.c.rank)).all()
        return {int(r): str(t) for r, t in rows}

    # ------------------------------------------------------------------ counts, spend and usage

    def counts(self) -> dict[str, Any]:
        """For metrics: jobs by state, placements made (transitions to provisioning), and
        allocations as (provider, state, count) rows."""
        with self._tx(write=False) as conn:
            by_state: dict[str, int] = dict(
                conn.execute(sa.select(JOBS.c.state, sa.func.count()).group_by(JOBS.c.state)).all())
            placements = conn.execute(
                sa.select(sa.func.count()).select_from(EVENTS).where(EVENTS.c.to_state == JobState.provisioning.value)
            ).scalar_one()
            allocs = conn.execute(
                sa.select(ALLOCS.c.provider, ALLOCS.c.state, sa.func.count()).group_by(
                    ALLOCS.c.provider, ALLOCS.c.state
                )
            ).all()
        return {"jobs": by_state, "placements": placements, "allocations": [tuple(r) for r in allocs]}

    def tenant_spend(self, tenant: str, since: datetime, now: datetime | None = None) -> float:
        """USD a tenant has spent since ``since`` (month-to-date: ``since`` is the month's start).

        What its allocations that ended since then cost (booked at their end; the part of one that began
        before ``since`` in proportion to its time), plus what its live ones (pending, running) have accrued
        from max(their start, ``since``) to ``now`` at their price — a live one still queued in its market (never
        seen running) accrues nothing: the same figure ``lockstep tenants list``,
        ``GET /v1/tenants`` and the router's budget check use.
        """
        now = as_utc(now or utcnow())
        since = as_utc(since)
        with self._tx(write=False) as conn:
            ended = conn.execute(
                sa.select(ALLOCS.c.cost_usd, ALLOCS.c.created_at, ALLOCS.c.ended_at, ALLOCS.c.attrs)
                .join(JOBS, JOBS.c.id == ALLOCS.c.job_id)
                .where(JOBS.c.tenant == tenant, ALLOCS.c.ended_at >= since, ALLOCS.c.cost_usd > 0)
            ).all()
            live = conn.execute(
                sa.select(ALLOCS.c.usd_per_hour, ALLOCS.c.created_at, ALLOCS.c.attrs, ALLOCS.c.state)
                .join(JOBS, JOBS.c.id == ALLOCS.c.job_id)
                .where(JOBS.c.tenant == tenant, ALLOCS.c.state.in_(BILLING_STATES))
            ).all()
        total = 0.0
        for cost, created_at, ended_at, attrs in ended:
            start, end = billing_start(created_at, attrs), as_utc(ended_at)
            if start >= since or end <= start:
                total += cost
            else:  # began before the window: the window's share of it
                total += cost * (end - since).total_seconds() / (end - start).total_seconds()
        for usd_per_hour, created_at, attrs, state in live:
            if not accrues(state, attrs):
                continue  # waiting in its market's queue: nothing billed yet
            start = max(billing_start(created_at, attrs), since)
            total += usd_per_hour * max((now - start).total_seconds(), 0.0) / 3600.0
        return total

    def accruing(self, job_ids: Iterable[str], now: datetime | None = None) -> dict[str, float]:
        """What each job's live allocation has cost so far (not booked yet), by job id (absent: nothing live)."""
        ids = list(job_ids)
        if not ids:
            return {}
        now = as_utc(now or utcnow())
        with self._tx(write=False) as conn:
            rows = conn.execute(
                sa.select(ALLOCS.c.job_id, ALLOCS.c.usd_per_hour, ALLOCS.c.created_at, ALLOCS.c.attrs, ALLOCS.c.state)
                .where(ALLOCS.c.job_id.in_(ids), ALLOCS.c.state.in_(BILLING_STATES))
            ).all()
        out: dict[str, float] = {}
        for job_id, usd_per_hour, created_at, attrs, state in rows:
            if not accrues(state, attrs):
                continue  # queued in its market: billing has not begun
            hours = max((now - billing_start(created_at, attrs)).total_seconds(), 0.0) / 3600.0
            out[job_id] = out.get(job_id, 0.0) + usd_per_hour * hours
        return out

    def live_costs(self, now: datetime | None = None, tenant: str | None = None) -> list[tuple[Job, float]]:
        """Each job that holds or is getting an allocation (provisioning or running), with what it has cost so
        far (booked plus accruing): what a budget check weighs."""
        jobs = [j for j in self.jobs_in_states([JobState.provisioning, JobState.running])
                if tenant is None or j.tenant == tenant]
        accrued = self.accruing([j.id for j in jobs], now)
        return [(j, j.spent_usd + accrued.get(j.id, 0.0)) for j in jobs]

    def tenant_committed(self, tenant: str, now: datetime | None = None) -> float:
        """What the tenant's running jobs are expected to cost yet: each one's expected cost at placement less
        what it has cost so far (policies/budget.py)."""
        from policies.budget import remaining

        return sum(remaining(j.placement.expected_cost_usd if j.placement else None, cost)
                   for j, cost in self.live_costs(now, tenant))

    def note_event(self, job_id: str, reason: str, data: dict[str, Any] | None = None) -> JobEvent:
        """An event on a job that changes nothing (a budget alert, a stop requested): from and to its current
        state."""
        with self._tx() as conn:
            state = JobState(self._job_row(conn, job_id).state)
            return self._insert_event(conn, job_id, state, state, reason, data, utcnow())

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
            end = now if state in FOLLOWED_STATES else as_utc(updated_at)  # still held: up to now
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
