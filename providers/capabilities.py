"""What a market can do beyond listing offers: one mix-in per ability, declared by inheriting it.

In the manner of dstack's ``Compute`` base and its ``ComputeWith*`` mix-ins: a provider
is a :class:`~providers.base.Provider` (``offers``, ``aclose``) plus the capabilities it
lists in its bases, e.g. ``class SlurmProvider(RunsBurnIn, DrainsNodes)``. The core asks
``isinstance(provider, DrainsNodes)``; it never compares a provider's name and never
probes for a method. Each mix-in's methods are abstract, so a class that declares a
capability cannot be built without implementing it.

=====================  ===============================================  ====================
capability             methods                                          who has it
=====================  ===============================================  ====================
:class:`Launches`      launch · poll · release · owned · installation   slurm, aws, reserved, vast
:class:`DrainsNodes`   drain · resume                                   slurm
:class:`ListsNodes`    pool · list_nodes → :class:`NodeUsage`           slurm
:class:`HasSpotPriceHistory`  price_regions · spot_price_history          aws
:class:`RunsBurnIn`    run_on_node (+ Launches, ListsNodes)             slurm
:class:`Snapshot`      as_of (offers carry ``source=snapshot``)         catalog
:class:`HasJobLogs`    job_log (+ Launches)                             aws, vast, slurm
:class:`HasHeartbeat`  heartbeat (+ Launches)                           aws, slurm
:class:`ReportsEnd`    end_reported (+ Launches)                        aws, vast, slurm
:class:`HearsNotices`  notice (+ Launches)                              aws, slurm
:class:`AssemblesNodes`  launch of ``members`` (+ Launches)               vast
:class:`KeepsBillingRecord`  billed_span (+ Launches)                     slurm, aws
:class:`SignalsJobs`   signal (+ Launches)                              slurm, aws, reserved
=====================  ===============================================  ====================

A new ability (job logs, teardown, a Kubernetes pool's namespaces…) is one more mix-in
here, implemented by the adapters that can, and checked by type where the core uses it;
docs/adding-a-provider.md shows how.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from broker.models import Allocation, AllocationStatus, Notice, PricePoint
from providers.base import LaunchRequest, Provider

__all__ = [
    "AssemblesNodes",
    "BilledSpan",
    "DrainsNodes",
    "HasHeartbeat",
    "HasJobLogs",
    "HasSpotPriceHistory",
    "HearsNotices",
    "KeepsBillingRecord",
    "Launches",
    "ListsNodes",
    "NodeUsage",
    "ReportsEnd",
    "RunsBurnIn",
    "SignalsJobs",
    "Snapshot",
]


class Launches(Provider):
    """Buys capacity for a job and gives it back: a full market, not only a price list.

    - ``launch`` is idempotent on ``LaunchRequest.client_token`` (derived from the job id
      and attempt): calling it twice, or again after a crash, never buys twice.
    - ``poll`` says what became of an allocation; ``release`` gives it back (idempotent:
      already gone counts as released).
    - ``owned`` lists everything this installation holds here (by tag, label or job
      comment), so the broker can reconcile after a crash. A market it cannot list must
      raise, not answer ``[]``: an empty answer would read as "every job lost".
    """

    installation: str  # the owner tag value this provider marks its resources with

    @abc.abstractmethod
    async def launch(self, req: LaunchRequest) -> Allocation:
        """Buy ``req.nodes`` nodes of ``req.offer`` for one attempt of a job: all or none."""

    @abc.abstractmethod
    async def poll(self, alloc: Allocation) -> AllocationStatus:
        """The allocation's state now (pending, running, succeeded, failed, preempted, released…)."""

    @abc.abstractmethod
    async def release(self, alloc: Allocation) -> None:
        """Give the allocation back; what is already gone counts as released."""

    @abc.abstractmethod
    async def owned(self) -> list[Allocation]:
        """Everything this installation holds here, one Allocation per job attempt."""


class DrainsNodes(Provider):
    """Can take one of its nodes out of service and put it back (an unhealthy node leaves the pool)."""

    @abc.abstractmethod
    async def drain(self, node: str, reason: str) -> None:
        """Running work finishes, nothing new starts there; ``reason`` is shown to operators."""

    @abc.abstractmethod
    async def resume(self, node: str) -> None:
        """The inverse of :meth:`drain`."""


@dataclass(frozen=True)
class NodeUsage:
    """One node of a pool, normalised: what the tracker turns into utilisation and burn-in checks against."""

    name: str
    gpu: str | None  # canonical GPU model (broker.gpus); None when the pool's GPU is not one (MIG slice, unknown)
    gpus_total: int
    gpus_used: int
    healthy: bool  # may new work start there (not down, drained, failing…)
    state: str = ""  # the pool's own words for its state, for messages ("DRAIN+IDLE")


class ListsNodes(Provider):
    """A pool of nodes it can list with their GPU use (an on-prem cluster)."""

    @property
    @abc.abstractmethod
    def pool(self) -> str:
        """The pool's name, as its offers' ``locality.region`` carries it (Slurm: the cluster name)."""

    @abc.abstractmethod
    async def list_nodes(self) -> list[NodeUsage]:
        """Every node of the pool, healthy or not."""


class HasSpotPriceHistory(Provider):
    """Keeps a spot-price history the tracker can read incrementally (EC2's DescribeSpotPriceHistory)."""

    @abc.abstractmethod
    async def price_regions(self) -> list[str]:
        """The regions whose history it reads (they may have to be listed first: ``aws.regions: all``)."""

    @abc.abstractmethod
    async def spot_price_history(
        self, since: Mapping[str, datetime | None], *, now: datetime
    ) -> dict[str, list[PricePoint] | BaseException]:
        """Spot price points per region from ``since[region]`` (None: a default backfill) to ``now``.

        A region that fails gives its exception in place of a list, so the others still count.
        """


