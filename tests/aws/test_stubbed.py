"""What moto does not emulate, through botocore's Stubber: cluster placement groups, EFA, retries."""

from __future__ import annotations

from pathlib import Path

import pytest
from botocore.stub import ANY

from broker.errors import CapacityError, ProviderAuthError, QuotaError
from broker.models import Locality, Market, Offer
from providers.aws.requests import LIVE_STATES, placement_group_name
from providers.base import OWNER_TAG
from tests.aws.conftest import INSTALLATION, job, launch_request
from tests.aws.stubs import instance, stub_config, stubbed, type_records

ZONE = "us-east-1a"


def p4d_offer(market: Market = Market.on_demand) -> Offer:
    return Offer(
        id=f"aws:{market.value}:us-east-1:{ZONE}:p4d.24xlarge",
        provider="aws",
        market=market,
        sku="p4d.24xlarge",
        gpu="A100-SXM-40GB",
        gpu_count=8,
        usd_per_hour=32.77,
        locality=Locality(provider="aws", region="us-east-1", zone=ZONE),
    )


def expect_token_lookup(stub, token: str, found: list[dict] | None = None) -> None:
    stub.add_response(
        "describe_instances",
        {"Reservations": [{"Instances": found}] if found else []},
        {
            "Filters": [
                {"Name": "tag:lockstep:client-token", "Values": [token]},
                {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
            ]
        },
    )


def expect_types(stub, shared_data: Path, *skus: str) -> None:
    stub.add_response(
        "describe_instance_types",
        {"InstanceTypes": type_records(shared_data, *skus)},
        {"Filters": [{"Name": "instance-type", "Values": ["p*", "g*"]}], "MaxResults": 100},
    )


async def test_four_node_efa_job_uses_one_cluster_placement_group(shared_data: Path) -> None:
    req = launch_request(p4d_offer(), 4, spec=job(gpus=32, fabric="efa"))
    group = placement_group_name(INSTALLATION, "job-1", 0)
    tags = {
        "Name": "lockstep-job-1",
        OWNER_TAG: INSTALLATION,
        "lockstep:job": "job-1",
        "lockstep:tenant": "team-a",
        "lockstep:client-token": req.client_token,
        "lockstep:attempt": "0",
        "lockstep:provider": "aws",
        "lockstep:market": "on_demand",
        "lockstep:placement-group": group,
    }
    tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
    ids = [f"i-0000000000000000{n}" for n in range(4)]
    async with stubbed(stub_config()) as (aws, stub):
        expect_token_lookup(stub, req.client_token)
        expect_types(stub, shared_data, "p4d.24xlarge")
        stub.add_response(
            "create_placement_group",
            {"PlacementGroup": {"GroupName": group, "Strategy": "cluster", "State": "available"}},
            {"GroupName": group, "Strategy": "cluster",
             "TagSpecifications": [{"ResourceType": "placement-group", "Tags": tag_list}]},
        )
        efa = [
            {"NetworkCardIndex": card, "DeviceIndex": 0 if card == 0 else 1, "InterfaceType": "efa",
             "SubnetId": "subnet-0a1b2c3d4e5f60718", "DeleteOnTermination": True,
             "Groups": ["sg-0123456789abcdef0"]}
            for card in range(4)  # p4d: 4 network cards, 4 EFA interfaces
        ]
        stub.add_response(
            "run_instances",
            {"Instances": [instance(i, "p4d.24xlarge", ZONE, tags, placement={"GroupName": group}) for i in ids]},
            {
                "ImageId": "ami-12c6146b",
                "InstanceType": "p4d.24xlarge",
                "MinCount": 4,
                "MaxCount": 4,
                "ClientToken": req.client_token,
                "Placement": {"AvailabilityZone": ZONE, "GroupName": group},
                "TagSpecifications": [
                    {"ResourceType": "instance", "Tags": tag_list},
                    {"ResourceType": "volume", "Tags": tag_list},
                ],
                "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
                "InstanceInitiatedShutdownBehavior": "terminate",
                "NetworkInterfaces": efa,
            },
        )
        alloc = await aws.launch(req)
        assert alloc.resource_ids == ids and alloc.attrs["placement_group"] == group

        # Release: mark, terminate, then remove the group.
        running = [instance(i, "p4d.24xlarge", ZONE, tags, "running") for i in ids]
        stub.add_response(
            "describe_instances",
            {"Reservations": [{"Instances": running}]},
            {"Filters": [{"Name": "instance-id", "Values": ids}]},
        )
        stub.add_response(
            "create_tags", {}, {"Resources": ids, "Tags": [{"Key": "lockstep:released", "Value": "true"}]}
        )
        stub.add_response("terminate_instances", {"TerminatingInstances": []}, {"InstanceIds": ids})
        stub.add_response("delete_placement_group", {}, {"GroupName": group})
        await aws.release(alloc)


async def test_group_in_use_is_deleted_by_a_later_sweep() -> None:
    group = placement_group_name(INSTALLATION, "job-1", 0)
    async with stubbed(stub_config()) as (aws, stub):
        stub.add_client_error(
            "delete_placement_group", "InvalidPlacementGroup.InUse", http_status_code=400,
            expected_params={"GroupName": group},
        )
        stub.add_response("delete_placement_group", {}, {"GroupName": group})
        assert await aws.delete_placement_group("us-east-1", group) is False
        assert await aws.sweep_placement_groups() == [group]
        assert await aws.sweep_placement_groups() == []


async def test_capacity_error_removes_the_new_group(shared_data: Path) -> None:
    req = launch_request(p4d_offer(Market.spot), 2)
    group = placement_group_name(INSTALLATION, "job-1", 0)
    async with stubbed(stub_config()) as (aws, stub):
        expect_token_lookup(stub, req.client_token)
        expect_types(stub, shared_data, "p4d.24xlarge")
        stub.add_response("create_placement_group", {}, {"GroupName": group, "Strategy": "cluster",
                                                         "TagSpecifications": ANY})
        stub.add_client_error("run_instances", "InsufficientInstanceCapacity", http_status_code=500)
        stub.add_response("delete_placement_group", {}, {"GroupName": group})
        with pytest.raises(CapacityError):
            await aws.launch(req)


async def test_throttling_is_retried_and_quota_is_not(shared_data: Path) -> None:
    req = launch_request(p4d_offer(Market.spot), 1)
    async with stubbed(stub_config()) as (aws, stub):
        stub.add_client_error("describe_instances", "RequestLimitExceeded", http_status_code=503)
        expect_token_lookup(stub, req.client_token)
        expect_types(stub, shared_data, "p4d.24xlarge")
        stub.add_client_error("run_instances", "VcpuLimitExceeded", http_status_code=400)
        with pytest.raises(QuotaError) as err:
            await aws.launch(req)  # one RunInstances only: a quota error is final
        assert err.value.code == "VcpuLimitExceeded"


@pytest.mark.parametrize(("code", "market", "state", "said"), [
    ("Server.SpotInstanceTermination", "on_demand", "preempted", "Server.SpotInstanceTermination"),
    # moto gives every termination the same reason, so this one goes through the Stubber: the instance's own
    # OS shut it down (its wrapper, or a boot script that could not start it) and no status came back.
    ("Client.InstanceInitiatedShutdown", "spot", "failed", "shut themselves down"),
])
async def test_what_the_state_reason_of_an_instance_gone_without_a_status_means(
    code: str, market: str, state: str, said: str
) -> None:
    from broker.models import Allocation, AllocationState

    alloc = Allocation(id="t", job_id="job-1", provider="aws", region="us-east-1", zone=ZONE,
                       resource_ids=["i-00000000000000001"], attrs={"market": market})
    gone = instance("i-00000000000000001", "p4d.24xlarge", ZONE, {}, "terminated",
                    StateReason={"Code": code, "Message": "gone"})
    gone["State"]["Code"] = 48
    async with stubbed(stub_config()) as (aws, stub):
        stub.add_response("describe_instances", {"Reservations": [{"Instances": [gone]}]},
                          {"Filters": [{"Name": "instance-id", "Values": alloc.resource_ids}]})
        status = await aws.poll(alloc)
        assert status.state is AllocationState(state) and said in status.reason and status.exit is None


async def test_errors_and_repr_carry_no_credentials() -> None:
    async with stubbed(stub_config()) as (aws, stub):
        stub.add_client_error("describe_instances", "AuthFailure", http_status_code=401,
                              service_message="AWS was not able to validate the provided access credentials")
        with pytest.raises(ProviderAuthError) as err:
            await aws.owned()
        text = f"{err.value} {err.value!r} {aws!r}"
        assert "AKIDSTUBBED" not in text and "stubbed-secret" not in text and "AuthFailure" in text


async def test_on_demand_instance_ended_by_aws_is_a_preemption_and_pending_is_pending() -> None:
    # Issue 15: an instance stopped or terminated under a job, not by Lockstep, requeues the job (counted);
    # a hardware failure is no fault of the job's.
    from broker.models import Allocation, AllocationState

    ids = ["i-00000000000000001", "i-00000000000000002"]
    alloc = Allocation(id="t", job_id="job-1", provider="aws", region="us-east-1", zone=ZONE,
                       resource_ids=ids, attrs={"market": "on_demand"})
    starting = [instance(i, "p4d.24xlarge", ZONE, {}, "pending") for i in ids]
    failed = instance(ids[1], "p4d.24xlarge", ZONE, {}, "terminated",
                      StateReason={"Code": "Server.InternalError", "Message": "internal error"})
    async with stubbed(stub_config()) as (aws, stub):
        params = {"Filters": [{"Name": "instance-id", "Values": ids}]}
        stub.add_response("describe_instances", {"Reservations": [{"Instances": starting}]}, params)
        stub.add_response("describe_instances", {"Reservations": [{"Instances": [starting[0], failed]}]}, params)
        assert (await aws.poll(alloc)).state is AllocationState.pending
        status = await aws.poll(alloc)
        assert status.state is AllocationState.preempted and "Server.InternalError" in status.reason
        assert ids[1] in status.reason and ids[0] not in status.reason

