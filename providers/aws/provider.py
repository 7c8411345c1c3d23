"""AWS EC2 spot and on-demand GPU capacity, through aiobotocore.

- offers: GPU types (DescribeInstanceTypes), where they are sold
  (DescribeInstanceTypeOfferings), spot prices (DescribeSpotPriceHistory, latest
  per AZ and type) and on-demand prices from the Price List API (:mod:`.pricing`:
  cached, concurrent per region, the bundled snapshot's when it cannot be had, marked
  so). Regions are the configured ones or, with ``regions: all``, those the account
  has enabled (DescribeRegions). They are scanned concurrently, each under its own
  timeout; a failing region is logged and recorded in ``region_health`` and the others stand.
- launch: RunInstances with ClientToken = the job attempt's token, MinCount =
  MaxCount = nodes, in the offer's AZ, tagged as Lockstep's. Before buying it
  looks the token up by tag, so a retried launch never buys twice (also where
  ClientToken is not honoured, as in moto).
- multi-node jobs get a cluster placement group named from the job, deleted on
  release (or by ``sweep_placement_groups`` once its instances are gone).
- at run time (with ``aws.runtime_bucket``): each attempt's wrapper and manifest go to
  S3 and the user data fetches them; ``peers.json`` is published after RunInstances;
  poll reads the nodes' statuses, so a command's end ends its job (:mod:`.runtime`).

Transport (EC2 and S3 clients, error mapping, retries) is :mod:`.client`; request
bodies and user data :mod:`.requests`; the run-time files :mod:`.runtime`; types and
offers :mod:`.instance_types` and :mod:`.offers`; the spot-price history the tracker
reads :mod:`.prices`.

Capabilities: launches; has job logs; has spot-price history.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiobotocore.session import AioSession

from broker.errors import REFUSALS, BadRequestError, ProviderError
from broker.models import (
    PER_SECOND_MIN_60,
    Allocation,
    AllocationState,
    AllocationStatus,
    ExitReason,
    JobExit,
    Market,
    Notice,
    Offer,
    PricePoint,
)
from providers.aws.client import Ec2Client, PricingClient, S3Client, SsmClient, chunks
from providers.aws.config import AwsConfig
from providers.aws.images import ImageResolver
from providers.aws.instance_types import GPU_TYPE_PATTERNS, GpuType, latest_spot_prices, parse_instance_type
from providers.aws.offers import offer_id, query_accepts, zone_offers
from providers.aws.prices import spot_price_history
from providers.aws.pricing import OnDemandPrices, OnDemandPricing
from providers.aws.requests import (
    ATTEMPT_TAG,
    CLIENT_TOKEN_TAG,
    LIVE_STATES,
    MARKET_TAG,
    PLACEMENT_TAG,
    PROVIDER_TAG,
    RELEASED_TAG,
    RESERVATION_TAG,
    RUNTIME_TAG,
    create_placement_group_request,
    launch_tags,
    placement_group_name,
    run_instances_request,
    user_data,
    wants_efa,
)
from providers.aws.runtime import RUNTIME_ATTR, RunFiles, launch_order, missing_runtime
from providers.base import JOB_TAG, OWNER_TAG, LaunchRequest, OfferQuery
from providers.capabilities import (
    BilledSpan,
    HasHeartbeat,
    HasJobLogs,
    HasSpotPriceHistory,
    HearsNotices,
    KeepsBillingRecord,
    ReportsEnd,
    SignalsJobs,
)
from providers.runtime.logs import job_exit

log = logging.getLogger(__name__)

GONE_STATES = frozenset({"shutting-down", "terminated", "stopping", "stopped"})
# EC2's state reason when the instance's own OS shut it down: on a job's instance, its wrapper (or its boot
# script) did, so the job ended there; it is no preemption even when no status reached the bucket.
SELF_SHUTDOWN = "Client.InstanceInitiatedShutdown"
# EC2's StateTransitionReason of an instance stopped or terminated: "User initiated (2026-12-06 04:00:00 GMT)"
# (moto writes UTC); the moment in it is when the instance stopped billing.
_TRANSITION_AT = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


def launched_at(inst: dict[str, Any]) -> datetime | None:
    """EC2's own launch time of an instance (aware, UTC)."""
    at = inst.get("LaunchTime")
    if isinstance(at, str):
        at = datetime.fromisoformat(at.replace("Z", "+00:00"))
    if not isinstance(at, datetime):
        return None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def stopped_at(inst: dict[str, Any]) -> datetime | None:
    """When EC2 says a stopped or terminated instance went down (its StateTransitionReason); None while it runs,
    or when the reason carries no time."""
    if inst.get("State", {}).get("Name") not in GONE_STATES:
        return None
    m = _TRANSITION_AT.search(str(inst.get("StateTransitionReason") or ""))
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC) if m else None


