"""The broker's side of the wrapper's heartbeat (issue 27): a running allocation whose wrapper stopped beating is
released and its job requeued at the next poll; one that beats, or never beat, is left alone.

Over the in-memory market (standins/memory.py) with the heartbeat capability, a real store on both
backends, and an injected clock.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from broker.lifecycle import JobLifecycle
from broker.models import Allocation, AllocationState, JobState
from broker.store import Store
from providers.capabilities import HasHeartbeat
from standins.memory import NOW, Clock, MemoryProvider, offer, poll, router_over, submit_and_place


class BeatingMarket(HasHeartbeat, MemoryProvider):
    """Serves each node's last heartbeat as the test sets it."""

    def __init__(self) -> None:
        super().__init__("mem", [offer("mem", "a", 2.0)])
        self.beats: dict[int, datetime | None] = {}

    async def heartbeat(self, alloc: Allocation, *, rank: int = 0) -> datetime | None:
        return self.beats.get(rank)




async def test_a_silent_wrapper_releases_its_machine_and_requeues_the_job(store: Store) -> None:
    market = BeatingMarket()
    res = await submit_and_place(store, await router_over(store, market))
    assert res.placed, res.reason
    [alloc] = store.allocations(res.job.id)
    clock = Clock()
    life = JobLifecycle(store, {"mem": market}, clock=clock)
    market.set_state(alloc, AllocationState.running)
    assert await poll(life, market, alloc.id) is JobState.running

    clock.now = NOW + timedelta(hours=1)  # no beat has ever come: left to max_duration and the market
    assert await poll(life, market, alloc.id) is None

    market.beats[0] = clock.now - timedelta(seconds=60)  # beating (within 3 x 30 s + 2 polls)
    assert await poll(life, market, alloc.id) is None

    clock.now += timedelta(minutes=5)  # and then no more
    assert await poll(life, market, alloc.id) is JobState.pending
    job = store.get_job(res.job.id)
    assert job.preemptions == 1
    assert any("went silent" in e.reason for e in job.events)
    rec = store.get_allocation(alloc.id)
    assert rec.state is AllocationState.preempted
    assert not market.held or all(a.state is not AllocationState.running for a in market.held.values())
