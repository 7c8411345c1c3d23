"""Across zones, live (issue 30 item 3): where the plan on the first spot option's market chooses on-demand or to
wait, the router weighs another zone's spot by the multi-zone simulator's own function
(``policies.spot.spot_zone_move``, through ``policies.placement.spot_elsewhere``), from the broker's own history
of each zone's spot market in the store."""

from __future__ import annotations

from datetime import timedelta

import broker.router
import broker.simulate.zones
import policies.spot
from broker.models import Allocation, AllocationState, Job, JobState, Market
from broker.store import Store
from standins.memory import NOW, MemoryProvider, offer, router_over, spec, submit_and_place

SKU = "g5.x"


def offers() -> list:
    return [offer("mem", "a", 0.30, zone="z-a", market=Market.spot, sku=SKU),
            offer("mem", "b", 0.32, zone="z-b", market=Market.spot, sku=SKU),
            offer("mem", "od", 1.00, zone="z-a", market=Market.on_demand, sku=SKU)]


def history(store: Store, zone: str, runs: list[tuple[float, float, bool]]) -> None:
    """Another job's spot instances in ``zone``: (start, end, preempted at the end) in hours before NOW; a run not
    preempted is still running."""
    jid = f"history-{zone}"
    store.create_job(Job(id=jid, spec=spec(), created_at=NOW - timedelta(days=8), updated_at=NOW))
    for n, (start_h, end_h, preempted) in enumerate(runs):
        start, end = NOW - timedelta(hours=start_h), NOW - timedelta(hours=end_h)
        store.add_allocation(Allocation(
            id=f"{jid}-{n}", job_id=jid, attempt=n + 1, provider="mem", offer_id="mem:history",
            state=AllocationState.preempted if preempted else AllocationState.running, zone=zone, region="r1",
            created_at=start, updated_at=end if preempted else NOW,
            attrs={"sku": SKU, "market": "spot", "running_since": start.isoformat()}))


def scarce() -> list[tuple[float, float, bool]]:
    """Spot up for 6 minutes every 8 hours, all week; gone now."""
    return [(h + 0.2, h + 0.1, True) for h in range(160, 0, -8)]


async def place(store: Store):
    router = await router_over(store, MemoryProvider("mem", offers()))
    return await submit_and_place(store, router, markets=["spot", "on_demand"], interruptible=True,
                                  workload={"hours": 10}, deadline_in="16h", checkpoint_minutes=10)


async def loops_over(store: Store):
    """The broker's loops over the memory market of ``offers()``, on a clock the test moves."""
    from broker.config import BrokerConfig, Settings
    from broker.loops import BrokerLoops
    from broker.market import Marketplace
    from standins.memory import Clock

    clock = Clock()
    mem = MemoryProvider("mem", offers())
    loops = BrokerLoops(Settings(broker=BrokerConfig(installation="mem")), store,
                        Marketplace({"mem": mem}, clock=clock), clock=clock)
    await loops.market.refresh()
    return clock, mem, loops


def test_the_live_router_and_the_simulator_share_the_move() -> None:
    assert broker.simulate.zones.spot_zone_move is policies.spot.spot_zone_move
    assert broker.router.spot_elsewhere.__module__ == "policies.placement"


async def test_spot_scarce_at_home_and_calm_in_another_zone_starts_there(store: Store) -> None:
    """At home the plan goes on-demand (its spot is rare); the other zone's spot has run all week: the job starts
    there, the decision saying why."""
    history(store, "z-a", scarce())
    history(store, "z-b", [(170.0, 0.0, False)])  # up all week, and now
    res = await place(store)
    assert res.placed, res.reason
    [alloc] = [a for a in store.allocations(res.job.id)]
    assert (alloc.zone, alloc.attrs["market"]) == ("z-b", "spot"), alloc
    decision = [e for e in store.events(res.job.id) if "decision" in e.data][-1].data["decision"]
    assert decision["allow_spot"] and decision["numbers"]["zone_move"]["chosen"] == "z-b"


async def test_without_a_better_zone_the_home_plan_stands(store: Store) -> None:
    """Spot is as scarce in the other zone: the move does not pay for itself, and what the home plan chose (to wait
    for spot, with this slack) stands; the decision keeps what was weighed."""
    history(store, "z-a", scarce())
    history(store, "z-b", scarce())
    res = await place(store)
    assert not res.placed and res.reason.startswith("waiting for a better moment"), res.reason
    assert store.allocations(res.job.id) == []
    weighed = store.get_job(res.job.id).decision["numbers"]["zone_move"]  # kept on the job, as every decision
    assert "z-b" in weighed and "chosen" not in weighed, weighed


async def test_one_zone_is_never_weighed(store: Store) -> None:
    history(store, "z-a", scarce())
    router = await router_over(store, MemoryProvider("mem", [o for o in offers() if o.locality.zone == "z-a"]))
    res = await submit_and_place(store, router, markets=["spot", "on_demand"], interruptible=True,
                                 workload={"hours": 10}, deadline_in="16h", checkpoint_minutes=10)
    assert "zone_move" not in str([e.data for e in store.events(res.job.id)])


