"""Deadline jobs across zones and regions (issue 30): the engine, the exact optimum against brute force, the
broker's policy moving where spot is, the union market the live broker builds, and the CLI."""

from __future__ import annotations

import itertools
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from broker.errors import SpecError
from broker.simulate.deadline import DeadlineJob, Lockstep, Mode, optimal, simulate
from broker.simulate.traces import SpotTrace
from broker.simulate.zones import (
    FixedZones,
    LockstepZones,
    Migration,
    aligned,
    optimal_zones,
    run_deadline_zones,
    simulate_zones,
)
from policies.spot import SpotMarket, availability_model, expected_up_hours, spot_zone_costs
from tests.simulate.helpers import write_trace
from tests.simulate.test_cli import deadline_args, lockstep


def test_optimal_zones_equals_brute_force_on_small_traces() -> None:
    """Every schedule of (mode, zone) per tick through the engine itself; the cheapest that meets the deadline is
    the optimum's cost (and with one zone, the single-zone optimum's)."""
    rng = random.Random(30)
    checked = 0
    while checked < 12:
        zones, ticks = rng.choice([1, 2]), rng.choice([4, 5])
        avail = np.array([[rng.random() < 0.6 for _ in range(ticks)] for _ in range(zones)])
        work = rng.choice([600, 900, 1200])
        deadline = work + rng.choice([300, 600, 1200, 1800])
        js = DeadlineJob(work / 3600, deadline / 3600, rng.choice([0, 60, 300, 600]) / 3600, 0.9, 3.06).seconds()
        mig = Migration(rng.choice([0, 120, 700]), rng.choice([0.0, 0.1, 1.0]))
        if js.deadline < js.work + js.changeover:
            continue
        choices = [(Mode.idle, 0)] + [(m, z) for m in (Mode.spot, Mode.on_demand) for z in range(zones)]
        best = math.inf
        for plan in itertools.product(choices, repeat=min(-(-deadline // 600) + 1, 5)):
            if any(m is Mode.spot and (t >= ticks or not avail[z, t]) for t, (m, z) in enumerate(plan)):
                continue
            r = simulate_zones(js, avail, 600, FixedZones(list(plan)), mig)
            if r.met_deadline:
                best = min(best, r.cost)
        got = optimal_zones(js, avail, 600, mig).cost
        assert (math.isinf(best) and math.isinf(got)) or got == pytest.approx(best, abs=1e-9), (avail, js, mig)
        if zones == 1 and math.isfinite(got):
            assert got == pytest.approx(optimal(js, avail[0], 600, split=False).cost, abs=1e-9)
        checked += 1


def test_a_move_pays_migration_time_and_egress() -> None:
    js = DeadlineJob(1.0, 3.0, 0.1, 1.0, 3.0).seconds()
    avail = np.array([[False] * 30, [True] * 30])
    r = simulate_zones(js, avail, 600, FixedZones([(Mode.spot, 1)] * 30), Migration(seconds=720, usd=2.5))
    assert r.moves == 1 and r.met_deadline
    # the instance is paid through changeover (0.1 h) + migration (0.2 h) + the hour of work, at the spot price
    assert r.cost == pytest.approx(1.3 * 1.0 + 2.5)
    assert Migration.of(50, 0.02, 2.0) == Migration(seconds=200, usd=1.0)
    with pytest.raises(SpecError, match="--transfer-gbps"):
        Migration.of(50, 0.02, 0)


def test_lockstep_moves_to_the_zone_with_spot_and_never_misses() -> None:
    """Home loses spot for a long outage while the other zone has it: the broker's policy moves (once) instead of
    paying on-demand, costs less than the single-zone lockstep, and no more than the optimum allows."""
    gap = 600
    rng = np.random.default_rng(3)
    history = np.array([rng.random(1008) < 0.9, rng.random(1008) < 0.9])  # a week of both, mostly up
    home = np.r_[np.ones(6, bool), np.zeros(60, bool), np.ones(200, bool)]
    other = np.ones(266, bool)
    window = np.array([home, other])
    job = DeadlineJob(20, 26, 0.2, 0.918, 3.06)
    multi = simulate_zones(job, window, gap, LockstepZones(history, gap), Migration(200, 1.0))
    single = simulate(job, home, gap, Lockstep(history[0], gap))
    best = optimal_zones(job, window, gap, Migration(200, 1.0))
    assert multi.met_deadline and single.met_deadline
    assert multi.moves >= 1 and multi.cost < single.cost
    assert best.cost <= multi.cost + 1e-9


def test_lockstep_leaves_a_wait_that_would_run_the_slack_out_and_never_chases_flapping_spot() -> None:
    """A scarce home (ten-hour outages, brief returns) loses spot: single-zone lockstep waits until the slack is
    gone, then pays on-demand. Across zones, once the outage is expected to outlast the slack, the job moves to
    lasting spot elsewhere (once, long before on-demand); a flapping zone instead is never worth a move, and the
    job does what it does in one zone."""
    gap = 600
    scarce = np.array(([False] * 60 + [True] * 2) * 17)[:1008]
    home = np.r_[np.ones(3, bool), np.zeros(300, bool)]
    job = DeadlineJob(20, 30, 0.2, 0.918, 3.06)
    single = simulate(job, home, gap, Lockstep(scarce, gap))
    calm = simulate_zones(job, np.array([home, np.ones(303, bool)]), gap,
                          LockstepZones(np.array([scarce, np.ones(1008, bool)]), gap), Migration(200, 1.0))
    assert calm.met_deadline and calm.moves == 1
    moved_at = next(seg.start for z, seg in calm.zone_segments if z == 1)
    first_od = next(seg.start for seg in single.segments if seg.mode is Mode.on_demand)
    assert moved_at < first_od / 4 and calm.cost < single.cost / 2
    flap = [i % 3 != 0 for i in range(1008)]
    flapping = simulate_zones(job, np.array([home, flap[:303]]), gap, LockstepZones(np.array([scarce, flap]), gap),
                              Migration(200, 1.0))
    assert flapping.met_deadline and flapping.moves == 0 and flapping.cost == pytest.approx(single.cost)


def test_spot_zone_costs_prefer_home_unless_a_move_pays() -> None:
    calm = availability_model([True] * 1000 + [False] + [True] * 1000, 600)
    flaky = availability_model([i % 3 != 0 for i in range(2000)], 600)
    assert expected_up_hours(calm, 0.0) > 10 * expected_up_hours(flaky, 0.0)
    both = [SpotMarket(calm, True, 5.0), SpotMarket(calm, True, 5.0)]
    costs = spot_zone_costs(both, here=0, changeover_hours=0.2, migration_hours=0.1, migration_usd=1.0,
                            spot_usd_per_hour=0.9)
    assert costs[0] < costs[1]  # the same market: staying saves the move
    moved = spot_zone_costs([SpotMarket(flaky, True, 0.0), SpotMarket(calm, True, 5.0)], here=0,
                            changeover_hours=0.2, migration_hours=0.1, migration_usd=1.0, spot_usd_per_hour=0.9)
    assert moved[1] < moved[0]  # spot that lasts pays for the move
    gone = spot_zone_costs([SpotMarket(calm, False, 1.0), SpotMarket(calm, True, 0.0)], here=0,
                           changeover_hours=0.2, migration_hours=0.1, migration_usd=1.0, spot_usd_per_hour=0.9)
    assert set(gone) == {1}


def test_traces_must_share_their_tick() -> None:
    with pytest.raises(SpecError, match="--trace"):
        aligned([SpotTrace("a", 600, np.ones(5, bool)), SpotTrace("b", 300, np.ones(5, bool))])
    avail, gap = aligned([SpotTrace("a", 600, np.ones(5, bool)), SpotTrace("b", 600, np.ones(3, bool))])
    assert avail.shape == (2, 3) and gap == 600


def test_cli_takes_several_traces(tmp_path: Path) -> None:
    home = write_trace(tmp_path / "a.json", [1] * 24 + [1] * 3 + [0] * 40 + [1] * 200)
    other = write_trace(tmp_path / "b.json", [1] * 300)
    costs = {}
    for policy in ("greedy", "lockstep", "optimal"):
        r = lockstep(*deadline_args(home, policy, **{"--start-hour": "4"}), "--trace", str(other),
                     "--data-gb", "20", "--json", tmp_path=tmp_path)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert out["met_deadline"] is True and "moves" in out
        costs[policy] = out["cost"]
    assert costs["optimal"] <= costs["lockstep"] <= costs["greedy"]
    bad = lockstep(*deadline_args(home, "lockstep"), "--trace", str(other), "--transfer-gbps", "0",
                   tmp_path=tmp_path)
    assert bad.returncode == 2 and "--transfer-gbps" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    mismatched = write_trace(tmp_path / "c.json", [1] * 300, gap=300)
    bad = lockstep(*deadline_args(home, "lockstep"), "--trace", str(mismatched), tmp_path=tmp_path)
    assert bad.returncode == 2 and "--trace" in bad.stderr


def test_run_deadline_zones_checks_its_input() -> None:
    t = [SpotTrace("a", 600, np.ones(60, bool)), SpotTrace("b", 600, np.ones(60, bool))]
    with pytest.raises(SpecError, match="--policy"):
        run_deadline_zones(t, DeadlineJob(4, 6, 0.2, 0.9, 3.06), "ondemand", Migration())
    with pytest.raises(SpecError, match="--deadline-hours"):
        run_deadline_zones(t, DeadlineJob(4, 6, 0.2, 0.9, 3.06), "lockstep", Migration(), start_hour=5)
