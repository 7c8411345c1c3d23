"""AWS spot price history, incrementally: DescribeSpotPriceHistory → PricePoint.

One call per region (types chunked, NextToken pages followed), starting at the
last point already stored for that region (``since``). EC2 answers a StartTime
with the price *in effect* at that time, so the newest known point comes back
again; the store drops points no newer than a series' latest, so overlap is
harmless and nothing between polls is lost.

Which types: the GPU types EC2 lists in the region (DescribeInstanceTypes,
``p*``/``g*``) plus those the bundled catalog knows; the GPU model comes from the
instance-type record, else from the catalog (``aws_instance_info``). Linux/UNIX
prices only (other OSes carry a licence surcharge, not market movement).

Credentials come from the standard AWS chain (env, profile, instance role);
calls go through the AWS adapter's client, which maps errors and retries TransientError.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from broker.models import Market, PricePoint, as_utc
from providers.aws.client import Ec2Client
from providers.aws.config import AwsConfig
from providers.aws.instance_types import GpuType
from providers.catalog.client import aws_instance_info, load_catalog


class Ec2Source(Protocol):
    """What the history reads through: the AWS adapter (its client, retries and instance-type cache)."""

    name: str
    config: AwsConfig
    ec2: Ec2Client

    async def gpu_types(self, region: str) -> dict[str, GpuType]: ...

log = logging.getLogger(__name__)

LINUX = "Linux/UNIX"  # also matches "Linux/UNIX (Amazon VPC)", the EC2-Classic-era spelling moto answers
DEFAULT_BACKFILL = timedelta(days=1)  # first poll of a region: how far back to start
_CHUNK = 100  # instance types per request
_PAGE = 1000  # MaxResults per page


def catalog_gpu_types() -> dict[str, str]:
    """{instance type: canonical GPU model} from the bundled catalog."""
    out: dict[str, str] = {}
    for sku in load_catalog()["aws"]["instance_types"]:
        info = aws_instance_info(sku)
        if info and info.get("gpu"):
            out[sku] = str(info["gpu"])
    return out


def to_price_points(
    rows: Sequence[Mapping[str, Any]], region: str, gpus: Mapping[str, str], provider: str = "aws"
) -> list[PricePoint]:
    """DescribeSpotPriceHistory rows → spot PricePoints (Linux/UNIX, known GPU types, parseable prices)."""
    out: list[PricePoint] = []
    for row in rows:
        sku = str(row.get("InstanceType") or "")
        if not str(row.get("ProductDescription") or "").startswith(LINUX) or sku not in gpus:
            continue
        try:
            price = float(row["SpotPrice"])
            at = as_utc(row["Timestamp"])
        except (KeyError, TypeError, ValueError):
            continue
        out.append(
            PricePoint(
                provider=provider,
                market=Market.spot,
                sku=sku,
                gpu=gpus[sku],
                region=region,
                zone=str(row.get("AvailabilityZone") or ""),
                usd_per_hour=price,
                at=at,
            )
        )
    return out


async def region_spot_history(aws: Ec2Source, region: str, since: datetime | None, now: datetime) -> list[PricePoint]:
    """Spot price points of one region from ``since`` (or ``now - DEFAULT_BACKFILL``) to now."""
    gpus = {**catalog_gpu_types(), **{sku: t.gpu for sku, t in (await aws.gpu_types(region)).items()}}
    start = as_utc(since) if since is not None else now - DEFAULT_BACKFILL
    rows: list[dict[str, Any]] = []
    skus = sorted(gpus)
    for i in range(0, len(skus), _CHUNK):
        rows.extend(
            await aws.ec2.paginate(
                region,
                "describe_spot_price_history",
                "SpotPriceHistory",
                InstanceTypes=skus[i : i + _CHUNK],
                ProductDescriptions=[LINUX],
                StartTime=start,
                EndTime=now,
                MaxResults=_PAGE,
            )
        )
    return to_price_points(rows, region, gpus, aws.name)


async def spot_price_history(
    aws: Ec2Source,
    since: Mapping[str, datetime | None],
    *,
    now: datetime | None = None,
) -> dict[str, list[PricePoint] | BaseException]:
    """Spot price points per region of ``since`` (the adapter's regions), each from ``since[region]``.

    Uses the AWS adapter's clients, retries, error mapping and instance-type cache.
    Regions run concurrently, each under ``region_timeout_s``; a failing region gives
    its exception (a ProviderError, or TimeoutError) in place of a list, so the
    others still count.
    """
    now = now or datetime.now(UTC)
    config = aws.config

    async def one(region: str) -> list[PricePoint]:
        # The budget covers every page of the region: a slow region must not hold the run up.
        return await asyncio.wait_for(region_spot_history(aws, region, since.get(region), now),
                                      timeout=config.region_timeout_s * 3)

    regions = list(since)
    results = await asyncio.gather(*(one(r) for r in regions), return_exceptions=True)
    out: dict[str, list[PricePoint] | BaseException] = {}
    for region, res in zip(regions, results, strict=True):
        if isinstance(res, BaseException) and not isinstance(res, Exception):
            raise res  # CancelledError, KeyboardInterrupt: not ours to swallow
        out[region] = res
    return out
