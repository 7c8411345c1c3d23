"""Capacity already paid for or held: EC2 capacity reservations and operator pools.

- Active capacity reservations (DescribeCapacityReservations, state=active) with
  free instances become ``Market.reserved`` offers, priced at their marginal cost:
  0 (the reservation is billed whether used or not) or the committed rate an
  operator pool sets for that reservation id. Launches target the reservation
  (CapacityReservationSpecification → CapacityReservationTarget).
- Operator pools (``AwsConfig.reserved_pools``) without a reservation id (capacity
  held under a savings plan or reserved instances, which are billing constructs)
  become offers at their configured rate and launch as plain on-demand instances
  in their zone.

Launch, poll, release, owned and job logs share :class:`providers.aws.provider.AwsProvider`'s code;
instances are tagged ``lockstep:provider=reserved`` so each adapter reconciles
only its own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from broker.errors import ProviderError
from broker.models import Allocation, AllocationStatus, Market, Offer
from providers.aws.config import AwsConfig, ReservedPool
from providers.aws.instance_types import GpuType
from providers.aws.offers import make_offer, query_accepts
from providers.aws.provider import AwsProvider
from providers.base import LaunchRequest, OfferQuery
from providers.capabilities import HasJobLogs, SignalsJobs

log = logging.getLogger(__name__)

RESERVATION_ATTR = "capacity_reservation_id"


def _group_name(arn: str | None) -> str:
    """'arn:aws:ec2:us-east-1:123:placement-group/train' → 'train'."""
    return arn.rsplit("/", 1)[-1] if arn else ""


class ReservedProvider(HasJobLogs, SignalsJobs):
    """EC2 capacity reservations and operator-configured pools, at marginal cost."""

    name = "reserved"

    def __init__(
        self, config: AwsConfig, *, installation: str = "lockstep", aws: AwsProvider | None = None
    ) -> None:
        self.config = config
        self.installation = installation
        self.aws = aws or AwsProvider(config, installation=installation)
        self._owns_aws = aws is None

    def __repr__(self) -> str:
        return f"ReservedProvider(pools={len(self.config.reserved_pools)}, installation={self.installation!r})"

    # ------------------------------------------------------------------ offers

    async def capacity_reservations(self, region: str) -> list[dict[str, Any]]:
        return await self.aws.ec2.paginate(
            region,
            "describe_capacity_reservations",
            "CapacityReservations",
            Filters=[{"Name": "state", "Values": ["active"]}],
        )

    def _reservation_offer(
        self, cr: dict[str, Any], t: GpuType, region: str, pools: dict[str, ReservedPool]
    ) -> Offer:
        cr_id = str(cr["CapacityReservationId"])
        pool = pools.get(cr_id)
        offer = make_offer(
            self.config,
            t,
            region,
            str(cr["AvailabilityZone"]),
            Market.reserved,
            pool.usd_per_hour if pool else 0.0,
            provider=self.name,
            max_nodes=int(cr.get("AvailableInstanceCount", 0)),
            cluster=_group_name(cr.get("PlacementGroupArn")),
            attrs={RESERVATION_ATTR: cr_id, "pool": pool.name if pool else ""},
        )
        return offer.model_copy(update={"id": f"{offer.id}:{cr_id}"})

    async def _region_reservations(self, region: str, query: OfferQuery | None) -> list[Offer]:
        pools = {p.capacity_reservation_id: p for p in self.config.reserved_pools if p.capacity_reservation_id}
        reservations = await self.capacity_reservations(region)
        types = await self.aws.gpu_types(region) if reservations else {}
        out = []
        for cr in reservations:
            t = types.get(str(cr.get("InstanceType", "")))
            if cr.get("State") != "active" or int(cr.get("AvailableInstanceCount", 0)) < 1 or t is None:
                continue
            if not query_accepts(t, query):
                continue
            out.append(self._reservation_offer(cr, t, region, pools))
        return out

    async def _pool_offers(self, query: OfferQuery | None, regions: list[str]) -> list[Offer]:
        out = []
        for pool in self.config.reserved_pools:
            if pool.provider != "aws" or pool.region not in regions:
                continue
            if pool.capacity_reservation_id and self.config.capacity_reservations:
                continue  # offered (or found gone) through DescribeCapacityReservations
            if query and query.regions and pool.region not in query.regions:
                continue
            try:
                t = (await self.aws.gpu_types(pool.region)).get(pool.sku)
            except ProviderError as exc:
                log.warning("reserved: pool %s left out: %s", pool.name, exc)
                continue
            if t is None or not query_accepts(t, query):
                continue
            offer = make_offer(
                self.config,
                t,
                pool.region,
                pool.zone,
                Market.reserved,
                pool.usd_per_hour,
                provider=self.name,
                max_nodes=pool.count,
                attrs={"pool": pool.name, RESERVATION_ATTR: pool.capacity_reservation_id or ""},
            )
            out.append(offer.model_copy(update={"id": f"{offer.id}:{pool.name}"}))
        return out

    async def offers(self, query: OfferQuery | None = None) -> list[Offer]:
        if query and query.markets and Market.reserved not in query.markets:
            return []
        offers: list[Offer] = []
        all_regions = await self.aws.regions()
        if self.config.capacity_reservations:
            regions = [r for r in all_regions if not (query and query.regions) or r in query.regions]
            results = await asyncio.gather(
                *(
                    asyncio.wait_for(self._region_reservations(r, query), self.config.region_timeout_s)
                    for r in regions
                ),
                return_exceptions=True,
            )
            for region, res in zip(regions, results, strict=True):
                if isinstance(res, BaseException):
                    if not isinstance(res, ProviderError | TimeoutError):
                        raise res
                    log.warning("reserved: capacity reservations of %s left out: %s", region, res)
                    continue
                offers.extend(res)
        offers.extend(await self._pool_offers(query, all_regions))
        return offers

    # ------------------------------------------------------------------ lifecycle (shared with AwsProvider)

    async def launch(self, req: LaunchRequest) -> Allocation:
        offer = req.offer
        return await self.aws.launch_as(
            req,
            provider=self.name,
            capacity_reservation_id=offer.attrs.get(RESERVATION_ATTR) or None,
            shared_group=offer.locality.cluster or None,
        )

    async def poll(self, alloc: Allocation) -> AllocationStatus:
        return await self.aws.poll(alloc)

    async def release(self, alloc: Allocation) -> None:
        await self.aws.release(alloc)

    async def owned(self) -> list[Allocation]:
        return await self.aws.owned_as(self.name)

    async def job_log(self, alloc: Allocation, *, rank: int = 0) -> str:
        return await self.aws.job_log(alloc, rank=rank)

    async def signal(self, alloc: Allocation, name: str = "TERM") -> None:
        await self.aws.signal(alloc, name)  # EC2 instances like any other: their attempt's control object

    async def aclose(self) -> None:
        if self._owns_aws:
            await self.aws.aclose()

