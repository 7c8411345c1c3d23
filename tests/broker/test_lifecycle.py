"""The job lifecycle (broker/lifecycle.py): claims, and what a provider's poll answer means for a job.

Over an in-memory market (standins/memory.py) and a real store on both backends. The same rules
against the real markets: test_e2e.py (a spot instance terminated at moto requeues its job).
"""

from __future__ import annotations

from datetime import timedelta

from broker.errors import ProviderError
from broker.lifecycle import JobLifecycle
from broker.models import Allocation, AllocationState, ExitReason, Job, JobExit, JobState
from broker.store import Store
from standins.memory import NOW, Clock, MemoryProvider, offer, placed_job, poll, router_over, spec, submit_and_place


async def test_a_job_is_claimed_once(store: Store) -> None:
    job, _ = store.create_job(Job(id="j-claim", spec=spec(), created_at=NOW, updated_at=NOW))
    life = JobLifecycle(store)
    first = await life.claim(job.id, "w1")
    assert first is not None and first.state is JobState.placing
    assert first.events[-1].data == {"worker": "w1"} and first.events[-1].reason == "claimed by w1"
    assert await life.claim(job.id, "w2") is None  # another worker's claim finds it taken
    assert await life.claim("j-missing", "w2") is None


async def test_running_then_succeeded_moves_the_job_and_charges_the_running_time(store: Store) -> None:
    mem, job, alloc = await placed_job(store)
    clock = Clock()
    life = JobLifecycle(store, {"mem": mem}, clock=clock)
    mem.set_state(alloc, AllocationState.running)
    assert await poll(life, mem, alloc.id) is JobState.running
    running = store.get_job(job.id)
    assert running.reason == f"running on host-{alloc.resource_ids[0]}"
    rec = store.get_allocation(alloc.id)
    assert rec.state is AllocationState.running and rec.attrs["running_since"] == NOW.isoformat()
    assert rec.attrs["hosts"] == f"host-{alloc.resource_ids[0]}"

    assert await poll(life, mem, alloc.id) is None  # nothing new: no change, no event
    assert len(store.get_job(job.id).events) == len(running.events)

    clock.now = NOW + timedelta(hours=3)
    mem.set_state(alloc, AllocationState.succeeded)
    assert await poll(life, mem, alloc.id) is JobState.succeeded
    done = store.get_job(job.id)
    assert done.spent_usd == 6.0  # three hours at $2/h, from when it was first seen running
    assert done.events[-1].data == {"allocation": alloc.id}


async def test_a_failed_allocation_fails_the_job(store: Store) -> None:
    mem, job, alloc = await placed_job(store)
    life = JobLifecycle(store, {"mem": mem}, clock=Clock())
    mem.set_state(alloc, AllocationState.failed)
    assert await poll(life, mem, alloc.id) is JobState.failed
    assert store.get_job(job.id).reason == "failed at provider"


async def test_a_preempted_allocation_requeues_the_job_and_counts_it(store: Store) -> None:
    mem, job, alloc = await placed_job(store)
    life = JobLifecycle(store, {"mem": mem}, clock=Clock())
    mem.set_state(alloc, AllocationState.preempted)
    assert await poll(life, mem, alloc.id) is JobState.pending
    job = store.get_job(job.id)
    assert job.preemptions == 1 and [e.to_state for e in job.events[-2:]] == [JobState.preempted, JobState.pending]
    assert job.reason == "requeued after preemption #1; resumes from its last checkpoint"
    assert store.get_allocation(alloc.id).state is AllocationState.preempted
    assert mem.released == alloc.resource_ids and not mem.held  # given back at the provider


async def test_an_allocation_gone_at_the_provider_requeues_the_job(store: Store) -> None:
    mem, job, alloc = await placed_job(store)
    life = JobLifecycle(store, {"mem": mem}, clock=Clock())
    mem.held.clear()  # cancelled outside Lockstep
    assert await poll(life, mem, alloc.id) is JobState.pending
    job = store.get_job(job.id)
    assert job.preemptions == 1 and any(e.reason == "gone" for e in job.events if e.to_state is JobState.preempted)


