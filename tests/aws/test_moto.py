"""AwsProvider against moto's EC2 server on loopback (real HTTP, real botocore, no stubs)."""

from __future__ import annotations

import pytest
from aiobotocore.session import AioSession

from broker.errors import CapacityError, ProviderAuthError
from broker.models import AllocationState, Colocate, Fabric, IntraNode, Market
from providers.aws import AwsProvider
from providers.aws.config import AwsConfig
from providers.aws.requests import ATTEMPT_TAG, CLIENT_TOKEN_TAG, PROVIDER_TAG
from providers.base import JOB_TAG, OWNER_TAG, TENANT_TAG, OfferQuery
from tests.aws.conftest import INSTALLATION, launch_request, pick
from tests.plugins.moto import FaultProxy, moto_config

pytestmark = pytest.mark.aws


async def _instances(aws: AwsProvider, ids: list[str]) -> dict[str, dict]:
    found = await aws.ec2.instances("us-east-1", [{"Name": "instance-id", "Values": ids}])
    return {i["InstanceId"]: i for i in found}


async def test_offers_list_p4d_and_p5_with_efa(aws_moto: str, aws_session: AioSession) -> None:
    provider = AwsProvider(
        moto_config(aws_moto, placement_groups=True), installation=INSTALLATION, session=aws_session
    )
    async with provider:
        offers = await provider.offers(OfferQuery(gpus=["A100-SXM-40GB", "H100-SXM", "H200"]))
    assert provider.region_health["us-east-1"].ok
    p4d = pick(offers, "p4d.24xlarge", Market.spot)
    assert (p4d.gpu, p4d.gpu_count, p4d.gpu_memory_gb) == ("A100-SXM-40GB", 8, 40.0)
    assert p4d.network.fabric is Fabric.efa and p4d.network.fabric_gbps == 400.0  # "4x 100 Gigabit"
    assert p4d.network.intra is IntraNode.nvlink and p4d.interruptible
    assert p4d.colocation is Colocate.cluster and p4d.max_nodes == 16
    assert p4d.vcpus == 96 and p4d.ram_gb == 1152.0
    assert p4d.locality.region == "us-east-1" and p4d.zone.startswith("us-east-1")
    p5 = pick(offers, "p5.48xlarge", Market.spot)
    assert (p5.gpu, p5.gpu_count) == ("H100-SXM", 8)
    assert p5.network.fabric is Fabric.efa and p5.network.fabric_gbps == 3200.0
    assert p5.attrs["efa_interfaces"] == "32"
    p5_single = pick(offers, "p5.4xlarge", Market.spot)
    assert p5_single.gpu_count == 1 and p5_single.network.intra is IntraNode.pcie
    assert {o.gpu for o in offers} <= {"A100-SXM-40GB", "H100-SXM", "H200"}
    # On-demand prices come from the bundled catalog; a type it does not price (p5e) has no on-demand offer.
    from providers.catalog.client import aws_on_demand_price

    od = pick(offers, "p5.48xlarge", Market.on_demand, p5.zone)
    assert od.usd_per_hour == aws_on_demand_price("p5.48xlarge", "us-east-1") and not od.interruptible
    assert not [o for o in offers if o.sku == "p5e.48xlarge" and o.market is Market.on_demand]
    # One offer per (type, zone, market): no duplicates.
    assert len({o.id for o in offers}) == len(offers)


async def test_offers_without_placement_groups_promise_only_a_zone(aws: AwsProvider) -> None:
    offers = await aws.offers(OfferQuery(gpus=["L40S"], markets=[Market.spot]))
    g6e = pick(offers, "g6e.48xlarge", Market.spot)
    assert g6e.colocation is Colocate.zone
    assert g6e.network.intra is IntraNode.pcie and g6e.network.fabric is Fabric.efa
    assert all(o.market is Market.spot for o in offers)


async def test_four_node_job_gets_four_tagged_instances_in_one_zone(aws: AwsProvider) -> None:
    offers = await aws.offers(OfferQuery(gpus=["A100-SXM-40GB"], markets=[Market.spot]))
    offer = pick(offers, "p4d.24xlarge", Market.spot)
    alloc = await aws.launch(launch_request(offer, 4))
    assert alloc.nodes == 4 and len(set(alloc.resource_ids)) == 4
    assert alloc.zone == offer.zone and alloc.provider == "aws"
    assert alloc.client_token == launch_request(offer, 4).client_token == alloc.id
    found = await _instances(aws, alloc.resource_ids)
    assert {i["Placement"]["AvailabilityZone"] for i in found.values()} == {offer.zone}
    assert {i["InstanceType"] for i in found.values()} == {"p4d.24xlarge"}
    assert {i.get("InstanceLifecycle") for i in found.values()} == {"spot"}
    for inst in found.values():
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert tags[OWNER_TAG] == INSTALLATION and tags[JOB_TAG] == "job-1" and tags[TENANT_TAG] == "team-a"
        assert tags[CLIENT_TOKEN_TAG] == alloc.client_token and tags[ATTEMPT_TAG] == "0"
        assert tags[PROVIDER_TAG] == "aws"
    status = await aws.poll(alloc)
    assert status.state is AllocationState.running and len(status.hosts) == 4


async def test_launch_twice_with_same_job_and_attempt_buys_once(aws: AwsProvider) -> None:
    offers = await aws.offers(OfferQuery(gpus=["H100-SXM"], markets=[Market.spot]))
    offer = pick(offers, "p5.48xlarge", Market.spot)
    first = await aws.launch(launch_request(offer, 2))
    again = await aws.launch(launch_request(offer, 2))
    assert sorted(again.resource_ids) == sorted(first.resource_ids)
    # A new attempt is a new purchase.
    other = await aws.launch(launch_request(offer, 2, attempt=1))
    assert not set(other.resource_ids) & set(first.resource_ids)
    live = await aws.ec2.instances(
        "us-east-1", [{"Name": f"tag:{OWNER_TAG}", "Values": [INSTALLATION]},
                      {"Name": "instance-state-name", "Values": ["pending", "running"]}]
    )
    assert len(live) == 4


