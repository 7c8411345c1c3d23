"""EC2 and S3 through aiobotocore: one cached client per region, every call's errors mapped and retried.

Credentials come from the standard AWS chain (env, profile, instance role) and
are never logged. Botocore's own retries are off: errors reach the mapping in
:mod:`providers.aws.errors`, and TransientError is retried by the shared policy
(:mod:`providers.retry`). S3 carries the run-time contract (:mod:`providers.aws.runtime`):
the bucket named by ``aws.runtime_bucket``, in ``aws.runtime_region``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from typing import Any, Literal, TypeVar

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession

from broker.errors import ProviderError
from providers.aws.config import AwsConfig
from providers.aws.errors import map_error
from providers.retry import retrying, with_retries

log = logging.getLogger(__name__)

CHUNK = 100  # filter values per request
T = TypeVar("T")
# What S3 answers for an object that is not there (GetObject: NoSuchKey; HeadObject: a bare 404).
MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})


def chunks(items: list[str], size: int = CHUNK) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class _Service:
    """One AWS service in any region, for one adapter (``provider`` names it in errors)."""

    service: Literal["ec2", "s3", "pricing", "ssm"]

    def __init__(self, config: AwsConfig, *, provider: str = "aws", session: AioSession | None = None,
                 endpoint_url: str | None = None, boto: dict[str, Any] | None = None) -> None:
        self.config = config
        self.provider = provider
        # AioSession(profile=None) resolves env → shared files → container/instance role.
        self._session = session or AioSession(profile=config.profile)
        self._endpoint_url = endpoint_url
        self._boto = boto or {}
        self._stack = AsyncExitStack()
        self._clients: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def client(self, region: str) -> Any:
        """The (cached) client of a region."""
        async with self._lock:
            client = self._clients.get(region)
            if client is None:
                cfg = AioConfig(
                    retries={"total_max_attempts": 1, "mode": "standard"},  # our retries, after mapping
                    connect_timeout=5,
                    read_timeout=max(5.0, self.config.region_timeout_s),
                    user_agent_extra="lockstep",
                    **self._boto,
                )
                client = await self._stack.enter_async_context(
                    self._session.create_client(
                        self.service, region_name=region, endpoint_url=self._endpoint_url, config=cfg
                    )
                )
                self._clients[region] = client
            return client

    async def aclose(self) -> None:
        self._clients.clear()
        await self._stack.aclose()
        self._stack = AsyncExitStack()

    async def call(self, region: str, method: str, use: Callable[[Any], Awaitable[T]]) -> T:
        """``use(client)`` in ``region``, its errors mapped (``method`` names the operation), retried."""
        client = await self.client(region)
        operation = f"{client.meta.method_to_api_mapping.get(method, method)} in {region}"

        async def once() -> T:
            try:
                return await use(client)
            except Exception as exc:
                mapped = map_error(exc, self.provider, operation)
                if mapped is not exc:
                    log.debug("%s: %s (%s)", self.provider, mapped, type(exc).__name__)
                    raise mapped from exc
                raise

        return await with_retries(once, retrying(self.config.max_attempts))

    async def request(self, region: str, method: str, **params: Any) -> dict[str, Any]:
        """One call in ``region`` (``method`` as in botocore: 'run_instances'), errors mapped, retried."""

        async def use(client: Any) -> dict[str, Any]:
            result: dict[str, Any] = await getattr(client, method)(**params)  # botocore builds them at run time
            return result

        return await self.call(region, method, use)


class Ec2Client(_Service):
    """EC2 in every configured region."""

    service = "ec2"

    def __init__(self, config: AwsConfig, *, provider: str = "aws", session: AioSession | None = None) -> None:
        super().__init__(config, provider=provider, session=session, endpoint_url=config.endpoint_url)

    async def paginate(self, region: str, method: str, key: str, **params: Any) -> list[dict[str, Any]]:
        """All items of a NextToken-paginated call (each page retried on its own)."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = await self.request(region, method, **params, **({"NextToken": token} if token else {}))
            items.extend(page.get(key) or [])
            token = page.get("NextToken")
            if not token:
                return items

    async def instances(self, region: str, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """DescribeInstances, flattened over reservations."""
        reservations = await self.paginate(region, "describe_instances", "Reservations", Filters=filters)
        return [i for r in reservations for i in r.get("Instances") or []]


def is_missing(exc: ProviderError) -> bool:
    return exc.code in MISSING_CODES


class S3Client(_Service):
    """The run-time bucket (``aws.runtime_bucket``) in its region; other buckets only to presign a data input."""

    service = "s3"

    def __init__(self, config: AwsConfig, *, provider: str = "aws", session: AioSession | None = None) -> None:
        assert config.runtime_bucket, "an S3 client is made only when aws.runtime_bucket is set"
        # SigV4 always: presigned URLs must carry the bucket's region (SigV2 is gone in new regions).
        super().__init__(config, provider=provider, session=session, endpoint_url=config.s3_endpoint_url,
                         boto={"signature_version": "s3v4"})
        self.bucket = config.runtime_bucket
        self.region = config.home_region
        self._bucket_regions: dict[str, str] = {config.runtime_bucket: config.home_region}

    async def bucket_region(self, bucket: str) -> str:
        """The region a bucket lives in (GetBucketLocation, cached): a URL for one of its objects must be signed
        for it (signed for another, S3 answers 301/400, while the SDK's own calls follow the redirect)."""
        found = self._bucket_regions.get(bucket)
        if found is None:
            resp = await self.request(self.region, "get_bucket_location", Bucket=bucket)
            where = resp.get("LocationConstraint") or "us-east-1"  # S3 says nothing for us-east-1
            found = {"EU": "eu-west-1"}.get(where, where)  # and "EU" for the oldest eu-west-1 buckets
            self._bucket_regions[bucket] = found
        return found

    async def put(self, key: str, body: bytes, content_type: str) -> None:
        await self.request(self.region, "put_object", Bucket=self.bucket, Key=key, Body=body, ContentType=content_type)

    async def get(self, key: str) -> bytes | None:
        """The object's bytes; None when there is no such object."""

        async def use(s3: Any) -> bytes:
            resp = await s3.get_object(Bucket=self.bucket, Key=key)
            async with resp["Body"] as stream:
                data: bytes = await stream.read()
            return data

        try:
            return await self.call(self.region, "get_object", use)
        except ProviderError as exc:
            if is_missing(exc):
                return None
            raise

    async def delete(self, key: str) -> None:
        """Delete an object (deleting what is not there is not an error in S3)."""
        await self.request(self.region, "delete_object", Bucket=self.bucket, Key=key)

    async def exists(self, bucket: str, key: str) -> bool:
        """Is ``s3://bucket/key`` an object this broker may read? (HeadObject; False when absent.)"""
        try:
            await self.request(await self.bucket_region(bucket), "head_object", Bucket=bucket, Key=key)
        except ProviderError as exc:
            if is_missing(exc):
                return False
            raise
        return True

    async def credentials(self) -> Any:
        """What is known of the credentials presigned URLs are signed with (:mod:`providers.aws.uploads`)."""
        from providers.aws.uploads import session_credentials

        return await session_credentials(self._session)

    async def presign(self, method: str, key: str, expires_s: float, *, bucket: str | None = None) -> str:
        """A URL granting one ``method`` ('get_object', 'put_object') on one object for ``expires_s`` seconds.

        Signed locally with the broker's credentials, for the bucket's own region (another bucket's is looked up
        once). With temporary credentials (a role) the URL stops working when they expire, whatever
        ``expires_s`` says (:mod:`providers.aws.uploads`).
        """
        s3 = await self.client(await self.bucket_region(bucket) if bucket else self.region)
        url: str = await s3.generate_presigned_url(
            method, Params={"Bucket": bucket or self.bucket, "Key": key}, ExpiresIn=int(expires_s)
        )
        return url


class SsmClient(_Service):
    """SSM Parameter Store in any region: the public parameters that name each region's current AMIs."""

    service = "ssm"

    def __init__(self, config: AwsConfig, *, provider: str = "aws", session: AioSession | None = None) -> None:
        super().__init__(config, provider=provider, session=session,
                         endpoint_url=config.ssm_endpoint_url or config.endpoint_url)

    async def parameter(self, region: str, name: str) -> str:
        """A parameter's value in ``region`` (GetParameter)."""
        resp = await self.request(region, "get_parameter", Name=name)
        return str((resp.get("Parameter") or {}).get("Value") or "")


class PricingClient(_Service):
    """The AWS Price List API (``pricing``): one endpoint (``aws.pricing_region``) answers for every region."""

    service = "pricing"

    def __init__(self, config: AwsConfig, *, provider: str = "aws", session: AioSession | None = None) -> None:
        super().__init__(config, provider=provider, session=session, endpoint_url=config.pricing_endpoint_url)
        self.region = config.pricing_region

    async def products(self, service_code: str, filters: list[dict[str, str]]) -> list[str]:
        """Every GetProducts item (each a JSON document in a string, as the API sends it), NextToken followed."""
        items: list[str] = []
        token: str | None = None
        while True:
            page = await self.request(self.region, "get_products", ServiceCode=service_code, Filters=filters,
                                      FormatVersion="aws_v1", MaxResults=100,
                                      **({"NextToken": token} if token else {}))
            items.extend(page.get("PriceList") or [])
            token = page.get("NextToken")
            if not token:
                return items