class RunsBurnIn(Launches, ListsNodes):
    """Runs Lockstep's own measuring jobs pinned to one node, and lets a job measure its node first.

    Both leave the probe's JSON in a directory the broker reads (``health.burnin_results_dir``):
    a filesystem the pool's nodes share with the broker. The router prepends the probe to the
    command of a ``burn_in`` job placed here; :mod:`broker.burnin` collects and judges the result.
    """

    @abc.abstractmethod
    async def run_on_node(
        self,
        node: str,
        script: str,
        *,
        gpus: int,
        time_limit_min: int,
        log_path: str,
        labels: Mapping[str, str],
    ) -> Allocation:
        """Start ``script`` on ``node`` with ``gpus`` of its GPUs; an Allocation to poll and release.

        ``labels`` mark the job (not with the owner tag: reconciliation would take a job that
        belongs to no Lockstep job for a leak). A retried start may at worst run it twice.
        """


class Snapshot(Provider):
    """Answers from a fixed, dated snapshot of other markets' prices: read-only, needs no network.

    Its offers carry ``source=snapshot`` and the snapshot's date in ``observed_at``; the market
    drops them for a market that answers live, the router never launches them, and the tracker
    has no history to take from them.
    """

    @property
    @abc.abstractmethod
    def as_of(self) -> datetime:
        """When the snapshot was taken."""


class HasJobLogs(Launches):
    """Reads what a job's in-job wrapper shipped: each node's log (docs/runtime.md).

    Markets whose machines cannot reach the broker carry the log through object storage, the
    market's own logs API or a shared directory; the broker reads it here while the job runs and
    archives it when the attempt ends.
    """

    @abc.abstractmethod
    async def job_log(self, alloc: Allocation, *, rank: int = 0) -> str:
        """The node's log so far, in the wrapper's line format ('' when nothing has arrived yet)."""


class HasHeartbeat(Launches):
    """Reads the heartbeat each node's in-job wrapper writes while it runs (docs/runtime.md), so the lifecycle
    can release a machine whose wrapper went silent (broker/heartbeats.py)."""

    @abc.abstractmethod
    async def heartbeat(self, alloc: Allocation, *, rank: int = 0) -> datetime | None:
        """When node ``rank``'s wrapper last said it was alive (None: no beat has arrived)."""


class HearsNotices(Launches):
    """Carries the market's interruption notice from the in-job wrapper to the broker (AWS: the heartbeat the
    wrapper beats at once in the run-time bucket; Slurm: the notice file it writes in the attempt's folder of the
    shared job directory, on the ``--signal`` the broker submits an interruptible job with). The lifecycle then
    makes before it breaks: the job is placed again at once while this machine, ``draining``, lets the command
    checkpoint until the market's deadline (broker/lifecycle.py, issue 30)."""

    @abc.abstractmethod
    async def notice(self, alloc: Allocation) -> Notice | None:
        """The interruption notice a node of ``alloc`` reported (the first, by rank); None while none came."""


class ReportsEnd(Launches):
    """Can tell, more cheaply than a full poll, that a node's in-job wrapper has reported its command's end
    (AWS: its status in the run-time bucket; Vast: the container's exit in the instance list; Slurm: its exit
    status file in the attempt's folder of the shared job directory): the broker watches that report between
    polls and releases the machine at once rather than at the next poll (broker/loops.py)."""

    @abc.abstractmethod
    async def end_reported(self, alloc: Allocation) -> bool:
        """True once a node of ``alloc`` has reported its command's end (the next ``poll`` then says how)."""


class AssemblesNodes(Launches):
    """Sells independent single machines that the broker may rent together for one multi-node job.

    The market lists such providers in ``OfferBook.assemblers``; the ranking then assembles their
    single-machine offers into multi-node options (policies/assembly.py) for jobs whose co-location and
    fabric allow it. ``launch`` of a request with ``members`` (one offer per node, rank order) rents every
    machine or none: if one fails, those already rented are destroyed before the error is raised. The
    allocation holds every machine (``resource_ids`` in rank order); ``poll`` follows them all (one gone
    or preempted: the whole allocation is), ``release`` gives them all back, and every machine gets the
    same rendezvous (docs/runtime.md), with its own rank.
    """

    @abc.abstractmethod
    async def launch_members(self, req: LaunchRequest) -> Allocation:
        """Rent ``req.members`` (all or none) for one attempt; what ``launch`` does when ``members`` is set."""


@dataclass(frozen=True)
class BilledSpan:
    """The market's own record of an allocation's billed time. ``start`` None: it never started (queued, then
    cancelled: nothing billed); ``end`` None: still billing."""

    start: datetime | None
    end: datetime | None


class KeepsBillingRecord(Launches):
    """Keeps its own record of when it billed an allocation (Slurm's start and end times of the job): the
    allocation ledger books that span rather than the broker's own view of it (broker/ledger.py)."""

    @abc.abstractmethod
    async def billed_span(self, alloc: Allocation) -> BilledSpan | None:
        """The market's record of the allocation's billed time; None when the market no longer knows it."""


class SignalsJobs(Launches):
    """Can send a signal to a running job's processes without ending the job (Slurm's ``scancel --signal``;
    AWS's control object in the run-time bucket, read by the wrapper):
    a job stopped for its budget gets SIGTERM and a checkpoint window before its machines are released."""

    @abc.abstractmethod
    async def signal(self, alloc: Allocation, name: str = "TERM") -> None:
        """Send signal ``name`` (TERM, INT, USR1…) to every process of the allocation's job."""
