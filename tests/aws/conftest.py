"""Helpers for the AWS adapter tests: providers on moto, job specs and launch requests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiobotocore.session import AioSession

from broker.models import JobSpec, Market, Offer
from providers.aws import AwsProvider
from providers.aws.config import AwsConfig
from providers.base import LaunchRequest

INSTALLATION = "lockstep-test"


def job(gpu: str = "A100", gpus: int = 8, gpus_per_node: int = 8, **extra: object) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "train", "gpu": gpu, "gpus": gpus, "gpus_per_node": gpus_per_node, "workload": {"hours": 1}}
        | extra
    )


def launch_request(
    offer: Offer, nodes: int, *, job_id: str = "job-1", attempt: int = 0, spec: JobSpec | None = None
) -> LaunchRequest:
    spec = spec or job(gpu=offer.gpu, gpus=offer.gpu_count * nodes, gpus_per_node=offer.gpu_count)
    return LaunchRequest(
        job_id=job_id,
        tenant="team-a",
        attempt=attempt,
        spec=spec,
        offer=offer,
        nodes=nodes,
        installation=INSTALLATION,
    )


def pick(offers: list[Offer], sku: str, market: Market, zone: str | None = None) -> Offer:
    for o in offers:
        if o.sku == sku and o.market is market and (zone is None or o.zone == zone):
            return o
    raise AssertionError(f"no {market} offer of {sku} in {zone or 'any zone'}: {[o.id for o in offers]}")


@pytest.fixture
async def aws(aws_config: AwsConfig, aws_session: AioSession) -> AsyncIterator[AwsProvider]:
    async with AwsProvider(aws_config, installation=INSTALLATION, session=aws_session) as provider:
        yield provider


@pytest.fixture
def runtime_config(aws_moto: str) -> AwsConfig:
    """An AwsConfig at moto with the run-time contract on: its bucket made, the VPC of standins.ec2."""
    from standins.ec2 import runtime_overrides
    from tests.plugins.moto import moto_config

    return moto_config(aws_moto, **runtime_overrides(aws_moto))


@pytest.fixture
async def run_aws(runtime_config: AwsConfig, aws_session: AioSession) -> AsyncIterator[AwsProvider]:
    async with AwsProvider(runtime_config, installation=INSTALLATION, session=aws_session) as provider:
        yield provider
