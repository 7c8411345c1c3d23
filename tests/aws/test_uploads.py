"""Run-time reporting that outlives temporary credentials (issue 28, items 3 and 9), on moto's EC2, S3 and IAM.

A presigned URL dies with the credentials that signed it; a broker usually runs with temporary ones. So a launch
whose upload URLs cannot be shown to outlive the job is refused, saying why; with ``aws.instance_profile`` the
instance fetches and reports with its own role and no URL that expires; and a data input in another region's
bucket is signed for that region (signed for the run-time bucket's, S3 answers 301/400 to the instance).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlparse

import boto3
import pytest
from aiobotocore.session import AioSession

from broker.errors import BadRequestError
from providers.aws import AwsProvider
from providers.aws.config import AwsConfig
from providers.aws.runtime import RunLocation
from providers.aws.uploads import INSTANCE_PROFILE, PRESIGNED, Credentials, choose
from standins.ec2 import BUCKET, ec2_client, s3_client, user_data_of
from tests.aws.conftest import INSTALLATION
from tests.aws.test_runtime import a10g, request

pytestmark = pytest.mark.aws

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def temporary_session() -> AioSession:
    """A broker on a role: credentials with a session token and no known expiry (as from the environment)."""
    session = AioSession()
    session.set_credentials("ASIATESTING", "testing", "a-session-token")
    return session


def _objects(endpoint: str) -> list[str]:
    return [o["Key"] for o in s3_client(endpoint).list_objects_v2(Bucket=BUCKET).get("Contents", [])]


async def test_temporary_credentials_refuse_presigned_reporting_before_anything_is_bought(
        runtime_config: AwsConfig, aws_moto: str) -> None:
    async with AwsProvider(runtime_config, installation=INSTALLATION, session=temporary_session()) as aws:
        offer = await a10g(aws)
        with pytest.raises(BadRequestError) as err:
            await aws.launch(request(offer, "echo hi", max_duration="6h"))
    assert err.value.code == "ShortLivedUrls" and "aws.instance_profile" in str(err.value)
    assert "temporary" in str(err.value)
    reservations = ec2_client(aws_moto).describe_instances()["Reservations"]
    assert not [i for r in reservations for i in r["Instances"]]  # nothing launched
    assert not [k for k in _objects(aws_moto) if k.endswith("manifest.json")]  # no secrets left staged


async def test_an_instance_profile_reports_with_the_instances_role_and_no_expiring_url(
        runtime_config: AwsConfig, aws_moto: str) -> None:
    boto3.client("iam", region_name="us-east-1", endpoint_url=aws_moto).create_instance_profile(
        InstanceProfileName="lockstep-runner")
    config = runtime_config.model_copy(update={"instance_profile": "lockstep-runner"})
    async with AwsProvider(config, installation=INSTALLATION, session=temporary_session()) as aws:
        offer = await a10g(aws)
        alloc = await aws.launch(request(offer, "echo hi", nodes=2, max_duration="3d"))
        iid = alloc.resource_ids[0]
        [inst] = ec2_client(aws_moto).describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"]
        assert inst["IamInstanceProfile"]["Arn"].endswith(":instance-profile/lockstep-runner")
        where = RunLocation.of(config, INSTALLATION, "job-rt", 1)
        script = user_data_of(aws_moto, iid)
        assert f"S3={where.uri}" in script and "aws s3 cp" in script and "aws s3 sync" in script
        assert "X-Amz-Signature" not in script and "http" not in script  # no URL at all, none that expires
        manifest = json.loads(s3_client(aws_moto).get_object(Bucket=BUCKET, Key=where.manifest)["Body"].read())
        assert "put_urls" not in manifest["logs"] and "status_put_urls" not in manifest["logs"]
        assert manifest["logs"]["file"].endswith("/out/log-{rank}.txt")
        assert manifest["logs"]["status_dir"].endswith("/out")
        assert "peers_url" not in manifest["rendezvous"] and manifest["rendezvous"]["peers_file"].endswith(
            "/peers.json")
        assert manifest["shutdown"][-3:] == [manifest["logs"]["status_dir"] + "/", where.uri, "us-east-1"]
        await aws.release(alloc)


async def test_a_data_input_in_another_regions_bucket_is_signed_for_that_region(
        runtime_config: AwsConfig, aws_moto: str, aws_session: AioSession) -> None:
    eu = boto3.client("s3", region_name="eu-west-1", endpoint_url=aws_moto)
    eu.create_bucket(Bucket="corpus-eu", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    eu.put_object(Bucket="corpus-eu", Key="tokens/shard-0.bin", Body=b"tokens")
    async with AwsProvider(runtime_config, installation=INSTALLATION, session=aws_session) as aws:
        offer = await a10g(aws)
        alloc = await aws.launch(request(offer, "echo hi", max_duration="2h",
                                         data={"uri": "s3://corpus-eu/tokens/shard-0.bin", "size_gb": 1}))
        where = RunLocation.of(runtime_config, INSTALLATION, "job-rt", 1)
        manifest = json.loads(s3_client(aws_moto).get_object(Bucket=BUCKET, Key=where.manifest)["Body"].read())
        await aws.release(alloc)
    url = manifest["data"]["url"]
    scope = parse_qs(urlparse(url).query)["X-Amz-Credential"][0]
    assert "/eu-west-1/s3/aws4_request" in scope, scope
    # The run-time bucket's own URLs stay signed for its region.
    log_url = next(iter(manifest["logs"]["put_urls"].values()))
    assert "/us-east-1/s3/aws4_request" in parse_qs(urlparse(log_url).query)["X-Amz-Credential"][0]


def test_presigned_urls_only_where_they_provably_outlive_the_job(runtime_config: AwsConfig) -> None:
    day = 86400.0
    long_term = Credentials(temporary=False, source="env")
    assert choose(runtime_config, long_term, needed_s=3 * day, now=NOW).ok
    assert not choose(runtime_config, long_term, needed_s=8 * day, now=NOW).ok  # past SigV4's 7 days
    role = Credentials(temporary=True, expires_at=NOW + timedelta(hours=6), source="iam-role")
    assert choose(runtime_config, role, needed_s=5 * 3600, now=NOW).ok
    short = choose(runtime_config, role, needed_s=7 * 3600, now=NOW)
    assert not short.ok and short.mode == PRESIGNED and "expire in 6.0 h" in short.why
    assert not choose(runtime_config, Credentials(temporary=True), needed_s=60, now=NOW).ok  # expiry unknown
    profile = runtime_config.model_copy(update={"instance_profile": "lockstep-runner"})
    mode = choose(profile, None, needed_s=30 * day, now=NOW)
    assert mode.ok and mode.mode == INSTANCE_PROFILE
