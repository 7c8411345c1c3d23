"""Budgets that hold while jobs run: every poll pass weighs each tenant against its monthly budget, and each
running job against its own ``max_cost_usd`` (policies/budget.py says how; this module reads and acts).

- An alert at 50, 80 and 100% of a tenant's budget (on spent + committed), once a month each (UTC): a log
  warning, an event on each of the tenant's live jobs, the ``on_alert`` hook (metrics, the service's events),
  and a POST to ``tracker.webhook_url`` when one is configured.
- Once what the tenant has *spent* reaches its budget, each running job is stopped per the tenant's
  ``on_budget_exhausted`` (``JobLifecycle.stop_for_cost``); the router places nothing new once the projected
  figure reaches it. A job that reached its own ``max_cost_usd`` is stopped the same way.

The month is the clock's UTC month: spend, alerts and their once-a-month memory all roll over at its start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from datetime import datetime
from typing import TYPE_CHECKING, Any

import httpx

from broker.config import Settings
from broker.errors import ConflictError
from broker.lifecycle import JobLifecycle
from broker.models import AllocationState, BudgetAction, Job, JobState, Tenant, month_start, utcnow
from policies.budget import Standing, alert_due, over_cap, remaining

if TYPE_CHECKING:
    from broker.store import Store

log = logging.getLogger(__name__)

BudgetAlert = Callable[[Standing, int], Awaitable[None]]  # (the standing, the level reached in percent)


class BudgetWatch:
    """The per-poll budget check over one store; ``on_alert`` is told of each alert sent."""

    def __init__(self, settings: Settings, store: Store, lifecycle: JobLifecycle, *,
                 clock: Callable[[], datetime] = utcnow, on_alert: BudgetAlert | None = None) -> None:
        self.settings = settings
        self.store = store
        self.lifecycle = lifecycle
        self.clock = clock
        self.on_alert = on_alert
        self.standings: dict[str, Standing] = {}  # the last check's, by tenant (metrics)

    async def check(self) -> list[Job]:
        """One pass: alerts due, and running jobs stopped for their cost. Returns the jobs it stopped."""
        now = self.clock()
        tenants: list[Tenant] = await asyncio.to_thread(self.store.list_tenants)
        live: list[tuple[Job, float]] = await asyncio.to_thread(self.store.live_costs, now)
        rules = {t.name: t for t in tenants}
        stopped: list[Job] = []
        standings: dict[str, Standing] = {}
        for t in tenants:
            if t.monthly_budget_usd is None:
                continue
            mine = [(j, cost) for j, cost in live if j.tenant == t.name]
            spent = await asyncio.to_thread(self.store.tenant_spend, t.name, month_start(now), now)
            committed = sum(remaining(j.placement.expected_cost_usd if j.placement else None, cost)
                            for j, cost in mine)
            standing = standings[t.name] = Standing(t.name, t.monthly_budget_usd, spent, committed)
            await self._alert(standing, [j for j, _ in mine], now)
            if standing.exhausted:
                why = (f"budget: tenant {t.name} has spent ${spent:,.2f} of its ${t.monthly_budget_usd:,.2f} "
                       f"monthly budget")
                for job, _ in mine:
                    if await self._stop(job, why, t.on_budget_exhausted):
                        stopped.append(job)
        self.standings = standings
        done = {j.id for j in stopped}
        for job, cost in live:
            if job.id in done or not over_cap(job.spec.max_cost_usd, cost):
                continue
            rule = rules.get(job.tenant)
            why = f"max_cost_usd: job {job.id} has cost ${cost:,.2f} of its ${job.spec.max_cost_usd:,.2f}"
            if await self._stop(job, why, rule.on_budget_exhausted if rule else BudgetAction.signal_then_stop):
                stopped.append(job)
        return stopped

    async def _stop(self, job: Job, why: str, action: BudgetAction) -> bool:
        live = [a for a in await asyncio.to_thread(self.store.allocations, job.id)
                if a.state in (AllocationState.pending, AllocationState.running, AllocationState.unknown)]
        if not live:
            return False  # launching (an intent) or between allocations: the next pass sees it
        try:
            moved = await self.lifecycle.stop_for_cost(job, live[0], why, action,
                                                       self.settings.broker.budget_grace_s)
        except ConflictError:
            return False
        if moved is not None:
            log.warning("job %s stopped: %s", job.id, why)
        return moved is JobState.failed

    async def _alert(self, standing: Standing, jobs: list[Job], now: datetime) -> None:
        """Send the alert the standing has reached, once a month a level (a compare-and-set on the tenant's
        record of the last one sent, so two replicas send it once)."""
        month = f"{now:%Y-%m}"
        level = standing.level
        last = await asyncio.to_thread(self.store.budget_alert, standing.tenant)
        if not alert_due(last, month, level):
            return
        if not await asyncio.to_thread(self.store.set_budget_alert, standing.tenant, f"{month}:{level}",
                                       expected=last):
            return  # another replica sent it
        text = (f"budget: tenant {standing.tenant} at {level}% of its ${standing.budget_usd:,.2f} monthly budget "
                f"(spent ${standing.spent_usd:,.2f}, committed ${standing.committed_usd:,.2f})")
        log.warning("%s", text)
        data: dict[str, Any] = {"kind": "budget.alert",  # the event stream's kind (docs/api.md, events)
                                "budget_alert": {**asdict(standing), "level": level, "month": month}}
        for job in jobs:
            await asyncio.to_thread(self.store.note_event, job.id, text, data)
        if self.on_alert is not None:
            await self.on_alert(standing, level)
        await self._webhook({"event": "budget", "at": now.isoformat(), **data["budget_alert"], "text": text})

    async def _webhook(self, body: dict[str, Any]) -> None:
        url = self.settings.tracker.webhook_url
        if url is None:
            return
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                (await client.post(url.get_secret_value(), json=body)).raise_for_status()
        except httpx.HTTPError as exc:  # an alert that cannot be posted is logged, never a reason to stop
            log.warning("budget webhook failed: %s", type(exc).__name__)
