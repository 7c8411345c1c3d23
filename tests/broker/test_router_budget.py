"""Tenant budgets are checked at placement (the router): a job that would break them stays pending, with the reason."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.config import BrokerConfig, Settings
from broker.models import JobState, Tenant
from broker.service import Lockstep
from broker.specs import parse_spec
from broker.store import Store
from providers.vast import VastProvider

CHEAP = {"name": "b", "gpu": ["RTX-4090", "RTX-3090"], "gpus": 1, "markets": ["on_demand"],
         "workload": {"hours": 2}, "command": "sleep 60"}


@pytest.fixture
async def svc(tmp_path: Path, vast_config) -> AsyncIterator[Lockstep]:
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'budget.db'}", broker=BrokerConfig(installation="budget-test"))
    store = Store(settings.db_url)
    store.migrate()
    s = Lockstep(settings, providers={"vast": VastProvider(vast_config, installation="budget-test")}, store=store)
    await s.refresh()
    yield s
    jobs, _ = await s.list_jobs(limit=100)
    for j in jobs:
        await s.cancel(j.id)
    await s.aclose()


async def test_gpu_cap_keeps_job_pending_with_reason(svc: Lockstep) -> None:
    svc.store.create_tenant(Tenant(name="small", max_gpus=1))
    first = await svc.submit(parse_spec(CHEAP), tenant="small")
    await svc.place_now([first.id])
    assert (await svc.get_job(first.id)).state is JobState.provisioning
    second = await svc.submit(parse_spec({**CHEAP, "name": "b2"}), tenant="small")
    await svc.place_now([second.id])
    job = await svc.get_job(second.id)
    assert job.state is JobState.pending
    assert job.reason.startswith("budget:") and "cap of 1" in job.reason
    assert not await svc.job_allocations(second.id)


async def test_monthly_budget_spent_blocks_placement(svc: Lockstep) -> None:
    svc.store.create_tenant(Tenant(name="broke", monthly_budget_usd=0.01))
    job = await svc.submit(parse_spec(CHEAP), tenant="broke")
    await svc.place_now([job.id])
    job = await svc.get_job(job.id)
    assert job.state is JobState.pending
    assert "budget" in job.reason and "$0.01" in job.reason
    assert not await svc.job_allocations(job.id)


async def test_tenant_without_caps_is_placed(svc: Lockstep) -> None:
    job = await svc.submit(parse_spec(CHEAP), tenant="free")
    await svc.place_now([job.id])
    assert (await svc.get_job(job.id)).state is JobState.provisioning
