"""The reasons a job's events carry say what an operator needs: the nodes, the figures (issue 29).

Real PostgreSQL (the ``store`` fixture) under the router; the markets are in memory.
"""

from __future__ import annotations

from datetime import timedelta

from broker.lifecycle import JobLifecycle
from broker.models import AllocationState, JobState, Locality, Market
from broker.store import Store
from providers.runtime.logs import exit_from_status
from standins.memory import NOW, MemoryProvider, offer, placed_job, router_over, submit_and_place


async def test_a_pending_job_names_the_unhealthy_nodes(store: Store) -> None:
    hosts = [f"rack1-n{i}" for i in range(5)]
    mem = MemoryProvider("mem", [
        offer("mem", h, 1.0 + i, max_nodes=1, locality=Locality(provider="mem", region="r1", zone="z1", host=h))
        for i, h in enumerate(hosts)
    ])
    for h in hosts:
        store.set_node_health("mem", h, False, "lockstep health: ECC")
    res = await submit_and_place(store, await router_over(store, mem))

    assert not res.placed and res.job.state is JobState.pending
    assert "unhealthy: 5" in res.reason, res.reason
    named = [h for h in hosts if h in res.reason]
    assert len(named) == 3 and "and 2 more" in res.reason, res.reason  # bounded: the first few, then a count


async def test_a_deadline_burst_event_carries_the_wait_the_deadline_and_both_costs(store: Store) -> None:
    # The on-prem pool is full (a 30 h queue) and the job has 20 h: the quote rejects the node as `deadline`,
    # and the placement event still says why the job left, in numbers.
    busy = offer("onprem", "node-1", 0.25, market=Market.owned, max_nodes=1, queue_wait_hours=30.0,
                 locality=Locality(provider="onprem", region="r1", zone="z1", host="node-1"))
    cloud = MemoryProvider("mem", [offer("mem", "a", 1.0)])
    onprem = MemoryProvider("onprem", [busy])
    res = await submit_and_place(store, await router_over(store, cloud, onprem), markets=["on_demand", "owned"],
                                 workload={"hours": 10}, deadline_in="20h")

    assert res.placed and res.job.placement is not None and res.job.placement.provider == "mem", res.reason
    [event] = [e for e in res.job.events if e.to_state is JobState.provisioning]
    decision = event.data["decision"]
    assert decision["reason"] == "burst: on-prem queue would miss the deadline", decision
    n = decision["numbers"]
    assert n["onprem_queue_wait_hours"] == 30 and n["hours_to_deadline"] > 0 and n["deadline"]
    assert n["cloud_cost_usd"] > 0 and n["onprem_cost_usd"] > 0


async def test_a_job_that_starts_and_ends_between_two_polls_still_shows_running(store: Store) -> None:
    mem, job, alloc = await placed_job(store)
    assert job.state is JobState.provisioning
    started = NOW + timedelta(seconds=7)
    # What the wrapper writes at the end (status.json), read as the market's poll reads it.
    ended = exit_from_status({"exit_code": 0, "reason": "exited", "rank": 0, "last_lines": ["done"],
                              "started_at": "2026-12-01T12:00:07.000Z", "ended_at": "2026-12-01T12:00:09.000Z"})
    assert ended is not None and ended.started_at == started
    got = await JobLifecycle(store, {"mem": mem}, clock=lambda: NOW + timedelta(minutes=1)).follow(
        alloc, AllocationState.succeeded, "", ["host-a"], exit=ended)

    assert got is JobState.succeeded
    events = store.get_job(job.id).events
    states = [e.to_state for e in events]
    assert states[-2:] == [JobState.running, JobState.succeeded], states
    running = events[-2]
    assert running.reason == "running on host-a" and running.data["started_at"] == started.isoformat()
