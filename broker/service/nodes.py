"""Nodes: take one out of the pool (and drain it at its provider), put it back, and what burn-in works with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.config import Settings
from broker.errors import NotFoundError, SpecError
from broker.models import Allocation, Benchmark, Fabric, Job
from broker.service.runtime import Runtime
from providers.capabilities import DrainsNodes

if TYPE_CHECKING:
    from broker.burnin import BurnIn
    from broker.nccl import NcclResult, NcclRow  # noqa: F401  (NcclRow: what a shell's table names)


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

    async def resume_node(self, provider: str, node: str) -> dict[str, Any]:
        """The inverse of a drain: healthy in the store (and in this process's quotes at once), resumed at
        its provider when it can. Never called automatically: a drained node stays out until someone decides.

        Idempotent: a node its provider already put back (an operator's ``scontrol ... state=resume``) is
        answered like one resumed now, and Lockstep's flag is cleared all the same. A provider no longer
        configured only has its flag cleared (``resumed`` false): the flag may outlive the market."""
        await self.db(self.store.set_node_health, provider, node, True, "")
        self._unhealthy_cache = None
        prov = self.market.providers.get(provider)
        resumed = False
        if isinstance(prov, DrainsNodes):
            await prov.resume(node)
            resumed = True
        return {"provider": provider, "node": node, "healthy": True, "resumed": resumed}

    async def burn_in_results(self, job: Job, alloc: Allocation) -> list[Benchmark]:
        from broker.burnin import collect_burnin, job_stem

        return await collect_burnin(self.burnin, alloc.provider, job_stem(job.id, alloc.attempt))

    @property
    def burnin(self) -> BurnIn:
        """What burn-in and benchmark recording (broker.burnin) use: the store, settings, providers, drain."""
        from broker.burnin import BurnIn

        return BurnIn(self.settings, self.store, self.market.providers, self.drain_node, self.resume_node)

    # ------------------------------------------------------------------ burn-in and benchmarks (CLI: burnin, bench)
    @staticmethod
    def market_configured(settings: Settings, name: str) -> bool:
        """Is market ``name`` switched on in ``settings``? (Before a service is built for it.)"""
        from providers.registry import configured

        return configured(settings, name)

    async def burn_in_node(self, provider: str, node: str, *, quick: bool = True, timeout_s: float = 300) -> Benchmark:
        """Run the probe on ``node`` as a job pinned to it, record the result, drain the node if unhealthy."""
        from broker.burnin import burn_in

        return await burn_in(self.burnin, provider, node, quick=quick, timeout_s=timeout_s)

    @staticmethod
    def benchmark_from_text(text: str, provider: str, target: str, *, nccl: bool = False) -> Benchmark:
        """A probe JSON document (or nccl-tests output) as a Benchmark; SpecError when it is neither."""
        from broker.burnin import benchmark_from_text

        return benchmark_from_text(text, provider, target, nccl=nccl)

    @staticmethod
    def parse_nccl(text: str) -> NcclResult:
        """nccl-tests output read into per-size rows and its summary; SpecError naming what is wrong."""
        from broker.nccl import parse_nccl

        return parse_nccl(text)

    @staticmethod
    def probe_this_node(*, quick: bool = False, disk_dir: str | None = None) -> dict[str, Any]:
        """Measure the machine this process runs on (host, disk; GPUs and NCCL when present): the probe's document."""
        from broker.probe import run_probe

        return run_probe(quick=quick, disk_dir=disk_dir)

    async def record_benchmark(self, bench: Benchmark, *, fabric: Fabric | None = None) -> Benchmark:
        """Store a benchmark judged by the health gates; an unhealthy node leaves the pool (and is drained)."""
        from broker.burnin import record_benchmark

        return await record_benchmark(self.burnin, bench, fabric=fabric)

    async def list_benchmarks(self, *, provider: str | None = None, target: str | None = None,
                              latest_only: bool = True) -> tuple[list[Benchmark], dict[tuple[str, str], str]]:
        """Stored benchmarks and the nodes marked unhealthy, (provider, node) → reason."""
        from broker.burnin import list_benchmarks

        return await list_benchmarks(self.burnin, provider=provider, target=target, latest_only=latest_only)