@dataclass
class RegionHealth:
    """Outcome of the last scan of one region."""

    ok: bool
    at: datetime
    seconds: float = 0.0
    offers: int = 0
    error: str = ""
    code: str = ""


def _tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags") or []}


class AwsProvider(HasJobLogs, HasHeartbeat, HasSpotPriceHistory, ReportsEnd, KeepsBillingRecord, HearsNotices,
                  SignalsJobs):
    """EC2 spot and on-demand capacity (see module docstring)."""

    name = "aws"
    billing = PER_SECOND_MIN_60  # EC2 Linux instances: per second, 60 s at least

    def __init__(
        self, config: AwsConfig, *, installation: str = "lockstep", session: AioSession | None = None
    ) -> None:
        self.config = config
        self.installation = installation
        self.ec2 = Ec2Client(config, provider=self.name, session=session)
        # The run-time contract's bucket (docs/aws.md); None: jobs run as a bare `docker run` (no logs, no exit).
        self.runs = (RunFiles(config, installation, S3Client(config, provider=self.name, session=session))
                     if config.runtime_bucket else None)
        self._peers_published: set[str] = set()  # allocations whose peer list this process has written
        if self.runs is None and config.enabled:
            log.warning("aws: aws.runtime_bucket is not set: jobs on EC2 run without logs or exit status (a "
                        "finished instance runs on until cancelled or max_duration), and jobs with env, secrets, "
                        "files or data are refused (docs/aws.md)")
        self._types: dict[str, dict[str, GpuType]] = {}
        self._released: set[str] = set()
        self._pending_groups: dict[str, str] = {}  # placement group → region, deletion deferred
        self.region_health: dict[str, RegionHealth] = {}
        self.pricing = OnDemandPricing(config, PricingClient(config, provider=self.name, session=session))
        self.ssm = SsmClient(config, provider=self.name, session=session)
        self.images = ImageResolver(config, self.ssm, provider=self.name)  # AMI ids are regional
        self._regions: tuple[float, list[str]] | None = None  # (monotonic time, regions) of `regions: all`

    def __repr__(self) -> str:
        return f"AwsProvider(regions={self.config.regions!r}, installation={self.installation!r})"

    async def aclose(self) -> None:
        await self.ec2.aclose()
        await self.ssm.aclose()
        await self.pricing.aclose()
        if self.runs is not None:
            await self.runs.s3.aclose()

    # ------------------------------------------------------------------ offers

    async def regions(self) -> list[str]:
        """The regions this adapter works in: the configured ones, or with ``regions: all`` the regions the
        account has enabled (DescribeRegions: opted in, or needing no opt-in), asked again every
        ``pricing_refresh_s``. Raises when they cannot be listed and none are known yet."""
        if isinstance(self.config.regions, list):
            return list(self.config.regions)
        now = time.monotonic()
        if self._regions is not None and now - self._regions[0] < self.config.pricing_refresh_s:
            return list(self._regions[1])
        try:
            resp = await self.ec2.request(self.config.home_region, "describe_regions", Filters=[
                {"Name": "opt-in-status", "Values": ["opt-in-not-required", "opted-in"]}])
        except ProviderError as exc:
            if self._regions is None:
                raise
            log.warning("aws: regions not listed again, the last list stands: %s", exc)
            return list(self._regions[1])
        regions = sorted(r["RegionName"] for r in resp.get("Regions") or []
                         if r.get("OptInStatus", "opt-in-not-required") in ("opt-in-not-required", "opted-in"))
        self._regions = (now, regions)
        return list(regions)

    def notes(self) -> list[str]:
        """What the provider's health should say beside ok/failed: prices that are not live, and why."""
        return self.pricing.notes()

    async def gpu_types(self, region: str) -> dict[str, GpuType]:
        """GPU instance types of a region (cached: the catalogue of types changes rarely)."""
        cached = self._types.get(region)
        if cached is not None:
            return cached
        records = await self.ec2.paginate(
            region,
            "describe_instance_types",
            "InstanceTypes",
            Filters=[{"Name": "instance-type", "Values": list(GPU_TYPE_PATTERNS)}],
            MaxResults=100,
        )
        types = {t.sku: t for t in (parse_instance_type(r) for r in records) if t is not None}
        self._types[region] = types
        return types

    async def offered_zones(self, region: str, skus: list[str]) -> dict[str, list[str]]:
        zones: dict[str, set[str]] = {}
        for chunk in chunks(sorted(skus)):
            rows = await self.ec2.paginate(
                region,
                "describe_instance_type_offerings",
                "InstanceTypeOfferings",
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": chunk}],
            )
            for row in rows:
                zones.setdefault(row["InstanceType"], set()).add(row["Location"])
        return {k: sorted(v) for k, v in zones.items()}

    async def spot_prices(self, region: str, skus: list[str]) -> dict[tuple[str, str], float]:
        """Current spot price per (type, AZ): the price in effect at StartTime=now is the latest."""
        rows: list[dict[str, Any]] = []
        now = datetime.now(UTC)
        for chunk in chunks(sorted(skus)):
            rows.extend(
                await self.ec2.paginate(
                    region,
                    "describe_spot_price_history",
                    "SpotPriceHistory",
                    InstanceTypes=chunk,
                    ProductDescriptions=["Linux/UNIX"],
                    StartTime=now,
                    MaxResults=1000,
                )
            )
        return latest_spot_prices(rows)

    async def _region_offers(self, region: str, query: OfferQuery | None,
                             on_demand: asyncio.Future[OnDemandPrices] | None, deadline: float) -> list[Offer]:
        markets = set(query.markets) if query and query.markets else {Market.spot, Market.on_demand}
        types = {k: t for k, t in (await self.gpu_types(region)).items() if query_accepts(t, query)}
        if not types or not markets & {Market.spot, Market.on_demand}:
            return []
        zones = await self.offered_zones(region, list(types))
        spot = await self.spot_prices(region, list(zones)) if Market.spot in markets and zones else {}
        prices = None
        if on_demand is not None and zones:
            # The region's budget is the EC2 answer's: past it, the snapshot (noted) and the fetch goes on.
            done, _ = await asyncio.wait({on_demand}, timeout=max(0.0, deadline - time.monotonic()))
            prices = on_demand.result() if done else self.pricing.waiting(region)
        return zone_offers(self.config, types, zones, spot, prices, region, provider=self.name)

    async def _scan(self, region: str, query: OfferQuery | None,
                    on_demand: asyncio.Future[OnDemandPrices] | None = None) -> list[Offer] | ProviderError:
        started = time.monotonic()
        budget = self.config.region_timeout_s
        try:
            offers = await asyncio.wait_for(
                self._region_offers(region, query, on_demand, started + max(budget / 2, budget - 2.0)), budget)
        except (ProviderError, TimeoutError) as exc:
            err = exc if isinstance(exc, ProviderError) else None
            code = err.code if err else "Timeout"
            text = str(exc) if err else f"no answer within {self.config.region_timeout_s:g}s"
            log.warning("aws: region %s left out of this scan: %s", region, text)
            self.region_health[region] = RegionHealth(
                ok=False, at=datetime.now(UTC), seconds=time.monotonic() - started, error=text, code=code
            )
            return err or ProviderError(self.name, f"{region}: {text}", code)
        self.region_health[region] = RegionHealth(
            ok=True, at=datetime.now(UTC), seconds=time.monotonic() - started, offers=len(offers)
        )
        return offers

    async def offers(self, query: OfferQuery | None = None) -> list[Offer]:
        regions = [r for r in await self.regions() if not (query and query.regions) or r in query.regions]
        # On-demand prices are fetched beside the EC2 calls (cached; never failing a region: see .pricing).
        want_on_demand = not (query and query.markets) or Market.on_demand in query.markets
        pricing = {r: self.pricing.start(r) for r in regions} if want_on_demand else {}
        results = await asyncio.gather(*(self._scan(r, query, pricing.get(r)) for r in regions))
        failures = [r for r in results if isinstance(r, ProviderError)]
        if regions and len(failures) == len(regions):
            raise failures[0]  # nothing answered: let the market mark AWS stale
        return [o for r in results if not isinstance(r, ProviderError) for o in r]

    # ------------------------------------------------------------------ launch

    async def find_by_token(self, region: str, token: str) -> list[dict[str, Any]]:
        """Live instances a previous call with this client token bought."""
        return await self.ec2.instances(
            region,
            [
                {"Name": f"tag:{CLIENT_TOKEN_TAG}", "Values": [token]},
                {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
            ],
        )

    async def ensure_placement_group(self, region: str, name: str, tags: dict[str, str]) -> None:
        try:
            await self.ec2.request(region, "create_placement_group", **create_placement_group_request(name, tags))
        except BadRequestError as exc:
            if exc.code != "InvalidPlacementGroup.Duplicate":  # a retried launch made it already
                raise

    async def delete_placement_group(self, region: str, name: str) -> bool:
        """Delete a placement group; False (and kept for a later sweep) while instances still occupy it."""
        try:
            await self.ec2.request(region, "delete_placement_group", GroupName=name)
        except ProviderError as exc:
            if exc.code == "InvalidPlacementGroup.Unknown":
                self._pending_groups.pop(name, None)
                return True
            if exc.code == "InvalidPlacementGroup.InUse" or exc.retryable:
                self._pending_groups[name] = region
                log.info("aws: placement group %s still in use; deletion deferred", name)
                return False
            raise
        self._pending_groups.pop(name, None)
        return True

    async def sweep_placement_groups(self) -> list[str]:
        """Retry deferred placement-group deletions (call from the reconcile loop); the names deleted."""
        done = []
        for name, region in list(self._pending_groups.items()):
            if await self.delete_placement_group(region, name):
                done.append(name)
        return done

    async def launch(self, req: LaunchRequest) -> Allocation:
        return await self.launch_as(req, provider=self.name)

    async def launch_as(
        self,
        req: LaunchRequest,
        *,
        provider: str,
        capacity_reservation_id: str | None = None,
        shared_group: str | None = None,
    ) -> Allocation:
        """Launch for ``provider`` (this adapter or the reserved one, which shares the code).

        ``shared_group``: an existing placement group to launch into (a capacity reservation's),
        which Lockstep neither creates nor deletes.
        """
        offer = req.offer
        region = offer.region
        token = req.client_token
        existing = await self.find_by_token(region, token)
        if existing:
            log.info("aws: %s attempt %d already launched (client token match)", req.job_id, req.attempt)
            alloc = self._allocation(req.job_id, req.attempt, provider, region, existing, offer=offer)
            await self._publish_peers(alloc, existing, again=True)  # a crash may have come before it was written
            return alloc
        if self.runs is None and (needs := missing_runtime(req.run_request())):
            raise BadRequestError(
                provider, f"the job's {', '.join(needs)} need aws.runtime_bucket: the S3 bucket the run-time "
                "contract goes through (docs/aws.md)", "NoRuntimeBucket")
        image = await self.images.image(region)  # before anything is staged or created: a missing one is an answer
        gpu_type = (await self.gpu_types(region)).get(offer.sku)
        # Staged before anything is created: a launch whose run-time reporting cannot work is refused here.
        where = self.runs.location(req.job_id, req.attempt) if self.runs is not None else None
        script: str | None = (await self.runs.stage(req, efa=wants_efa(req, gpu_type), provider=provider)
                              if self.runs is not None else user_data(req))
        group: str | None = None
        if (
            req.nodes > 1
            and self.config.placement_groups
            and capacity_reservation_id is None  # a reservation decides its own placement
            and (gpu_type is None or gpu_type.cluster_placement)
        ):
            group = placement_group_name(self.installation, req.job_id, req.attempt)
            tags = launch_tags(
                req,
                installation=self.installation,
                provider=provider,
                market=offer.market,
                placement_group=group,
                capacity_reservation_id=None,
            )
            try:
                await self.ensure_placement_group(region, group, tags)
            except ProviderError:
                if self.runs is not None and where is not None:
                    await self.runs.forget(where)  # a manifest nobody will read still holds the secrets
                raise
        params = run_instances_request(
            req,
            config=self.config,
            installation=self.installation,
            provider=provider,
            gpu_type=gpu_type,
            placement_group=group,
            capacity_reservation_id=capacity_reservation_id,
            shared_group=shared_group,
            script=script,
            runtime_uri=where.uri if where else "",
            image_id=image,
        )
        try:
            resp = await self.ec2.request(region, "run_instances", **params)
        except ProviderError as exc:
            # A refusal bought nothing. Any other error may have come after EC2 acted (the answer lost): look
            # for what the token bought before giving up the manifest its instances would boot from.
            bought = [] if isinstance(exc, REFUSALS) else await self._bought_despite(region, token, exc)
            if bought:
                log.info("aws: %s attempt %d launched despite %s (client token match)", req.job_id, req.attempt,
                         type(exc).__name__)
                resp = {"Instances": bought}
            else:
                if group:  # nothing runs in it: do not leave it behind (the launch error is what matters)
                    try:
                        await self.delete_placement_group(region, group)
                    except ProviderError as cleanup:
                        log.warning("aws: placement group %s not removed after a failed launch: %s", group, cleanup)
                if self.runs is not None and where is not None and bought is not None:
                    await self.runs.forget(where)  # a manifest nobody will read still holds the secrets
                raise
        instances = resp.get("Instances") or []
        alloc = self._allocation(req.job_id, req.attempt, provider, region, instances, offer=offer)
        if where is not None:
            alloc.attrs[RUNTIME_ATTR] = where.uri
        await self._publish_peers(alloc, instances)
        return alloc

    async def _bought_despite(self, region: str, token: str, exc: ProviderError) -> list[dict[str, Any]] | None:
        """What a launch that raised ``exc`` (not a refusal) bought after all; None when that cannot be told
        (then the manifest stays: an instance may boot from it, and its release deletes it)."""
        try:
            return await self.find_by_token(region, token)
        except ProviderError as lookup:
            log.warning("aws: cannot tell whether a launch that raised %s went through: %s", type(exc).__name__,
                        lookup)
            return None

    async def _publish_peers(self, alloc: Allocation, instances: list[dict[str, Any]], *, again: bool = False) -> None:
        """Write the attempt's ``peers.json``: at launch, again when a launch is adopted (``again``), and at the
        first poll in each process (after a restart). Idempotent, and never fatal to a launch: the next poll
        tries again."""
        if self.runs is None or alloc.nodes < 2 or (alloc.id in self._peers_published and not again):
            return
        try:
            if await self.runs.publish_peers(self.runs.location_of(alloc), instances):
                self._peers_published.add(alloc.id)
        except ProviderError as exc:
            log.warning("aws: peer list of %s not written yet: %s", alloc.id, exc)

    def _allocation(
        self,
        job_id: str,
        attempt: int,
        provider: str,
        region: str,
        instances: list[dict[str, Any]],
        *,
        offer: Offer | None = None,
    ) -> Allocation:
        instances = sorted(instances, key=launch_order)  # resource_ids in rank order
        first = instances[0] if instances else {}
        tags = _tags(first)
        zone = (first.get("Placement") or {}).get("AvailabilityZone", offer.zone if offer else "")
        sku = first.get("InstanceType", offer.sku if offer else "")
        market = tags.get(MARKET_TAG) or (offer.market.value if offer else "")
        if not market:
            market = Market.spot.value if first.get("InstanceLifecycle") == "spot" else Market.on_demand.value
        token = tags.get(CLIENT_TOKEN_TAG, "")
        states = {i.get("State", {}).get("Name", "") for i in instances}
        group = tags.get(PLACEMENT_TAG) or (first.get("Placement") or {}).get("GroupName") or ""
        attrs = {"instance_type": sku, "market": market, "placement_group": group}
        if tags.get(RESERVATION_TAG):
            attrs["capacity_reservation_id"] = tags[RESERVATION_TAG]
        if tags.get(RUNTIME_TAG):
            attrs[RUNTIME_ATTR] = tags[RUNTIME_TAG]
        return Allocation(
            id=token or f"{provider}-{job_id}-{attempt}",
            job_id=job_id,
            attempt=attempt,
            provider=provider,
            offer_id=offer.id if offer else offer_id(provider, market, region, zone, sku),
            state=AllocationState.running if states == {"running"} else AllocationState.pending,
            client_token=token,
            resource_ids=[i["InstanceId"] for i in instances],
            nodes=len(instances),
            region=region,
            zone=zone,
            usd_per_hour=(offer.usd_per_hour * len(instances)) if offer else 0.0,
            attrs=attrs,
        )

    # ------------------------------------------------------------------ poll / release / owned

    async def poll(self, alloc: Allocation) -> AllocationStatus:
        """What became of the attempt: its instances' states and, with the run-time contract, its nodes'
        statuses. A command that ended ends the attempt (succeeded/failed with its ``exit``) whether its
        instances still run, shut down or are gone; instances stopped or terminated under the job without
        Lockstep releasing them are a preemption (the job is requeued), except an instance that shut itself
        down (its wrapper or its boot script did: the job failed)."""
        ids = list(alloc.resource_ids)
        if not ids:
            return AllocationStatus(state=AllocationState.unknown, reason="allocation has no instances")
        found: dict[str, dict[str, Any]] = {}
        for chunk in chunks(ids):
            for inst in await self.ec2.instances(alloc.region, [{"Name": "instance-id", "Values": chunk}]):
                found[inst["InstanceId"]] = inst
        gone = [i for i in ids if i not in found or found[i]["State"]["Name"] in GONE_STATES]
        if gone:
            released = alloc.state is AllocationState.released or set(ids) <= self._released
            released = released or any(_tags(found[i]).get(RELEASED_TAG) for i in gone if i in found)
            if released:
                return AllocationStatus(state=AllocationState.released, reason="released by Lockstep")
        hosts = [found[i].get("PrivateIpAddress") or found[i].get("PrivateDnsName") or i if i in found else i
                 for i in ids]
        statuses = await self._statuses(alloc, found, gone)
        ended = job_exit(statuses, len(ids))
        if ended is not None:
            if ended.reason is ExitReason.signal:  # its machine was going down under it: not the job's doing
                return AllocationStatus(state=AllocationState.preempted, hosts=hosts, reason=(
                    f"node {ended.rank}'s command was stopped by a signal as its instance went down "
                    f"({self._why_gone(found, gone) or 'instance stopping'})"))
            state = AllocationState.succeeded if ended.succeeded else AllocationState.failed
            return AllocationStatus(state=state, reason=ended.describe(), hosts=hosts, exit=ended)
        # A node whose status came in may have shut itself down already; the others are what matters.
        lost = [i for rank, i in enumerate(ids) if i in gone and rank not in statuses]
        if lost:
            return self._lost(alloc, found, lost)
        states = {found[i]["State"]["Name"] for i in ids if i not in gone}
        if states == {"running"}:  # billed from EC2's own launch of the instances, not from this poll
            starts = [t for i in ids if (t := launched_at(found[i])) is not None]
            return AllocationStatus(state=AllocationState.running, hosts=hosts,
                                    started_at=min(starts) if len(starts) == len(ids) else None)
        return AllocationStatus(state=AllocationState.pending, reason="starting", hosts=hosts)

    async def _statuses(self, alloc: Allocation, found: dict[str, dict[str, Any]],
                        gone: list[str]) -> dict[int, JobExit]:
        """The nodes' statuses so far ({} without the run-time contract). When the bucket cannot be read,
        an attempt whose instances all run is judged by EC2 alone; one with an instance gone is not judged
        now (it may have ended, not been preempted): the poll fails and the next one looks again."""
        if self.runs is None:
            return {}
        live = [found[i] for i in alloc.resource_ids if i in found and i not in gone]
        if len(live) == len(alloc.resource_ids):
            await self._publish_peers(alloc, live)
        try:
            return await self.runs.statuses(self.runs.location_of(alloc), len(alloc.resource_ids))
        except ProviderError as exc:
            if gone:
                raise
            log.warning("aws: statuses of %s unreadable this poll: %s", alloc.id, exc)
            return {}

    @staticmethod
    def _why_gone(found: dict[str, dict[str, Any]], gone: list[str]) -> str:
        """EC2's state-reason codes of the instances gone, e.g. 'Server.SpotInstanceTermination'."""
        return ", ".join(sorted({(found[i].get("StateReason") or {}).get("Code", "") for i in gone if i in found}
                                - {""}))

    def _lost(self, alloc: Allocation, found: dict[str, dict[str, Any]], lost: list[str]) -> AllocationStatus:
        """Instances stopped or terminated under a running attempt, with no status from them."""
        why = self._why_gone(found, lost) or "instance gone"
        names = ", ".join(f"{i} ({found[i]['State']['Name'] if i in found else 'gone'})" for i in lost)
        if why == SELF_SHUTDOWN:
            return AllocationStatus(state=AllocationState.failed, reason=(
                f"instance(s) {names} shut themselves down and no exit status reached the bucket: the boot "
                "script could not start the wrapper, or the status upload failed (see the console output)"))
        spot = alloc.attrs.get("market") == Market.spot.value or any(
            found[i].get("InstanceLifecycle") == "spot" for i in lost if i in found)
        kind = "spot instance(s)" if spot else "instance(s)"
        return AllocationStatus(state=AllocationState.preempted,
                                reason=f"{kind} {names} ended, not released by Lockstep ({why})")

    async def job_log(self, alloc: Allocation, *, rank: int = 0) -> str:
        """Node ``rank``'s log as its wrapper last shipped it ('' before the first upload, or without the
        run-time contract)."""
        if self.runs is None:
            return ""
        return await self.runs.log(self.runs.location_of(alloc), rank)

    async def end_reported(self, alloc: Allocation) -> bool:
        """A node's status has reached the run-time bucket (S3 reads only, no EC2 call); never without the
        run-time contract (the poll's EC2 states are all there is)."""
        if self.runs is None or not alloc.resource_ids:
            return False
        statuses = await self.runs.statuses(self.runs.location_of(alloc), len(alloc.resource_ids))
        return job_exit(statuses, len(alloc.resource_ids)) is not None

    async def notice(self, alloc: Allocation) -> Notice | None:
        """The spot interruption notice a node's wrapper heard from the instance metadata service and beat into
        the run-time bucket at once (S3 reads only); never without the run-time contract."""
        if self.runs is None or not alloc.resource_ids:
            return None
        return await self.runs.notice(self.runs.location_of(alloc), len(alloc.resource_ids))

    async def signal(self, alloc: Allocation, name: str = "TERM") -> None:
        """Signal the attempt's commands through its control object in the run-time bucket (EC2 has no call that
        reaches a process): each node's wrapper reads it every few seconds and sends ``name`` to its command.
        Needs the run-time contract (``aws.runtime_bucket``); an attempt launched before Lockstep wrote control
        objects has a wrapper that never reads one."""
        if self.runs is None:
            raise BadRequestError(self.name, "signalling a job needs aws.runtime_bucket (docs/aws.md)",
                                  "NoRuntimeBucket")
        await self.runs.signal(self.runs.location_of(alloc), time.time_ns(), name)

    async def billed_span(self, alloc: Allocation) -> BilledSpan | None:
        """EC2's own record of the attempt's instances: from their launch (``LaunchTime``) to the last one's stop
        or termination (the time in its ``StateTransitionReason``); ``end`` None while one still runs. None when
        EC2 no longer lists them (terminated instances drop out of DescribeInstances after about an hour)."""
        ids = list(alloc.resource_ids)
        found: dict[str, dict[str, Any]] = {}
        for chunk in chunks(ids):
            for inst in await self.ec2.instances(alloc.region, [{"Name": "instance-id", "Values": chunk}]):
                found[inst["InstanceId"]] = inst
        if not ids or any(i not in found for i in ids):
            return None
        starts = [launched_at(found[i]) for i in ids]
        ends = [stopped_at(found[i]) for i in ids]
        if any(t is None for t in starts):
            return None
        start = min(t for t in starts if t is not None)
        end = max(t for t in ends if t is not None) if all(t is not None for t in ends) else None
        return BilledSpan(start=start, end=max(end, start) if end is not None else None)

    async def heartbeat(self, alloc: Allocation, *, rank: int = 0) -> datetime | None:
        """Node ``rank``'s last heartbeat in the run-time bucket (None without the run-time contract)."""
        if self.runs is None:
            return None
        return await self.runs.heartbeat(self.runs.location_of(alloc), rank)

    async def release(self, alloc: Allocation) -> None:
        """Terminate the instances (idempotent) and delete the job's placement group."""
        region = alloc.region
        ids = list(alloc.resource_ids)
        self._released.update(ids)
        for chunk in chunks(ids):
            alive = [
                i["InstanceId"]
                for i in await self.ec2.instances(region, [{"Name": "instance-id", "Values": chunk}])
                if i["State"]["Name"] not in ("shutting-down", "terminated")
            ]
            if not alive:
                continue
            # Mark first, so that poll() (even from another replica) tells this from a preemption.
            await self.ec2.request(
                region, "create_tags", Resources=alive, Tags=[{"Key": RELEASED_TAG, "Value": "true"}]
            )
            await self.ec2.request(region, "terminate_instances", InstanceIds=alive)
        group = alloc.attrs.get("placement_group")
        if group:
            await self.delete_placement_group(region, group)
        await self.sweep_placement_groups()
        if self.runs is not None:
            await self.runs.forget(self.runs.location_of(alloc))

    async def owned(self) -> list[Allocation]:
        return await self.owned_as(self.name)

    # ------------------------------------------------------------------ spot-price history

    async def price_regions(self) -> list[str]:
        return await self.regions()

    async def spot_price_history(
        self, since: Mapping[str, datetime | None], *, now: datetime
    ) -> dict[str, list[PricePoint] | BaseException]:
        return await spot_price_history(self, since, now=now)

    async def owned_as(self, provider: str) -> list[Allocation]:
        """Live instances of this installation launched by ``provider``, one Allocation per job attempt."""
        regions = await self.regions()
        results = await asyncio.gather(*(self._owned_region(r, provider) for r in regions), return_exceptions=True)
        out: list[Allocation] = []
        for region, res in zip(regions, results, strict=True):
            if isinstance(res, BaseException):
                # A region we cannot see must not look empty: the broker would think its jobs lost.
                log.warning("aws: owned() could not list %s: %s", region, res)
                raise res
            out.extend(res)
        return out

    async def _owned_region(self, region: str, provider: str) -> list[Allocation]:
        instances = await self.ec2.instances(
            region,
            [
                {"Name": f"tag:{OWNER_TAG}", "Values": [self.installation]},
                {"Name": f"tag:{PROVIDER_TAG}", "Values": [provider]},
                {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
            ],
        )
        groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for inst in instances:
            tags = _tags(inst)
            key = (tags.get(JOB_TAG, ""), tags.get(ATTEMPT_TAG, "0"), tags.get(CLIENT_TOKEN_TAG, ""))
            groups.setdefault(key, []).append(inst)
        out = []
        for (job_id, attempt, _token), members in sorted(groups.items()):
            members.sort(key=lambda i: (i.get("AmiLaunchIndex", 0), i["InstanceId"]))
            out.append(
                self._allocation(job_id, int(attempt) if attempt.isdigit() else 0, provider, region, members)
            )
        return out
