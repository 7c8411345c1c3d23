"""Budgets hold while jobs run (issue 24): each poll pass weighs a tenant's month-to-date spend, what its live
allocations accrue and what its running jobs are expected to cost yet against its monthly budget — alerts at
50/80/100% once a month each, nothing new placed at 100%, running jobs stopped per ``on_budget_exhausted`` —
and each job against its own ``max_cost_usd``. An injected clock on both stores (the ``store`` fixture); the
month rolls over in UTC.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta

import pytest

from broker.budgets import BudgetWatch
from broker.config import BrokerConfig, Settings
from broker.lifecycle import JobLifecycle
from broker.market import Marketplace
from broker.models import Allocation, AllocationState, BudgetAction, Job, JobState, Tenant
from broker.router import Router
from broker.store import Store
from policies.budget import Standing, alert_due
from providers.capabilities import SignalsJobs
from standins.memory import NOW, MemoryProvider, offer, spec

GRACE_S = 120.0


class Clock:
    def __init__(self, now: datetime = NOW) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


class SignalingMemory(MemoryProvider, SignalsJobs):
    """The in-memory market, able to signal a running job (as Slurm is): it records each signal."""

    def __init__(self, name: str, offers: list) -> None:
        super().__init__(name, offers)
        self.signals: list[tuple[str, str]] = []

    async def signal(self, alloc: Allocation, name: str = "TERM") -> None:
        self.signals.extend((rid, name) for rid in alloc.resource_ids)


class Budgets:
    """A router, a lifecycle and the budget watch over one store and one market, all on one clock."""

    def __init__(self, store: Store, mem: MemoryProvider, clock: Clock) -> None:
        self.store, self.mem, self.clock = store, mem, clock
        self.settings = Settings(broker=BrokerConfig(installation="mem", budget_grace_s=GRACE_S))
        self.market = Marketplace({mem.name: mem}, clock=clock)
        self.life = JobLifecycle(store, {mem.name: mem}, clock=clock)
        self.router = Router(self.settings, store, self.market, clock=clock, lifecycle=self.life)
        self.watch = BudgetWatch(self.settings, store, self.life, clock=clock)

    async def submit(self, tenant: str = "acme", **spec_fields: object) -> Job:
        """A job placed now if it may be (provisioning), else left pending with the reason."""
        now = self.clock()
        job, _ = self.store.create_job(Job(id="j" + secrets.token_hex(6), tenant=tenant, spec=spec(**spec_fields),
                                           created_at=now, updated_at=now))
        claimed = await self.life.claim(job.id, "w")
        assert claimed is not None
        return (await self.router.place(claimed, now=now)).job

    async def run(self, job: Job) -> Allocation:
        """The market starts the job: a poll sees it running (billing begins now)."""
        [alloc] = self.store.allocations(job.id)
        self.mem.set_state(alloc, AllocationState.running)
        await self.poll(alloc)
        return self.store.get_allocation(alloc.id)

    async def poll(self, alloc: Allocation) -> JobState | None:
        current = self.store.get_allocation(alloc.id)
        status = await self.mem.poll(current)
        return await self.life.follow(current, status.state, status.reason, status.hosts, status.exit)

    def at(self, hours: float) -> None:
        self.clock.now = NOW + timedelta(hours=hours)


def alerts(store: Store, job_id: str) -> list[int]:
    return [e.data["budget_alert"]["level"] for e in store.events(job_id) if "budget_alert" in e.data]


async def world(store: Store, mem: MemoryProvider | None = None, *, budget: float | None = 10.0,
                action: BudgetAction = BudgetAction.stop) -> Budgets:
    mem = mem or MemoryProvider("mem", [offer("mem", "a", 4.0)])
    w = Budgets(store, mem, Clock())
    await w.market.refresh()
    store.create_tenant(Tenant(name="acme", monthly_budget_usd=budget, on_budget_exhausted=action))
    return w


def test_standing_and_alerts_are_pure_arithmetic() -> None:
    s = Standing("acme", 10.0, 6.0, 2.5)
    assert s.projected_usd == 8.5 and s.level == 80 and not s.exhausted
    assert Standing("acme", 10.0, 10.0, 0.0).exhausted and Standing("acme", 10.0, 10.0, 0.0).level == 100
    assert Standing("acme", 10.0, 4.9, 0.0).level == 0
    assert Standing("acme", 0.0, 0.0, 0.0).level == 0 and Standing("acme", 0.0, 0.01, 0.0).level == 100
    assert alert_due("", "2026-12", 50) and not alert_due("2026-12:80", "2026-12", 50)
    assert alert_due("2026-12:50", "2026-12", 80) and alert_due("2026-11:100", "2026-12", 50)
    assert not alert_due("", "2026-12", 0)


async def test_alerts_at_50_80_and_100_percent_once_each_and_continue_keeps_the_job_running(store: Store) -> None:
    w = await world(store, action=BudgetAction.continue_)
    job = await w.submit()
    assert job.state is JobState.provisioning, job.reason
    await w.run(job)
    w.at(1.5)  # $6 of $10
    await w.watch.check()
    await w.watch.check()  # the same level again: not sent twice
    assert alerts(store, job.id) == [50]
    assert w.watch.standings["acme"].spent_usd == pytest.approx(6.0)
    w.at(2.0)  # $8
    await w.watch.check()
    w.at(3.0)  # $12: spent, but the tenant says continue
    assert await w.watch.check() == []
    assert alerts(store, job.id) == [50, 80, 100]
    assert store.get_job(job.id).state is JobState.running and not w.mem.released
    # ...and nothing new is placed for it
    late = await w.submit()
    assert late.state is JobState.pending and late.reason.startswith("budget:"), late.reason


async def signalled(store: Store) -> tuple[SignalingMemory, Budgets, Job, Allocation]:
    """A running job of a tenant whose budget is spent (with ``signal_then_stop``), just signalled to stop."""
    mem = SignalingMemory("mem", [offer("mem", "a", 4.0)])
    w = await world(store, mem, action=BudgetAction.signal_then_stop)
    job = await w.submit()
    alloc = await w.run(job)
    w.at(2.6)  # $10.40 of $10
    await w.watch.check()
    return mem, w, job, alloc


async def test_at_100_percent_new_jobs_are_refused_and_a_running_job_is_signalled_then_released(
        store: Store) -> None:
    mem = SignalingMemory("mem", [offer("mem", "a", 4.0)])
    w = await world(store, mem, action=BudgetAction.signal_then_stop)
    job = await w.submit()
    alloc = await w.run(job)
    w.at(2.6)  # $10.40 of $10
    assert await w.watch.check() == []  # signalled, not stopped yet: its checkpoint window is open
    assert mem.signals == [(alloc.resource_ids[0], "TERM")]
    assert store.get_job(job.id).state is JobState.running and not mem.released
    assert any("SIGTERM sent" in e.reason for e in store.events(job.id))
    refused = await w.submit()
    assert refused.state is JobState.pending and "budget" in refused.reason and "$10.00" in refused.reason
    assert not store.allocations(refused.id)
    w.clock.now += timedelta(seconds=GRACE_S - 1)
    assert await w.watch.check() == [] and len(mem.signals) == 1  # signalled once
    w.clock.now += timedelta(seconds=2)
    [stopped] = await w.watch.check()
    assert stopped.id == job.id
    done = store.get_job(job.id)
    assert done.state is JobState.failed and done.reason.startswith("budget: tenant acme has spent")
    assert mem.released == alloc.resource_ids
    rec = store.get_allocation(alloc.id)
    assert rec.state is AllocationState.released
    billed = 2.6 * 3600 + GRACE_S + 1
    assert rec.billed_s == pytest.approx(billed) and rec.cost_usd == pytest.approx(4.0 * billed / 3600)


async def test_a_job_that_ends_in_its_checkpoint_window_says_why_it_was_stopped(store: Store) -> None:
    from broker.models import ExitReason, JobExit

    mem, w, job, alloc = await signalled(store)
    mem.end(alloc, JobExit(exit_code=143, reason=ExitReason.signal))  # it saved its checkpoint and exited
    assert await w.poll(alloc) is JobState.failed
    done = store.get_job(job.id)
    assert done.reason.startswith("budget: tenant acme has spent") and "stopped" in done.reason
    assert mem.released == alloc.resource_ids


async def test_a_job_whose_market_reads_the_stop_signal_as_a_preemption_ends_and_is_not_requeued(
        store: Store) -> None:
    """AWS's poll answers ``preempted`` for a wrapper stopped by a signal (its machine going away, as a rule): after
    a stop for cost, that is the end the broker asked for — failed with the budget's reason, never requeued."""
    mem, w, job, alloc = await signalled(store)
    assert mem.signals == [(alloc.resource_ids[0], "TERM")]
    mem.set_state(alloc, AllocationState.preempted)
    assert await w.poll(alloc) is JobState.failed
    done = store.get_job(job.id)
    assert done.reason.startswith("budget: tenant acme has spent") and "stopped" in done.reason
    assert done.preemptions == 0 and mem.released == alloc.resource_ids


