"""End to end over the real local parts: on-prem first, bursting, marketplace, failover, preemption."""

from __future__ import annotations

import boto3

from broker.models import AllocationState, JobState, Market
from tests.broker.conftest import World, wait_for


async def test_8gpu_infiniband_job_lands_onprem_and_runs(world: World) -> None:
    job = await world.submit(name="ib-8", gpu="H100", gpus=8, gpus_per_node=8, fabric="infiniband")
    job = await world.place(job)
    assert job.state is JobState.provisioning, job.reason
    assert job.placement.provider == "slurm" and job.placement.market is Market.owned
    assert job.decision["route"] == "onprem"

    async def running() -> bool:
        await world.svc.poll_now()
        return await world.state(job.id) is JobState.running

    await wait_for(running)
    [alloc] = await world.svc.job_allocations(job.id)
    assert alloc.state is AllocationState.running and alloc.resource_ids


async def test_4node_rdma_job_bursts_to_aws_in_one_zone(world: World, slurm_cluster) -> None:
    # moto cannot create placement groups (HTML 500), so against moto the adapter runs with
    # placement_groups off and offers zone-level locality; the placement-group path of the same
    # launch is covered against the real EC2 service model with botocore's Stubber (tests/aws).
    job = await world.submit(name="burst-4", gpu=["H100"], gpus=32, gpus_per_node=8, fabric="rdma",
                             colocate="zone", deadline_in="3h", providers=["slurm", "aws"])
    job = await world.place(job)
    assert job.state is JobState.provisioning, job.reason
    p = job.placement
    assert p.provider == "aws" and p.sku.startswith("p5") and p.nodes == 4 and p.market is Market.on_demand
    assert job.decision["route"] == "cloud"
    [alloc] = await world.svc.job_allocations(job.id)
    assert len(alloc.resource_ids) == 4
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=world.svc.market.providers["aws"].config
                       .endpoint_url)
    desc = ec2.describe_instances(InstanceIds=alloc.resource_ids)
    instances = [i for r in desc["Reservations"] for i in r["Instances"]]
    assert {i["Placement"]["AvailabilityZone"] for i in instances} == {alloc.zone}
    for i in instances:
        tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
        assert job.id in tags.values()


async def test_cheap_1gpu_job_lands_on_vast(world: World) -> None:
    job = await world.submit(name="cheap-1", gpu=["RTX-4090", "RTX-3090"], gpus=1, max_usd_per_hour=1.0,
                             markets=["on_demand", "owned"])
    job = await world.place(job)
    assert job.state is JobState.provisioning, job.reason
    assert job.placement.provider == "vast" and job.placement.usd_per_hour <= 1.0


async def test_capacity_error_in_one_zone_moves_to_the_next(world: World, aws_faults) -> None:
    spec = dict(name="failover", gpu="A10G", gpus=1, providers=["aws"], markets=["on_demand"])
    quote = await world.svc.quote((await world.submit(**spec)).spec)
    first_zone = quote.options[0].zone
    aws_faults.fail("RunInstances", "InsufficientInstanceCapacity", zone=first_zone)
    job = await world.place(await world.submit(**spec))
    assert job.state is JobState.provisioning, job.reason
    assert job.placement.zone != first_zone
    launched = [e for e in job.events if e.to_state is JobState.provisioning][-1]
    tries = launched.data["tries"]
    assert tries and tries[0]["zone"] == first_zone and tries[0]["kind"] == "capacity"
    assert "InsufficientInstanceCapacity" in tries[0]["error"]


async def test_spot_preemption_requeues_and_runs_again(world: World) -> None:
    job = await world.submit(name="spotty", gpu="A10G", gpus=1, providers=["aws"], markets=["spot"],
                             interruptible=True)
    job = await world.place(job)
    assert job.state is JobState.provisioning and job.placement.market is Market.spot, job.reason
    [alloc] = await world.svc.job_allocations(job.id)
    # AWS reclaims the instance: terminated behind Lockstep's back.
    ec2 = boto3.client("ec2", region_name="us-east-1",
                       endpoint_url=world.svc.market.providers["aws"].config.endpoint_url)
    ec2.terminate_instances(InstanceIds=alloc.resource_ids)
    await world.svc.poll_now()
    job = await world.svc.get_job(job.id)
    assert job.state is JobState.pending and job.preemptions == 1
    assert any(e.to_state is JobState.preempted for e in job.events)
    job = await world.place(job)
    assert job.state is JobState.provisioning and job.attempts == 2
    allocs = await world.svc.job_allocations(job.id)
    assert [a.state for a in allocs].count(AllocationState.preempted) == 1
    assert sum(a.state in (AllocationState.pending, AllocationState.running) for a in allocs) == 1
