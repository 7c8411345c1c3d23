"""The deadline-job simulator: the exact optimum against brute force, and honest reports from every policy."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from broker.errors import SpecError
from broker.simulate.deadline import (
    DeadlineJob,
    Fixed,
    Greedy,
    JobSeconds,
    Mode,
    Step,
    UniformProgress,
    make_policy,
    optimal,
    run_deadline,
    simulate,
)
from broker.simulate.traces import SpotTrace, load_spot_trace, spot_trace_files, spot_trace_from
from tests.simulate.helpers import replay_check

ONLINE = ("ondemand", "greedy", "uniform-progress", "lockstep")


def brute_force(js: JobSeconds, avail: list[bool], gap: int) -> float:
    """The cheapest schedule meeting the deadline, over every mode sequence the engine accepts."""
    ticks = -(-js.deadline // gap)
    best = math.inf
    for plan in itertools.product((Mode.idle, Mode.spot, Mode.on_demand), repeat=ticks):
        if any(m is Mode.spot and not (i < len(avail) and avail[i]) for i, m in enumerate(plan)):
            continue
        r = simulate(js, avail, gap, Fixed(plan))
        if r.met_deadline:
            best = min(best, r.cost)
    return best


def random_case(rng: random.Random, max_ticks: int = 7) -> tuple[JobSeconds, list[bool], int]:
    gap = rng.choice([10, 30, 60])
    n = rng.randint(3, max_ticks)
    avail = [rng.random() < 0.6 for _ in range(n)]
    d = rng.choice([0, gap // 2, gap, gap + gap // 3, 2 * gap])
    work = rng.randint(1, max(1, n * gap - d))
    deadline = rng.randint(work + d, n * gap)
    return JobSeconds(work, deadline, d, rng.choice([0.3, 1.0]), 3.0), avail, gap


def test_optimal_equals_brute_force_on_small_traces() -> None:
    rng = random.Random(16)
    checked = 0
    for _ in range(120):
        js, avail, gap = random_case(rng)
        want = brute_force(js, avail, gap)
        got = optimal(js, avail, gap)
        assert got.cost == pytest.approx(want, abs=1e-12), (js, avail, gap)
        assert optimal(js, avail, gap, split=False).cost == pytest.approx(want, abs=1e-12)
        if math.isfinite(want):
            checked += 1
            assert got.met_deadline and got.finish_hour is not None and got.finish_hour * 3600 <= js.deadline
            # the split adds up: cost = spot price × spot hours + on-demand price × on-demand hours
            assert js.spot_price * got.spot_hours + js.ondemand_price * got.ondemand_hours == pytest.approx(got.cost)
    assert checked > 100


def test_optimal_is_a_lower_bound_on_longer_traces() -> None:
    rng = random.Random(7)
    for _ in range(25):
        gap = rng.choice([60, 600])
        n = rng.randint(20, 80)
        avail = list(np.repeat(rng.choices([True, False], k=n // 4 + 1), 4)[:n])
        d = rng.choice([0, gap // 3, 2 * gap])
        work = rng.randint(n * gap // 3, n * gap // 2)
        job = JobSeconds(work, rng.randint(work + 2 * d + gap, n * gap), d, 0.9, 3.06)
        best = optimal(job, avail, gap)
        for name in ONLINE:
            r = simulate(job, avail, gap, make_policy(name, [], gap))
            assert r.met_deadline
            assert best.cost <= r.cost + 1e-9, name


def adversarial() -> list[tuple[str, list[bool]]]:
    n = 120
    return [
        ("always", [True] * n),
        ("never", [False] * n),
        ("flapping", [i % 2 == 0 for i in range(n)]),
        ("lost before the end", [i < 55 for i in range(n)]),
        ("back at the end", [i > 50 for i in range(n)]),
        ("short blips", [i % 7 != 3 for i in range(n)]),
        ("long outages", [(i // 12) % 2 == 0 for i in range(n)]),
    ]


@pytest.mark.parametrize("name", ONLINE)
def test_no_policy_reports_a_met_deadline_it_missed(name: str) -> None:
    """Every report is checked against a replay of the schedule itself; tight deadlines included."""
    gap = 600
    rng = random.Random(hash(name) % 1000)
    traces = adversarial() + [(f"random {i}", [rng.random() < 0.5 for _ in range(120)]) for i in range(6)]
    for label, avail in traces:
        for work_h, deadline_h, d_h in ((10, 10.2, 0.2), (10, 10.55, 0.2), (10, 12, 0.2), (10, 16, 0.25),
                                        (8, 19, 0.0), (12, 18, 1.0)):
            job = DeadlineJob(work_h, deadline_h, d_h, 0.9, 3.06)
            js = job.seconds()
            history = [rng.random() < 0.7 for _ in range(144)]
            r = simulate(job, avail, gap, make_policy(name, history, gap))
            done, finish = replay_check(r.segments, js, avail, gap)
            assert r.finish_hour is not None, (label, job)
            assert done >= js.work and finish == round(r.finish_hour * 3600), (label, job)
            assert r.met_deadline == (finish <= js.deadline), (label, job)
            paid = {m: sum(s.end - s.start for s in r.segments if s.mode is m) for m in (Mode.spot, Mode.on_demand)}
            assert r.spot_hours * 3600 == pytest.approx(paid[Mode.spot])
            assert r.ondemand_hours * 3600 == pytest.approx(paid[Mode.on_demand])
            assert r.cost == pytest.approx((paid[Mode.spot] * 0.9 + paid[Mode.on_demand] * 3.06) / 3600)
            # these policies keep a safety net: they never miss
            assert r.met_deadline, (name, label, job)


class Reckless:
    """Spot when it can be had, else idle, whatever the deadline: it misses, and must be reported missing."""

    name = "reckless"

    def start(self, job: JobSeconds, gap: int) -> None:
        pass

    def act(self, step: Step) -> Mode:
        return Mode.spot if step.available else Mode.idle


def test_a_miss_is_reported_as_a_miss() -> None:
    avail = [i % 6 != 0 for i in range(200)]
    job = DeadlineJob(10, 11, 0.2, 0.9, 3.06)
    r = simulate(job, avail, 600, Reckless())
    done, finish = replay_check(r.segments, job.seconds(), avail, 600)
    assert done >= job.seconds().work and finish is not None and finish > job.seconds().deadline
    assert not r.met_deadline and r.finish_hour == pytest.approx(finish / 3600)
    # a policy that never runs never finishes, and says so
    idle = simulate(job, [False] * 10, 600, Reckless())
    assert idle.finish_hour is None and not idle.met_deadline


def test_greedy_waits_for_spot_until_the_slack_is_gone_then_stays_on_demand() -> None:
    job = DeadlineJob(10, 14, 0.2, 0.9, 3.06)
    avail = [False] * 30 + [True] * 200  # spot back after 5 h: the 4 h of slack are gone by then
    r = simulate(job, avail, 600, Greedy())
    first = r.segments[0]
    assert first.mode is Mode.on_demand and len(r.segments) == 1  # on-demand once, to the end
    assert (14 - 10 - 0.2) * 3600 - 600 <= first.start <= (14 - 10 - 0.2) * 3600
    quick = simulate(job, [False] * 10 + [True] * 200, 600, Greedy())
    assert quick.ondemand_hours == 0 and quick.met_deadline  # spot came back while the slack lasted


def test_uniform_progress_follows_the_line() -> None:
    job = DeadlineJob(10, 20, 0.2, 0.9, 3.06)
    always = simulate(job, [True] * 200, 600, UniformProgress())
    assert always.ondemand_hours == 0 and always.changeovers == 1
    never = simulate(job, [False] * 200, 600, UniformProgress())
    # behind the line after one idle tick: on-demand from the second tick on
    assert never.segments[0].mode is Mode.on_demand and never.segments[0].start == 600
    # hysteresis: back to spot only when ahead of the line by two changeovers' worth
    back = simulate(job, [False] * 12 + [True] * 200, 600, UniformProgress())
    switch = next(s for s in back.segments if s.mode is Mode.spot)
    rate = 10 / 20
    od_done = sum(s.work for s in back.segments if s.end <= switch.start)
    assert od_done >= (switch.start / 3600 + 2 * 0.2) * rate * 3600 - 1


def test_lockstep_learns_the_market_from_its_history() -> None:
    """Short blips are waited out; where outages are long, it beats greedy by bridging them on on-demand."""
    gap = 600
    blippy = [i % 12 != 0 for i in range(24 * 6 * 7)]  # down one tick in twelve
    job = DeadlineJob(20, 30, 0.2, 0.9, 3.06)
    calm = simulate(job, blippy[:300], gap, make_policy("lockstep", blippy, gap))
    assert calm.ondemand_hours == 0 and calm.met_deadline
    rng = random.Random(3)

    def stormy(n: int) -> list[bool]:  # up about 2 h, down about 10 h, lengths drawn at random
        out: list[bool] = []
        while len(out) < n:
            out += [True] * rng.randint(6, 18) + [False] * rng.randint(30, 90)
        return out[rng.randint(0, 100):][:n]

    greedy = lockstep = 0.0
    for _ in range(8):
        history, trace = stormy(24 * 6 * 7), stormy(400)
        g = simulate(job, trace, gap, Greedy())
        ls = simulate(job, trace, gap, make_policy("lockstep", history, gap))
        assert g.met_deadline and ls.met_deadline
        greedy, lockstep = greedy + g.cost, lockstep + ls.cost
    assert lockstep < greedy


def test_lockstep_never_misses_and_beats_greedy_on_average(shared_data) -> None:
    """On real traces (a sample of submissions): no misses, and cheaper than greedy in total."""
    files = spot_trace_files(shared_data / "spot")
    assert len(files) >= 19
    totals = {"greedy": 0.0, "uniform-progress": 0.0, "lockstep": 0.0, "optimal": 0.0}
    for path in files[::3]:
        trace = load_spot_trace(path)
        scale = min(1.0, trace.hours / 96)
        job = DeadlineJob(48 * scale, 60 * scale, 0.2, 0.918, 3.06)
        start = min(24.0, trace.hours - job.deadline_hours) if trace.hours > 96 else 0.0
        for name in totals:
            r = run_deadline(trace, job, name, start)
            assert r.met_deadline, (path.name, name)
            totals[name] += r.cost
    assert totals["optimal"] <= totals["lockstep"] < totals["greedy"]


def test_trace_input_is_checked() -> None:
    with pytest.raises(SpecError, match="gap_seconds"):
        spot_trace_from({"metadata": {}, "data": [1]})
    with pytest.raises(SpecError, match="non-empty"):
        spot_trace_from({"metadata": {"gap_seconds": 600}, "data": []})
    trace = SpotTrace("t", 600, np.ones(100, dtype=bool))
    job = DeadlineJob(10, 12, 0.2, 0.9, 3.06)
    with pytest.raises(SpecError, match="--deadline-hours"):
        run_deadline(trace, job, "greedy", start_hour=10)
    with pytest.raises(SpecError, match="--policy"):
        run_deadline(trace, job, "cheapest", 0)
    with pytest.raises(SpecError, match="--deadline-hours"):
        run_deadline(trace, DeadlineJob(10, 10.1, 0.2, 0.9, 3.06), "greedy", 0)
    with pytest.raises(SpecError, match="--job-hours"):
        run_deadline(trace, DeadlineJob(-1, 10, 0.2, 0.9, 3.06), "greedy", 0)
