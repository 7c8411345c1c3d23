"""Parsing EC2 instance-type records (the real ones, from shared/data/aws) and mapping EC2 errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from broker.errors import BadRequestError, CapacityError, ProviderAuthError, QuotaError, TransientError
from broker.models import IntraNode
from providers.aws.errors import map_error
from providers.aws.instance_types import latest_spot_prices, parse_instance_type, parse_network_gbps


@pytest.fixture(scope="module")
def records(shared_data: Path) -> dict[str, dict]:
    with open(shared_data / "aws" / "moto_instance_types_all_gpu.json", encoding="utf-8") as fh:
        return json.load(fh)


@pytest.mark.parametrize(
    ("text", "gbps"),
    [
        ("3200 Gigabit", 3200.0),
        ("4x 100 Gigabit", 400.0),
        ("Up to 25 Gigabit", 25.0),
        ("8x 400 Gigabit", 3200.0),
        ("Up to 10 Gigabit", 10.0),
        ("750 Megabit", 0.75),
        ("Moderate", 0.0),
        (None, 0.0),
    ],
)
def test_network_performance(text: str | None, gbps: float) -> None:
    assert parse_network_gbps(text) == gbps


def test_gpu_types_from_real_records(records: dict[str, dict]) -> None:
    types = {sku: parse_instance_type(rec) for sku, rec in records.items()}
    p5 = types["p5.48xlarge"]
    assert p5 is not None
    assert (p5.gpu, p5.gpu_count, p5.gpu_memory_gb, p5.vcpus) == ("H100-SXM", 8, 80.0, 192)
    assert p5.efa and p5.efa_interfaces == 32 and p5.network_gbps == 3200.0 and p5.intra is IntraNode.nvlink
    p4d, p4de = types["p4d.24xlarge"], types["p4de.24xlarge"]
    assert p4d is not None and p4de is not None
    assert (p4d.gpu, p4d.network_gbps, p4d.network_cards) == ("A100-SXM-40GB", 400.0, 4)
    assert p4de.gpu == "A100-SXM-80GB"
    assert types["p5en.48xlarge"].gpu == "H200"  # type: ignore[union-attr]
    g6e = types["g6e.48xlarge"]
    assert g6e is not None and g6e.gpu == "L40S" and g6e.intra is IntraNode.pcie and g6e.cluster_placement
    g5 = types["g5.xlarge"]
    assert g5 is not None and g5.gpu == "A10G" and not g5.efa and g5.network_gbps == 10.0
    # Fractional GPUs (g6f) and GPUs we cannot rank (T4g, RTX PRO) are not offered.
    assert types["g6f.xlarge"] is None and types["g5g.xlarge"] is None
    assert parse_instance_type({"InstanceType": "m5.large", "NetworkInfo": {}}) is None


def test_latest_spot_price_per_zone_and_type(shared_data: Path) -> None:
    rows = []
    with open(shared_data / "spot" / "aws-spot-prices-2022-05-31-gpu.tsv", encoding="utf-8") as fh:
        for line in fh:
            az, sku, _desc, price, at = line.rstrip("\n").split("\t")
            rows.append({"AvailabilityZone": az, "InstanceType": sku, "SpotPrice": price, "Timestamp": at})
    latest = latest_spot_prices(rows)
    key = next(iter(latest))
    newest = max((r for r in rows if (r["InstanceType"], r["AvailabilityZone"]) == key),
                 key=lambda r: r["Timestamp"])
    assert latest[key] == float(newest["SpotPrice"])
    assert len(latest) == len({(r["InstanceType"], r["AvailabilityZone"]) for r in rows})


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "RunInstances"
    )


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("InsufficientInstanceCapacity", 500, CapacityError),
        ("SpotMaxPriceTooLow", 400, CapacityError),
        ("MaxSpotInstanceCountExceeded", 400, CapacityError),
        ("Unsupported", 400, CapacityError),
        ("InstanceLimitExceeded", 400, QuotaError),
        ("VcpuLimitExceeded", 400, QuotaError),
        ("RequestLimitExceeded", 503, TransientError),
        ("Throttling", 400, TransientError),
        ("SomethingNew", 502, TransientError),
        ("AuthFailure", 401, ProviderAuthError),
        ("UnauthorizedOperation", 403, ProviderAuthError),
        ("InvalidClientTokenId", 403, ProviderAuthError),
        ("InvalidAMIID.Malformed", 400, BadRequestError),
        ("InvalidParameterValue", 400, BadRequestError),
    ],
)
def test_error_mapping(code: str, status: int, kind: type) -> None:
    err = map_error(_client_error(code, status), "aws", "RunInstances")
    assert type(err) is kind and err.code == code and err.provider == "aws"


def test_connection_and_credential_errors() -> None:
    assert isinstance(map_error(EndpointConnectionError(endpoint_url="http://x"), "aws", "op"), TransientError)
    assert isinstance(map_error(NoCredentialsError(), "aws", "op"), ProviderAuthError)
    assert isinstance(map_error(TimeoutError(), "aws", "op"), TransientError)


def test_spot_request_caps_the_price_per_node() -> None:
    from broker.models import Locality, Market, Offer
    from providers.aws.config import AwsConfig
    from providers.aws.requests import run_instances_request
    from tests.aws.conftest import job, launch_request

    offer = Offer(id="o", provider="aws", market=Market.spot, sku="p5.48xlarge", gpu="H100-SXM", gpu_count=8,
                  usd_per_hour=30.0, locality=Locality(provider="aws", region="us-east-1", zone="us-east-1a"))
    capped = launch_request(offer, 4, spec=job(gpu="H100", gpus=32, max_usd_per_hour=200.0))
    params = run_instances_request(capped, config=AwsConfig(), installation="x", provider="aws", gpu_type=None)
    assert params["InstanceMarketOptions"]["SpotOptions"]["MaxPrice"] == "50.00000"
    assert params["MinCount"] == params["MaxCount"] == 4 and "SubnetId" not in params
    on_demand = launch_request(offer.model_copy(update={"market": Market.on_demand}), 1)
    params = run_instances_request(on_demand, config=AwsConfig(), installation="x", provider="aws", gpu_type=None)
    assert "InstanceMarketOptions" not in params
