"""Which machine image a launch in a region uses (docs/aws.md "Images"): AMI ids are regional.

A region's image is ``aws.images[region]``, else ``aws.image_id``; either is an AMI id, or
``resolve:ssm:<parameter>``, read from that region's SSM Parameter Store at launch (AWS publishes the Deep
Learning AMI's current id per region under /aws/service/deeplearning/...), cached ``aws.image_cache_s``.
A configuration that would launch one AMI id in several regions is refused when it loads (providers/aws/config.py).
"""

from __future__ import annotations

import asyncio

from broker.errors import BadRequestError, ProviderError
from providers.aws.client import SsmClient
from providers.aws.config import SSM_PREFIX, AwsConfig


class ImageResolver:
    """The AMI id of a region, its SSM parameter read once per ``aws.image_cache_s``."""

    def __init__(self, config: AwsConfig, ssm: SsmClient, *, provider: str = "aws") -> None:
        self.config = config
        self.ssm = ssm
        self.provider = provider
        self._cache: dict[tuple[str, str], tuple[float, str]] = {}  # (region, parameter) → (loop time, AMI id)

    async def image(self, region: str) -> str:
        want = self.config.image_for(region)
        if not want.startswith(SSM_PREFIX):
            return want
        name = want[len(SSM_PREFIX):]
        now = asyncio.get_running_loop().time()
        hit = self._cache.get((region, name))
        if hit is not None and now - hit[0] < self.config.image_cache_s:
            return hit[1]
        try:
            ami = await self.ssm.parameter(region, name)
        except ProviderError as exc:
            if exc.code in ("ParameterNotFound", "ParameterVersionNotFound"):
                raise BadRequestError(self.provider, f"no image for region {region}: SSM parameter {name} is not "
                                                     f"there (set aws.images.{region})", "NoImage") from None
            raise
        if not ami.startswith("ami-"):
            raise BadRequestError(self.provider, f"no image for region {region}: SSM parameter {name} holds "
                                                 f"{ami[:40]!r}, not an AMI id", "NoImage")
        self._cache[(region, name)] = (now, ami)
        return ami
