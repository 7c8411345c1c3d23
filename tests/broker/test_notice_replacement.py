"""Interruption notices → make before break (issue 30 item 2), in the lifecycle and the router, on both stores.

A market that carries the wrapper's notice (:class:`~providers.capabilities.HearsNotices`; here an in-memory one
the test gives notice on) has a running spot attempt of an interruptible job: at the next poll the allocation
becomes ``draining`` (still billing while its command checkpoints), the job is requeued, counted as a
preemption, and its replacement is placed at once — while the old machine still runs. The old one is booked
once its command ends or the market takes it, and given back by the broker if the market has not taken it
shortly after its deadline. Reconciliation leaves a draining machine alone. A job that does not resume from
checkpoints (not interruptible) is left to the market's end, as before.
"""

from __future__ import annotations

from datetime import timedelta

from broker.lifecycle import DRAIN_GRACE, JobLifecycle
from broker.models import Allocation, AllocationState, JobExit, JobState, Market, Notice
from broker.reconcile import reconcile
from broker.store import Store
from providers.capabilities import HearsNotices
from standins.memory import NOW, Clock, MemoryProvider, offer, poll, router_over, submit_and_place


class NoticeMarket(MemoryProvider, HearsNotices):
    """The in-memory market, plus the notices its wrappers reported, by resource id."""

    def __init__(self, name: str, offers: list) -> None:
        super().__init__(name, offers)
        self.notices: dict[str, Notice] = {}
        self.notice_reads = 0

    async def notice(self, alloc: Allocation) -> Notice | None:
        self.notice_reads += 1
        return next((self.notices[r] for r in alloc.resource_ids if r in self.notices), None)


DEADLINE = NOW + timedelta(minutes=2)
NOTICE = Notice(source="imds", action="terminate", deadline=DEADLINE, seen_at=NOW)



async def running_spot_job(store: Store, interruptible: bool = True) -> tuple[NoticeMarket, JobLifecycle, Clock,
                                                                                str, Allocation]:
    mem = NoticeMarket("mem", [offer("mem", "spot", 1.0, market=Market.spot, interruptible=True),
                               offer("mem", "od", 3.0)])
    router = await router_over(store, mem)
    fields: dict[str, object] = {"markets": ["spot", "on_demand"], "interruptible": interruptible}
    if interruptible:
        fields["checkpoint_minutes"] = 10
    res = await submit_and_place(store, router, **fields)
    assert res.placed, res.reason
    [alloc] = store.allocations(res.job.id)
    clock = Clock()
    life = JobLifecycle(store, {"mem": mem}, clock=clock)
    mem.set_state(alloc, AllocationState.running)
    assert await poll(life, mem, alloc.id) is JobState.running
    return mem, life, clock, res.job.id, store.get_allocation(alloc.id)


async def test_at_the_notice_the_job_is_placed_again_while_the_old_machine_drains(store: Store) -> None:
    mem, life, clock, job_id, old = await running_spot_job(store)
    assert await poll(life, mem, old.id) is None  # no notice: nothing changes
    mem.notices[old.resource_ids[0]] = NOTICE

    assert await poll(life, mem, old.id) is JobState.pending
    drained = store.get_allocation(old.id)
    assert drained.state is AllocationState.draining and drained.cost_usd is None
    assert drained.attrs["notice_deadline"] == DEADLINE.isoformat()
    assert old.resource_ids[0] in mem.held and mem.released == []  # make before break: still running
    job = store.get_job(job_id)
    assert job.preemptions == 1
    [preempted] = [e for e in job.events if e.to_state is JobState.preempted]
    assert preempted.reason.startswith("interruption notice from mem (terminate), the machine goes at")
    assert preempted.data["notice"]["deadline"].startswith(DEADLINE.isoformat()[:19])
    assert store.live_allocations() == []  # the job's one live allocation slot is free

    # The replacement is placed now, while the old machine still runs and checkpoints.
    res = await submit_again(store, mem, job_id)
    assert res.placed, res.reason
    new = next(a for a in store.allocations(job_id) if a.id != old.id)
    assert new.attempt == old.attempt + 1 and new.state in (AllocationState.pending, AllocationState.running)
    assert old.resource_ids[0] in mem.held

    # Polls of the draining allocation never move the job; its command ends after its checkpoint: booked.
    mem.set_state(new, AllocationState.running)
    assert await poll(life, mem, new.id) is JobState.running
    clock.now = NOW + timedelta(seconds=50)
    assert await poll(life, mem, old.id) is None
    assert store.get_allocation(old.id).state is AllocationState.draining
    mem.end(old, JobExit(exit_code=143))
    assert await poll(life, mem, old.id) is None
    done = store.get_allocation(old.id)
    assert done.state is AllocationState.preempted and done.cost_usd is not None and done.cost_usd > 0
    assert old.resource_ids[0] in mem.released and store.get_job(job_id).state is JobState.running
    assert store.get_allocation(new.id).state is AllocationState.running


async def submit_again(store: Store, mem: MemoryProvider, job_id: str):
    router = await router_over(store, mem)
    claimed = await JobLifecycle(store).claim(job_id, "test-worker")
    assert claimed is not None
    return await router.place(claimed)


async def test_a_draining_machine_the_market_does_not_take_is_released_after_its_deadline(store: Store) -> None:
    mem, life, clock, _job_id, old = await running_spot_job(store)
    mem.notices[old.resource_ids[0]] = NOTICE
    assert await poll(life, mem, old.id) is JobState.pending
    clock.now = DEADLINE + DRAIN_GRACE - timedelta(seconds=1)
    assert await poll(life, mem, old.id) is None
    assert store.get_allocation(old.id).state is AllocationState.draining
    clock.now = DEADLINE + DRAIN_GRACE
    assert await poll(life, mem, old.id) is None
    rec = store.get_allocation(old.id)
    assert rec.state is AllocationState.preempted and "deadline passed" in rec.reason
    assert mem.released == old.resource_ids and rec.cost_usd is not None


async def test_a_draining_machine_taken_by_the_market_is_booked_and_reconciliation_leaves_one_alone(
        store: Store) -> None:
    mem, life, clock, job_id, old = await running_spot_job(store)
    mem.notices[old.resource_ids[0]] = NOTICE
    assert await poll(life, mem, old.id) is JobState.pending
    report = await reconcile(store, {"mem": mem}, clock=clock, lifecycle=life)
    assert report.released == [] and old.resource_ids[0] in mem.held  # not an orphan: it drains
    assert store.get_allocation(old.id).state is AllocationState.draining

    mem.held.pop(old.resource_ids[0])  # the market takes it at its deadline
    clock.now = DEADLINE
    assert await poll(life, mem, old.id) is None
    rec = store.get_allocation(old.id)
    assert rec.state is AllocationState.preempted and rec.cost_usd is not None
    assert store.get_job(job_id).spent_usd == rec.cost_usd


async def test_a_job_that_does_not_resume_from_checkpoints_is_left_to_the_markets_end(store: Store) -> None:
    mem, life, _clock, _job_id, old = await running_spot_job(store, interruptible=False)
    mem.notices[old.resource_ids[0]] = NOTICE
    assert await poll(life, mem, old.id) is None
    assert store.get_allocation(old.id).state is AllocationState.running
    assert mem.notice_reads == 0  # not even read
