"""AWS billing from EC2's own record (issue 24 item 2): an attempt bills from its instances' LaunchTime to the
moment EC2 says they went down (the time in StateTransitionReason), per second with the 60 s minimum — not
from the broker's polls and clock. Against moto, on both store backends, with the broker's clock injected and
moved on 10 minutes between the poll and the release: the booking follows EC2, not that clock."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import boto3
from aiobotocore.session import AioSession

from broker.config import BrokerConfig, Settings
from broker.loops import BrokerLoops
from broker.market import Marketplace
from broker.models import AllocationState, Job, JobState
from broker.specs import parse_spec
from broker.store import Store
from providers.aws import AwsProvider
from providers.aws.config import AwsConfig
from providers.aws.provider import launched_at, stopped_at

INSTALLATION = "billedspan"
SPEC = {"name": "span", "gpu": "A10G", "gpus": 1, "providers": ["aws"], "markets": ["on_demand"],
        "workload": {"hours": 1}, "command": "sleep 600"}


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


def test_the_transition_reason_is_read_in_ec2s_and_motos_words() -> None:
    gone = {"State": {"Name": "terminated"}, "StateTransitionReason": "User initiated (2026-12-06 04:00:07 GMT)"}
    assert stopped_at(gone) == datetime(2026, 12, 6, 4, 0, 7, tzinfo=UTC)
    assert stopped_at({**gone, "StateTransitionReason": "User initiated (2026-12-06 04:00:07 UTC)"}) == \
        datetime(2026, 12, 6, 4, 0, 7, tzinfo=UTC)
    assert stopped_at({**gone, "State": {"Name": "running"}}) is None  # still billing
    assert stopped_at({**gone, "StateTransitionReason": ""}) is None
    assert launched_at({"LaunchTime": datetime(2026, 12, 6, 4, 0, 1)}) == datetime(2026, 12, 6, 4, 0, 1, tzinfo=UTC)


async def test_an_attempt_is_billed_from_ec2s_launch_to_its_termination(
        store: Store, aws_config: AwsConfig, aws_session: AioSession) -> None:
    clock = Clock(datetime.now(UTC))
    async with AwsProvider(aws_config, installation=INSTALLATION, session=aws_session) as aws:
        loops = BrokerLoops(Settings(broker=BrokerConfig(installation=INSTALLATION)), store,
                            Marketplace({"aws": aws}, clock=clock), clock=clock)
        await loops.market.refresh()
        job, _ = store.create_job(Job(id="j" + secrets.token_hex(6), spec=parse_spec(SPEC), created_at=clock(),
                                      updated_at=clock()))
        [placed] = await loops.place_pending([job.id])
        assert placed.placed, placed.reason
        await loops.poll_once()
        assert store.get_job(job.id).state is JobState.running
        [alloc] = store.allocations(job.id)
        ec2 = boto3.client("ec2", region_name=alloc.region, endpoint_url=aws_config.endpoint_url)
        [inst] = [i for r in ec2.describe_instances(InstanceIds=alloc.resource_ids)["Reservations"]
                  for i in r["Instances"]]
        assert alloc.attrs["running_since"] == launched_at(inst).isoformat()  # EC2's launch, not the poll's
        clock.now += timedelta(minutes=10)  # the broker's own view would book 10 minutes
        await loops.lifecycle.release(alloc, "test over")
    done = store.get_allocation(alloc.id)
    [inst] = [i for r in ec2.describe_instances(InstanceIds=alloc.resource_ids)["Reservations"]
              for i in r["Instances"]]
    span = (stopped_at(inst) - launched_at(inst)).total_seconds()  # type: ignore[operator]
    assert done.state is AllocationState.released and span < 60
    assert done.billed_s == 60.0  # EC2's span of a few seconds, at its 60 s minimum
    assert done.cost_usd == done.usd_per_hour * 60 / 3600
