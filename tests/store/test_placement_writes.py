"""A placement's two writes after its claim (issue 25): the attempt counter with the intent, and the launch with
the job's move to provisioning — each a transaction of single statements (an UPDATE … RETURNING, a conditional
UPDATE), nothing read back. What they return must be what is stored, and what another writer decided meanwhile
must stand; on both stores."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from broker.errors import ConflictError, NotFoundError
from broker.models import Allocation, AllocationState, Fabric, JobState, Market, QuoteOption
from broker.store import Store

from .helpers import job


def _intent(job_id: str, attempt: int) -> Allocation:
    return Allocation(id=f"a-{job_id}-{attempt}", job_id=job_id, attempt=attempt, provider="mem", offer_id="mem:x",
                      client_token=f"tok-{job_id}-{attempt}", usd_per_hour=1.5, region="r1", zone="z1",
                      attrs={"sku": "g5", "market": "on_demand"})


def _option() -> QuoteOption:
    return QuoteOption(provider="mem", offer_id="mem:x", sku="g5", gpu="A10G", gpus_per_node=1, nodes=1,
                       market=Market.on_demand, region="r1", zone="z1", fabric=Fabric.ethernet, fabric_gbps=25,
                       usd_per_hour=1.5, expected_hours=2.0,
                       expected_cost_usd=3.0)


def _claimed(store: Store, job_id: str) -> None:
    store.create_job(job(job_id=job_id))
    [claimed] = store.claim_many([job_id], "w1", store.get_job(job_id).created_at)
    assert claimed.state is JobState.placing


def _launch(store: Store, alloc: Allocation, job_id: str) -> object:
    spec = store.get_job(job_id).spec
    return store.record_launch(alloc.id, {"state": AllocationState.pending, "resource_ids": ["i-1"], "zone": "z1",
                                          "attrs": {**alloc.attrs, "host": "h1"}},
                               job_id, "launched on g5", {"allocation": alloc.id}, spec=spec,
                               placement=_option(), decision={"route": "on_demand", "cost": 3.0})


def test_the_attempt_and_the_launch_return_what_is_stored(store: Store) -> None:
    _claimed(store, "j")
    alloc = store.open_attempt("j", lambda attempt: _intent("j", attempt))
    assert alloc.attempt == 1 and store.get_job("j").attempts == 1
    assert store.get_allocation(alloc.id).model_dump(exclude={"created_at", "updated_at"}) == \
        alloc.model_dump(exclude={"created_at", "updated_at"})
    record = _launch(store, alloc, "j")
    assert record.recorded and record.alloc_state is AllocationState.pending  # type: ignore[attr-defined]
    moved = record.job  # type: ignore[attr-defined]
    stored = store.get_job("j")
    assert moved is not None and moved.state is JobState.provisioning
    # The job as returned, without a read-back, is the job as stored (its history aside: only this move's event).
    assert moved.model_dump(exclude={"events"}) == stored.model_dump(exclude={"events"})
    assert [e.to_state for e in moved.events] == [JobState.provisioning]
    assert stored.events[-1].to_state is JobState.provisioning and stored.events[-1].reason == "launched on g5"
    assert stored.placement == _option() and stored.decision == {"route": "on_demand", "cost": 3.0}
    got = store.get_allocation(alloc.id)
    assert got.state is AllocationState.pending and got.resource_ids == ["i-1"] and got.attrs["host"] == "h1"


def test_a_second_attempt_while_one_is_live_writes_nothing(store: Store) -> None:
    _claimed(store, "j")
    store.open_attempt("j", lambda attempt: _intent("j", attempt))
    with pytest.raises(ConflictError):
        store.open_attempt("j", lambda attempt: _intent("j", attempt))
    assert store.get_job("j").attempts == 1  # the counter's UPDATE went with the refused intent
    with pytest.raises(NotFoundError):
        store.open_attempt("nope", lambda attempt: _intent("nope", attempt))


def test_a_job_cancelled_during_its_launch_stays_cancelled(store: Store) -> None:
    _claimed(store, "j")
    alloc = store.open_attempt("j", lambda attempt: _intent("j", attempt))
    store.transition("j", JobState.cancelled, "cancelled by the user", expected={JobState.placing})
    record = _launch(store, alloc, "j")
    assert record.job is None and record.job_state is JobState.cancelled  # type: ignore[attr-defined]
    assert record.recorded  # type: ignore[attr-defined]  # the launch is on record, for its release
    assert store.get_job("j").state is JobState.cancelled
    assert store.get_allocation(alloc.id).resource_ids == ["i-1"]


def test_an_intent_given_up_meanwhile_is_not_overwritten_and_the_job_is_not_moved(store: Store) -> None:
    _claimed(store, "j")
    alloc = store.open_attempt("j", lambda attempt: _intent("j", attempt))
    store.update_allocation(alloc.id, expected={AllocationState.intent}, state=AllocationState.failed,
                            reason="given up by a reconcile")
    store.transition("j", JobState.pending, "requeued by a reconcile", expected={JobState.placing})
    record = _launch(store, alloc, "j")
    assert not record.recorded and record.alloc_state is AllocationState.failed  # type: ignore[attr-defined]
    assert record.job is None and record.job_state is JobState.pending  # type: ignore[attr-defined]
    assert store.get_allocation(alloc.id).resource_ids == []


def test_the_driver_sql_writes_and_reads_what_sqlalchemy_would(store: Store) -> None:
    # A placement's statements run as driver SQL compiled once (broker/store/engine.py's Prepared), their binds and
    # RETURNING rows processed by hand: the stored text (JSON, datetimes) and the values read back must be what
    # SQLAlchemy's own path writes and reads, on both stores.
    from broker.store.engine import JSONText
    from broker.store.jobs import EVENT_KEYS, EVENTS, INSERT_EVENT, JOBS, SELECT_JOB

    _claimed(store, "j")
    at = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=timezone(timedelta(hours=2)))
    data = {"tries": [{"error": "naïve \"quoted\" %s", "at": 1.5e-7}], "n": 3, "none": None, "nested": {"ok": True}}
    rows = {"sqlalchemy": dict(data), "prepared": dict(data), "serialised once": JSONText(json.dumps(data))}
    with store._tx() as conn:
        for reason, stored in rows.items():
            values = {"job_id": "j", "at": at, "from_state": "placing", "to_state": "placing", "reason": reason,
                      "data": stored}
            if reason == "sqlalchemy":
                conn.execute(INSERT_EVENT, values)
            else:
                store._run(conn, store._prepare(INSERT_EVENT, EVENT_KEYS), values)
        text = "" if store.is_sqlite else "::text"
        written = {r[0]: r[1:] for r in conn.exec_driver_sql(
            f"SELECT reason, at{text}, data{text} FROM job_events WHERE reason IN ('sqlalchemy', 'prepared', "
            "'serialised once')")}
        assert written["prepared"] == written["sqlalchemy"] == written["serialised once"]
        by_sqlalchemy = dict(conn.execute(SELECT_JOB, {"job_key": "j"}).one()._mapping)
        assert store._run(conn, store._prepare(SELECT_JOB, returns=list(JOBS.c)), {"job_key": "j"}) == by_sqlalchemy
        events = store._prepare(sa.select(EVENTS).where(EVENTS.c.reason == sa.bindparam("why")), returns=list(EVENTS.c))
        got = store._run(conn, events, {"why": "prepared"})
        assert got is not None and got["at"] == at and got["at"].tzinfo is not None and got["data"] == data