async def test_stop_releases_at_once_where_the_tenant_says_stop(store: Store) -> None:
    w = await world(store, action=BudgetAction.stop)
    job = await w.submit()
    alloc = await w.run(job)
    w.at(2.5)  # $10 exactly: spent
    [stopped] = await w.watch.check()
    assert store.get_job(stopped.id).state is JobState.failed
    assert w.mem.released == alloc.resource_ids
    assert store.get_allocation(alloc.id).cost_usd == pytest.approx(10.0)


async def test_max_cost_usd_stops_a_job_without_any_tenant_budget(store: Store) -> None:
    w = await world(store, budget=None)
    job = await w.submit(max_cost_usd=5.0)
    assert job.state is JobState.provisioning, job.reason
    alloc = await w.run(job)
    w.at(1.0)  # $4 of its $5
    assert await w.watch.check() == []
    w.at(1.25)  # $5: reached (the in-memory market cannot signal: stopped at once)
    [stopped] = await w.watch.check()
    done = store.get_job(stopped.id)
    assert done.state is JobState.failed and done.reason.startswith("max_cost_usd:"), done.reason
    assert w.mem.released == alloc.resource_ids
    # A job whose cap no option fits is not placed at all.
    capped = await w.submit(max_cost_usd=0.5)
    assert capped.state is JobState.pending and "max_cost_usd" in capped.reason, capped.reason


