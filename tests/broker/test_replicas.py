"""Two broker replicas (two processes) on one PostgreSQL database place 200 jobs at once.

A third broker starts while they place, so its start-up reconciliation meets launches in flight.
They coordinate only through the database: a job is claimed by a row-locked pending →
placing transition, and a Vast machine another replica is launching on shows as that replica's
intent. Afterwards: every job placed exactly once (one claim, one provisioning transition, one live
allocation), every provider resource owned by exactly one allocation, no Vast ask rented for two
jobs (the server's own record of rentals), and both replicas did part of the work.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path

import pytest

from broker.lifecycle import JobLifecycle
from broker.models import Allocation, AllocationState, JobState, utcnow
from broker.reconcile import reconcile
from broker.store import Store
from providers.vast import VastProvider
from providers.vast.config import VastConfig
from standins.vastapi.server import VastApiServer
from tests.broker.harness import Brokers, audit, child_env, submit_jobs
from tests.plugins.moto import FaultProxy

JOBS = 200


@pytest.fixture
async def brokers(tmp_path: Path, pg_database: Callable[[], str], vast_api: VastApiServer,
                  aws_proxy_config) -> AsyncIterator[Brokers]:
    db_url = pg_database()
    env = child_env(db_url, vast_api.url, aws_proxy_config.endpoint_url)
    b = Brokers(f"replicas-{secrets.token_hex(3)}", db_url, env, tmp_path / "brokers.log")
    yield b
    await b.kill_all()


@pytest.mark.timeout(180)
async def test_two_replicas_place_every_job_once(brokers: Brokers, vast_api: VastApiServer,
                                                 aws_faults: FaultProxy) -> None:
    await submit_jobs(brokers.db_url, JOBS)
    # Both replicas start (and reconcile: nothing to do yet), then place at once. A third broker starts
    # meanwhile: its start-up reconciliation meets their launches in flight and must leave them alone.
    a, b = await brokers.start("recover"), await brokers.start("recover")
    await asyncio.gather(a.line(), b.line())
    c = await brokers.start("reconcile")
    a.go()
    b.go()
    out_a, out_b, out_c = await asyncio.gather(a.result(), b.result(), c.result())
    late = out_c["report"]
    assert not (late["released"] or late["failed_intents"] or late["requeued"]), late

    done = await audit(brokers.db_url, brokers.installation, aws_faults.upstream, vast_api.state, events=True)
    assert not done.problems, done.explain()
    assert done.states[JobState.provisioning.value] + done.states[JobState.running.value] == JOBS, done.states
    assert len(done.vast) == JOBS // 2 and len(done.aws) == JOBS // 2

    # Placed once: one claim and one launch per job, by one replica.
    workers: Counter[str] = Counter()
    for job in done.jobs.values():
        claims = [e for e in job.events if e.to_state is JobState.placing]
        launched = [e for e in job.events if e.to_state is JobState.provisioning]
        assert len(launched) == 1, (job.id, [(e.to_state, e.reason) for e in job.events])
        workers[claims[-1].data["worker"]] += 1
    assert set(workers) == {out_a["worker"], out_b["worker"]}, workers  # both replicas placed jobs

    # No offer double-booked: every ask the server rented out backs exactly one live allocation, of one job.
    rentals = {str(iid): inst for iid, inst in vast_api.state.instances.items()}
    by_ask = Counter(inst["ask_id"] for inst in rentals.values())
    assert max(by_ask.values()) == 1
    vast_allocs = [x for x in done.allocs if x.provider == "vast" and x.state.value in ("pending", "running")]
    assert len({x.job_id for x in vast_allocs}) == len(vast_allocs) == JOBS // 2
    for x in vast_allocs:
        [rid] = x.resource_ids
        assert str(rentals[rid]["ask_id"]) == x.attrs["ask_id"], (x, rentals[rid])
        assert rentals[rid]["label"].split(":")[2] == x.job_id


async def test_a_dead_replicas_placement_is_left_while_fresh_then_resolved(
        pg_database: Callable[[], str], vast_api: VastApiServer, vast_config: VastConfig) -> None:
    """A replica died between writing its intent and launching. Other replicas cannot tell that from a
    launch in flight, so reconciliation leaves it alone until it is stale, then fails the intent and
    requeues the job (the periodic pass does this without any restart)."""
    db_url = pg_database()
    [job] = await submit_jobs(db_url, 1)
    store = Store(db_url)
    try:
        assert await JobLifecycle(store).claim(job.id, "broker-dead") is not None
        store.add_allocation(Allocation(id="a-dead", job_id=job.id, attempt=1, provider="vast",
                                        state=AllocationState.intent, client_token="ls-dead"))
        providers = {"vast": VastProvider(vast_config, installation="replicas-dead")}
        fresh = await reconcile(store, providers, exclusive=False)
        assert not fresh.failed_intents and not fresh.requeued, fresh
        assert store.get_job(job.id).state is JobState.placing

        stale = await reconcile(store, providers, exclusive=False,
                                clock=lambda: utcnow() + timedelta(minutes=6))
        assert stale.failed_intents == ["a-dead"] and stale.requeued == [job.id], stale
        assert store.get_job(job.id).state is JobState.pending
        assert [a.state for a in store.allocations(job.id)] == [AllocationState.failed]
        await providers["vast"].aclose()
    finally:
        store.close()