async def test_a_finished_job_still_holding_capacity_gives_it_back(store: Store) -> None:
    mem, job, alloc = await placed_job(store)
    life = JobLifecycle(store, {"mem": mem}, clock=Clock())
    await life.cancel(job.id, "cancelled by user")
    mem.set_state(alloc, AllocationState.running)
    assert await poll(life, mem, alloc.id) is None
    assert store.get_job(job.id).state is JobState.cancelled
    rec = store.get_allocation(alloc.id)
    assert rec.state is AllocationState.released and rec.reason == "job is cancelled" and not mem.held


async def test_a_failed_release_is_left_live_for_reconciliation(store: Store) -> None:
    mem, job, alloc = await placed_job(store)

    class Stuck(MemoryProvider):
        async def release(self, alloc: Allocation) -> None:
            raise ProviderError("mem", "release refused")

    stuck = Stuck("mem", [])
    stuck.held = dict(mem.held)
    life = JobLifecycle(store, {"mem": stuck}, clock=Clock())
    await life.cancel(job.id, "cancelled by user")
    stuck.set_state(alloc, AllocationState.running)
    assert await poll(life, stuck, alloc.id) is None
    # Not recorded as released: still live, so reconciliation retries the release.
    assert [a.id for a in store.live_allocations()] == [alloc.id] and stuck.held


async def test_a_command_that_exits_3_fails_the_job_and_releases_its_machine_without_a_cancel(store: Store) -> None:
    mem, job, alloc = await placed_job(store)
    clock = Clock()
    life = JobLifecycle(store, {"mem": mem}, clock=clock)
    mem.set_state(alloc, AllocationState.running)
    assert await poll(life, mem, alloc.id) is JobState.running
    clock.now = NOW + timedelta(minutes=30)
    mem.end(alloc, JobExit(exit_code=3, last_lines=["step 9", "boom"]))
    assert await poll(life, mem, alloc.id) is JobState.failed
    failed = store.get_job(job.id)
    assert failed.reason == "failed: exit code 3"
    assert failed.events[-1].data == {"allocation": alloc.id, "exit_code": 3, "exit_reason": "exited", "node": 0,
                                      "last_lines": ["step 9", "boom"]}
    assert mem.released == alloc.resource_ids  # given back at this poll: no cancel, no waiting
    assert store.get_allocation(alloc.id).state is AllocationState.failed
    assert failed.spent_usd == 1.0  # half an hour at $2/h


async def test_a_command_that_exits_0_succeeds_and_releases(store: Store) -> None:
    mem, job, alloc = await placed_job(store)
    life = JobLifecycle(store, {"mem": mem}, clock=Clock())
    mem.end(alloc, JobExit(exit_code=0))
    assert await poll(life, mem, alloc.id) is JobState.succeeded
    assert store.get_job(job.id).reason == "finished: exit code 0"
    assert mem.released == alloc.resource_ids


async def test_a_job_stopped_at_its_max_duration_fails_with_that_reason(store: Store) -> None:
    mem, job, alloc = await placed_job(store)
    life = JobLifecycle(store, {"mem": mem}, clock=Clock())
    mem.end(alloc, JobExit(exit_code=143, reason=ExitReason.max_duration))
    assert await poll(life, mem, alloc.id) is JobState.failed
    assert store.get_job(job.id).reason == "failed: stopped at its max_duration (exit code 143)"
    assert mem.released == alloc.resource_ids


async def test_the_broker_stops_a_job_whose_wrapper_overran_max_duration(store: Store) -> None:
    mem = MemoryProvider("mem", [offer("mem", "a", 2.0)])
    res = await submit_and_place(store, await router_over(store, mem), max_duration="1h")
    assert res.placed
    [alloc] = store.allocations(res.job.id)
    clock = Clock()
    life = JobLifecycle(store, {"mem": mem}, clock=clock)
    mem.set_state(alloc, AllocationState.running)
    assert await poll(life, mem, alloc.id) is JobState.running
    clock.now = NOW + timedelta(hours=1, minutes=1)  # inside the wrapper's margin: left alone
    assert await poll(life, mem, alloc.id) is None and not mem.released
    clock.now = NOW + timedelta(hours=1, minutes=3)
    assert await poll(life, mem, alloc.id) is JobState.failed
    job = store.get_job(res.job.id)
    assert job.reason == "max_duration 1h exceeded: stopped and released"
    assert mem.released == alloc.resource_ids and job.spent_usd > 2.0
