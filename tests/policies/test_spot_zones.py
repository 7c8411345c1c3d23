"""``policies.spot.spot_zone_move``: where a job should start spot instead of what its home plan chose (issue 30).

Pure: markets are built from plain availability series, no clock, no I/O.
"""

from __future__ import annotations

from typing import Any

import pytest

from policies.spot import (
    AvailabilityModel,
    SpotMarket,
    availability_model,
    expected_down_hours,
    expected_up_hours,
    spot_zone_move,
)

GAP = 600
CALM = availability_model([True] * 1000 + [False] + [True] * 1000, GAP)  # spot stays for days
FLAKY = availability_model([i % 3 != 0 for i in range(2000)], GAP)  # up 20 min, down 10 min, again and again
SCARCE = availability_model(([False] * 60 + [True] * 2) * 30, GAP)  # ten-hour outages, brief returns
# a 48 h job, a 0.2 h changeover, 50 GB at 2 Gbps ($1 of egress), the p3.2xlarge prices
JOB: dict[str, Any] = dict(
    changeover_hours=0.2,
    migration_hours=200 / 3600,
    migration_usd=1.0,
    spot_usd_per_hour=0.918,
    ondemand_usd_per_hour=3.06,
    decision_interval_hours=GAP / 3600,
)


def move(
    markets: list[SpotMarket],
    plan: str,
    *,
    running_on_demand: bool = False,
    hours_left: float = 60.0,
    work_left_hours: float = 48.0,
) -> int | None:
    return spot_zone_move(
        markets,
        here=0,
        plan=plan,
        running_on_demand=running_on_demand,
        hours_left=hours_left,
        work_left_hours=work_left_hours,
        **JOB,
    ).zone


def test_expected_down_hours_reads_the_down_hazards() -> None:
    assert expected_down_hours(SCARCE, 0.0) > 10 * expected_down_hours(CALM, 0.0)
    swapped = AvailabilityModel(CALM.step_hours, CALM.down_hazard, CALM.up_hazard)
    assert expected_down_hours(CALM, 1.0) == pytest.approx(expected_up_hours(swapped, 1.0))


def test_instead_of_starting_on_demand_a_lasting_spot_elsewhere_wins() -> None:
    markets = [SpotMarket(SCARCE, False, 0.5), SpotMarket(CALM, True, 3.0)]
    assert move(markets, "on-demand") == 1
    # spot elsewhere that is gone, or lost within minutes, does not pay for the move
    assert move([SpotMarket(SCARCE, False, 0.5), SpotMarket(CALM, False, 3.0)], "on-demand") is None
    assert move([SpotMarket(SCARCE, False, 0.5), SpotMarket(FLAKY, True, 0.0)], "on-demand") is None


def test_the_cheapest_zone_wins_and_home_is_never_a_move() -> None:
    markets = [SpotMarket(CALM, True, 3.0), SpotMarket(FLAKY, True, 0.0), SpotMarket(CALM, True, 3.0)]
    assert move(markets, "on-demand") == 2  # the home zone's spot was the plan's to take; the flaky zone loses


def test_a_running_on_demand_instance_is_left_only_where_that_zones_plan_would_leave_it() -> None:
    """A move off on-demand pays a changeover now and one back when that spot goes: the remote zone's own plan
    must prefer spot from on-demand, and its hazards turn down a young run in a flapping market."""
    young_flaky = [SpotMarket(SCARCE, False, 0.5), SpotMarket(FLAKY, True, 0.0)]
    assert move(young_flaky, "on-demand", running_on_demand=True) is None
    calm = [SpotMarket(SCARCE, False, 0.5), SpotMarket(CALM, True, 3.0)]
    assert move(calm, "on-demand", running_on_demand=True) == 1


def test_waiting_at_home_is_left_only_when_the_home_outage_outlasts_the_slack() -> None:
    remote = SpotMarket(CALM, True, 3.0)
    # a short outage at home (calm market, just lost): waiting is free, the plan meets spot's return there
    assert move([SpotMarket(CALM, False, 0.0), remote], "wait") is None
    # a scarce home whose outage (8.5 h more, expected) outlasts the 8 h of slack: move to the lasting spot
    assert expected_down_hours(SCARCE, 1.0) > 8.0
    assert move([SpotMarket(SCARCE, False, 1.0), remote], "wait", hours_left=56.0) == 1
    # with days of slack the same outage is waited out
    assert move([SpotMarket(SCARCE, False, 1.0), remote], "wait", hours_left=400.0) is None
    # spot up at home while the plan waits: the plan's own choice, no move
    assert move([SpotMarket(SCARCE, True, 0.0), remote], "wait", hours_left=56.0) is None


def test_no_move_once_the_slack_no_longer_covers_two_changeovers_with_the_migration() -> None:
    markets = [SpotMarket(SCARCE, False, 0.5), SpotMarket(CALM, True, 3.0)]
    overhead = JOB["changeover_hours"] + JOB["migration_hours"]
    assert move(markets, "on-demand", hours_left=48.0 + 2 * overhead + 0.1 + 0.01) is None
    assert move(markets, "on-demand", hours_left=48.0 + 2 * overhead + 0.2 + 0.01) == 1
    got = spot_zone_move(
        markets, here=0, plan="on-demand", running_on_demand=False, hours_left=48.2, work_left_hours=48.0, **JOB
    )
    assert got.zone is None and "slack" in got.reason


def test_the_plan_is_on_demand_or_wait() -> None:
    with pytest.raises(ValueError, match="plan"):
        move([SpotMarket(CALM, True, 3.0), SpotMarket(CALM, True, 3.0)], "spot")
