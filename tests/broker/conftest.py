"""A whole Lockstep over the real local parts: Slurm, moto's EC2 (behind the fault proxy), the Vast API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import boto3
import pytest

from broker.config import BrokerConfig, Settings
from broker.models import Job, JobState
from broker.service import Lockstep
from broker.specs import parse_spec
from broker.store import Store
from providers.aws import AwsProvider
from providers.slurm import SlurmProvider
from providers.vast import VastProvider


async def wait_for(cond: Callable[[], object], limit_s: float = 60.0, every: float = 0.5) -> None:
    """Poll an async or sync condition until true (no timing asserted: it only bounds the wait)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while True:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if loop.time() > end:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(every)


class World:
    def __init__(self, svc: Lockstep) -> None:
        self.svc = svc

    async def submit(self, **spec) -> Job:
        data = {"name": "e2e", "workload": {"hours": 1}, "command": "sleep 600"}
        data.update(spec)
        return await self.svc.submit(parse_spec(data))

    async def place(self, job: Job) -> Job:
        await self.svc.place_now([job.id])
        return await self.svc.get_job(job.id)

    async def state(self, job_id: str) -> JobState:
        return (await self.svc.get_job(job_id)).state


@pytest.fixture
async def world(tmp_path: Path, slurm_config, slurm_installation: str, aws_proxy_config, vast_config
                ) -> AsyncIterator[World]:
    inst = slurm_installation
    # EFA launches name a subnet per zone, as in a real account: use moto's default VPC subnets.
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=aws_proxy_config.endpoint_url)
    subnets = {s["AvailabilityZone"]: s["SubnetId"] for s in ec2.describe_subnets()["Subnets"]}
    aws_proxy_config = aws_proxy_config.model_copy(update={"subnet_ids": subnets})
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'e2e.db'}",
                        broker=BrokerConfig(installation=inst, max_queue_wait_hours=1.0))
    providers = {
        "slurm": SlurmProvider(slurm_config, installation=inst),
        "aws": AwsProvider(aws_proxy_config, installation=inst),
        "vast": VastProvider(vast_config, installation=inst),
    }
    store = Store(settings.db_url)
    store.migrate()
    svc = Lockstep(settings, providers=providers, store=store)
    health = await svc.refresh()
    assert all(h.ok for h in health.values()), health
    yield World(svc)
    # Leave nothing behind: cancel every job (which releases its allocations).
    jobs, _ = await svc.list_jobs(limit=1000)
    for j in jobs:
        await svc.cancel(j.id)
    await svc.aclose()
