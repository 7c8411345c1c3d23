"""The simulated ``lockstep`` policy is the live broker's: the same functions, the same decision points, the same
inputs (issue 16). The live side reads its inputs from a real store (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

import broker.loops
import broker.router
import broker.simulate.cluster
import broker.simulate.deadline
import policies.placement
from broker.config import BrokerConfig, Settings
from broker.market import Marketplace
from broker.models import Allocation, AllocationState, Job, JobEvent, JobState, Market
from broker.router import Router
from broker.simulate.deadline import EPOCH, DeadlineJob, Lockstep, Mode, _options, _sim_spec, simulate
from broker.spot_markets import GAP_SECONDS
from broker.store import Store
from policies.spot import Observation, availability_series

GAP = int(GAP_SECONDS)


def test_simulator_and_broker_call_the_same_functions() -> None:
    """By identity: the simulator's lockstep, the router and the rebalance loop step share each function."""
    sim, cluster = broker.simulate.deadline, broker.simulate.cluster
    assert sim.decide is cluster.decide is broker.router.decide is policies.placement.decide
    assert sim.candidates is cluster.candidates is broker.router.candidates is policies.placement.candidates
    assert sim.rebalance is cluster.rebalance is broker.loops.rebalance is policies.placement.rebalance
    assert broker.router.progress_hours is policies.placement.progress_hours


def test_availability_series_from_observations() -> None:
    t0 = EPOCH
    obs = [Observation(t0 + timedelta(seconds=2 * GAP), t0 + timedelta(seconds=4 * GAP + 10), True),
           Observation(t0 + timedelta(seconds=6 * GAP + 5), t0 + timedelta(seconds=6 * GAP + 5), False),
           Observation(t0 + timedelta(seconds=9 * GAP), t0 + timedelta(seconds=9 * GAP), True),
           Observation(t0 + timedelta(seconds=40 * GAP), t0 + timedelta(seconds=41 * GAP), False)]  # future
    series, first = availability_series(obs, until=t0 + timedelta(seconds=10 * GAP), since=t0, gap_seconds=GAP)
    assert first == t0 + timedelta(seconds=2 * GAP)  # nothing known before the first observation
    #                  2     3     4     5 (as 4) 6 down 7, 8 (as 6)  9     10 (as 9)
    assert series.tolist() == [True, True, True, True, False, False, False, True, True]
    empty, none = availability_series([], until=t0, since=t0 - timedelta(hours=1), gap_seconds=GAP)
    assert len(empty) == 0 and none is None


def _record(store: Store, job: Job, segments: list, upto: int, tick: int) -> None:
    """The allocations the live broker would hold for the simulated job's attempts before ``tick``."""
    for i, seg in enumerate(segments[:upto]):
        last = i == upto - 1 and seg.end > tick * GAP
        market = Market.spot if seg.mode is Mode.spot else Market.on_demand
        state = AllocationState.running if last else (
            AllocationState.preempted if market is Market.spot else AllocationState.released)
        at, ended = EPOCH + timedelta(seconds=seg.start), EPOCH + timedelta(seconds=seg.end)
        store.add_allocation(Allocation(  # as the broker would have recorded it (updated when it ended)
            id=f"{job.id}-{i}", job_id=job.id, attempt=i + 1, provider="sim", offer_id=f"sim:{market.value}",
            state=state, zone="sim", region="sim", created_at=at, updated_at=at if last else ended,
            attrs={"sku": "sim", "market": market.value, "running_since": at.isoformat()}))


