"""Jobs: idempotent creation, events, transitions, listing and claiming, on both backends."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import pytest

from broker.errors import ConflictError, NotFoundError, SpecError
from broker.lifecycle import JobLifecycle
from broker.models import ALLOWED_TRANSITIONS, JobState, QuoteOption
from broker.store import Store

from .helpers import T0, job, spec


def test_create_writes_job_and_first_event(store: Store) -> None:
    j, created = store.create_job(job(tenant="acme", job_id="j-1"))
    assert created
    assert j.id == "j-1" and j.tenant == "acme" and j.state is JobState.pending
    assert [(e.from_state, e.to_state) for e in j.events] == [(None, JobState.pending)]
    got = store.get_job("j-1")
    assert got.spec == j.spec
    assert got.spec.fingerprint() == j.spec.fingerprint()
    assert got.created_at.tzinfo is not None


def test_idempotency_same_body_returns_existing(store: Store) -> None:
    first, created1 = store.create_job(job(tenant="acme", job_id="a"), idempotency_key="key-1")
    again, created2 = store.create_job(job(tenant="acme", job_id="b"), idempotency_key="key-1")
    assert created1 and not created2
    assert again.id == first.id == "a"
    with pytest.raises(NotFoundError):
        store.get_job("b")
    assert len(store.events("a")) == 1


def test_idempotency_other_body_conflicts(store: Store) -> None:
    store.create_job(job(tenant="acme", job_id="a"), idempotency_key="key-1")
    with pytest.raises(ConflictError):
        store.create_job(job(tenant="acme", job_id="b", gpus=16), idempotency_key="key-1")


def test_idempotency_keys_are_per_tenant(store: Store) -> None:
    store.create_job(job(tenant="acme", job_id="a"), idempotency_key="k")
    other, created = store.create_job(job(tenant="globex", job_id="b"), idempotency_key="k")
    assert created and other.id == "b"


def test_duplicate_job_id_conflicts(store: Store) -> None:
    store.create_job(job(job_id="same"))
    with pytest.raises(ConflictError):
        store.create_job(job(job_id="same"))


def test_get_job_hides_other_tenants(store: Store) -> None:
    store.create_job(job(tenant="acme", job_id="mine"))
    assert store.get_job("mine", tenant="acme").id == "mine"
    with pytest.raises(NotFoundError):
        store.get_job("mine", tenant="globex")
    with pytest.raises(NotFoundError):
        store.get_job("absent")


def test_deadline_from_spec(store: Store) -> None:
    j, _ = store.create_job(job(job_id="d", created=T0, deadline_in="48h"))
    assert j.deadline == T0 + timedelta(hours=48)


def test_transitions_record_events_and_fields(store: Store) -> None:
    store.create_job(job(job_id="t"))
    placement = QuoteOption(
        offer_id="o1", provider="aws", market="spot", sku="p5.48xlarge", region="us-east-1", zone="us-east-1a",
        nodes=1, gpus_per_node=8, gpu="H100-SXM", fabric="efa", fabric_gbps=3200, usd_per_hour=40.0,
        expected_hours=10, expected_cost_usd=400,
    )
    store.transition("t", JobState.placing, "claimed")
    j = store.transition(
        "t", JobState.provisioning, "launching", data={"offer": "o1"}, expected={JobState.placing},
        placement=placement, attempts=1, decision={"market": "spot", "why": ["cheapest"]},
    )
    assert j.state is JobState.provisioning and j.reason == "launching"
    assert j.placement == placement and j.attempts == 1 and j.decision["market"] == "spot"
    j = store.transition("t", JobState.running, "up")
    j = store.transition("t", JobState.succeeded, "done", spent_usd=123.5)
    assert j.spent_usd == 123.5
    states = [(e.from_state, e.to_state) for e in store.events("t")]
    assert states == [
        (None, JobState.pending),
        (JobState.pending, JobState.placing),
        (JobState.placing, JobState.provisioning),
        (JobState.provisioning, JobState.running),
        (JobState.running, JobState.succeeded),
    ]
    assert store.events("t")[2].data == {"offer": "o1"}
    assert store.get_job("t").placement == placement


def test_illegal_transition_refused_and_nothing_written(store: Store) -> None:
    store.create_job(job(job_id="x"))
    assert JobState.running not in ALLOWED_TRANSITIONS[JobState.pending]
    with pytest.raises(ConflictError):
        store.transition("x", JobState.running)
    store.transition("x", JobState.cancelled, "user")
    with pytest.raises(ConflictError):
        store.transition("x", JobState.pending)  # terminal
    j = store.get_job("x")
    assert j.state is JobState.cancelled and len(j.events) == 2


def test_expected_state_guard(store: Store) -> None:
    store.create_job(job(job_id="g"))
    with pytest.raises(ConflictError):
        store.transition("g", JobState.cancelled, expected={JobState.running})
    assert store.get_job("g").state is JobState.pending


def test_update_job_without_event(store: Store) -> None:
    store.create_job(job(job_id="u"))
    j = store.update_job("u", spent_usd=9.5, preemptions=2)
    assert (j.spent_usd, j.preemptions, j.state) == (9.5, 2, JobState.pending)
    assert len(j.events) == 1
    with pytest.raises(NotFoundError):
        store.update_job("nope", spent_usd=1)


def test_list_jobs_newest_first_with_cursor(store: Store) -> None:
    for i in range(7):
        store.create_job(job(tenant="acme", job_id=f"j{i}", created=T0 + timedelta(minutes=i)))
    store.create_job(job(tenant="globex", job_id="other", created=T0))
    store.transition("j3", JobState.cancelled)
    page, cursor = store.list_jobs(tenant="acme", limit=3)
    assert [j.id for j in page] == ["j6", "j5", "j4"] and cursor
    page2, cursor2 = store.list_jobs(tenant="acme", limit=3, cursor=cursor)
    assert [j.id for j in page2] == ["j3", "j2", "j1"] and cursor2
    page3, cursor3 = store.list_jobs(tenant="acme", limit=3, cursor=cursor2)
    assert [j.id for j in page3] == ["j0"] and cursor3 is None
    cancelled, _ = store.list_jobs(states=[JobState.cancelled])
    assert [j.id for j in cancelled] == ["j3"]
    everyone, _ = store.list_jobs(limit=100)
    assert len(everyone) == 8


def test_jobs_in_states(store: Store) -> None:
    store.create_job(job(job_id="a", created=T0))
    store.create_job(job(job_id="b", created=T0 + timedelta(seconds=1)))
    store.transition("b", JobState.placing)
    assert [j.id for j in store.jobs_in_states([JobState.pending, JobState.placing])] == ["a", "b"]
    assert [j.id for j in store.jobs_in_states([JobState.placing])] == ["b"]


def test_jobs_in_states_by_id_and_job_heads(store: Store) -> None:
    for i, name in enumerate(["a", "b", "c"]):
        store.create_job(job(job_id=name, created=T0 + timedelta(seconds=i)))
    store.transition("b", JobState.placing)
    assert [j.id for j in store.jobs_in_states([JobState.pending], ["c", "b", "a", "zz"])] == ["a", "c"]
    heads = store.job_heads(JobState.pending)
    assert [h[0] for h in heads] == ["a", "c"]
    assert heads[0][1] == store.get_job("a").updated_at
    many = [f"x{i}" for i in range(1200)]  # more than one IN (...) list's worth
    assert [j.id for j in store.jobs_in_states([JobState.pending], [*many, "c"])] == ["c"]


def test_note_reasons_changes_only_jobs_still_pending(store: Store) -> None:
    store.create_job(job(job_id="p"))
    store.create_job(job(job_id="q"))
    store.transition("q", JobState.placing, reason="claimed")
    assert store.note_reasons({"p": "no feasible offer", "q": "late note"}) == 1
    assert store.get_job("p").reason == "no feasible offer"
    assert store.get_job("q").reason == "claimed"
    assert len(store.events("p")) == 1  # no event for a note


def test_create_jobs_answers_as_one_after_the_other(store: Store) -> None:
    """A group commit gives each submission what create_job alone would have."""
    store.create_job(job(tenant="acme", job_id="old"), idempotency_key="k0")
    out = store.create_jobs([
        (job(tenant="acme", job_id="a"), "k1"),
        (job(tenant="acme", job_id="b"), "k1"),  # a retry of a: a again, not created
        (job(tenant="acme", job_id="c", gpus=16), "k1"),  # the same key, another spec
        (job(tenant="acme", job_id="d"), None),
        (job(tenant="acme", job_id="e"), "k0"),  # a retry of a job stored before
        (job(tenant="globex", job_id="f"), "k1"),  # keys are per tenant
    ])
    assert len(out) == 6
    a, b, c, d, e, f = out
    assert isinstance(a, tuple) and a[1] and a[0].id == "a"
    assert isinstance(b, tuple) and not b[1] and b[0].id == "a"
    assert isinstance(c, ConflictError)
    assert isinstance(d, tuple) and d[1] and d[0] == store.get_job("d")
    assert isinstance(e, tuple) and not e[1] and e[0].id == "old"
    assert isinstance(f, tuple) and f[1] and f[0].id == "f"
    assert a[0] == store.get_job("a")
    for gone in ("b", "c", "e"):
        with pytest.raises(NotFoundError):
            store.get_job(gone)


def test_create_jobs_one_bad_item_fails_alone(store: Store) -> None:
    store.create_job(job(job_id="taken"))
    out = store.create_jobs([(job(job_id="fresh"), None), (job(job_id="taken"), None), (job(job_id="new2"), "k")])
    assert isinstance(out[0], tuple) and out[0][1]
    assert isinstance(out[1], ConflictError)
    assert isinstance(out[2], tuple) and out[2][1]
    assert {j.id for j in store.jobs_in_states([JobState.pending])} == {"taken", "fresh", "new2"}


def claim(s: Store, job_id: str, worker: str) -> bool:
    """How a broker claims a job (JobLifecycle.claim): pending → placing under the job's row lock."""
    return asyncio.run(JobLifecycle(s).claim(job_id, worker)) is not None


