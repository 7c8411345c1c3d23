"""The one small interface every market adapter implements.

In the spirit of gpuhunt: a provider answers ``offers(query)`` with flat,
normalised :class:`~broker.models.Offer` items; the broker never sees a
provider's own shapes. That, and ``aclose``, is all a :class:`Provider` must do.

Everything else a market may be able to do (launch and release capacity, drain
nodes, list nodes, give spot-price history, run a burn-in, answer from a dated
snapshot) is a capability in :mod:`providers.capabilities`: a provider declares it
by inheriting the mix-in, and the core checks it with ``isinstance``, never by
name. Errors are the :mod:`broker.errors` provider hierarchy, nothing else.
See docs/adding-a-provider.md.
"""

from __future__ import annotations

import abc
import hashlib
from typing import ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field

from broker.configbase import RuntimeConfig
from broker.models import PER_SECOND, Billing, JobSpec, Market, Offer
from providers.runtime.manifest import RunRequest

OWNER_TAG = "lockstep:owner"  # tag/label key marking what Lockstep owns
JOB_TAG = "lockstep:job"
TENANT_TAG = "lockstep:tenant"


class OfferQuery(BaseModel):
    """Constraints a provider may push down to its API; all optional.

    Providers may return more than asked, never less: the market filters every
    answer with :func:`matches` (and the router judges every offer again).
    """

    model_config = ConfigDict(defer_build=True)

    gpus: list[str] | None = None  # canonical models
    min_gpus_per_node: int | None = None
    min_gpu_memory_gb: float | None = None
    max_usd_per_hour: float | None = None  # per node
    markets: list[Market] | None = None
    regions: list[str] | None = None
    min_reliability: float | None = None
    nodes: int | None = None
    disk_gb: float | None = None

    @classmethod
    def for_job(cls, spec: JobSpec) -> OfferQuery:
        return cls(
            gpus=list(spec.gpu),
            min_gpus_per_node=spec.gpus_per_node,
            min_gpu_memory_gb=spec.min_gpu_memory_gb or None,
            markets=list(spec.markets),
            regions=spec.regions,
            min_reliability=spec.min_reliability or None,
            nodes=spec.nodes,
            disk_gb=spec.disk_gb,
        )


def matches(o: Offer, q: OfferQuery) -> bool:
    """Does an offer meet a query? Applied in one place: the market, to every provider's answer.

    It errs on the side of keeping an offer: what it cannot judge (an offer with no
    region, an unknown reliability) passes, and the router filters again.
    """
    return (
        (q.gpus is None or o.gpu in q.gpus)
        and (q.markets is None or o.market in q.markets)
        and (q.regions is None or not o.locality.region or o.locality.region in q.regions)
        and (q.min_gpus_per_node is None or o.gpu_count >= q.min_gpus_per_node)
        and (q.min_gpu_memory_gb is None or o.gpu_memory_gb >= q.min_gpu_memory_gb)
        and (q.max_usd_per_hour is None or o.usd_per_hour <= q.max_usd_per_hour)
        and (q.min_reliability is None or o.reliability is None or o.reliability >= q.min_reliability)
    )


class LaunchRequest(BaseModel):
    model_config = ConfigDict(defer_build=True)

    job_id: str
    tenant: str = "default"
    attempt: int = 0
    spec: JobSpec
    offer: Offer
    nodes: int = Field(ge=1)
    installation: str = "lockstep"  # owner tag value; lets two installs share an account
    # What the in-job wrapper needs (docs/runtime.md), secrets resolved: the router sets it. Never stored.
    run: RunRequest | None = None
    # An assembled offer's machines, one per node in rank order (policies/assembly.py); only for a provider
    # that AssemblesNodes (providers/capabilities.py). Empty for every other launch.
    members: list[Offer] = Field(default_factory=list)

    def run_request(self) -> RunRequest:
        """``run``, or one built from the spec alone (no secrets: for requests made outside the router)."""
        if self.run is not None:
            return self.run
        return RunRequest.for_launch(self.spec, job_id=self.job_id, attempt=self.attempt, secrets={},
                                     runtime=RuntimeConfig())

    @property
    def client_token(self) -> str:
        """Idempotency token: the same job and attempt always give the same token (≤ 64 chars)."""
        digest = hashlib.sha256(f"{self.installation}/{self.job_id}/{self.attempt}".encode()).hexdigest()
        return f"ls-{digest[:40]}"


class Provider(abc.ABC):
    """A market. Subclasses are small: translate, call, normalise, map errors.

    Optional abilities are mix-ins from :mod:`providers.capabilities` (``Launches``,
    ``DrainsNodes``…), declared in the class bases.
    """

    name: str = "provider"
    # How the market bills a machine's time: what an allocation's recorded cost is made of (docs/runtime.md).
    billing: ClassVar[Billing] = PER_SECOND

    @abc.abstractmethod
    async def offers(self, query: OfferQuery | None = None) -> list[Offer]:
        """Current offers, normalised. May push ``query`` down; never returns fewer than match."""

    def notes(self) -> list[str]:
        """What its last answer lacks though it answered (e.g. prices from a snapshot), and why: the market
        shows them in the provider's health. Nothing by default."""
        return []

    async def aclose(self) -> None:
        """Release connections and clients."""
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
