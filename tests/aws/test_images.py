"""Images per region (issue 28, item 1): AMI ids are regional, so one id for every region fails everywhere but
its own. A region's image is its own setting or AWS's public SSM parameter, read in that region; a configuration
that would launch one AMI id in two regions is refused by `lockstep config check` (exit 2, naming the region).

moto launches any AMI id in any region, so the tests go through the fault proxy, which knows each region's
images (registered in moto, one per region) and answers another with EC2's InvalidAMIID.NotFound.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from aiobotocore.session import AioSession

from broker.errors import BadRequestError
from broker.models import Market
from providers.aws import AwsProvider
from providers.base import OfferQuery
from tests.aws.conftest import INSTALLATION, launch_request, pick
from tests.plugins.moto import FaultProxy, moto_config

REGIONS = ["us-east-1", "us-west-2"]
PARAMETER = "/lockstep/tests/deeplearning/ami-id"
ROOT = Path(__file__).resolve().parents[2]


def _register(url: str, region: str) -> str:
    """One image registered in ``region`` and published under PARAMETER there, as AWS does for its DLAMI."""
    ec2 = boto3.client("ec2", region_name=region, endpoint_url=url)
    ami = ec2.register_image(Name=f"lockstep-dlami-{region}", Architecture="x86_64",
                             RootDeviceName="/dev/sda1")["ImageId"]
    boto3.client("ssm", region_name=region, endpoint_url=url).put_parameter(
        Name=PARAMETER, Value=ami, Type="String", DataType="aws:ec2:image", Overwrite=True)
    return str(ami)


@pytest.mark.aws
async def test_each_region_launches_its_own_image_resolved_from_ssm(
        aws_faults: FaultProxy, moto_server: str, aws_session: AioSession) -> None:
    amis = {r: _register(moto_server, r) for r in REGIONS}
    aws_faults.images = {r: {ami} for r, ami in amis.items()}
    config = moto_config(aws_faults.url, regions=REGIONS, image_id=f"resolve:ssm:{PARAMETER}", images={},
                         ssm_endpoint_url=moto_server)
    async with AwsProvider(config, installation=INSTALLATION, session=aws_session) as aws:
        offers = await aws.offers(OfferQuery(markets=[Market.on_demand]))
        for n, region in enumerate(REGIONS):
            offer = pick([o for o in offers if o.region == region], "g5.xlarge", Market.on_demand)
            alloc = await aws.launch(launch_request(offer, 1, job_id=f"job-{region}"))
            [inst] = boto3.client("ec2", region_name=region, endpoint_url=moto_server).describe_instances(
                InstanceIds=alloc.resource_ids)["Reservations"][0]["Instances"]
            assert inst["ImageId"] == amis[region], (region, n)
            await aws.release(alloc)


@pytest.mark.aws
async def test_a_region_without_its_parameter_is_a_clear_error_before_anything_is_bought(
        aws_faults: FaultProxy, moto_server: str, aws_session: AioSession) -> None:
    _register(moto_server, "us-east-1")  # us-west-2 has no such parameter
    config = moto_config(aws_faults.url, regions=REGIONS, image_id=f"resolve:ssm:{PARAMETER}", images={},
                         ssm_endpoint_url=moto_server)
    async with AwsProvider(config, installation=INSTALLATION, session=aws_session) as aws:
        offers = await aws.offers(OfferQuery(markets=[Market.on_demand]))
        offer = pick([o for o in offers if o.region == "us-west-2"], "g5.xlarge", Market.on_demand)
        with pytest.raises(BadRequestError) as err:
            await aws.launch(launch_request(offer, 1))
    assert "us-west-2" in str(err.value) and PARAMETER in str(err.value) and err.value.code == "NoImage"
    assert ("RunInstances", None, "us-west-2") not in [(a, None, r) for a, _z, r in aws_faults.calls]


def _check(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "lockstep.yaml"
    cfg.write_text(text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", "from broker.cli import main; main()", "config", "check", str(cfg)],
                          capture_output=True,
                          text=True, env=env, timeout=120, cwd=tmp_path)


def test_config_check_refuses_one_ami_id_for_two_regions_naming_the_region(tmp_path: Path) -> None:
    bad = _check(tmp_path, "aws:\n  enabled: true\n  regions: [us-east-1, us-west-2]\n"
                           "  image_id: ami-0123456789abcdef0\n")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "aws.images" in bad.stdout and "us-west-2" in bad.stdout and "Traceback" not in bad.stdout + bad.stderr
    good = _check(tmp_path, "aws:\n  enabled: true\n  regions: [us-east-1, us-west-2]\n"
                            "  images: {us-east-1: ami-0123456789abcdef0, us-west-2: ami-0fedcba9876543210}\n")
    assert good.returncode == 0, good.stdout + good.stderr
    default = _check(tmp_path, "aws:\n  enabled: true\n  regions: [us-east-1, us-west-2]\n")  # the DLAMI parameter
    assert default.returncode == 0, default.stdout + default.stderr