async def test_a_job_running_on_demand_moves_to_another_zones_spot_once_it_pays(store: Store) -> None:
    """The rebalance step, across zones: placed on on-demand while the broker knew nothing of another zone's spot,
    the job is moved (break before make) once it has seen spot run calmly there, and placed there."""
    history(store, "z-a", scarce())
    clock, mem, loops = await loops_over(store)
    res = await submit_and_place(store, loops.router, markets=["spot", "on_demand"], interruptible=True,
                                 workload={"hours": 10}, deadline_in="11h", checkpoint_minutes=10)
    assert res.placed, res.reason
    [od] = store.allocations(res.job.id)
    assert od.attrs["market"] == "on_demand"
    mem.set_state(od, AllocationState.running)
    await loops.poll_once()
    assert await loops.rebalance_running() == []  # nowhere better yet: it stays

    history(store, "z-b", [(170.0, 0.0, False)])  # now known: another job's spot there has run all week
    clock.now = NOW + timedelta(seconds=10)  # past the markets' read cache (broker/spot_markets.py)
    [moved] = await loops.rebalance_running()
    assert moved.state is JobState.pending
    why = [e.data["rebalance"] for e in store.events(moved.id) if "rebalance" in e.data][-1]
    assert why["reason"].startswith("move to spot in z-b") and why["numbers"]["zone_move"]["chosen"] == "z-b"
    assert store.get_allocation(od.id).state is AllocationState.released and od.resource_ids[0] in mem.released
    placed = await loops.place_pending([moved.id])
    assert placed and placed[0].placed, placed
    new = [a for a in store.allocations(moved.id) if a.id != od.id]
    assert [(a.zone, a.attrs["market"]) for a in new] == [("z-b", "spot")]


async def test_a_preempted_job_restarts_where_its_checkpoint_lies_not_in_the_cheapest_zone(store: Store) -> None:
    """Placed on spot in z-b (z-a's spot was scarce), the job is preempted; meanwhile z-a's spot, the cheaper, has
    come up and stayed. The job's checkpoint and data lie in z-b and its spot is up there too: the plan weighs
    z-b's market as home and the job restarts there (policies.placement.checkpoint_first), not in z-a."""
    history(store, "z-a", scarce())
    history(store, "z-b", [(170.0, 0.0, False)])
    clock, mem, loops = await loops_over(store)
    res = await submit_and_place(store, loops.router, markets=["spot", "on_demand"], interruptible=True,
                                 workload={"hours": 10}, deadline_in="16h", checkpoint_minutes=10)
    assert res.placed, res.reason
    [first] = store.allocations(res.job.id)
    assert (first.zone, first.attrs["market"]) == ("z-b", "spot")
    mem.set_state(first, AllocationState.running)
    clock.now = NOW + timedelta(minutes=30)
    await loops.poll_once()
    # z-a's spot: another job's instance there has run for the last 20 hours, and runs on
    store.add_allocation(Allocation(
        id="calm-z-a", job_id="history-z-a", attempt=99, provider="mem", offer_id="mem:history",
        state=AllocationState.running, zone="z-a", region="r1", created_at=NOW - timedelta(hours=20),
        updated_at=clock.now, attrs={"sku": SKU, "market": "spot",
                                     "running_since": (NOW - timedelta(hours=20)).isoformat()}))
    mem.set_state(first, AllocationState.preempted)
    clock.now = NOW + timedelta(minutes=31)
    await loops.poll_once()
    assert store.get_job(res.job.id).state is JobState.pending
    clock.now = NOW + timedelta(minutes=32)
    placed = await loops.place_pending([res.job.id])
    assert placed and placed[0].placed, placed
    again = [a for a in store.allocations(res.job.id) if a.id != first.id]
    assert [(a.zone, a.attrs["market"]) for a in again] == [("z-b", "spot")], again


def test_checkpoint_first_puts_the_checkpoints_spot_ahead_and_keeps_the_rest_in_rank_order() -> None:
    from policies.book import OfferBook
    from policies.placement import checkpoint_first, checkpoint_place
    from policies.ranking import quote

    opts = quote(OfferBook.build(offers()), spec(markets=["spot", "on_demand"]), now=NOW).options
    assert [(o.zone, o.market.value) for o in opts] == [("z-a", "spot"), ("z-b", "spot"), ("z-a", "on_demand")]
    ran = Allocation(id="x", job_id="j", provider="mem", zone="z-b", region="r1", created_at=NOW, updated_at=NOW,
                     attrs={"running_since": NOW.isoformat()})
    never = ran.model_copy(update={"zone": "z-a", "attrs": {}})
    assert checkpoint_place([ran, never]) == "z-b"  # the last that ran, not the last made
    assert checkpoint_place([never]) is None
    moved = checkpoint_first(opts, "z-b")
    assert [(o.zone, o.market.value) for o in moved] == [("z-b", "spot"), ("z-a", "spot"), ("z-a", "on_demand")]
    assert checkpoint_first(opts, "elsewhere") == opts and checkpoint_first(opts, None) == opts
