"""Placement policies (pure): reserved first, on-prem first, bursting, spot while slack lasts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from broker.models import CostBreakdown, Fabric, Market, QuoteOption
from broker.specs import parse_spec
from policies.placement import candidates, decide, spot_allowed

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def opt(market: Market, cost: float, hours: float, wait: float = 0.0, provider: str = "aws") -> QuoteOption:
    return QuoteOption(
        offer_id=f"{provider}-{market.value}-{cost}", provider=provider, market=market, sku="x", region="r", zone="z",
        nodes=1, gpus_per_node=8, gpu="H100-SXM", fabric=Fabric.efa, fabric_gbps=3200, usd_per_hour=cost / hours,
        expected_hours=hours + wait, expected_cost_usd=cost,
        breakdown=CostBreakdown(compute_hours=hours, comm_hours=0, queue_wait_hours=wait),
    )


def spec(**kw):
    data = {"name": "j", "gpu": "H100", "gpus": 8, "workload": {"hours": 10}}
    data.update(kw)
    return parse_spec(data)


ONPREM = opt(Market.owned, 100, 10, provider="slurm")
ONPREM_BUSY = opt(Market.owned, 100, 10, wait=30, provider="slurm")
OD = opt(Market.on_demand, 300, 10)
SPOT = opt(Market.spot, 120, 10)
RESERVED = opt(Market.reserved, 0, 10, provider="reserved")


def test_reserved_first() -> None:
    d = decide(spec(), [RESERVED, ONPREM, OD], now=NOW, deadline=None, max_queue_wait_hours=4)
    assert d.route == "reserved"
    assert [o.market for o in candidates([ONPREM, OD, RESERVED], d)][:2] == [Market.reserved, Market.owned]


def test_onprem_first_when_it_can_serve_in_time() -> None:
    d = decide(spec(), [OD, ONPREM], now=NOW, deadline=NOW + timedelta(hours=48), max_queue_wait_hours=4)
    assert d.route == "onprem" and "already paid" in d.reason
    assert [o.market for o in candidates([OD, ONPREM], d)] == [Market.owned]


def test_burst_when_queue_would_miss_deadline() -> None:
    d = decide(spec(), [OD, ONPREM_BUSY], now=NOW, deadline=NOW + timedelta(hours=20), max_queue_wait_hours=100)
    assert d.route == "cloud" and "miss the deadline" in d.reason
    assert d.numbers["onprem_queue_wait_hours"] == 30 and d.numbers["extra_cost_usd"] == 200
    assert [o.market for o in candidates([OD, ONPREM_BUSY], d)] == [Market.on_demand]


def test_burst_when_wait_exceeds_limit() -> None:
    d = decide(spec(), [OD, ONPREM_BUSY], now=NOW, deadline=None, max_queue_wait_hours=4)
    assert d.route == "cloud" and "exceeds the limit" in d.reason


def test_onprem_only_and_cloud_not_ok_never_burst() -> None:
    for s in (spec(onprem_only=True), spec(cloud_ok=False)):
        d = decide(s, [OD, ONPREM_BUSY], now=NOW, deadline=NOW + timedelta(hours=20), max_queue_wait_hours=1)
        assert d.route == "onprem"
        d = decide(s, [OD], now=NOW, deadline=None, max_queue_wait_hours=1)
        assert d.route == "wait" and candidates([OD], d) == []


def test_budget_blocks_burst() -> None:
    d = decide(spec(), [OD, ONPREM_BUSY], now=NOW, deadline=NOW + timedelta(hours=20), max_queue_wait_hours=1,
               budget_left_usd=250)
    assert d.route == "onprem" and "budget" in d.reason


def test_spot_with_slack_on_demand_as_it_runs_out() -> None:
    s = spec(interruptible=True, checkpoint_minutes=30)
    ok, numbers = spot_allowed(s, now=NOW, deadline=NOW + timedelta(hours=40), on_demand_hours=10,
                               preemptions_per_hour=0.1)
    assert ok and numbers["slack_hours"] == 29
    late, _ = spot_allowed(s, now=NOW, deadline=NOW + timedelta(hours=11.5), on_demand_hours=10,
                           preemptions_per_hour=0.1)
    assert not late
    never, _ = spot_allowed(spec(), now=NOW, deadline=None, on_demand_hours=10, preemptions_per_hour=0.1)
    assert not never
    d = decide(s, [SPOT, OD], now=NOW, deadline=NOW + timedelta(hours=40), max_queue_wait_hours=4)
    assert d.route == "cloud" and d.allow_spot
    assert [o.market for o in candidates([SPOT, OD], d)] == [Market.spot, Market.on_demand]
    d = decide(s, [SPOT, OD], now=NOW, deadline=NOW + timedelta(hours=11), max_queue_wait_hours=4)
    assert not d.allow_spot and [o.market for o in candidates([SPOT, OD], d)] == [Market.on_demand]


def test_preemption_history_lowers_spot_value() -> None:
    s = spec(interruptible=True, checkpoint_minutes=60)
    calm, _ = spot_allowed(s, now=NOW, deadline=NOW + timedelta(hours=14), on_demand_hours=10,
                           preemptions_per_hour=0.05)
    stormy, _ = spot_allowed(s, now=NOW, deadline=NOW + timedelta(hours=14), on_demand_hours=10,
                             preemptions_per_hour=3.0)
    assert calm and not stormy
