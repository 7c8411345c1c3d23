"""Release at the end, not at the next poll (issue 24 item 4): the broker's end watch sees the wrapper's report
of its command's end (on the local Vast API server: the container exited, its last line the exit status) and
releases the machine at once — the job failed with its code, the instance destroyed, its cost booked for the
instance's exact time — with no poll pass in between; a poll pass and the watch racing on the same end destroy
the machine once and book it once. On both store backends.

The command waits for a file the test writes once a poll has seen it running, so nothing here is timed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest

from broker.config import BrokerConfig, Settings
from broker.models import AllocationState, JobState, as_utc
from broker.service import Lockstep
from broker.specs import parse_spec
from broker.store import Store
from providers.vast import VastProvider
from providers.vast.config import VastConfig
from standins.vastapi.server import VastApiServer
from tests.waiting import eventually

INSTALLATION = "endwatch"


@pytest.fixture
async def svc(store: Store, vast_config: VastConfig) -> AsyncIterator[Lockstep]:
    settings = Settings(db_url="sqlite://", broker=BrokerConfig(installation=INSTALLATION))
    vast = VastProvider(vast_config, installation=INSTALLATION)
    service = Lockstep(settings, providers={"vast": vast}, store=store)
    await service.refresh()
    yield service
    for a in store.live_allocations():
        await service.broker.lifecycle.release(a, "test over")
    await service.aclose()


def destroys(vast: VastApiServer, iid: str) -> int:
    return sum(1 for r in vast.state.requests
               if r["method"] == "DELETE" and r["path"].rstrip("/").endswith(f"/instances/{iid}"))


async def gated_job(svc: Lockstep, gate: Path, code: int) -> str:
    command = f"while [ ! -e {gate} ]; do sleep 0.1; done; echo done; exit {code}"
    spec = {"name": "endwatch", "gpu": ["RTX-4090", "RTX-3090"], "gpus": 1, "providers": ["vast"],
            "markets": ["on_demand"], "workload": {"hours": 1}, "command": command}
    job = await svc.submit(parse_spec(spec))
    await svc.broker.place_pending([job.id])

    async def polled() -> JobState:
        await svc.broker.poll_once()
        return (await svc.get_job(job.id)).state

    await eventually(polled, lambda s: s is JobState.running, "a poll sees the command running")
    return job.id


async def test_the_wrappers_end_report_releases_the_machine_without_a_poll(
        svc: Lockstep, store: Store, vast_api: VastApiServer, tmp_path: Path) -> None:
    job_id = await gated_job(svc, tmp_path / "gate", 3)
    alloc = store.allocations(job_id)[0]
    (tmp_path / "gate").touch()
    # Only the end watch runs from here on: no poll pass.
    await eventually(svc.broker.watch_ends, lambda n: n == 1, "the end watch follows the ended command")
    job = await svc.get_job(job_id)
    assert job.state is JobState.failed and "exit code 3" in job.reason, job.reason
    done = store.get_allocation(alloc.id)
    assert done.state is AllocationState.failed and done.cost_usd is not None and done.ended_at is not None
    iid = alloc.resource_ids[0]
    assert destroys(vast_api, iid) == 1
    # Booked for the instance's exact time from Vast's own start, as Vast's record counts it (no whole seconds).
    assert done.billed_s == pytest.approx(
        (as_utc(done.ended_at) - as_utc(datetime.fromisoformat(done.attrs["running_since"]))).total_seconds())
    # The poll that comes later finds nothing left to do: no second destroy, the booking unchanged.
    await svc.broker.poll_once()
    assert await svc.broker.watch_ends() == 0
    assert destroys(vast_api, iid) == 1
    assert store.get_allocation(alloc.id).cost_usd == done.cost_usd


async def test_a_poll_and_the_end_watch_on_the_same_end_release_once(
        svc: Lockstep, store: Store, vast_api: VastApiServer, tmp_path: Path) -> None:
    job_id = await gated_job(svc, tmp_path / "gate", 0)
    alloc = store.allocations(job_id)[0]
    provider = svc.broker.market.launcher("vast")
    assert isinstance(provider, VastProvider)
    (tmp_path / "gate").touch()
    await eventually(lambda: provider.end_reported(alloc), bool, "the container's exit is reported")
    await asyncio.gather(svc.broker.poll_once(), svc.broker.watch_ends())
    assert (await svc.get_job(job_id)).state is JobState.succeeded
    done = store.get_allocation(alloc.id)
    assert done.state is AllocationState.succeeded and done.cost_usd is not None
    assert destroys(vast_api, alloc.resource_ids[0]) == 1
