"""The adapters' shared test kit: the contract every provider passes, against its real part.

An adapter's kit module (``tests/providers/test_contract_<market>.py``) defines one class per
provider type that inherits :class:`OffersContract` plus the contract of every capability the
type declares, sets ``provider_type``, and gives a ``subject`` fixture: the provider talking to
its real part (the local Slurm cluster, moto's server, the local Vast API server, the bundled
catalog), a query that market has offers for, and how to break it. ``test_kit_coverage.py``
fails when a market of the registry, or a capability it declares, has no kit class.

What the kit checks:
- offers are normalised Offers (valid, unique ids, canonical GPU models, the source the provider
  declares); a query never drops a match; the market keeps exactly the matching ones;
- errors are the broker.errors hierarchy (a refused or unreachable market raises a ProviderError
  from ``owned``/``offers`` and no secret is in its message);
- Launches: launch is idempotent on the client token; poll, release and owned behave;
- AssemblesNodes: several machines are rented as one allocation (owned, polled, released together), and a
  set one of whose machines cannot be rented leaves nothing behind;
- HasJobLogs: a launched job's log reads as text on every rank, '' for a rank it does not have;
- DrainsNodes, ListsNodes, HasSpotPriceHistory, RunsBurnIn, Snapshot: each does what it says.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest

from broker.errors import ProviderError
from broker.gpus import GPU_SPECS
from broker.market import Marketplace
from broker.models import (
    Allocation,
    AllocationState,
    JobSpec,
    Market,
    Offer,
    OfferSource,
    PricePoint,
    Workload,
)
from policies.assembly import combine
from providers.base import LaunchRequest, OfferQuery, Provider, matches
from providers.capabilities import (
    AssemblesNodes,
    DrainsNodes,
    HasHeartbeat,
    HasJobLogs,
    HasSpotPriceHistory,
    HearsNotices,
    KeepsBillingRecord,
    Launches,
    ListsNodes,
    NodeUsage,
    ReportsEnd,
    RunsBurnIn,
    SignalsJobs,
    Snapshot,
)
from tests.waiting import eventually

_DONE = frozenset({AllocationState.succeeded, AllocationState.failed, AllocationState.released,
                   AllocationState.preempted})


@dataclass
class Subject:
    """One provider under test, through its real part."""

    provider: Provider
    query: OfferQuery  # a query the market has offers for
    # A provider of the same market that is refused or cannot be reached (None: a snapshot, which calls nothing).
    broken: Callable[[], Provider] | None = None
    secrets: list[str] = field(default_factory=list)  # what must never appear in an error message
    # Launches: which offer of the query's answer to launch, and the job's command.
    pick: Callable[[list[Offer]], Offer] = lambda offers: offers[0]
    command: str = "sleep 60"
    # DrainsNodes / RunsBurnIn: a node to use; RunsBurnIn: a directory the node shares with this host.
    node: str = ""
    shared_dir: Path | None = None
    # Where the market's machines do not run anything themselves (moto): run a launched allocation's boot as
    # its machine would, until its command ends (SignalsJobs needs a command that hears the signal).
    boot: Callable[[Allocation], Awaitable[None]] | None = None


def launch_request(subject: Subject, offer: Offer, *, attempt: int = 0) -> LaunchRequest:
    """One GPU of a divisible offer (do not hold a shared cluster's nodes), else the whole node."""
    per_node = 1 if offer.divisible else offer.gpu_count
    spec = JobSpec(name="kit", gpu=[offer.gpu], gpus=per_node, gpus_per_node=per_node,
                   workload=Workload(hours=0.05), command=subject.command)
    installation = subject.provider.installation if isinstance(subject.provider, Launches) else "lockstep"
    return LaunchRequest(job_id=f"kit-{uuid.uuid4().hex[:10]}", tenant="kit", attempt=attempt, spec=spec,
                         offer=offer, nodes=1, installation=installation)


async def _market_offers(provider: Provider, query: OfferQuery | None) -> list[Offer]:
    market = Marketplace({provider.name: provider})
    health = await market.refresh(query)
    assert health[provider.name].ok, health[provider.name].last_error
    return market.offers()


class OffersContract:
    """What every provider does: normalised offers, queries that drop nothing, errors of the hierarchy."""

    provider_type: ClassVar[type[Provider]]

    async def test_the_subject_is_the_type_under_test(self, subject: Subject) -> None:
        assert type(subject.provider) is self.provider_type

    async def test_offers_are_normalised(self, subject: Subject) -> None:
        p = subject.provider
        offers = await p.offers()
        assert offers, f"{p.name}: the real part has offers"
        assert len({o.id for o in offers}) == len(offers), "offer ids are unique"
        snapshot = isinstance(p, Snapshot)
        now = datetime.now(UTC)
        for o in offers:
            assert isinstance(o, Offer) and Offer.model_validate(o.model_dump(mode="json")) == o
            if snapshot:
                assert o.source is OfferSource.snapshot, o.id
            else:  # live; or a price it could not have live (AWS's Price List down), marked with its age or date
                assert o.source is OfferSource.live or o.observed_at < now, o.id
            assert o.provider == p.name or snapshot, o.id  # a snapshot describes others
            assert o.locality.provider == o.provider, o.id
            assert o.gpu in GPU_SPECS and o.gpu_count >= 1 and o.gpu_memory_gb > 0, o.id
            assert o.usd_per_hour >= 0 and o.max_nodes >= 1, o.id
            assert o.market is not Market.spot or o.interruptible, o.id

    async def test_a_query_never_drops_a_match_and_the_market_keeps_only_matches(self, subject: Subject) -> None:
        p, q = subject.provider, subject.query

        async def both() -> tuple[list[Offer], list[Offer]]:
            return await p.offers(), await p.offers(q)

        def never_fewer(pair: tuple[list[Offer], list[Offer]]) -> bool:
            everything, answer = pair
            return {o.id for o in everything if matches(o, q)} <= {o.id for o in answer}

        # Eventually: a live market may change between the two reads (a node drained, a job started).
        everything, _ = await eventually(both, never_fewer, f"{p.name}: the query drops no match")
        assert any(matches(o, q) for o in everything), "the subject's query has matches"
        kept = await _market_offers(p, q)
        assert kept and all(matches(o, q) for o in kept)

    async def test_errors_are_the_provider_hierarchy(self, subject: Subject) -> None:
        if subject.broken is None:
            assert isinstance(subject.provider, Snapshot), "only a snapshot has no call that can be refused"
            return
        broken = subject.broken()
        try:
            with pytest.raises(ProviderError) as caught:
                # owned() must raise when the market cannot be listed: [] would read as "every job lost".
                await (broken.owned() if isinstance(broken, Launches) else broken.offers())
        finally:
            await broken.aclose()
        assert caught.value.provider  # which market's call failed ("aws" for the reserved adapter: EC2's)
        for secret in subject.secrets:
            assert secret not in str(caught.value)


class LaunchesContract:
    """Launches: idempotent launch on the client token; poll, release and owned."""

    async def _launch(self, subject: Subject) -> tuple[Launches, LaunchRequest, Allocation]:
        p = subject.provider
        assert isinstance(p, Launches)
        offers = [o for o in await p.offers(subject.query) if matches(o, subject.query)]
        req = launch_request(subject, subject.pick(offers))
        return p, req, await p.launch(req)

    async def test_launch_is_idempotent_on_the_client_token(self, subject: Subject) -> None:
        p, req, first = await self._launch(subject)
        assert Marketplace({p.name: p}).launcher(p.name) is p
        try:
            assert first.client_token == req.client_token and first.resource_ids
            assert (first.job_id, first.attempt, first.provider) == (req.job_id, req.attempt, p.name)
            again = await p.launch(req)  # a retry, or the same attempt after a crash
            assert again.resource_ids == first.resource_ids
            mine = [a for a in await p.owned() if a.job_id == req.job_id]
            assert [(a.attempt, a.resource_ids) for a in mine] == [(req.attempt, first.resource_ids)]
        finally:
            await p.release(first)

    async def test_poll_release_and_owned(self, subject: Subject) -> None:
        p, req, alloc = await self._launch(subject)
        try:
            status = await p.poll(alloc)
            assert status.state in (AllocationState.pending, AllocationState.running), status
        finally:
            await p.release(alloc)
        status = await eventually(lambda: p.poll(alloc), lambda s: s.state in _DONE, f"{p.name}: released")
        assert status.state is AllocationState.released, status

        async def still_owned() -> list[Allocation]:
            return [a for a in await p.owned() if a.job_id == req.job_id]

        await eventually(still_owned, lambda left: left == [], f"{p.name}: no longer owned after release")
        await p.release(alloc)  # releasing what is gone is not an error


class HasJobLogsContract:
    """HasJobLogs: a live allocation's log is text ('' before anything arrived); a rank it lacks is ''."""

    async def test_a_launched_jobs_log_reads_as_text(self, subject: Subject) -> None:
        p = subject.provider
        assert isinstance(p, HasJobLogs)
        offers = [o for o in await p.offers(subject.query) if matches(o, subject.query)]
        req = launch_request(subject, subject.pick(offers))
        alloc = await p.launch(req)
        try:
            log = await p.job_log(alloc)
            assert isinstance(log, str)
            for secret in subject.secrets:
                assert secret not in log
            assert await p.job_log(alloc, rank=alloc.nodes + 3) == ""  # no such node: nothing will arrive
        finally:
            await p.release(alloc)


class KeepsBillingRecordContract:
    """KeepsBillingRecord: the market's own span of a launched allocation — started once it runs, ended (not
    before its start) once released."""

    async def test_the_markets_span_starts_and_ends(self, subject: Subject) -> None:
        p = subject.provider
        assert isinstance(p, KeepsBillingRecord)
        offers = [o for o in await p.offers(subject.query) if matches(o, subject.query)]
        alloc = await p.launch(launch_request(subject, subject.pick(offers)))
        try:
            await eventually(lambda: p.poll(alloc), lambda s: s.state is AllocationState.running,
                             f"{p.name}: running")
            started = await eventually(lambda: p.billed_span(alloc), lambda s: s is not None and s.start is not None,
                                       f"{p.name}: the market records the start")
            assert started is not None and started.end is None  # still billing
            await asyncio.sleep(1.5)  # markets record whole seconds: a span of none reads as "never ran"
        finally:
            await p.release(alloc)
        ended = await eventually(lambda: p.billed_span(alloc), lambda s: s is not None and s.end is not None,
                                 f"{p.name}: the market records the end")
        assert ended is not None and ended.start is not None and ended.end is not None
        assert ended.start <= ended.end


class SignalsJobsContract:
    """SignalsJobs: a TERM reaches the running job's processes, which end (the command is a plain sleep)."""

    async def test_a_term_ends_a_sleeping_job(self, subject: Subject) -> None:
        p = subject.provider
        assert isinstance(p, SignalsJobs)
        offers = [o for o in await p.offers(subject.query) if matches(o, subject.query)]
        alloc = await p.launch(launch_request(subject, subject.pick(offers)))
        booted = asyncio.create_task(subject.boot(alloc)) if subject.boot is not None else None
        try:
            await eventually(lambda: p.poll(alloc), lambda s: s.state is AllocationState.running,
                             f"{p.name}: running")
            if isinstance(p, HasHeartbeat):  # its wrapper is up (it beats once its command starts)
                await eventually(lambda: p.heartbeat(alloc), lambda b: b is not None, f"{p.name}: a heartbeat")
            await p.signal(alloc, "TERM")
            await eventually(lambda: p.poll(alloc), lambda s: s.state in _DONE, f"{p.name}: ended by the TERM")
        finally:
            await p.release(alloc)
            if booted is not None:
                await asyncio.wait_for(booted, 60)


class HasHeartbeatContract:
    """HasHeartbeat: reading a node's beat never fails for a live allocation; a beat is a past, aware instant;
    a rank the allocation lacks has none."""

    async def test_a_beat_is_read_or_none(self, subject: Subject) -> None:
        p = subject.provider
        assert isinstance(p, HasHeartbeat)
        offers = [o for o in await p.offers(subject.query) if matches(o, subject.query)]
        alloc = await p.launch(launch_request(subject, subject.pick(offers)))
        try:
            beat = await p.heartbeat(alloc)
            assert beat is None or (beat.tzinfo is not None and beat <= datetime.now(UTC))
            assert await p.heartbeat(alloc, rank=alloc.nodes + 3) is None
        finally:
            await p.release(alloc)


@asynccontextmanager
async def long_running(subject: Subject) -> AsyncIterator[Allocation]:
    """An allocation of ``subject``'s market whose command runs on (a long sleep), released after."""
    p = subject.provider
    assert isinstance(p, Launches)
    offers = [o for o in await p.offers(subject.query) if matches(o, subject.query)]
    alloc = await p.launch(launch_request(replace(subject, command="sleep 600"), subject.pick(offers)))
    try:
        yield alloc
    finally:
        await p.release(alloc)


class ReportsEndContract:
    """ReportsEnd: a live allocation whose command still runs (a long sleep) reports no end, and reading it
    never fails; an end reported and acted on is tests/broker/test_end_watch.py's."""

    async def test_no_end_is_reported_while_the_command_runs(self, subject: Subject) -> None:
        assert isinstance(subject.provider, ReportsEnd)
        async with long_running(subject) as alloc:
            assert await subject.provider.end_reported(alloc) is False


class HearsNoticesContract:
    """HearsNotices: a live allocation with no notice from its market reports none, and reading it never fails;
    a notice heard and acted on (make before break) is tests/broker/test_notice_replacement.py's."""

    async def test_no_notice_while_the_market_gave_none(self, subject: Subject) -> None:
        assert isinstance(subject.provider, HearsNotices)
        async with long_running(subject) as alloc:
            assert await subject.provider.notice(alloc) is None


class DrainsNodesContract:
    """DrainsNodes: a drained node leaves the offers; resumed, it comes back."""

    async def test_drain_and_resume(self, subject: Subject) -> None:
        p, node = subject.provider, subject.node
        assert isinstance(p, DrainsNodes) and node

        async def hosts() -> set[str]:
            return {o.locality.host for o in await p.offers()}

        await eventually(hosts, lambda h: node in h, f"{node} offered before the drain")
        try:
            await p.drain(node, "lockstep kit: drain and resume")
            await eventually(hosts, lambda h: node not in h, f"{node} gone from the offers once drained")
        finally:
            await p.resume(node)
        await eventually(hosts, lambda h: node in h, f"{node} offered again after resume")


class ListsNodesContract:
    """ListsNodes: every node, normalised; the pool is its offers' region."""

    async def test_nodes_are_listed_normalised(self, subject: Subject) -> None:
        p = subject.provider
        assert isinstance(p, ListsNodes)
        nodes = await p.list_nodes()
        assert nodes and len({n.name for n in nodes}) == len(nodes)
        for n in nodes:
            assert isinstance(n, NodeUsage) and n.name
            assert 0 <= n.gpus_used <= n.gpus_total, n
            assert n.gpu is None or n.gpu in GPU_SPECS, n
        assert {o.region for o in await p.offers()} == {p.pool}

        async def consistent() -> tuple[list[NodeUsage], list[Offer]]:
            return await p.list_nodes(), await p.offers()

        def offered_nodes_are_healthy(pair: tuple[list[NodeUsage], list[Offer]]) -> bool:
            healthy = {n.name for n in pair[0] if n.healthy}
            return {o.locality.host for o in pair[1] if o.locality.host} <= healthy

        await eventually(consistent, offered_nodes_are_healthy, f"{p.name}: every offered node is a healthy node")


class SpotHistoryContract:
    """HasSpotPriceHistory: spot price points per region, from a given time."""

    async def test_history_per_region(self, subject: Subject) -> None:
        p = subject.provider
        assert isinstance(p, HasSpotPriceHistory)
        regions = await p.price_regions()
        assert regions
        now = datetime.now(UTC)
        got = await p.spot_price_history(dict.fromkeys(regions), now=now)
        assert set(got) == set(regions)
        for region, points in got.items():
            assert not isinstance(points, BaseException), points
            assert points, f"{region}: the real part has a spot history"
            for pt in points:
                assert isinstance(pt, PricePoint) and pt.market is Market.spot and pt.provider == p.name
                assert pt.region == region and pt.gpu in GPU_SPECS and pt.usd_per_hour >= 0


class RunsBurnInContract:
    """RunsBurnIn: a job of Lockstep's own, pinned to one node, leaves its file where the broker reads."""

    async def test_a_pinned_job_runs_on_its_node(self, subject: Subject) -> None:
        p, node, shared = subject.provider, subject.node, subject.shared_dir
        assert isinstance(p, RunsBurnIn) and node and shared is not None
        token = uuid.uuid4().hex[:10]
        out = shared / f"kit-{token}.txt"
        script = f'#!/bin/bash\necho "${{SLURMD_NODENAME:-$(hostname -s)}}" > {out}.part && mv {out}.part {out}\n'
        alloc = await p.run_on_node(node, script, gpus=0, time_limit_min=2, log_path=str(shared / f"{token}.log"),
                                    labels={"lockstep:kit": token})
        try:
            assert alloc.resource_ids and alloc.provider == p.name
            status = await eventually(lambda: p.poll(alloc), lambda s: s.state in _DONE, "the job ended")
            assert status.state is AllocationState.succeeded, status
        finally:
            await p.release(alloc)
        assert await asyncio.to_thread(out.read_text) == f"{node}\n"


class SnapshotContract:
    """Snapshot: dated, read-only rows; nothing to launch."""

    async def test_rows_carry_the_snapshot_and_its_date(self, subject: Subject) -> None:
        p = subject.provider
        assert isinstance(p, Snapshot) and not isinstance(p, Launches)
        offers = await p.offers()
        assert {o.source for o in offers} == {OfferSource.snapshot}
        assert {o.observed_at for o in offers} == {p.as_of}


class AssemblesNodesContract:
    """AssemblesNodes: a multi-node launch from several single-machine offers, all or none."""

    async def _members(self, subject: Subject) -> tuple[AssemblesNodes, list[Offer]]:
        p = subject.provider
        assert isinstance(p, AssemblesNodes)
        offers = [o for o in await p.offers(subject.query) if matches(o, subject.query) and o.max_nodes == 1]
        first = subject.pick(offers)
        twin = next(o for o in offers if o.id != first.id and (o.gpu, o.gpu_count) == (first.gpu, first.gpu_count))
        return p, [first, twin]

    @staticmethod
    def _request(subject: Subject, members: list[Offer]) -> LaunchRequest:
        one = launch_request(subject, members[0])
        spec = one.spec.model_copy(update={"gpus": 2 * one.spec.gpus})
        return one.model_copy(update={"spec": spec, "offer": combine(members), "nodes": len(members),
                                      "members": members})

    async def test_machines_are_rented_followed_and_released_together(self, subject: Subject) -> None:
        p, members = await self._members(subject)
        req = self._request(subject, members)
        alloc = await p.launch(req)
        try:
            assert len(alloc.resource_ids) == 2 and alloc.nodes == 2
            mine = [a for a in await p.owned() if a.job_id == req.job_id]
            assert [a.resource_ids for a in mine] == [alloc.resource_ids]
            status = await p.poll(alloc)
            assert status.state in (AllocationState.pending, AllocationState.running), status
        finally:
            await p.release(alloc)
        assert [a for a in await p.owned() if a.job_id == req.job_id] == []

    async def test_a_set_that_cannot_all_be_rented_leaves_nothing_behind(self, subject: Subject) -> None:
        p, members = await self._members(subject)
        req = self._request(subject, [members[0], members[0]])  # one machine twice: the second rent must fail
        with pytest.raises(ProviderError):
            await p.launch(req)
        assert [a for a in await p.owned() if a.job_id == req.job_id] == []


CONTRACTS: dict[type[Provider], type] = {
    Launches: LaunchesContract,
    HasJobLogs: HasJobLogsContract,
    KeepsBillingRecord: KeepsBillingRecordContract,
    SignalsJobs: SignalsJobsContract,
    HasHeartbeat: HasHeartbeatContract,
    ReportsEnd: ReportsEndContract,
    HearsNotices: HearsNoticesContract,
    AssemblesNodes: AssemblesNodesContract,
    DrainsNodes: DrainsNodesContract,
    ListsNodes: ListsNodesContract,
    HasSpotPriceHistory: SpotHistoryContract,
    RunsBurnIn: RunsBurnInContract,
    Snapshot: SnapshotContract,
}
