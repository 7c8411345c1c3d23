"""ReservedProvider: capacity reservations (Stubber: moto lacks them) and operator pools (moto)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiobotocore.session import AioSession
from botocore.stub import ANY

from broker.models import AllocationState, Colocate, Market
from providers.aws import AwsProvider, ReservedProvider
from providers.aws.config import AwsConfig, ReservedPool
from providers.base import OfferQuery
from tests.aws.conftest import INSTALLATION, launch_request
from tests.aws.stubs import instance, stub_config, stubbed
from tests.aws.test_stubbed import expect_token_lookup, expect_types
from tests.plugins.moto import moto_config

CR = "cr-0123456789abcdef0"


def reservation(cr_id: str, sku: str, available: int, **extra: object) -> dict:
    return {
        "CapacityReservationId": cr_id,
        "InstanceType": sku,
        "InstancePlatform": "Linux/UNIX",
        "AvailabilityZone": "us-east-1a",
        "TotalInstanceCount": 4,
        "AvailableInstanceCount": available,
        "State": "active",
        **extra,
    }


async def test_capacity_reservation_becomes_a_reserved_offer_and_launch_targets_it(shared_data: Path) -> None:
    pool = ReservedPool(name="p5-commit", sku="p5.48xlarge", region="us-east-1", zone="us-east-1a", count=4,
                        usd_per_hour=41.5, capacity_reservation_id=CR)
    config = stub_config(reserved_pools=[pool])
    async with stubbed(config, lambda aws: ReservedProvider(config, installation=INSTALLATION, aws=aws)) as (
        reserved, stub
    ):
        stub.add_response(
            "describe_capacity_reservations",
            {"CapacityReservations": [
                reservation(CR, "p5.48xlarge", 2),
                reservation("cr-0000000000000full", "p5.48xlarge", 0),  # nothing free
                reservation("cr-000000000000000m5", "m5.large", 3),  # not a GPU type
            ]},
            {"Filters": [{"Name": "state", "Values": ["active"]}]},
        )
        expect_types(stub, shared_data, "p5.48xlarge")
        offers = await reserved.offers(OfferQuery(gpus=["H100-SXM"]))
        assert len(offers) == 1
        offer = offers[0]
        assert offer.market is Market.reserved and offer.provider == "reserved"
        assert offer.usd_per_hour == 41.5  # the committed rate configured for this reservation
        assert offer.max_nodes == 2 and offer.attrs["capacity_reservation_id"] == CR
        assert (offer.gpu, offer.gpu_count, offer.zone) == ("H100-SXM", 8, "us-east-1a")

        req = launch_request(offer, 2)
        expect_token_lookup(stub, req.client_token)
        tags = {"lockstep:client-token": req.client_token, "lockstep:provider": "reserved"}
        stub.add_response(
            "run_instances",
            {"Instances": [instance(f"i-0c0000000000000{n}", "p5.48xlarge", "us-east-1a", tags) for n in range(2)]},
            {
                "ImageId": "ami-12c6146b",
                "InstanceType": "p5.48xlarge",
                "MinCount": 2,
                "MaxCount": 2,
                "ClientToken": req.client_token,
                # A reservation decides its own placement: no new placement group.
                "Placement": {"AvailabilityZone": "us-east-1a"},
                "TagSpecifications": ANY,
                "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
                "InstanceInitiatedShutdownBehavior": "terminate",
                "SubnetId": "subnet-0a1b2c3d4e5f60718",
                "SecurityGroupIds": ["sg-0123456789abcdef0"],
                "CapacityReservationSpecification": {"CapacityReservationTarget": {"CapacityReservationId": CR}},
            },
        )
        alloc = await reserved.launch(req)
        assert alloc.provider == "reserved" and alloc.nodes == 2 and alloc.zone == "us-east-1a"


async def test_reservation_in_a_cluster_group_is_offered_as_a_cluster(shared_data: Path) -> None:
    config = stub_config()
    async with stubbed(config, lambda aws: ReservedProvider(config, installation=INSTALLATION, aws=aws)) as (
        reserved, stub
    ):
        arn = "arn:aws:ec2:us-east-1:123456789012:placement-group/train-pg"
        stub.add_response(
            "describe_capacity_reservations",
            {"CapacityReservations": [reservation(CR, "p4d.24xlarge", 4, PlacementGroupArn=arn)]},
            {"Filters": [{"Name": "state", "Values": ["active"]}]},
        )
        expect_types(stub, shared_data, "p4d.24xlarge")
        [offer] = await reserved.offers()
        assert offer.usd_per_hour == 0.0  # already paid for: marginal cost 0
        assert offer.colocation is Colocate.cluster and offer.locality.cluster == "train-pg"


@pytest.mark.aws
async def test_operator_pool_launches_on_demand_and_reconciles_apart(
    aws_moto: str, aws_session: AioSession
) -> None:
    pool = ReservedPool(name="a100-plan", sku="p4d.24xlarge", region="us-east-1", zone="us-east-1b", count=3,
                        usd_per_hour=12.0)
    config: AwsConfig = moto_config(aws_moto, reserved_pools=[pool])
    shared = AwsProvider(config, installation=INSTALLATION, session=aws_session)
    async with ReservedProvider(config, installation=INSTALLATION, aws=shared) as reserved:
        offers = await reserved.offers(OfferQuery(markets=[Market.reserved]))
        assert [(o.sku, o.zone, o.max_nodes, o.usd_per_hour) for o in offers] == [
            ("p4d.24xlarge", "us-east-1b", 3, 12.0)
        ]
        assert await reserved.offers(OfferQuery(markets=[Market.spot])) == []
        alloc = await reserved.launch(launch_request(offers[0], 2))
        assert alloc.provider == "reserved" and alloc.zone == "us-east-1b"
        assert (await reserved.poll(alloc)).state is AllocationState.running
        assert [a.resource_ids for a in await reserved.owned()] == [alloc.resource_ids]
        # The spot/on-demand adapter does not claim the pool's instances.
        assert await shared.owned() == []
        await reserved.release(alloc)
        assert await reserved.owned() == []
    await shared.aclose()