def test_claim_moves_a_pending_job_to_placing_once(store: Store) -> None:
    store.create_job(job(job_id="c0", created=T0))
    assert claim(store, "c0", "w1")
    j = store.get_job("c0")
    assert j.state is JobState.placing and j.events[-1].data == {"worker": "w1"}
    assert not claim(store, "c0", "w2")  # already claimed: the second worker gets nothing
    assert store.get_job("c0").events[-1].data == {"worker": "w1"}


def test_claim_from_two_threads_never_overlaps(store: Store) -> None:
    for i in range(40):
        store.create_job(job(job_id=f"p{i:02d}", created=T0 + timedelta(seconds=i)))
    # Two Store objects: two engines, two connection pools (on PostgreSQL, two sessions).
    other = Store(store.url)
    got: dict[str, list[str]] = {"a": [], "b": []}
    barrier = threading.Barrier(2)

    def worker(name: str, s: Store) -> None:
        barrier.wait()
        for j in s.jobs_in_states([JobState.pending]):
            if claim(s, j.id, name):
                got[name].append(j.id)

    threads = [threading.Thread(target=worker, args=("a", store)), threading.Thread(target=worker, args=("b", other))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other.close()
    assert not set(got["a"]) & set(got["b"])
    assert sorted(got["a"] + got["b"]) == [f"p{i:02d}" for i in range(40)]
    for j in store.jobs_in_states([JobState.placing]):
        assert len([e for e in store.events(j.id) if e.to_state is JobState.placing]) == 1


def test_spec_round_trips_exactly(store: Store) -> None:
    s = spec(gpus=16, colocate="cluster", fabric="infiniband", labels={"team": "llm"}, deadline_in="36h")
    j, _ = store.create_job(job(job_id="rt", gpus=16, colocate="cluster", fabric="infiniband",
                                labels={"team": "llm"}, deadline_in="36h"))
    assert store.get_job("rt").spec == s == j.spec


def test_bad_cursor_is_a_spec_error(store: Store) -> None:
    with pytest.raises(SpecError):
        store.list_jobs(cursor="not-a-cursor")


def test_concurrent_same_idempotency_key_creates_one_job(store: Store) -> None:
    other = Store(store.url)
    results: list[tuple[str, bool]] = []
    barrier = threading.Barrier(2)

    def submit(s: Store, job_id: str) -> None:
        barrier.wait()
        j, created = s.create_job(job(tenant="acme", job_id=job_id), idempotency_key="race")
        results.append((j.id, created))

    threads = [threading.Thread(target=submit, args=(store, "r1")), threading.Thread(target=submit, args=(other, "r2"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other.close()
    assert sorted(c for _, c in results) == [False, True]
    assert len({jid for jid, _ in results}) == 1
    assert len(store.list_jobs(tenant="acme")[0]) == 1


def test_rows_with_null_json_read_back_as_empty(store: Store) -> None:
    """Collections a row may hold as NULL (an older writer, a hand edit) read back empty, never None."""
    from broker.models import Allocation

    store.create_job(job(job_id="n"))
    store.add_allocation(Allocation(id="a-n", job_id="n", provider="aws"))
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE jobs SET decision = NULL")
        conn.exec_driver_sql("UPDATE job_events SET data = NULL")
        conn.exec_driver_sql("UPDATE allocations SET resource_ids = NULL, attrs = NULL")
    j = store.get_job("n")
    assert j.decision == {} and j.events[0].data == {}
    a = store.get_allocation("a-n")
    assert a.resource_ids == [] and a.attrs == {}
    assert store.find_allocation("aws", "i-123") is None
