"""Interruption risk: real spot traces → preemptions per hour; allocations → per-zone rates."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker.models import Allocation, AllocationState
from policies.book import OfferBook
from policies.risk import DEFAULT_PREEMPTIONS_PER_HOUR, PRIOR_HOURS, preemption_rates, trace_preemption_rate


def load(shared_data: Path, rel: str) -> dict:
    return json.loads((shared_data / "spot" / rel).read_text())


def test_v100_preemption_trace_us_east_1c(shared_data: Path) -> None:
    # 19,961 ticks of 32 s; 6,274 ticks held the instance (55.8 h); 41 times it was lost.
    r = trace_preemption_rate(load(shared_data, "preemption/1-node/aws-04-22-2023/us-east-1c_v100_1.json"))
    assert r.preemptions == 41
    assert r.instance_hours == pytest.approx(6274 * 32 / 3600)
    assert r.hours == pytest.approx(19961 * 32 / 3600)
    assert r.per_hour == pytest.approx(0.735, abs=0.001)


def test_gcp_c3_trace_that_never_lost_its_instance_has_rate_zero(shared_data: Path) -> None:
    r = trace_preemption_rate(load(shared_data, "preemption/1-node/gcp-04-30-2023/us-central1-a_c3-88.json"))
    assert r.preemptions == 0 and r.instance_hours > 40 and r.per_hour == 0.0


def test_every_real_trace_gives_a_finite_rate_and_aws_v100_is_riskier_than_gcp_c3(shared_data: Path) -> None:
    files = sorted((shared_data / "spot").glob("*/1-node/*/*.json"))
    assert len(files) == 19
    rates = {
        f.relative_to(shared_data / "spot").as_posix(): trace_preemption_rate(json.loads(f.read_text()))
        for f in files
    }
    assert all(0.0 <= r.per_hour < 2.0 for r in rates.values())
    aws_v100 = [r.per_hour for k, r in rates.items() if "aws-04-22-2023" in k]
    gcp = [r.per_hour for k, r in rates.items() if "gcp-04-30-2023" in k]
    assert min(aws_v100) > max(gcp)
    # The 8-GPU availability traces lose capacity more often per held hour than the 1-GPU ones (same zone).
    one = rates["availability/1-node/aws-10-26-2022/us-west-2b_v100_1.json"].per_hour
    eight = rates["availability/1-node/aws-10-26-2022/us-west-2b_v100_8.json"].per_hour
    assert eight > one


def test_trace_without_gap_is_refused() -> None:
    with pytest.raises(ValueError):
        trace_preemption_rate({"metadata": {}, "data": [1, 0]})


NOW = datetime(2026, 1, 10, tzinfo=UTC)


def alloc(
    i: int,
    state: AllocationState,
    hours: float,
    zone: str = "us-east-1a",
    sku: str = "p4d.24xlarge",
    market: str = "spot",
) -> Allocation:
    start = NOW - timedelta(hours=100)
    return Allocation(
        id=f"a{i}",
        job_id=f"j{i}",
        provider="aws",
        state=state,
        zone=zone,
        region="us-east-1",
        created_at=start,
        updated_at=start + timedelta(hours=hours),
        offer_id=f"aws:{market}:us-east-1:{zone}:{sku}",
        attrs={"instance_type": sku, "market": market},
    )


def test_preemption_rates_blend_observations_with_the_prior() -> None:
    allocs = [
        alloc(1, AllocationState.preempted, 10),
        alloc(2, AllocationState.preempted, 10),
        alloc(3, AllocationState.succeeded, 20),
        alloc(4, AllocationState.running, 0),  # live: counts until NOW (100 h)
        alloc(5, AllocationState.intent, 0),  # never reached the provider
        alloc(6, AllocationState.released, 50, market="on_demand"),  # not spot: no preemption risk
    ]
    rates = preemption_rates(allocs, NOW)
    hours = 10 + 10 + 20 + 100
    expected = (2 + DEFAULT_PREEMPTIONS_PER_HOUR * PRIOR_HOURS) / (hours + PRIOR_HOURS)
    assert rates == {("aws", "us-east-1a", "p4d.24xlarge"): pytest.approx(expected)}


def test_volatile_series_get_a_higher_prior() -> None:
    vol = {("aws", "us-east-1a", "p5.48xlarge"): 0.0, ("aws", "us-east-1b", "p5.48xlarge"): 0.2}
    rates = preemption_rates([], NOW, volatility=vol)
    assert rates[("aws", "us-east-1a", "p5.48xlarge")] == pytest.approx(DEFAULT_PREEMPTIONS_PER_HOUR)
    assert rates[("aws", "us-east-1b", "p5.48xlarge")] == pytest.approx(DEFAULT_PREEMPTIONS_PER_HOUR * 3.0)


def test_rates_feed_the_offer_book() -> None:
    from broker.models import Locality, Market, Offer

    offer = Offer(
        id="x",
        provider="aws",
        market=Market.spot,
        sku="p4d.24xlarge",
        gpu="A100-SXM-40GB",
        gpu_count=8,
        usd_per_hour=10.0,
        interruptible=True,
        locality=Locality(provider="aws", region="us-east-1", zone="us-east-1a"),
    )
    rates = preemption_rates([alloc(1, AllocationState.preempted, 1)], NOW)
    book = OfferBook.build([offer], preemption_rates=rates)
    assert book.cols["preempt_rate"][0] == pytest.approx(rates[("aws", "us-east-1a", "p4d.24xlarge")])
