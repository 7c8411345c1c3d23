"""The spot plan's decision points in the live broker, against moto's EC2 on loopback (spot launches refused by the
fault proxy when the market is gone): the rebalance step (``BrokerLoops.rebalance_running``) moves a running
on-demand job back to spot when the plan says so — break before make, through the lifecycle — and a placement that
waits for spot leaves the job pending rather than on on-demand.

The spot market's history is what the broker itself saw (broker/spot_markets.py): spot instances of an earlier job
in the same zone and instance type, up and preempted through a week (the runs of a recorded trace), and gone for
the last three hours. A deadline job with an hour of slack cannot wait for it: the plan places it on on-demand
(its spot tries are refused for capacity). While spot stays gone the job stays; once another job's spot launch
succeeds in that market, the rebalance step moves the job to spot.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import numpy as np
import pytest

from broker.config import BrokerConfig, Settings
from broker.models import Allocation, AllocationState, Job, JobState, Market
from broker.service import Lockstep
from broker.specs import parse_spec
from broker.store import Store
from providers.aws import AwsProvider


class Clock:
    """The broker's clock: it starts at the real time of the test's own start (rows the store stamps itself carry
    the real time; a time taken at import would lag a slow suite's later tests) and moves by hand."""

    def __init__(self) -> None:
        self.start = self.now = datetime.now(UTC).replace(second=0, microsecond=0)

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
async def broker(tmp_path: Path, aws_proxy_config) -> AsyncIterator[tuple[Lockstep, Clock, str]]:
    """A Lockstep over moto's EC2 (behind the fault proxy), a SQLite store and a clock the test moves."""
    installation = "reb-" + secrets.token_hex(3)
    clock = Clock()
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'reb.db'}",
                        broker=BrokerConfig(installation=installation, max_launch_tries=100))
    store = Store(settings.db_url)
    store.migrate()
    svc = Lockstep(settings, providers={"aws": AwsProvider(aws_proxy_config, installation=installation)},
                   store=store, clock=clock)
    health = await svc.refresh()
    assert all(h.ok for h in health.values()), health
    yield svc, clock, aws_proxy_config.endpoint_url
    jobs, _ = await svc.list_jobs(limit=100)
    for j in jobs:
        await svc.cancel(j.id)
    await svc.aclose()


GAP = timedelta(seconds=360)
SPEC = {"gpu": "A10G", "gpus": 1, "providers": ["aws"], "markets": ["spot", "on_demand"], "interruptible": True,
        "checkpoint_minutes": 5, "command": "sleep 600"}


def market_week() -> np.ndarray:
    """A week and a bit of spot availability in 6-minute intervals: runs of 1-6 h up and 0.5-6 h gone, ending
    with 3.4 h gone."""
    rng = np.random.default_rng(0)
    runs, up = [], True
    while sum(runs) < 1700:
        runs.append(int(rng.integers(10, 60)) if up else int(rng.integers(5, 60)))
        up = not up
    return np.concatenate([np.full(n, i % 2 == 0) for i, n in enumerate(runs)])[:1700]


def seen_spot(store: Store, zone: str, sku: str, availability: np.ndarray, end: datetime) -> None:
    """The broker's record of that market: an earlier job's spot instances, one through each run of spot."""
    first = end - GAP * len(availability)
    store.create_job(Job(id="earlier", spec=parse_spec({**SPEC, "name": "earlier", "workload": {"hours": 1}}),
                         created_at=first, updated_at=first, state=JobState.pending))
    edges = np.flatnonzero(np.diff(np.r_[0, availability.astype(int), 0]))
    for i, (a, b) in enumerate(zip(edges[::2], edges[1::2], strict=True)):
        since, until = first + GAP * int(a), first + GAP * int(b)
        store.add_allocation(Allocation(
            id=f"earlier-{i}", job_id="earlier", attempt=i + 1, provider="aws", offer_id="seen",
            state=AllocationState.preempted, zone=zone, region="us-east-1", created_at=since, updated_at=until,
            attrs={"sku": sku, "market": Market.spot.value, "running_since": since.isoformat()}))


async def running(svc: Lockstep, job: Job) -> Allocation:
    await svc.poll_now()
    job = await svc.get_job(job.id)
    assert job.state is JobState.running, job.reason
    [alloc] = [a for a in await svc.job_allocations(job.id) if a.state is AllocationState.running]
    return alloc


def instance_state(endpoint: str, instance_id: str) -> str:
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    [r] = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return r["Instances"][0]["State"]["Name"]


