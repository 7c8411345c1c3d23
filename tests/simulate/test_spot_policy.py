"""The planned spot policy (policies/spot.py) and its place in policies.placement: pure functions, time as input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from broker.models import Allocation, AllocationState, Market
from broker.simulate.deadline import (
    CHECKPOINT_MINUTES,
    DeadlineJob,
    Lockstep,
    Mode,
    _options,
    _sim_spec,
    make_policy,
    simulate,
)
from policies.placement import candidates, decide, progress_hours, rebalance
from policies.spot import (
    AvailabilityModel,
    SpotMarket,
    availability_model,
    current_run,
    model_span,
    must_run_on_demand,
    spot_choice,
    spot_market,
)

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)
BLIPPY = [i % 12 != 0 for i in range(1008)]  # 600 s ticks: down one tick in twelve


def choice(model: AvailabilityModel, *, hours_left: float, work: float, up: bool = False, age: float = 0.0,
           running: Market | None = None):
    return spot_choice(hours_left=hours_left, work_left_hours=work, changeover_hours=0.2, spot_usd_per_hour=0.9,
                       ondemand_usd_per_hour=3.06, running=running, model=model, spot_up=up, spot_age_hours=age,
                       decision_interval_hours=1 / 6)


def test_hazards_follow_the_run_lengths_of_the_history() -> None:
    series = ([True] * 3 + [False] * 2) * 200  # up three steps, down two, at 600 s = one plan step
    m = availability_model(series, 600)
    assert m.step_hours == pytest.approx(600 / 3600)
    assert m.up_hazard[0] < 0.05 and m.up_hazard[1] < 0.05 and m.up_hazard[2] > 0.9
    assert m.down_hazard[0] < 0.05 and m.down_hazard[1] > 0.9
    assert m.summary()["spot_up_hours"] == pytest.approx(0.5, rel=0.1)  # the prior pulls a little
    prior = availability_model([], 600)  # no history: the prior alone
    assert prior.runs_seen == 0 and prior.summary()["spot_up_hours"] > prior.summary()["spot_down_hours"]
    # a coarse plan step on fine ticks: a step is available only when all its ticks were
    fine = availability_model([True] * 100 + [False] + [True] * 100, 32)
    assert fine.step_hours == pytest.approx(11 * 32 / 3600)


def test_current_run() -> None:
    assert current_run([True, False, False, False], 600) == (False, pytest.approx(2 * 600 / 3600))
    assert current_run([True], 600) == (True, 0.0)
    assert current_run([], 600) == (False, 0.0)


def test_safety_net_comes_first() -> None:
    m = availability_model(BLIPPY, 600)
    assert must_run_on_demand(10.5, 10, 0.2, 1 / 6)
    c = choice(m, hours_left=10.5, work=10)
    assert c.if_available is Market.on_demand and c.if_unavailable is Market.on_demand
    kept = choice(m, hours_left=10.1, work=10, up=True, running=Market.spot)
    assert kept.if_available is Market.spot  # a running spot instance is kept even then


def test_blips_are_waited_out_when_slack_allows() -> None:
    m = availability_model(BLIPPY, 600)
    c = choice(m, hours_left=30, work=20, up=False, age=0.0)
    assert c.if_available is Market.spot and c.if_unavailable is None
    assert c.numbers["spot_down_hours"] < 0.5 < c.numbers["spot_up_hours"]


def test_on_demand_moves_back_to_spot_only_with_slack() -> None:
    m = availability_model(BLIPPY, 600)
    roomy = choice(m, hours_left=30, work=20, up=True, age=2.0, running=Market.on_demand)
    assert roomy.if_available is Market.spot
    tight = choice(m, hours_left=20.5, work=20, up=True, age=2.0, running=Market.on_demand)
    assert tight.if_available is Market.on_demand


def test_decide_waits_for_spot_or_falls_back() -> None:
    job = DeadlineJob(20, 30, 0.2, 0.9, 3.06).seconds()
    spec, options = _sim_spec(job), _options(job)
    market = SpotMarket(availability_model(BLIPPY, 600), False, 0.0)
    d = decide(spec, options, now=NOW, deadline=NOW + timedelta(hours=30), max_queue_wait_hours=4,
               spot_market=market, restart_minutes=12, decision_interval_hours=1 / 6)
    assert d.route == "cloud" and d.allow_spot and not d.on_demand_fallback
    assert [o.market for o in candidates(options, d)] == [Market.spot]  # spot or wait
    late = decide(spec, options, now=NOW + timedelta(hours=9.7), deadline=NOW + timedelta(hours=30),
                  max_queue_wait_hours=4, done_hours=0.0, spot_market=market, restart_minutes=12,
                  decision_interval_hours=1 / 6)
    assert [o.market for o in candidates(options, late)] == [Market.on_demand]
    # progress counts: the same moment with half the job done leaves slack again
    done = decide(spec, options, now=NOW + timedelta(hours=9.7), deadline=NOW + timedelta(hours=30),
                  max_queue_wait_hours=4, done_hours=10.0, spot_market=market, restart_minutes=12,
                  decision_interval_hours=1 / 6)
    assert Market.spot in [o.market for o in candidates(options, done)]
    # without a market history: the slack rule, as before (spot first, on-demand behind it)
    plain = decide(spec, options, now=NOW, deadline=NOW + timedelta(hours=30), max_queue_wait_hours=4)
    assert plain.on_demand_fallback and [o.market for o in candidates(options, plain)] == [Market.spot,
                                                                                           Market.on_demand]


def test_rebalance_is_the_running_on_demand_decision() -> None:
    job = DeadlineJob(20, 30, 0.2, 0.9, 3.06).seconds()
    spec, options = _sim_spec(job), _options(job)
    market = SpotMarket(availability_model(BLIPPY, 600), True, 3.0)
    move = rebalance(spec, options, now=NOW + timedelta(hours=2), deadline=NOW + timedelta(hours=30),
                     done_hours=2.0, spot_market=market, restart_minutes=12, decision_interval_hours=1 / 6)
    assert move.allow_spot and [o.market for o in candidates(options, move)] == [Market.spot]
    stay = rebalance(spec, options, now=NOW + timedelta(hours=2), deadline=NOW + timedelta(hours=30),
                     done_hours=2.0, spot_market=None)
    assert not stay.allow_spot and candidates(options, stay) == []


def test_the_simulator_sees_the_market_as_the_live_helper_builds_it() -> None:
    """Lockstep's per-tick market state equals spot_market() over the same series (the live hook's helper)."""
    rng = np.random.default_rng(5)
    history = rng.random(500) < 0.7
    trace = rng.random(200) < 0.6
    job = DeadlineJob(20, 30, 0.2, 0.9, 3.06).seconds()
    policy = Lockstep(history, 600)
    policy.start(job, 600)
    for i, available in enumerate(trace):
        got = policy.market.see(bool(available))
        want = spot_market(np.concatenate([history, trace[: i + 1]]), 600, submitted_tick=len(history))
        assert got.model == want.model and got.up == want.up
        assert got.age_hours == pytest.approx(want.age_hours)


def test_model_span_is_the_week_before_submission() -> None:
    assert model_span(6 * 24 * 10 + 50, 600) == (6 * 24 * 3 + 50, 6 * 24 * 10 + 50)
    assert model_span(100, 600) == (0, 100)
    assert model_span(0, 600) == (0, 0)  # no history: the prior alone


def test_progress_hours_is_what_the_simulator_counts() -> None:
    """The live helper for done_hours, over allocations shaped like the simulator's attempts, gives its progress."""
    job = DeadlineJob(10, 16, 0.2, 0.9, 3.06)
    avail = [(i // 9) % 3 != 2 for i in range(200)]  # spot for 1.5 h of every 2.25 h
    policy = make_policy("greedy", [], 600)
    r = simulate(job, avail, 600, policy)
    for cut in range(1, len(r.segments) + 1):
        allocs = []
        for i, seg in enumerate(r.segments[:cut]):
            ended = i < cut - 1 or cut == len(r.segments)
            state = (AllocationState.preempted if seg.mode is Mode.spot and ended and cut != len(r.segments)
                     else AllocationState.released if ended else AllocationState.running)
            allocs.append(Allocation(id=f"a{i}", job_id="j", provider="sim", state=state,
                                     created_at=NOW + timedelta(seconds=seg.start),
                                     updated_at=NOW + timedelta(seconds=seg.end),
                                     attrs={"running_since": (NOW + timedelta(seconds=seg.start)).isoformat()}))
        now = NOW + timedelta(seconds=r.segments[cut - 1].end)
        want = sum(s.work for s in r.segments[:cut]) / 3600
        got = progress_hours(allocs, now, restart_minutes=12, checkpoint_minutes=CHECKPOINT_MINUTES)
        assert got == pytest.approx(want, abs=1e-6)


def test_outage_quantile_follows_the_history() -> None:
    from policies.spot import outage_quantile_hours

    short = availability_model(([True] * 10 + [False]) * 90, 600)  # one-tick blips
    long = availability_model(([True] * 10 + [False] * 30) * 25, 600)  # five-hour outages
    assert outage_quantile_hours(short, 0.0) <= 2 * short.step_hours
    assert outage_quantile_hours(long, 0.0) >= 4.0
    # an outage that has lasted is expected to last longer in the blippy market (past its blips)
    assert outage_quantile_hours(short, 2.0) > outage_quantile_hours(short, 0.0)
    assert outage_quantile_hours(long, 0.0, 0.5) < outage_quantile_hours(long, 0.0, 0.95)


def test_no_on_demand_while_the_slack_outlasts_the_outage() -> None:
    """A job that lost spot waits for it while its slack covers a changeover and the market's outage quantile;
    with less slack the plan may take on-demand (issue 30: no regret in calm markets)."""
    from policies.spot import outage_quantile_hours

    scarce = availability_model(([True] * 6 + [False] * 6) * 80, 600)  # up an hour, down an hour
    q = outage_quantile_hours(scarce, 0.0)
    roomy = choice(scarce, hours_left=40 + 0.2 + q + 0.5, work=40, up=False)
    assert roomy.if_unavailable is None and "outages" in roomy.reason
    assert roomy.numbers["outage_quantile_hours"] == pytest.approx(q, abs=1e-3)
    tight = choice(scarce, hours_left=40 + 0.2 + q - 0.3, work=40, up=False)
    assert tight.if_unavailable is Market.on_demand  # the plan's own choice, once waiting is no longer free
