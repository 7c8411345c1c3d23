"""The reasons a job's events carry say what an operator needs: the nodes, the figures (issue 29).

Real PostgreSQL (the ``store`` fixture) under the router; the markets are in memory.
"""

from __future__ import annotations

from broker.models import JobState, Locality
from broker.store import Store
from tests.broker.memory import MemoryProvider, offer, router_over, submit_and_place


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