async def test_on_demand_job_moves_back_to_spot_when_spot_returns(broker, aws_faults) -> None:
    svc, clock, endpoint = broker
    spec = parse_spec({**SPEC, "name": "deadline", "workload": {"hours": 4.6},
                       "deadline": (clock.start + timedelta(hours=5.6)).isoformat()})
    quote = await svc.quote(spec)
    spot = next(o for o in quote.options if o.market is Market.spot)
    week = market_week()
    assert not week[-34:].any() and week[-35]  # gone for the last 3.4 hours
    seen_spot(svc.store, spot.zone, spot.sku, week, clock.start)

    # Placed: spot first if it can be had, else on-demand (an hour of slack cannot wait out such outages).
    aws_faults.fail("RunInstances", "InsufficientInstanceCapacity", market="spot")
    job = await svc.submit(spec)
    await svc.place_now([job.id])
    job = await svc.get_job(job.id)
    assert job.state is JobState.provisioning and job.placement.market is Market.on_demand, job.reason
    assert job.decision["allow_spot"] is True and job.decision["on_demand_fallback"] is True, job.decision
    launched = [e for e in job.events if e.to_state is JobState.provisioning][-1]
    assert launched.data["tries"] and all(t["kind"] == "capacity" and t["market"] == "spot"
                                          for t in launched.data["tries"])
    od = await running(svc, job)

    # Ten minutes on, spot still gone (last seen: those refusals): the job stays on on-demand.
    clock.now = clock.start + timedelta(minutes=10)
    assert await svc.broker.rebalance_running() == []
    assert (await svc.get_job(job.id)).state is JobState.running

    # Spot comes back: another job's spot launch in the same market succeeds and runs.
    aws_faults.clear()
    other = await svc.submit(parse_spec({**SPEC, "name": "other", "markets": ["spot"], "workload": {"hours": 1}}))
    await svc.place_now([other.id])
    other = await svc.get_job(other.id)
    assert other.placement is not None and (other.placement.zone, other.placement.sku) == (spot.zone, spot.sku)
    await running(svc, other)

    # Six minutes later the rebalance step moves the deadline job: its on-demand instance is released first
    # (break before make), the job requeued without counting a preemption, and the next pass puts it on spot.
    clock.now = clock.start + timedelta(minutes=16)
    [moved] = await svc.broker.rebalance_running()
    assert moved.id == job.id and moved.state is JobState.pending and moved.preemptions == 0
    event = [e for e in moved.events if e.from_state is JobState.running][-1]
    assert event.to_state is JobState.pending and event.data["rebalance"]["allow_spot"] is True
    assert "move to spot" in event.data["rebalance"]["reason"]
    [released] = [a for a in await svc.job_allocations(job.id) if a.id == od.id]
    assert released.state is AllocationState.released
    assert instance_state(endpoint, od.resource_ids[0]) in ("shutting-down", "terminated")
    assert moved.spent_usd > 0  # the on-demand time was paid for

    await svc.place_now([job.id])
    job = await svc.get_job(job.id)
    assert job.state is JobState.provisioning and job.placement.market is Market.spot, job.reason
    live = [a for a in await svc.job_allocations(job.id) if a.state in (AllocationState.pending,
                                                                          AllocationState.running)]
    assert len(live) == 1 and live[0].attrs["market"] == Market.spot.value


async def test_job_with_slack_waits_for_spot_and_is_placed_when_it_returns(broker, aws_faults) -> None:
    svc, clock, _ = broker
    spec = parse_spec({**SPEC, "name": "patient", "workload": {"hours": 10},
                       "deadline": (clock.start + timedelta(hours=14)).isoformat()})
    aws_faults.fail("RunInstances", "InsufficientInstanceCapacity", market="spot")
    job = await svc.submit(spec)
    for _ in range(2):  # two rounds: every spot try refused, and no on-demand tried
        await svc.place_now([job.id])
        job = await svc.get_job(job.id)
        assert job.state is JobState.pending, job.reason
        assert job.decision["allow_spot"] is True and job.decision["on_demand_fallback"] is False, job.decision
    assert all(a.attrs["market"] == Market.spot.value and a.state is AllocationState.failed
               for a in await svc.job_allocations(job.id))
    rounds = [e for e in job.events if e.from_state is JobState.placing and e.to_state is JobState.pending]
    assert len(rounds) == 2 and all(e.data["waits_for_spot"] and e.data["tries"] for e in rounds)
    wait = await svc.broker.lifecycle.placement_wait(job)
    assert wait.rounds == 0  # waiting for spot is no failed round: placement_rounds does not end the job

    aws_faults.clear()
    await svc.place_now([job.id])
    job = await svc.get_job(job.id)
    assert job.state is JobState.provisioning and job.placement.market is Market.spot, job.reason
