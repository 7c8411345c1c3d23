"""The event stream in the store: job events (their own kind when they name one), spike alerts for every tenant,
tenant scoping, cursors; and on PostgreSQL, ids that commit out of order are neither skipped nor repeated."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from broker.errors import SpecError
from broker.models import Job, JobSpec, JobState
from broker.store import EventCursor, Store
from broker.store.events import EVENTS

AT = datetime(2026, 11, 30, 9, tzinfo=UTC)


def _job(store: Store, name: str, tenant: str) -> Job:
    spec = JobSpec.model_validate({"name": name, "gpu": ["H100"], "gpus": 8, "workload": {"hours": 1}})
    job, _ = store.create_job(Job(id=f"j-{name}", tenant=tenant, spec=spec, created_at=AT, updated_at=AT))
    return job


def test_kinds_spikes_and_tenants(store: Store) -> None:
    start = store.events_end()
    mine, theirs = _job(store, "ev-a", "alpha"), _job(store, "ev-b", "beta")
    store.transition(mine.id, JobState.cancelled, reason="by hand")
    # Another part of the broker records an event with its own kind in a job's history (a budget alert).
    with store.engine.begin() as conn:
        conn.execute(EVENTS.insert().values(job_id=theirs.id, at=AT, from_state="pending", to_state="pending",
                                            reason="80% of the monthly budget", data={"kind": "budget.alert"}))
    store.add_alert({"provider": "aws", "gpu": "H100", "sku": "p5.48xlarge"}, AT, peak=98.0, baseline=40.0)

    # Sources interleave by time (the spike started at AT, before the cancel); each keeps its own order.
    alpha, end = store.events_after(start, "alpha")
    assert [(e.job_id, e.kind) for e in alpha if e.job_id] == [(mine.id, "job.pending"), (mine.id, "job.cancelled")]
    [spike] = [e for e in alpha if e.kind == "price.spike"]
    assert spike.tenant is None and spike.data["peak_usd_per_hour"] == 98.0
    beta, _ = store.events_after(start, "beta")
    assert sorted(e.kind for e in beta) == ["budget.alert", "job.pending", "price.spike"]
    everything, _ = store.events_after(start)
    assert len(everything) == 5 and len({e.cursor for e in everything}) == 5
    assert end == store.events_end() and store.events_after(end, "alpha") == ([], end)
    # From any line's cursor: exactly what came after it.
    after, _ = store.events_after(EventCursor.parse(everything[1].cursor))
    assert [e.cursor for e in after] == [e.cursor for e in everything[2:]]
    with pytest.raises(SpecError) as bad:
        EventCursor.parse("3")
    assert bad.value.field == "since"


@pytest.mark.postgres
def test_ids_committed_out_of_order_are_waited_for_not_skipped(pg_database: Callable[[], str]) -> None:
    store = Store(pg_database())
    store.migrate()
    try:
        first, second = _job(store, "gap-1", "alpha"), _job(store, "gap-2", "alpha")
        start = store.events_end()
        # A transaction takes the next id and has not committed; a later one commits the id after it.
        slow = store.engine.connect()
        tx = slow.begin()
        slow.execute(EVENTS.insert().values(job_id=first.id, at=AT, from_state="pending", to_state="pending",
                                            reason="slow writer", data={}))
        store.transition(second.id, JobState.cancelled, reason="fast writer")
        assert store.events_after(start) == ([], start)  # stops before the id still being written
        tx.commit()
        slow.close()
        got, end = store.events_after(start)
        assert [e.reason for e in got] == ["slow writer", "fast writer"]

        # A rolled-back id never fills: passed once the gap has settled (here at once).
        aborted = store.engine.connect()
        tx = aborted.begin()
        aborted.execute(EVENTS.insert().values(job_id=first.id, at=AT, from_state="pending", to_state="pending",
                                               reason="rolled back", data={}))
        tx.rollback()
        aborted.close()
        store.transition(first.id, JobState.cancelled, reason="after the gap")
        assert store.events_after(end) == ([], end)
        store.gap_settle_s = 0.0
        got, _ = store.events_after(end)
        assert [e.reason for e in got] == ["after the gap"]
    finally:
        store.close()
