"""Running the service: is the store there (readiness), and the figures a metrics scrape reports."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from broker.models import AllocationState, JobState, as_utc, utcnow
from broker.service.runtime import Runtime

log = logging.getLogger(__name__)

WAITING_STATES = (JobState.pending, JobState.placing, JobState.provisioning)  # where a job can get stuck
BILLING = (AllocationState.pending, AllocationState.running)  # allocations that cost money now
__all__ = ["OperationsService", "circuit_code"]


def circuit_code(state: Any) -> int:
    """The number /metrics reports for a provider's circuit state. Imported where asked: the offer book (numpy)
    stays out of the commands that only read the store (`lockstep tokens`)."""
    from broker.market import CIRCUIT_CODES

    return CIRCUIT_CODES[state]


class OperationsService(Runtime):
    async def store_ok(self) -> bool:
        """True when the store answers; any failure to reach it is False (and logged by its type only)."""
        try:
            return bool(await self.db(self.store.ping))
        except Exception as exc:  # any failure to reach the store means "not ready"
            log.warning("readiness: store unreachable (%s)", type(exc).__name__)
            return False

    async def ready(self) -> tuple[bool, bool, dict[str, bool]]:
        """Readiness: (store answers, a market is available — a healthy provider or the catalog, provider → ok)."""
        store_ok = await self.store_ok()
        health = {name: h.ok for name, h in self.market.health().items()}
        return store_ok, any(health.values()) or self.market.has_snapshot, health

    def metrics_figures(self, now: datetime | None = None) -> dict[str, Any]:
        """What a metrics scrape reports, read from the store (so every replica reports the same truth) and
        this replica's provider health and last reconciliation. Blocking: run it off the event loop."""
        now = as_utc(now or utcnow())
        store = self.store
        out: dict[str, Any] = dict(store.counts())
        waiting = store.jobs_in_states(WAITING_STATES)
        out["oldest"] = {s.value: max([(now - as_utc(j.updated_at)).total_seconds() for j in waiting
                                       if j.state == s] or [0.0]) for s in WAITING_STATES}
        month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        budgets = {t.name: t.monthly_budget_usd for t in store.list_tenants()}
        tenant_of = {j.id: j.tenant for j in store.jobs_in_states([JobState.provisioning, JobState.running])}
        burn = dict.fromkeys(budgets, 0.0)
        for a in store.allocations(states=list(BILLING)):
            tenant = tenant_of.get(a.job_id) or store.get_job(a.job_id).tenant
            burn[tenant] = burn.get(tenant, 0.0) + a.usd_per_hour
        out["tenants"] = [(t, store.tenant_spend(t, month, now), b, budgets.get(t)) for t, b in burn.items()]
        spikes: dict[tuple[str, str], list[float]] = {}
        for alert in store.alerts(open_only=True, since=now - timedelta(days=30)):
            series = alert.get("series") or {}
            ratio = alert["peak"] / alert["baseline"] if alert.get("baseline") else 0.0
            spikes.setdefault((str(series.get("provider", "")), str(series.get("gpu", ""))), []).append(ratio)
        out["spikes"] = spikes
        out["providers"] = self.market.health()
        # Only a started broker has reconciled: never make one here.
        out["reconciled"] = self._broker.reconciled if self._broker is not None else None
        return out
