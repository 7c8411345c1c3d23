"""Issue 29's table papercuts: `tenants list` in local mode shows `default` (the tenant local jobs belong to)
with its month-to-date spend; a quote's price column says it is the whole allocation's; `tenants create` takes
`--monthly-usd` like `set-budget` (``--budget`` kept as a hidden alias)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker.config import Settings
from broker.models import Allocation, AllocationState
from broker.service import Lockstep
from broker.store import Store
from tests.store.helpers import job

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


async def test_the_default_tenant_is_listed_with_its_month_to_date_spend(store: Store) -> None:
    store.create_job(job(job_id="local"))  # no tenant named: `default`, which has no row
    store.add_allocation(Allocation(id="a1", job_id="local", provider="aws", usd_per_hour=10.0,
                                    state=AllocationState.running, created_at=NOW - timedelta(hours=5)))
    store.end_allocation("a1", state=AllocationState.released, reason="done", ended_at=NOW - timedelta(hours=1),
                         cost_usd=40.0, billed_s=4 * 3600.0)
    svc = Lockstep(Settings(db_url=store.url), providers={}, store=store, clock=lambda: NOW)
    listed = await svc.list_tenants()
    assert [(t.name, t.month_to_date_usd) for t in listed] == [("default", pytest.approx(40.0))]


def test_tenants_list_in_local_mode_shows_default(invoke) -> None:
    code, out, err = invoke("tenants", "list", "--json")
    assert code == 0, err
    assert [t["name"] for t in json.loads(out)] == ["default"]
    code, out, _ = invoke("tenants", "list")
    assert code == 0 and "default" in out


def test_tenants_create_takes_monthly_usd_and_the_old_budget_flag(invoke) -> None:
    code, out, err = invoke("tenants", "create", "acme", "--monthly-usd", "200", "--json")
    assert code == 0, err
    assert json.loads(out)["monthly_budget_usd"] == 200.0
    code, out, err = invoke("tenants", "create", "old", "--budget", "50", "--json")
    assert code == 0, err
    assert json.loads(out)["monthly_budget_usd"] == 50.0
    code, out, _ = invoke("tenants", "create", "--help")
    assert "--monthly-usd" in out and "--budget" not in out  # the alias is hidden


def test_the_quote_price_column_says_it_is_the_whole_allocations(invoke) -> None:
    code, out, err = invoke("quote", str(ROOT / "examples" / "llama-70b-pretrain.yaml"))
    assert code == 0, err
    assert "$/h (all" in out and "GPUs)" in out
