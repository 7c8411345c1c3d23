"""The one-zone and the multi-zone engines count a tick alike: both run ``Tally`` (issue 30: no second copy of the
step accounting to drift)."""

from __future__ import annotations

import random

import numpy as np

from broker.simulate.deadline import DeadlineJob, Fixed, Lockstep, Mode, Tally, simulate
from broker.simulate.zones import FixedZones, LockstepZones, Migration, OneZone, simulate_zones


def test_one_zone_schedules_cost_the_same_in_both_engines() -> None:
    """Random schedules over random traces: every field of the result, segments included, is the same whether the
    single-zone engine or the multi-zone engine (one zone, a migration that is never paid) runs it."""
    rng = random.Random(3030)
    for _ in range(200):
        ticks = rng.randint(3, 12)
        avail = [rng.random() < 0.6 for _ in range(ticks)]
        js = DeadlineJob(rng.choice([600, 1500, 3000]) / 3600, 2.5, rng.choice([0, 60, 420, 900]) / 3600,
                         0.9, 3.06).seconds()
        plan = [Mode.spot if a and rng.random() < 0.7 else rng.choice([Mode.idle, Mode.on_demand]) for a in avail]
        one = simulate(js, avail, 600, Fixed(plan))
        many = simulate_zones(js, np.array([avail]), 600, FixedZones([(m, 0) for m in plan]), Migration(600, 5.0))
        assert many.moves == 0
        assert (one.cost, one.spot_hours, one.ondemand_hours, one.finish_hour, one.met_deadline, one.preemptions,
                one.changeovers, one.segments) == (many.cost, many.spot_hours, many.ondemand_hours,
                                                   many.finish_hour, many.met_deadline, many.preemptions,
                                                   many.changeovers, many.segments)


def test_the_broker_policy_is_the_same_run_through_either_engine() -> None:
    """Single-zone lockstep wrapped as a zone policy, and the zone policy on one zone, reproduce the single-zone
    run exactly (the market each follows is the same ``FollowedMarket``)."""
    gap = 600
    rng = np.random.default_rng(30)
    history = rng.random(1008) < 0.7
    window = rng.random(200) < 0.6
    job = DeadlineJob(20, 30, 0.2, 0.918, 3.06)
    single = simulate(job, window, gap, Lockstep(history, gap))
    wrapped = simulate_zones(job, np.array([window]), gap, OneZone(Lockstep(history, gap)))
    zones = simulate_zones(job, np.array([window]), gap, LockstepZones(np.array([history]), gap))
    assert single.met_deadline
    for other in (wrapped, zones):
        assert (other.cost, other.segments, other.preemptions) == (single.cost, single.segments, single.preemptions)


def test_a_move_adds_its_time_and_egress_only_when_the_zone_changes() -> None:
    js = DeadlineJob(1.0, 3.0, 0.1, 1.0, 3.0).seconds()
    run = Tally(js)
    run.advance(0, 600, Mode.on_demand, 0, move_seconds=720, move_usd=2.5)
    assert (run.moves, run.overhead, run.cost) == (0, 0, 3.0 * 600 / 3600)  # 360 s of changeover, all spent
    run.advance(1, 600, Mode.spot, 1, move_seconds=720, move_usd=2.5)
    assert (run.moves, run.zone, run.changeovers) == (1, 1, 2)
    assert run.overhead == 360 + 720 - 600 and run.cost == 3.0 * 600 / 3600 + 2.5 + 1.0 * 600 / 3600
    assert run.see(False) and run.mode is Mode.idle and run.overhead == 0 and run.preemptions == 1
