"""Rent, hybrid or own: the design notes' rules of thumb on the cases they describe, and why when they disagree."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from broker.advise import (
    Interval,
    advise,
    catalog_prices,
    payback_years,
    usage_from_history,
    usage_from_intervals,
    usage_from_pods,
)
from broker.errors import SpecError
from broker.models import Allocation, AllocationState, Job, JobSpec
from broker.simulate.traces import load_pods
from broker.store import Store
from providers.slurm.config import OwnedCost

PRICES = catalog_prices("H100", 8)


def load(gpu_hours_per_week: float, wiggle: float = 0.0, weeks: int = 4):
    """A load of this weekly volume, steady or with a daily swing of ±wiggle."""
    mean = gpu_hours_per_week / 168
    intervals = []
    for h in range(weeks * 168):
        g = mean * (1 + wiggle * np.sin(2 * np.pi * h / 24))
        whole, part = int(g), g - int(g)
        if whole:
            intervals.append(Interval(h, h + 1, whole))
        if part > 1e-9:
            intervals.append(Interval(h, h + part, 1))
    return usage_from_intervals(intervals, f"{gpu_hours_per_week} GPU-hours a week")


def test_prices_come_from_the_catalog() -> None:
    assert PRICES.on_demand > 0 and PRICES.on_demand_offer
    assert PRICES.spot is not None and PRICES.spot < PRICES.on_demand


@pytest.mark.parametrize(("weekly", "verdict"), [(500, "rent"), (3000, "hybrid"), (8000, "own")])
def test_steady_loads_agree_with_the_volume_rule(weekly: float, verdict: str) -> None:
    a = advise(load(weekly), PRICES, OwnedCost())
    assert a.usage["gpu_hours_per_week"] == pytest.approx(weekly, rel=1e-6)
    assert a.recommendation == verdict
    best = min(a.plans, key=lambda p: p["usd_per_year"])
    assert {"rent": "rent", "hybrid": "hybrid", "own": "own for peak"}[verdict] == best["name"]
    rule = a.rules[0]
    assert rule["rule_says"] == verdict and rule["agrees"] and rule["why"] == ""


def test_utilisation_and_break_even_agree_with_the_rules() -> None:
    a = advise(load(3000), PRICES, OwnedCost())
    assert 0.6 <= a.break_even_utilisation <= 0.8
    years = payback_years(PRICES.on_demand, OwnedCost(), 8, 0.7)
    assert years is not None and 3.0 <= years <= 4.0
    assert all(r["agrees"] for r in a.rules)
    # owning for the peak of a steady 3,000 GPU-hours a week leaves a node three quarters used
    own = next(p for p in a.plans if p["name"] == "own for peak")
    assert own["owned_gpus"] == 24 and own["owned_utilisation"] == pytest.approx(17.857 / 24, rel=1e-3)


def test_disagreements_say_why() -> None:
    bursty = advise(load(8000, wiggle=0.3), PRICES, OwnedCost())
    assert bursty.recommendation == "hybrid"
    rule = bursty.rules[0]
    assert rule["rule_says"] == "own" and not rule["agrees"] and "bursty" in rule["why"]
    cheap = advise(load(3000), PRICES, OwnedCost(capex_usd=100_000))
    years = next(r for r in cheap.rules if r["rule"].startswith("break-even"))
    assert not years["agrees"] and "capex" in years["why"]
    assert cheap.break_even_utilisation < 0.6
    util = next(r for r in cheap.rules if "utilisation" in r["rule"])
    assert not util["agrees"] and util["why"]


def test_history_from_the_store(tmp_path: Path) -> None:
    """GPU-hours from a real store's jobs and allocations, as `lockstep advise --from-history` reads them."""
    store = Store(f"sqlite:///{tmp_path / 'h.db'}")
    store.migrate()
    now = datetime(2026, 6, 1, tzinfo=UTC)
    for i, (gpus, hours, interruptible) in enumerate([(8, 10.0, False), (2, 5.0, True), (1, 3.0, False)]):
        spec = JobSpec(name=f"j{i}", gpu=["H100"], gpus=gpus, workload={"hours": hours},
                       interruptible=interruptible)
        start = now - timedelta(hours=24 + i)
        store.create_job(Job(id=f"j{i}", spec=spec, created_at=start, updated_at=start))
        store.add_allocation(Allocation(id=f"a{i}", job_id=f"j{i}", provider="aws", state=AllocationState.released,
                                        created_at=start, updated_at=start + timedelta(hours=hours)))
    store.add_allocation(Allocation(id="never", job_id="j0", provider="aws", state=AllocationState.intent,
                                    created_at=now - timedelta(hours=2), updated_at=now))
    rows = store.job_usage(now=now)
    usage = usage_from_history(rows, store.allocations(), {"j1"}, now)
    assert usage.gpu_hours == pytest.approx(8 * 10 + 2 * 5 + 1 * 3)
    assert usage.interruptible_gpu_hours == pytest.approx(10)
    assert usage.peak_gpus == pytest.approx(11, rel=0.01)
    a = advise(usage, PRICES, OwnedCost())
    assert a.recommendation == "rent"


def test_alibaba_trace_advice(shared_data: Path) -> None:
    usage = usage_from_pods(load_pods(shared_data / "traces/alibaba-gpu-v2023/openb_pod_list_default.csv"))
    a = advise(usage, PRICES, OwnedCost())
    assert 1000 < a.usage["gpu_hours_per_week"] < 5000
    assert a.recommendation in ("hybrid", "rent") and a.reason
    assert {p["name"] for p in a.plans} == {"rent", "hybrid", "own for peak"}


def test_no_usage_is_bad_input() -> None:
    with pytest.raises(SpecError, match="no GPU-hours"):
        usage_from_intervals([], "empty history")
