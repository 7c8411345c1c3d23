"""A poll pass polls its live allocations concurrently (issue 24: release at the end, not one poll per
allocation later): a command that ended is seen, and its machine released, within one pass however many
allocations are live. Over the in-memory market and a real store on both backends."""

from __future__ import annotations

import asyncio

from broker.config import BrokerConfig, Settings
from broker.loops import POLLING_AT_ONCE, BrokerLoops
from broker.market import Marketplace
from broker.models import Allocation, AllocationState, AllocationStatus, JobExit, JobState
from broker.store import Store
from standins.memory import MemoryProvider, clock, offer, router_over, submit_and_place


class GatheredPolls(MemoryProvider):
    """Answers no poll until ``together`` polls are in flight at once (bounded: a sequential pass would wait
    for ever, and fails on the bound instead)."""

    def __init__(self, name: str, offers: list, together: int) -> None:
        super().__init__(name, offers)
        self.together = together
        self.in_flight = 0
        self.most = 0
        self.all_in = asyncio.Event()

    async def poll(self, alloc: Allocation) -> AllocationStatus:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        if self.in_flight >= self.together:
            self.all_in.set()
        try:
            await asyncio.wait_for(self.all_in.wait(), 30)
            return await super().poll(alloc)
        finally:
            self.in_flight -= 1


async def test_a_poll_pass_polls_its_allocations_at_once_and_releases_every_ended_one(store: Store) -> None:
    n = 6
    assert n <= POLLING_AT_ONCE
    mem = GatheredPolls("mem", [offer("mem", "a", 1.0)], together=n)
    router = await router_over(store, mem)
    jobs = [(await submit_and_place(store, router)).job for _ in range(n)]
    allocs = [store.allocations(j.id)[0] for j in jobs]
    for a in allocs:
        mem.set_state(a, AllocationState.running)
        mem.end(a, JobExit(exit_code=0))
    loops = BrokerLoops(Settings(broker=BrokerConfig(installation="mem")), store,
                        Marketplace({"mem": mem}, clock=clock), clock=clock)
    await loops.market.refresh()
    assert await loops.poll_once() == n
    assert mem.most == n
    assert [store.get_job(j.id).state for j in jobs] == [JobState.succeeded] * n
    assert sorted(mem.released) == sorted(r for a in allocs for r in a.resource_ids)
