"""Reconciliation's phases (broker/reconcile.py), one case each, over an in-memory market and a real store
on both backends. What a crash, a replica or a launch in flight leaves is tested against the real markets in
test_crash.py, test_replicas.py and test_launch_races.py.
"""

from __future__ import annotations

from datetime import timedelta

from broker.errors import TransientError
from broker.lifecycle import JobLifecycle
from broker.models import Allocation, AllocationState, Job, JobState, utcnow
from broker.reconcile import reconcile
from broker.store import Store
from standins.memory import NOW, MemoryProvider, clock, placed_job, spec


async def claimed(store: Store, job_id: str) -> Job:
    job, _ = store.create_job(Job(id=job_id, spec=spec(), created_at=NOW, updated_at=NOW))
    got = await JobLifecycle(store).claim(job.id, "dead-worker")
    assert got is not None
    return got


async def test_a_provider_that_cannot_be_listed_is_left_alone(store: Store) -> None:
    mem, job, alloc = await placed_job(store)
    mem.held.clear()  # gone, but we cannot know that: the listing fails
    mem.owned_error = TransientError("mem", "listing timed out")
    report = await reconcile(store, {"mem": mem}, clock=clock, exclusive=True)
    assert set(report.unreachable) == {"mem"} and not (report.requeued or report.released)
    assert store.get_job(job.id).state is JobState.provisioning
    assert store.get_allocation(alloc.id).state is AllocationState.pending


async def test_what_belongs_to_no_live_job_is_released(store: Store) -> None:
    mem, job, alloc = await placed_job(store)
    await JobLifecycle(store).cancel(job.id, "cancelled by user")  # its release never happened
    stray = Allocation(id="x", job_id="j-unknown", attempt=1, provider="mem", client_token="t-x",
                       resource_ids=["stray"], state=AllocationState.running)
    mem.hold(stray)
    report = await reconcile(store, {"mem": mem}, clock=clock, exclusive=True)
    assert sorted(report.released) == sorted([
        f"mem:{alloc.resource_ids[0]} (belongs to no live job (job {job.id} is cancelled))",
        "mem:stray (belongs to no live job (job j-unknown is unknown))",
    ])
    assert not mem.held
    assert store.get_allocation(alloc.id).state is AllocationState.released


async def test_a_launch_a_crash_left_unrecorded_is_adopted_and_its_job_moves_on(store: Store) -> None:
    mem = MemoryProvider("mem", [])
    job = await claimed(store, "j-unrecorded")  # crashed after the launch, before any record
    mem.hold(Allocation(id="p-1", job_id=job.id, attempt=1, provider="mem", client_token="t-1",
                        resource_ids=["r1"], state=AllocationState.running))
    report = await reconcile(store, {"mem": mem}, clock=clock, exclusive=True)
    assert report.adopted == ["p-1"] and report.to_provisioning == [job.id]
    [rec] = store.allocations(job.id)
    assert rec.state is AllocationState.running and rec.resource_ids == ["r1"]
    job = store.get_job(job.id)
    assert job.state is JobState.provisioning and job.reason == "adopted mem allocation p-1 after a broker restart"
    assert mem.held  # kept


async def test_an_intent_whose_launch_went_through_is_adopted(store: Store) -> None:
    mem = MemoryProvider("mem", [])
    job = await claimed(store, "j-intent")
    store.add_allocation(Allocation(id="a-1", job_id=job.id, attempt=1, provider="mem", client_token="t-1",
                                    state=AllocationState.intent))
    mem.hold(Allocation(id="p-1", job_id=job.id, attempt=1, provider="mem", client_token="t-1",
                        resource_ids=["r1"], state=AllocationState.pending))
    # Beside running placements (replicas), a young intent may be a launch in flight: its launcher decides.
    fresh = await reconcile(store, {"mem": mem}, clock=utcnow, exclusive=False)
    assert not (fresh.adopted or fresh.to_provisioning)
    assert store.get_allocation("a-1").state is AllocationState.intent
    later = await reconcile(store, {"mem": mem}, clock=lambda: utcnow() + timedelta(minutes=6), exclusive=False)
    assert later.adopted == ["a-1"] and later.to_provisioning == [job.id]
    rec = store.get_allocation("a-1")
    assert rec.state is AllocationState.pending and rec.resource_ids == ["r1"]


async def test_a_second_allocation_of_a_job_is_released_as_a_duplicate(store: Store) -> None:
    mem, job, alloc = await placed_job(store)
    mem.hold(Allocation(id="p-dup", job_id=job.id, attempt=7, provider="mem", client_token="t-dup",
                        resource_ids=["dup"], state=AllocationState.running))
    report = await reconcile(store, {"mem": mem}, clock=clock, exclusive=True)
    assert report.released == [f"mem:dup (duplicate: job {job.id} already holds {alloc.id})"]
    assert list(mem.held) == alloc.resource_ids and report.adopted == [alloc.id]


async def test_an_intent_never_acted_on_is_failed_and_its_job_requeued(store: Store) -> None:
    mem = MemoryProvider("mem", [])
    job = await claimed(store, "j-dead")
    store.add_allocation(Allocation(id="a-dead", job_id=job.id, attempt=1, provider="mem", client_token="t-dead",
                                    state=AllocationState.intent))
    report = await reconcile(store, {"mem": mem}, clock=clock, exclusive=True)
    assert report.failed_intents == ["a-dead"] and report.requeued == [job.id]
    assert store.get_allocation("a-dead").state is AllocationState.failed
    job = store.get_job(job.id)
    assert job.state is JobState.pending and job.reason == "requeued: placement was interrupted by a broker restart"


async def test_jobs_whose_allocation_is_gone_are_requeued(store: Store) -> None:
    mem, provisioning, alloc1 = await placed_job(store)
    mem2, running, alloc2 = await placed_job(store)
    mem2.set_state(alloc2, AllocationState.running)
    await JobLifecycle(store, {"mem": mem2}, clock=clock).follow(alloc2, AllocationState.running, "", [])
    assert store.get_job(running.id).state is JobState.running
    # A crash came after their allocations were recorded as ended, before their jobs were moved on.
    for a in (alloc1, alloc2):
        store.update_allocation(a.id, state=AllocationState.released, reason="released")
    mem.held.clear()
    report = await reconcile(store, {"mem": mem}, clock=clock, exclusive=True)
    assert sorted(report.requeued) == sorted([provisioning.id, running.id])
    p = store.get_job(provisioning.id)
    assert p.state is JobState.pending and p.preemptions == 0  # never ran: no preemption counted
    assert p.events[-1].from_state is JobState.provisioning
    r = store.get_job(running.id)
    assert r.state is JobState.pending and r.preemptions == 1
    assert [e.to_state for e in r.events[-2:]] == [JobState.preempted, JobState.pending]
    assert r.reason == "requeued: its allocation is gone at the provider"
