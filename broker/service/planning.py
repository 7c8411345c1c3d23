"""Planning: replay the broker's policies over recorded traces (broker/simulate/) and advise rent, hybrid or own
(broker/advise.py) from a pod trace or the store's job history. The CLI's ``simulate`` and ``advise`` commands
call these and nothing below them."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.errors import SpecError
from broker.models import JobState
from broker.service.runtime import Runtime
from providers.slurm.config import OwnedCost, SlurmConfig

if TYPE_CHECKING:  # the simulators and the advisor load numpy: imported when used, not with the service
    from broker.advise import Advice

__all__ = ["Advice", "PlanningService"]


def _gpu(name: str) -> str:
    from broker.gpus import accepted_models

    if not accepted_models(name):
        raise SpecError("--gpu", f"unknown GPU model {name!r}")
    return name


class PlanningService(Runtime):
    async def simulate_deadline(self, traces: list[Path], *, job_hours: float, deadline_hours: float,
                                changeover_hours: float, spot_price: float, ondemand_price: float, policy: str,
                                start_hour: float, data_gb: float = 0.0, egress_usd_per_gb: float = 0.0,
                                transfer_gbps: float = 1.0) -> dict[str, Any]:
        """One deadline job on spot and on-demand over a spot availability trace, or over several zones' traces
        (aligned in time, the first the job's home), moving between them at a migration cost."""
        from broker.simulate.deadline import DeadlineJob, run_deadline
        from broker.simulate.traces import load_spot_trace
        from broker.simulate.zones import Migration, run_deadline_zones

        job = DeadlineJob(job_hours, deadline_hours, changeover_hours, spot_price, ondemand_price)
        if len(traces) == 1:
            return run_deadline(load_spot_trace(traces[0]), job, policy, start_hour).as_dict()
        return run_deadline_zones([load_spot_trace(t) for t in traces], job, policy,
                                  Migration.of(data_gb, egress_usd_per_gb, transfer_gbps), start_hour).as_dict()

    async def simulate_cluster(self, pods: Path, spot_trace: Path, *, onprem_gpus: int, gpus_per_node: int, gpu: str,
                         policy: str) -> dict[str, Any]:
        """A GPU job trace against an on-prem pool that bursts to the cloud, under this broker's settings."""
        from broker.simulate.cluster import ClusterConfig, run_cluster
        from broker.simulate.traces import load_pods, load_spot_trace

        cfg = ClusterConfig(onprem_gpus=onprem_gpus, gpus_per_node=gpus_per_node, gpu=_gpu(gpu),
                            max_queue_wait_hours=self.settings.broker.max_queue_wait_hours,
                            owned=self._owned())
        cfg.validate()
        return run_cluster(load_pods(pods), cfg, load_spot_trace(spot_trace, "--spot-trace"), policy).as_dict()

    async def advise(self, *, pods: Path | None, since_days: float, gpu: str, gpus_per_node: int,
                     weekly: tuple[float, int] | None = None) -> Advice:
        """Rent, hybrid or own for the GPU-hours of a pod trace, of a stated load (``weekly``: GPU-hours a
        week and the peak GPUs), or (both None) of the store's jobs over the last ``since_days``."""
        from broker.advise import advise, catalog_prices, usage_from_pods, usage_from_weekly
        from broker.simulate.traces import load_pods

        if gpus_per_node < 1:
            raise SpecError("--gpus-per-node", f"must be at least 1, not {gpus_per_node}")
        if weekly is not None:
            usage = usage_from_weekly(*weekly)
        elif pods is not None:
            usage = usage_from_pods(load_pods(pods))
        else:
            usage = await self._usage(since_days)
        return advise(usage, catalog_prices(_gpu(gpu), gpus_per_node), self._owned(), gpus_per_node)

    def _owned(self) -> OwnedCost:
        """What owned hardware costs: the on-prem market's setting (its section is typed where it is defined)."""
        return self.settings.section("slurm", SlurmConfig).owned

    async def _usage(self, since_days: float) -> Any:
        from broker.advise import usage_from_history

        if not since_days > 0:
            raise SpecError("--since-days", f"must be positive, not {since_days:g}")
        now = self.clock()
        rows = await self.db(self.store.job_usage, now - timedelta(days=since_days), now)
        allocs = await self.db(self.store.allocations)
        interruptible: set[str] = set()
        cursor = None
        while True:
            jobs, cursor = await self.db(self.store.list_jobs, None, None, 1000, cursor)
            interruptible |= {j.id for j in jobs if j.spec.interruptible and j.state is not JobState.cancelled}
            if not cursor:
                break
        return usage_from_history(rows, allocs, interruptible, now)
