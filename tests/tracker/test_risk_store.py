"""Risk figures from the store: spot price volatility and observed preemptions per (provider, zone, sku)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.models import Allocation, AllocationState, Job, JobSpec, Market, PricePoint
from broker.store import Store
from broker.tracker import load_preemption_rates, spot_volatility
from policies.risk import DEFAULT_PREEMPTIONS_PER_HOUR, PRIOR_HOURS, VOLATILITY_WEIGHT


def spot(now: datetime, zone: str, price: float, hours_ago: float) -> PricePoint:
    return PricePoint(
        provider="aws",
        market=Market.spot,
        sku="p4d.24xlarge",
        gpu="A100-SXM-40GB",
        region="us-east-1",
        zone=zone,
        usd_per_hour=price,
        at=now - timedelta(hours=hours_ago),
    )


def test_volatility_and_preemptions_combine_per_zone(store: Store) -> None:
    # The test's own start, not the import's: update_allocation stamps the real time, and a slow suite reaches
    # this test long after its import.
    now = datetime.now(UTC)
    store.add_price_points(
        [
            spot(now, "us-east-1a", 10.0, 48),
            spot(now, "us-east-1a", 20.0, 24),
            spot(now, "us-east-1a", 10.0, 0),
            spot(now, "us-east-1b", 10.0, 48),
        ]
    )
    vol = spot_volatility(store, now)
    assert vol[("aws", "us-east-1b", "p4d.24xlarge")] == 0.0
    assert vol[("aws", "us-east-1a", "p4d.24xlarge")] == pytest.approx(
        ((2 * 0.6931471805599453**2) / 48) ** 0.5
    )

    spec = JobSpec(name="t", gpu=["A100"], gpus=8, workload={"hours": 1})
    job, _ = store.create_job(Job(id="j1", spec=spec))
    start = now - timedelta(hours=30)
    store.add_allocation(
        Allocation(
            id="a1",
            job_id=job.id,
            provider="aws",
            zone="us-east-1b",
            region="us-east-1",
            state=AllocationState.running,
            created_at=start,
            attrs={"instance_type": "p4d.24xlarge", "market": "spot"},
        )
    )
    store.update_allocation("a1", state=AllocationState.preempted)
    rates = load_preemption_rates(store, now)
    held = (store.get_allocation("a1").updated_at.astimezone(UTC) - start).total_seconds() / 3600
    assert 30 <= held < 31
    assert rates[("aws", "us-east-1b", "p4d.24xlarge")] == pytest.approx(
        (1 + DEFAULT_PREEMPTIONS_PER_HOUR * PRIOR_HOURS) / (held + PRIOR_HOURS), rel=1e-3
    )
    prior_a = DEFAULT_PREEMPTIONS_PER_HOUR * (
        1 + VOLATILITY_WEIGHT * vol[("aws", "us-east-1a", "p4d.24xlarge")]
    )
    assert rates[("aws", "us-east-1a", "p4d.24xlarge")] == pytest.approx(prior_a)