async def test_release_terminates_and_owned_survives_a_restart(
    aws_config: AwsConfig, aws_session: AioSession
) -> None:
    async with AwsProvider(aws_config, installation=INSTALLATION, session=aws_session) as first:
        offers = await first.offers(OfferQuery(gpus=["A100-SXM-40GB"], markets=[Market.spot]))
        offer = pick(offers, "p4d.24xlarge", Market.spot)
        kept = await first.launch(launch_request(offer, 2, job_id="job-kept"))
        gone = await first.launch(launch_request(offer, 1, job_id="job-gone"))
        await first.release(gone)
        assert (await first.poll(gone)).state is AllocationState.released
        found = await _instances(first, gone.resource_ids)
        assert found[gone.resource_ids[0]]["State"]["Name"] == "terminated"
        await first.release(gone)  # idempotent
    # A new process (same installation) finds what is still held, grouped by job.
    async with AwsProvider(aws_config, installation=INSTALLATION, session=aws_session) as second:
        owned = await second.owned()
        assert [(a.job_id, sorted(a.resource_ids)) for a in owned] == [("job-kept", sorted(kept.resource_ids))]
        assert owned[0].attrs["market"] == "spot" and owned[0].zone == offer.zone
        assert owned[0].client_token == kept.client_token
        # After a restart the released-tag, not memory, tells release from preemption.
        assert (await second.poll(gone)).state is AllocationState.released
    async with AwsProvider(aws_config, installation="someone-else", session=aws_session) as stranger:
        assert await stranger.owned() == []


async def test_capacity_error_in_one_zone_through_the_proxy(
    aws_faults: FaultProxy, aws_proxy_config: AwsConfig, aws_session: AioSession
) -> None:
    async with AwsProvider(aws_proxy_config, installation=INSTALLATION, session=aws_session) as aws:
        offers = await aws.offers(OfferQuery(gpus=["A100-SXM-40GB"], markets=[Market.spot]))
        zones = sorted({o.zone for o in offers if o.sku == "p4d.24xlarge"})
        assert len(zones) >= 2
        aws_faults.fail("RunInstances", "InsufficientInstanceCapacity", zone=zones[0])
        with pytest.raises(CapacityError) as err:
            await aws.launch(launch_request(pick(offers, "p4d.24xlarge", Market.spot, zones[0]), 2))
        assert err.value.code == "InsufficientInstanceCapacity"
        # The next zone is untouched by the fault.
        alloc = await aws.launch(
            launch_request(pick(offers, "p4d.24xlarge", Market.spot, zones[1]), 2, job_id="job-2")
        )
        assert alloc.zone == zones[1] and alloc.nodes == 2
        assert aws_faults.actions("RunInstances") == [zones[0], zones[1]]


async def test_out_of_band_spot_termination_is_a_preemption(aws: AwsProvider, aws_session: AioSession) -> None:
    offers = await aws.offers(OfferQuery(gpus=["H100-SXM"], markets=[Market.spot]))
    alloc = await aws.launch(launch_request(pick(offers, "p5.48xlarge", Market.spot), 2))
    assert (await aws.poll(alloc)).state is AllocationState.running
    # AWS (here: another client) ends one node; Lockstep did not release it.
    async with AwsProvider(aws.config, installation="outsider", session=aws_session) as outsider:
        await outsider.ec2.request("us-east-1", "terminate_instances", InstanceIds=alloc.resource_ids[:1])
    status = await aws.poll(alloc)
    assert status.state is AllocationState.preempted
    assert alloc.resource_ids[0] in status.reason


async def test_throttled_launch_is_retried_once_and_buys_once(
    aws_faults: FaultProxy, aws_proxy_config: AwsConfig, aws_session: AioSession
) -> None:
    async with AwsProvider(aws_proxy_config, installation=INSTALLATION, session=aws_session) as aws:
        offers = await aws.offers(OfferQuery(gpus=["H100-SXM"], markets=[Market.spot]))
        aws_faults.fail("RunInstances", "RequestLimitExceeded", times=1)
        alloc = await aws.launch(launch_request(pick(offers, "p5.48xlarge", Market.spot), 2))
        assert alloc.nodes == 2
        assert len(aws_faults.actions("RunInstances")) == 2  # throttled, then retried


async def test_a_failing_region_leaves_the_others_standing(
    aws_faults: FaultProxy, aws_proxy_config: AwsConfig, aws_session: AioSession
) -> None:
    config = aws_proxy_config.model_copy(update={"regions": ["us-east-1", "us-west-2"], "max_attempts": 1})
    aws_faults.fail("DescribeInstanceTypes", "Unavailable", region="us-west-2")
    async with AwsProvider(config, installation=INSTALLATION, session=aws_session) as aws:
        offers = await aws.offers(OfferQuery(gpus=["A100-SXM-40GB"], markets=[Market.spot]))
        assert offers and {o.region for o in offers} == {"us-east-1"}
        assert aws.region_health["us-east-1"].ok
        bad = aws.region_health["us-west-2"]
        assert not bad.ok and bad.code == "Unavailable"
        # Every region down: the caller hears it (the market marks AWS stale).
        aws_faults.fail("DescribeInstanceTypeOfferings", "AuthFailure", region="us-east-1")
        with pytest.raises(ProviderAuthError):
            await aws.offers(OfferQuery(gpus=["H100-SXM"], regions=["us-east-1"]))
