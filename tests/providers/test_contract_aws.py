"""The kit against moto's EC2 server: the spot/on-demand adapter and the reserved one (an operator pool)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiobotocore.session import AioSession

from broker.models import Allocation, Market, Offer
from providers.aws import AwsProvider, ReservedProvider
from providers.aws.config import ReservedPool
from providers.base import OfferQuery
from standins.ec2 import FakeImds, Node, runtime_overrides
from tests.plugins.moto import moto_config
from tests.providers.kit import (
    HasHeartbeatContract,
    HasJobLogsContract,
    HearsNoticesContract,
    KeepsBillingRecordContract,
    LaunchesContract,
    OffersContract,
    ReportsEndContract,
    SignalsJobsContract,
    SpotHistoryContract,
    Subject,
)

pytestmark = pytest.mark.aws

UNREACHABLE = "http://127.0.0.1:1"  # nothing listens on port 1 of loopback


def booter(endpoint: str, root: Path) -> Callable[[Allocation], Awaitable[None]]:
    """Run an allocation's (one) boot script as its EC2 instance would (moto runs nothing)."""

    async def boot(alloc: Allocation) -> None:
        async with FakeImds() as imds:
            await Node(endpoint, alloc.resource_ids[0], root, imds).run()

    return boot


def p4d(offers: list[Offer]) -> Offer:
    return next(o for o in offers if o.sku == "p4d.24xlarge")


class TestAws(OffersContract, LaunchesContract, SpotHistoryContract, HasJobLogsContract, HasHeartbeatContract,
              ReportsEndContract, KeepsBillingRecordContract, HearsNoticesContract, SignalsJobsContract):
    provider_type = AwsProvider

    @pytest.fixture
    async def subject(self, aws_moto: str, aws_session: AioSession, tmp_path: Path) -> AsyncIterator[Subject]:
        # The run-time contract on (its bucket at moto): what a signal, a log and a heartbeat travel through.
        config = moto_config(aws_moto, **runtime_overrides(aws_moto))
        async with AwsProvider(config, installation="kit", session=aws_session) as aws:
            yield Subject(
                aws,
                OfferQuery(gpus=["A100-SXM-40GB"], markets=[Market.spot], regions=["us-east-1"]),
                broken=lambda: AwsProvider(moto_config(UNREACHABLE, max_attempts=1), installation="kit"),
                secrets=["testing"],  # the (dummy) credentials
                pick=p4d,
                boot=booter(aws_moto, tmp_path),
            )


class TestReserved(OffersContract, LaunchesContract, HasJobLogsContract, SignalsJobsContract):
    provider_type = ReservedProvider

    @pytest.fixture
    async def subject(self, aws_moto: str, aws_session: AioSession, tmp_path: Path) -> AsyncIterator[Subject]:
        pool = ReservedPool(name="a100-plan", sku="p4d.24xlarge", region="us-east-1", zone="us-east-1b", count=3,
                            usd_per_hour=12.0)
        config = moto_config(aws_moto, reserved_pools=[pool], **runtime_overrides(aws_moto))
        unreachable = moto_config(UNREACHABLE, reserved_pools=[pool], max_attempts=1)
        shared = AwsProvider(config, installation="kit", session=aws_session)
        async with ReservedProvider(config, installation="kit", aws=shared) as reserved:
            yield Subject(
                reserved,
                OfferQuery(markets=[Market.reserved], max_usd_per_hour=20.0),
                broken=lambda: ReservedProvider(unreachable, installation="kit"),
                secrets=["testing"],
                boot=booter(aws_moto, tmp_path),
            )
        await shared.aclose()
