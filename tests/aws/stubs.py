"""botocore Stubber helpers for what moto does not emulate.

Stubber checks every request against the real EC2 service model (parameter names,
types, required fields) and each canned answer against the output shapes, so these
tests exercise the real botocore request path of AwsProvider up to the wire.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiobotocore.session import AioSession
from botocore.stub import Stubber

from providers.aws import AwsProvider
from providers.aws.config import AwsConfig
from tests.aws.conftest import INSTALLATION

# Nothing listens here; the Stubber answers before any connection is made.
UNUSED_ENDPOINT = "http://127.0.0.1:9"


def stub_config(**overrides: Any) -> AwsConfig:
    regions = overrides.get("regions", ["us-east-1"])
    data: dict[str, Any] = {
        "enabled": True,
        "regions": ["us-east-1"],
        "endpoint_url": UNUSED_ENDPOINT,
        "max_attempts": 3,
        "subnet_ids": {"us-east-1a": "subnet-0a1b2c3d4e5f60718"},
        "security_group_ids": ["sg-0123456789abcdef0"],
        # Each listed region's own image (AMI ids are regional); `regions: all` resolves a parameter.
        "image_id": "ami-12c6146b" if isinstance(regions, list) else "resolve:ssm:/lockstep/tests/ami",
        "images": {r: "ami-12c6146b" for r in regions} if isinstance(regions, list) else {},
    }
    data.update(overrides)
    return AwsConfig.model_validate(data)


def type_records(shared_data: Path, *skus: str) -> list[dict[str, Any]]:
    with open(shared_data / "aws" / "moto_instance_types_gpu_selected.json", encoding="utf-8") as fh:
        records = json.load(fh)
    return [records[s] for s in skus]


def instance(iid: str, sku: str, zone: str, tags: dict[str, str], state: str = "pending", **extra: Any) -> dict:
    return {
        "InstanceId": iid,
        "InstanceType": sku,
        "Placement": {"AvailabilityZone": zone, **extra.pop("placement", {})},
        "State": {"Code": 0 if state == "pending" else 16, "Name": state},
        "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
        **extra,
    }


_SESSION: AioSession | None = None


def _session() -> AioSession:
    """One session for all stubbed tests: it caches the parsed EC2 model (~0.5 s to load)."""
    global _SESSION
    if _SESSION is None:
        _SESSION = AioSession()
        _SESSION.set_credentials("AKIDSTUBBED", "stubbed-secret")
    return _SESSION


@asynccontextmanager
async def stubbed(config: AwsConfig, factory: Callable[[AwsProvider], Any] | None = None
                  ) -> AsyncIterator[tuple[Any, Stubber]]:
    """An AwsProvider (or what ``factory`` builds on it) whose us-east-1 client is stubbed."""
    aws = AwsProvider(config, installation=INSTALLATION, session=_session())
    provider = factory(aws) if factory else aws
    try:
        stub = Stubber(await aws.ec2.client("us-east-1"))
        with stub:
            yield provider, stub
            stub.assert_no_pending_responses()
    finally:
        await aws.aclose()
