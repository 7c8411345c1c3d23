"""EC2 through aiobotocore: one cached client per region, every call's errors mapped and retried.

Credentials come from the standard AWS chain (env, profile, instance role) and
are never logged. Botocore's own retries are off: errors reach the mapping in
:mod:`providers.aws.errors`, and TransientError is retried by the shared policy
(:mod:`providers.retry`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from contextlib import AsyncExitStack
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession

from broker.config import AwsConfig
from providers.aws.errors import map_error
from providers.retry import retrying, with_retries

log = logging.getLogger(__name__)

CHUNK = 100  # filter values per request


def chunks(items: list[str], size: int = CHUNK) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class Ec2Client:
    """EC2 in every configured region, for one adapter (``provider`` names it in errors)."""

    def __init__(self, config: AwsConfig, *, provider: str = "aws", session: AioSession | None = None) -> None:
        self.config = config
        self.provider = provider
        # AioSession(profile=None) resolves env → shared files → container/instance role.
        self._session = session or AioSession(profile=config.profile)
        self._stack = AsyncExitStack()
        self._clients: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def client(self, region: str) -> Any:
        """The (cached) EC2 client of a region."""
        async with self._lock:
            ec2 = self._clients.get(region)
            if ec2 is None:
                cfg = AioConfig(
                    retries={"total_max_attempts": 1, "mode": "standard"},  # our retries, after mapping
                    connect_timeout=5,
                    read_timeout=max(5.0, self.config.region_timeout_s),
                    user_agent_extra="lockstep",
                )
                ec2 = await self._stack.enter_async_context(
                    self._session.create_client(
                        "ec2", region_name=region, endpoint_url=self.config.endpoint_url, config=cfg
                    )
                )
                self._clients[region] = ec2
            return ec2

    async def aclose(self) -> None:
        self._clients.clear()
        await self._stack.aclose()
        self._stack = AsyncExitStack()

    async def request(self, region: str, method: str, **params: Any) -> dict[str, Any]:
        """One EC2 call in ``region`` (``method`` as in botocore: 'run_instances'), errors mapped, retried."""
        ec2 = await self.client(region)
        operation = f"{ec2.meta.method_to_api_mapping.get(method, method)} in {region}"
        call = getattr(ec2, method)  # botocore builds its operations at run time

        async def once() -> dict[str, Any]:
            try:
                result: dict[str, Any] = await call(**params)
            except Exception as exc:
                mapped = map_error(exc, self.provider, operation)
                if mapped is not exc:
                    log.debug("%s: %s (%s)", self.provider, mapped, type(exc).__name__)
                    raise mapped from exc
                raise
            return result

        return await with_retries(once, retrying(self.config.max_attempts))

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