def test_the_live_router_decides_as_the_simulator(store: Store) -> None:
    """Drive the simulator's lockstep over a trace; at its decision ticks, give the live router the same job,
    history and attempts through the store, and compare its inputs and its decisions."""
    rng = np.random.default_rng(0)
    runs, up = [], True
    while sum(runs) < 2400:  # runs of spot up and down, on the live series' intervals (0.1 h)
        runs.append(int(rng.integers(10, 60)) if up else int(rng.integers(5, 60)))
        up = not up
    trace = np.concatenate([np.full(n, i % 2 == 0) for i, n in enumerate(runs)])[:2400]
    trace = trace if trace[0] else trace[runs[1]:]  # begins with spot up (the history's first observation)
    first = 1680  # the job's submission: a week of history before it
    job_spec = DeadlineJob(job_hours=12, deadline_hours=22, changeover_hours=0.2, spot_price=0.9, ondemand_price=3.06)
    policy = Lockstep(trace[:first], GAP, record=True)
    result = simulate(job_spec, trace[first:], GAP, policy)
    assert result.met_deadline and policy.calls is not None
    moves = [c for c in policy.calls if c[1] == "rebalance" and c[3].allow_spot]
    stays = [c for c in policy.calls if c[1] == "rebalance" and not c[3].allow_spot]
    decides = [c for c in policy.calls if c[1] == "decide"]
    assert moves and stays and decides  # this trace exercises every decision point, and a move back to spot
    after_move = [c for c in decides if c[0] in {m[0] for m in moves}]
    preempted_at = [seg.end for seg in result.segments[:-1] if seg.mode is Mode.spot]
    after_preemption = [next(c for c in decides if c[0] * GAP >= end) for end in preempted_at]
    assert after_preemption  # the trace preempts the job, and the next placement decides again
    picks = moves + stays[:2] + after_move + after_preemption + decides[:3] + decides[-2:]

    # The market as the broker saw it: spot instances of another job that ran through each run of the
    # trace and were preempted at its end (the broker's own observations of that market).
    t_first = EPOCH - timedelta(seconds=first * GAP)
    store.create_job(Job(id="history", spec=_sim_spec(job_spec.seconds()), created_at=t_first, updated_at=t_first))
    edges = np.flatnonzero(np.diff(np.r_[0, trace.astype(int), 0]))
    for n, (a, b) in enumerate(zip(edges[::2], edges[1::2], strict=True)):
        start, end = t_first + timedelta(seconds=int(a) * GAP), t_first + timedelta(seconds=int(b) * GAP)
        store.add_allocation(Allocation(
            id=f"history-{n}", job_id="history", attempt=n + 1, provider="sim", offer_id="sim:spot",
            state=AllocationState.preempted, zone="sim", region="sim", created_at=start, updated_at=end,
            attrs={"sku": "sim", "market": "spot", "running_since": start.isoformat()}))
    js = job_spec.seconds()
    spec, options = _sim_spec(js), _options(js)
    restart = js.changeover / 60.0
    router = Router(Settings(broker=BrokerConfig(restart_minutes=restart)), store, Marketplace({}))
    for n, (tick, kind, sim_situation, sim_decision) in enumerate(picks):
        now = EPOCH + timedelta(seconds=tick * GAP)
        job, _ = store.create_job(Job(id=f"j{n}", spec=spec, created_at=EPOCH, updated_at=EPOCH,
                                      deadline=EPOCH + timedelta(seconds=js.deadline),
                                      state=JobState.running if kind == "rebalance" else JobState.pending))
        upto = sum(1 for s in result.segments if s.start < tick * GAP)
        _record(store, job, result.segments, upto, tick)
        live = router.situation(job, options, now)
        assert live["now"] == sim_situation["now"] and live["deadline"] == sim_situation["deadline"]
        assert live["done_hours"] == pytest.approx(sim_situation["done_hours"], abs=1e-6)
        assert live["restart_minutes"] == pytest.approx(sim_situation["restart_minutes"])
        lm, sm = live["spot_market"], sim_situation["spot_market"]
        assert lm is not None and sm is not None
        assert lm.model == sm.model and lm.up == sm.up and lm.age_hours == pytest.approx(sm.age_hours)
        # the decision interval is the broker's own (a minute), the simulator's is its tick
        live = {**live, "decision_interval_hours": sim_situation["decision_interval_hours"]}
        if kind == "decide":
            got = router.decide(job, options, live, None)
        else:
            got = broker.loops.rebalance(job.spec, options, **live)
        assert (got.route, got.allow_spot, got.on_demand_fallback, got.reason) == (
            sim_decision.route, sim_decision.allow_spot, sim_decision.on_demand_fallback, sim_decision.reason), (
            kind, tick, got, sim_decision, live, sim_situation)


def test_waiting_for_spot_is_not_a_failed_round() -> None:
    from broker.lifecycle import PlacementWait

    job = Job(id="w", spec=_sim_spec(DeadlineJob(2, 5, 0.2, 0.9, 3.06).seconds()), created_at=EPOCH,
              updated_at=EPOCH)
    tries = [{"offer_id": "sim:spot", "provider": "sim", "error": "no spot", "kind": "capacity"}]
    events = [JobEvent(job_id="w", at=EPOCH + timedelta(seconds=i), from_state=JobState.placing,
                       to_state=JobState.pending, reason="spot refused",
                       data={"tries": tries, **({"waits_for_spot": True} if i < 3 else {})}) for i in range(5)]
    wait = PlacementWait.of(job, events)
    assert wait.rounds == 2 and wait.reasons == ("no spot",)


def test_across_zones_the_simulator_and_broker_share_the_functions() -> None:
    """The multi-zone simulator's lockstep runs the same placement functions as one zone and the router."""
    import broker.simulate.zones as zones

    assert zones.decide is broker.router.decide is policies.placement.decide
    assert zones.candidates is policies.placement.candidates and zones.rebalance is broker.loops.rebalance

