"""Nodes: take one out of the pool (and drain it at its provider), put it back, and what burn-in works with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.errors import NotFoundError, SpecError
from broker.models import Allocation, Benchmark, Job
from broker.service.runtime import Runtime
from providers.capabilities import DrainsNodes

if TYPE_CHECKING:
    from broker.burnin import BurnIn


class NodesService(Runtime):
    async def drain_node(self, provider: str, node: str, reason: str) -> dict[str, Any]:
        """Mark a node unhealthy (it leaves the offers at once) and drain it at its provider when possible."""
        if not reason.strip():
            raise SpecError("reason", "a drain needs a reason")
        prov = self.market.providers.get(provider)
        if prov is None:
            raise NotFoundError(f"provider {provider} not configured")
        await self.db(self.store.set_node_health, provider, node, False, reason)
        self._unhealthy_cache = None
        drained = False
        if isinstance(prov, DrainsNodes):
            await prov.drain(node, reason)
            drained = True
        return {"provider": provider, "node": node, "healthy": False, "reason": reason, "drained": drained}

    async def resume_node(self, provider: str, node: str) -> None:
        """The inverse of a drain: healthy in the store (and in this process's quotes at once), resumed at
        its provider when it can. Never called automatically: a drained node stays out until someone decides."""
        await self.db(self.store.set_node_health, provider, node, True, "")
        self._unhealthy_cache = None
        prov = self.market.providers.get(provider)
        if isinstance(prov, DrainsNodes):
            await prov.resume(node)

    async def burn_in_results(self, job: Job, alloc: Allocation) -> list[Benchmark]:
        from broker.burnin import collect_burnin, job_stem

        return await collect_burnin(self.burnin, alloc.provider, job_stem(job.id, alloc.attempt))

    @property
    def burnin(self) -> BurnIn:
        """What burn-in and benchmark recording (broker.burnin) use: the store, settings, providers, drain."""
        from broker.burnin import BurnIn

        return BurnIn(self.settings, self.store, self.market.providers, self.drain_node, self.resume_node)
