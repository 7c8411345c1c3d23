"""A reconcile pass (another replica's, or a restart's) deciding on an intent while its launch is in flight.

The launch goes to the local Vast API server, slowed down by its faults: either before the ask is rented
(the reconcile sees nothing at the provider and gives the intent up) or after (it sees the instance and
adopts it). Either way exactly one record wins, and nothing is left running that no live job holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.config import Settings
from broker.models import AllocationState, JobState
from broker.reconcile import reconcile
from broker.service import Lockstep
from broker.specs import parse_spec
from broker.store import Store
from providers.vast import VastProvider
from standins.vastapi.server import VastApiServer
from tests.broker.conftest import wait_for

INSTALLATION = "race-test"


@pytest.fixture
async def vast_only(tmp_path: Path, vast_config) -> AsyncIterator[Lockstep]:
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'race.db'}")
    store = Store(settings.db_url)
    store.migrate()
    svc = Lockstep(settings, providers={"vast": VastProvider(vast_config, installation=INSTALLATION)}, store=store)
    await svc.refresh()
    yield svc
    await svc.aclose()


async def _launch_in_flight(svc: Lockstep, vast_api: VastApiServer) -> tuple[str, asyncio.Task[None]]:
    job = await svc.submit(parse_spec({"name": "race", "gpu": ["RTX-4090"], "gpus": 1, "workload": {"hours": 1},
                                       "command": "sleep 600", "markets": ["on_demand"]}))
    placing = asyncio.create_task(svc.place_now([job.id]))
    await wait_for(lambda: any(r["method"] == "PUT" and "/asks/" in r["path"] for r in vast_api.state.requests),
                   limit_s=30, every=0.05)
    return job.id, placing


async def test_an_intent_given_up_during_its_launch_is_released_when_the_launch_lands(
    vast_only: Lockstep, vast_api: VastApiServer
) -> None:
    vast_api.state.faults.slow_create_s = 1.5  # the create is in flight, nothing rented yet
    job_id, placing = await _launch_in_flight(vast_only, vast_api)
    report = await reconcile(vast_only.store, vast_only.market.providers, exclusive=True)
    assert len(report.failed_intents) == 1 and report.requeued == [job_id]
    await placing  # the create now rents the ask and answers
    allocs = vast_only.store.allocations(job_id)
    assert [a.state for a in allocs] == [AllocationState.released]
    assert allocs[0].resource_ids and "given up" in allocs[0].reason
    assert vast_api.state.instances == {}  # what the late launch got was destroyed at once
    assert (await vast_only.get_job(job_id)).state is JobState.pending  # requeued, nothing lost


async def test_a_launch_adopted_during_its_launch_stays_placed(vast_only: Lockstep, vast_api: VastApiServer) -> None:
    vast_api.state.faults.slow_create_answer_s = 1.5  # rented at once, the answer comes later
    job_id, placing = await _launch_in_flight(vast_only, vast_api)
    await wait_for(lambda: len(vast_api.state.instances) == 1, limit_s=30, every=0.05)
    report = await reconcile(vast_only.store, vast_only.market.providers, exclusive=True)
    assert len(report.adopted) == 1 and report.to_provisioning == [job_id]
    await placing
    job = await vast_only.get_job(job_id)
    assert job.state is JobState.provisioning and job.placement is not None
    allocs = vast_only.store.allocations(job_id)
    assert len(allocs) == 1 and allocs[0].state in (AllocationState.pending, AllocationState.running)
    assert allocs[0].resource_ids == [str(next(iter(vast_api.state.instances)))]  # kept, not released
    await vast_only.cancel(job_id)
    assert vast_api.state.instances == {}


async def test_a_periodic_reconcile_leaves_a_launch_in_flight_to_its_launcher(
    vast_only: Lockstep, vast_api: VastApiServer
) -> None:
    vast_api.state.faults.slow_create_answer_s = 1.5  # rented at once, the answer comes later
    job_id, placing = await _launch_in_flight(vast_only, vast_api)
    await wait_for(lambda: len(vast_api.state.instances) == 1, limit_s=30, every=0.05)
    # A replica's (or this process's own periodic) pass: the young intent is not its to decide.
    report = await reconcile(vast_only.store, vast_only.market.providers, exclusive=False)
    assert report.adopted == [] and report.failed_intents == [] and report.released == []
    await placing
    job = await vast_only.get_job(job_id)
    assert job.state is JobState.provisioning
    (alloc,) = vast_only.store.allocations(job_id)
    assert alloc.state in (AllocationState.pending, AllocationState.running) and alloc.resource_ids
    await vast_only.cancel(job_id)


async def test_a_late_launch_whose_release_fails_is_recorded_and_released_by_the_next_reconcile(
    vast_only: Lockstep, vast_api: VastApiServer
) -> None:
    vast_api.state.faults.slow_create_s = 1.5
    job_id, placing = await _launch_in_flight(vast_only, vast_api)
    report = await reconcile(vast_only.store, vast_only.market.providers, exclusive=True)
    assert report.requeued == [job_id]
    vast_api.state.faults.burst_429 = 1000  # the create already passed the gate; the release will not
    await placing
    (alloc,) = vast_only.store.allocations(job_id)
    assert alloc.state is AllocationState.released and alloc.resource_ids  # recorded before the release
    assert len(vast_api.state.instances) == 1  # the release failed: still running at Vast
    assert (await vast_only.get_job(job_id)).state is JobState.pending
    vast_api.state.faults.burst_429 = 0
    again = await reconcile(vast_only.store, vast_only.market.providers, exclusive=True)
    assert len(again.released) == 1 and vast_api.state.instances == {}