async def test_the_month_rolls_over_in_utc(store: Store) -> None:
    w = await world(store, action=BudgetAction.continue_)
    w.clock.now = datetime(2026, 11, 30, 20, tzinfo=UTC)
    first = await w.submit()
    alloc = await w.run(first)
    w.clock.now = datetime(2026, 11, 30, 23, tzinfo=UTC)  # $12 in November
    await w.watch.check()
    assert alerts(store, first.id) == [100]
    from broker.models import JobExit

    w.clock.now = datetime(2026, 11, 30, 23, 30, tzinfo=UTC)
    w.mem.end(alloc, JobExit(exit_code=0))
    assert await w.poll(alloc) is JobState.succeeded  # $14 booked, in November
    w.clock.now = datetime(2026, 12, 1, 0, 30, tzinfo=UTC)  # a new month: nothing spent yet
    second = await w.submit()
    assert second.state is JobState.provisioning, second.reason
    await w.run(second)
    w.clock.now = datetime(2026, 12, 1, 2, 45, tzinfo=UTC)  # $9 in December
    await w.watch.check()
    assert w.watch.standings["acme"].spent_usd == pytest.approx(9.0)
    assert alerts(store, second.id) == [80]  # November's 100% does not silence December's alerts
    assert store.get_job(second.id).state is JobState.running
