"""Spot or on-demand for a job with a deadline: a plan over what the market's history says. Pure, no clock.

A job that tolerates preemption can run on spot (cheap, lost when the market reclaims it),
on on-demand (dear, never lost) or wait. Every start costs a changeover (restart and lost
work) during which the instance is paid for and the job makes no progress. The deadline
leaves ``slack = hours left − work left`` to spend on waiting and changeovers.

The choice is made by planning: spot availability is modelled as a *semi-Markov* process whose
age-dependent hazards come from the recorded history of that market — how long spot tends to
stay once it is there, and how long it tends to stay away — and the expected cost to finish is
minimised by backward induction over (steps left, slack left, where the job runs, whether spot
is up and for how long). Real markets have heavy tails (many short blips, a few long outages),
which a memoryless model misses; the age buckets capture them: a market that came back a
minute ago is likelier to vanish again than one that has been up for hours, and an outage that
has lasted an hour is likelier to last another.

The plan's decisions are those the broker can act on:

- a job waiting to be placed (new, or requeued after a preemption): spot if it can be had,
  otherwise on-demand or wait (:func:`spot_choice` with ``running=None``);
- a job running on on-demand: move to spot if it can be had, or stay (``running=on_demand``);
- a job running on spot keeps it until the market takes it back.

A hard safety net comes first: when the slack no longer covers two changeovers and a decision
interval, only on-demand is allowed (a running spot instance is kept: its progress keeps pace
with the clock, and the slack left still covers the one changeover a preemption would cost).
So no plan, however wrong its model, can make a job miss its deadline.

References: Wu et al., *Can't Be Late: Optimizing Spot Instance Savings under Deadlines*
(NSDI'24) for the problem and the traces; the planner here replaces their uniform-progress
rule (see docs/simulation.md for the comparison).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, cast

import numpy as np

from broker.models import Market

IDLE, SPOT, ON_DEMAND = 0, 1, 2
UNREACHABLE = 1e9  # the value of a state that cannot finish in time (finite: it is multiplied by zero chances)
DEFAULT_STEP_HOURS = 0.1  # the plan's time step (a history with coarser ticks plans on its ticks)
MAX_PLAN_STEPS = 1500  # a longer job plans on coarser steps, so one plan is solved in well under a second
DEFAULT_BUCKETS = 8  # ages tracked per side; the last bucket holds every older age
# The prior, when history is short: spot that stays about 2 h and outages of about 1 h, worth
# two observed runs each. History dominates as soon as it holds a few runs.
PRIOR_UP_HOURS = 2.0
PRIOR_DOWN_HOURS = 1.0
PRIOR_RUNS = 4.0
# A job plans with the model of its market as it was at its submission, learnt from the week
# before: one model per job, so its plan is solved once (and shared by jobs submitted together).
MODEL_WINDOW_HOURS = 168.0


@dataclass(frozen=True)
class AvailabilityModel:
    """Age-dependent hazards of one spot market, per plan step.

    ``up_hazard[b]``: chance spot is lost within the next step when it has been up ``b`` steps
    (the last bucket: ``b`` or more); ``down_hazard[b]``: chance it comes back within the next step
    after ``b`` steps away.
    """

    step_hours: float
    up_hazard: tuple[float, ...]
    down_hazard: tuple[float, ...]
    runs_seen: int = 0  # availability runs the history held (0: the prior alone)

    @property
    def buckets(self) -> int:
        return len(self.up_hazard)

    def summary(self) -> dict[str, float]:
        """Mean up and down run lengths the hazards imply, in hours (for the decision's numbers)."""
        return dict(_summary(self))


@lru_cache(maxsize=256)
def _summary(model: AvailabilityModel) -> dict[str, float]:
    """:meth:`AvailabilityModel.summary`, once per model (every decision of a job shows it)."""
    def mean_run(h: tuple[float, ...]) -> float:
        alive, total = 1.0, 0.0
        for b, hb in enumerate(h):
            if b == len(h) - 1:
                total += alive / hb
                break
            total += alive
            alive *= 1 - hb
        return total * model.step_hours
    return {"spot_up_hours": round(mean_run(model.up_hazard), 3),
            "spot_down_hours": round(mean_run(model.down_hazard), 3)}


def plan_step_hours(deadline_hours: float) -> float:
    """The plan step for a job with this long to its deadline (from submission)."""
    return max(DEFAULT_STEP_HOURS, deadline_hours / MAX_PLAN_STEPS)


def plan_step(gap_seconds: float, step_hours: float = DEFAULT_STEP_HOURS) -> int:
    """Ticks of a history per plan step: the step is a whole number of ticks, at least one."""
    return max(1, round(step_hours * 3600.0 / gap_seconds))


def resample(series: Sequence[bool] | np.ndarray, ticks: int) -> np.ndarray:
    """Availability per plan step: a step counts as available only when all its ticks were.

    Steps are aligned on the end of the series, so the last step is the present.
    """
    arr = np.asarray(series, dtype=bool)
    usable = len(arr) // ticks * ticks
    if usable == 0:
        return np.zeros(0, dtype=bool)
    # all() over an axis of a 2-D array is an array (numpy's stubs also allow a scalar)
    return cast(np.ndarray, arr[len(arr) - usable:].reshape(-1, ticks).all(axis=1))


def availability_model(series: Sequence[bool] | np.ndarray, gap_seconds: float, *,
                       step_hours: float = DEFAULT_STEP_HOURS, buckets: int = DEFAULT_BUCKETS) -> AvailabilityModel:
    """Hazards from an availability history (one bool per tick of ``gap_seconds``; True = spot could be had).

    Every completed run of availability (and of unavailability) counts once at each age it
    lived through and once where it ended; the run still going at the end of the history counts
    only where it lived (it has not ended). A prior of ``PRIOR_RUNS`` geometric runs per side keeps
    a short history from swinging the model.
    """
    ticks = plan_step(gap_seconds, step_hours)
    step = ticks * gap_seconds / 3600.0
    steps = resample(series, ticks)
    # the runs of availability and unavailability: where each starts, how long, which side
    starts = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]]) if len(steps) else np.zeros(0, dtype=np.intp)
    lengths = np.diff(np.r_[starts, len(steps)])
    sides = steps[starts]
    ended_run = np.arange(len(starts)) < len(starts) - 1  # the last run has not ended
    ages = np.arange(buckets - 1)
    hazards = []
    for side, prior_hours in ((True, PRIOR_UP_HOURS), (False, PRIOR_DOWN_HOURS)):
        mine = lengths[sides == side]
        # a run of length L lived through ages 0 .. L-1 (the last bucket counts every older age)
        at_risk = np.zeros(buckets)
        at_risk[:-1] = (mine[:, None] > ages[None, :]).sum(axis=0)
        at_risk[-1] += (mine[mine >= buckets] - (buckets - 1)).sum()
        # and ended at its last age, unless it is still going
        gone = mine[ended_run[sides == side]]
        ended = np.bincount(np.minimum(gone - 1, buckets - 1), minlength=buckets).astype(float)
        h0 = min(1.0, step / prior_hours)
        prior_risk = PRIOR_RUNS * (1 - h0) ** np.arange(buckets)
        prior_risk[-1] /= max(h0, 1e-9)
        hz = (ended + prior_risk * h0) / (at_risk + prior_risk)
        hazards.append(tuple(float(x) for x in np.clip(hz, 1e-6, 1 - 1e-6)))
    return AvailabilityModel(step, hazards[0], hazards[1], runs_seen=len(starts))


def current_run(series: Sequence[bool] | np.ndarray, gap_seconds: float) -> tuple[bool, float]:
    """(available now, hours it has been so) from the end of an availability history."""
    arr = np.asarray(series, dtype=bool)
    if not len(arr):
        return False, 0.0
    last = bool(arr[-1])
    changes = np.flatnonzero(arr != last)
    same = len(arr) - (int(changes[-1]) + 1 if len(changes) else 0)
    return last, (same - 1) * gap_seconds / 3600.0


@dataclass(frozen=True)
class SpotMarket:
    """What a decision knows of one spot market: its model, and whether spot is up now and for how long."""

    model: AvailabilityModel
    up: bool
    age_hours: float


def model_span(submitted_tick: int, gap_seconds: float) -> tuple[int, int]:
    """The ticks ``[start, end)`` of a series a job's model is built from: the week before its submission."""
    return max(0, submitted_tick - int(MODEL_WINDOW_HOURS * 3600.0 // gap_seconds)), submitted_tick


def spot_market(series: Sequence[bool] | np.ndarray, gap_seconds: float, *, submitted_tick: int | None = None,
                step_hours: float = DEFAULT_STEP_HOURS, buckets: int = DEFAULT_BUCKETS) -> SpotMarket:
    """A :class:`SpotMarket` from an availability history that ends now (the live broker's helper).

    The model comes from the week before the job's submission (``submitted_tick``, default:
    now), on the plan step of the job (``step_hours``: :func:`plan_step_hours` of its deadline);
    the present (up or down, since when) from the whole series.
    """
    arr = np.asarray(series, dtype=bool)
    start, end = model_span(len(arr) if submitted_tick is None else submitted_tick, gap_seconds)
    up, age = current_run(arr, gap_seconds)
    model = availability_model(arr[start:end], gap_seconds, step_hours=step_hours, buckets=buckets)
    return SpotMarket(model, up, age)


@dataclass(frozen=True)
class Observation:
    """One thing seen of a spot market: spot could be had over ``[start, end]`` (``up``), or could not at ``start``.

    What the live broker has seen (broker/spot_markets.py): a spot allocation running (up over
    its run), a spot launch refused for capacity or an allocation preempted (down at that moment).
    """

    start: datetime
    end: datetime
    up: bool


def availability_series(observations: Sequence[Observation], *, until: datetime, since: datetime,
                        gap_seconds: float) -> tuple[np.ndarray, datetime | None]:
    """An availability history (one bool per tick of ``gap_seconds``, ending with the tick of ``until``).

    A tick with a down observation is down; else one an up observation covers is up; else it is
    as the tick before it was (a market stays as it was last seen). The series starts at the
    first observed tick on or after ``since`` (before it nothing is known); the second value is
    the time that first tick begins (None: nothing observed, an empty series).
    """
    span = (until - since).total_seconds()
    ticks = int(span // gap_seconds) + 1
    first = until - timedelta(seconds=(ticks - 1) * gap_seconds + (span % gap_seconds))

    def tick(at: datetime) -> int:
        return int((at - first).total_seconds() // gap_seconds)

    down = np.zeros(ticks, dtype=bool)
    up = np.zeros(ticks, dtype=bool)
    for o in observations:
        a, b = max(tick(o.start), 0), min(tick(max(o.end, o.start)), ticks - 1)
        if b < 0 or a > ticks - 1:
            continue
        if o.up:
            up[a:b + 1] = True
        else:
            down[a] = True
    seen = down | up
    if not seen.any():
        return np.zeros(0, dtype=bool), None
    start = int(np.argmax(seen))
    out = np.empty(ticks - start, dtype=bool)
    state = True
    for i in range(start, ticks):
        if seen[i]:
            state = not down[i]
        out[i - start] = state
    return out, first + timedelta(seconds=start * gap_seconds)


def observed_market(observations: Sequence[Observation], *, now: datetime, submitted: datetime,
                    deadline_hours: float, gap_seconds: float) -> SpotMarket:
    """The live broker's :class:`SpotMarket` for a job submitted at ``submitted``, from what it observed.

    The series runs from a week before the submission to ``now`` (:func:`availability_series`);
    the model is learnt from its part before the submission, on the plan step of the job's
    deadline (hours from submission), as the simulator's ``lockstep`` learns it from a trace.
    Nothing observed: the prior, with spot taken as just lost.
    """
    since = submitted - timedelta(hours=MODEL_WINDOW_HOURS)
    series, first = availability_series(observations, until=now, since=since, gap_seconds=gap_seconds)
    submitted_tick = 0 if first is None else max(0, int((submitted - first).total_seconds() // gap_seconds))
    return spot_market(series, gap_seconds, submitted_tick=min(submitted_tick, len(series)),
                       step_hours=plan_step_hours(deadline_hours))


# --------------------------------------------------------------------------- the plan


_PLANS: OrderedDict[tuple[AvailabilityModel, int, float], np.ndarray] = OrderedDict()
PLANS_KEPT = 32


def plan_table(model: AvailabilityModel, changeover_steps: int, price_ratio: float, steps: int,
               slack: int) -> np.ndarray:
    """The solved plan covering ``steps`` and ``slack``: a cached one when it is large enough.

    A value depends only on its own state, so a table solved for a longer horizon or more slack
    answers every smaller one; the next decisions of a job (fewer steps, less slack) reuse it.
    """
    key = (model, changeover_steps, price_ratio)
    table = _PLANS.get(key)
    if table is None or table.shape[0] <= steps or table.shape[3] <= slack:
        have_n, have_s = (table.shape[0] - 1, table.shape[3] - 1) if table is not None else (0, 0)
        table = _solve(model, changeover_steps, price_ratio, max(steps, have_n), max(slack, have_s))
        _PLANS[key] = table
    _PLANS.move_to_end(key)
    while len(_PLANS) > PLANS_KEPT:
        _PLANS.popitem(last=False)
    return table


def _solve(model: AvailabilityModel, changeover_steps: int, price_ratio: float, steps: int,
           slack: int) -> np.ndarray:
    """Best action per state: ``table[n, where, x, s]`` for ``n`` steps left, ``s`` steps of slack.

    ``where``: 0 waiting (idle), 1 running on-demand. ``x < B``: spot up for ``x`` steps;
    ``x ≥ B``: down for ``x − B`` steps. Prices per step: spot ``price_ratio``, on-demand 1.
    """
    B = model.buckets
    X = 2 * B
    k = changeover_steps
    p, q = price_ratio, 1.0
    up = np.arange(X) < B
    flip = np.array(model.up_hazard + model.down_hazard)
    older = np.array([min(b + 1, B - 1) for b in range(B)] + [B + min(b + 1, B - 1) for b in range(B)])
    T = np.zeros((X, X))  # one step of the market
    T[np.arange(X), older] += 1 - flip
    T[np.arange(X), np.r_[np.full(B, B), np.zeros(B, dtype=int)]] += flip
    Tk = np.linalg.matrix_power(T, k) if k else np.eye(X)
    # a spot start from x: lost at step j (paid j steps, then waiting, just down) or alive after k steps
    lost = np.zeros((k, X))
    alive = np.eye(X) * up[:, None]
    stay = T * up[None, :]  # moves that keep spot up
    for j in range(k):
        lost[j] = alive.sum(axis=1) - (alive @ stay).sum(axis=1)
        alive = alive @ stay
    S1 = slack + 1
    inf = UNREACHABLE
    table = np.zeros((steps + 1, 2, X, S1), dtype=np.int8)
    # V[n] for the last k+1 n, in a ring of preallocated arrays (V[n] in ring[n % R]). The loop
    # below is the plain recurrence with its buffers kept between steps: every value is the
    # same arithmetic on the same operands (matrix products on contiguous arrays, as written).
    R = k + 2
    ring = [np.zeros((3, X, S1)) for _ in range(R)]
    alive_cost = alive.sum(axis=1)[:, None] * (k * p)
    lost_col = [lost[j][:, None] for j in range(k)]
    # shifted operands, a[..., s - by] (inf where there is not enough slack): their inf heads are set once
    spot_k = np.full((X, S1), inf)  # V[n-k][SPOT] spent by k
    idle_j = [np.full(S1, inf) for _ in range(k)]  # V[n-j-1][IDLE][B] spent by j+1
    spot_next = np.empty((X, S1))
    choices = np.empty((2, X, S1))  # from idle: wait, start on-demand (and start spot, below)
    od_choices = np.empty((2, X, S1))  # from on-demand: keep it, start spot
    run_spot = np.empty((X, S1))
    best = np.empty((X, S1))
    lt = np.empty((X, S1), dtype=bool)
    lo = min(k, S1)
    choices[0, :, 0] = inf  # waiting spends a step of slack: none left at s = 0
    choices[1, :, :lo] = k * q + inf  # starting on-demand spends k (and costs k steps, as where it can)

    for n in range(1, steps + 1):
        prev = ring[(n - 1) % R]
        V = ring[n % R]
        # a lost spot instance leaves the job waiting
        spot_next[:B] = prev[SPOT, :B]
        spot_next[B:] = prev[IDLE, B:]
        wait = choices[0]  # its first column stays inf (set above)
        wait[:, 1:] = (T @ prev[IDLE])[:, :S1 - 1]
        np.matmul(T, spot_next, out=run_spot)
        run_spot += p
        run_od = od_choices[0]
        np.matmul(T, prev[ON_DEMAND], out=run_od)
        run_od += q
        start_spot = od_choices[1]
        start_od = choices[1]
        if k:
            back_k = ring[max(0, n - k) % R]
            start_od[:, lo:] = (Tk @ back_k[ON_DEMAND])[:, :S1 - lo]
            start_od[:, lo:] += k * q
            spot_k[:, lo:] = back_k[SPOT, :, :S1 - lo]
            np.matmul(alive, spot_k, out=start_spot)
            start_spot += alive_cost
            for j in range(k):
                shifted = idle_j[j]
                by = min(j + 1, S1)
                shifted[by:] = ring[max(0, n - j - 1) % R][IDLE, B, :S1 - by]
                start_spot += lost_col[j] * ((j + 1) * p + shifted)
        else:
            start_od[...] = run_od
            start_spot[...] = run_spot
        start_spot[B:] = inf  # no spot to start while it is down
        # the first cheapest choice (argmin's, by comparisons: the same choice, quicker on small arrays)
        np.less(start_spot, wait, out=lt)
        np.minimum(wait, start_spot, out=best)
        act = table[n, 0]
        np.copyto(act, lt)  # 0: wait, 1: start spot
        np.less(start_od, best, out=lt)
        np.copyto(act, ON_DEMAND, where=lt)
        np.minimum(best, start_od, out=V[IDLE])
        V[SPOT, :B] = run_spot[:B]
        V[SPOT, B:] = V[IDLE, B:]
        np.less(start_spot, run_od, out=lt)
        act = table[n, 1]
        act[...] = ON_DEMAND  # stay on on-demand, or start spot
        np.copyto(act, SPOT, where=lt)
        np.minimum(run_od, start_spot, out=V[ON_DEMAND])
        np.minimum(V, UNREACHABLE, out=V)
        V[:, :, n:] = 0.0  # no work left: done
    table.setflags(write=False)
    return table


OUTAGE_QUANTILE = 0.9  # the share of outages (of the current age) the slack must outlast before on-demand is taken


def outage_quantile_hours(model: AvailabilityModel, age_hours: float, quantile: float = OUTAGE_QUANTILE) -> float:
    """How much longer an outage that has lasted ``age_hours`` goes on, at ``quantile`` of the market's outages.

    From the model's down-hazards (the history's observed outages, smoothed by the prior): the
    remaining time that only ``1 − quantile`` of such outages outlast. Past the last age bucket
    the hazard is constant, so the tail is geometric and solved in closed form.
    """
    B, step = model.buckets, model.step_hours
    b = min(int(age_hours / step + 1e-9), B - 1)
    alive, steps, target = 1.0, 0, 1.0 - quantile
    while b < B - 1:
        if alive <= target:
            return steps * step
        alive *= 1.0 - model.down_hazard[b]
        steps, b = steps + 1, b + 1
    if alive <= target:
        return steps * step
    tail = model.down_hazard[-1]
    return (steps + math.ceil(math.log(target / alive) / math.log(1.0 - tail))) * step


def expected_up_hours(model: AvailabilityModel, age_hours: float) -> float:
    """How long spot that has been up ``age_hours`` is expected to stay, from the model's up-hazards."""
    B, step = model.buckets, model.step_hours
    b = min(int(age_hours / step + 1e-9), B - 1)
    alive, total = 1.0, 0.0
    while b < B - 1:
        alive *= 1.0 - model.up_hazard[b]
        total += alive
        b += 1
    tail = model.up_hazard[-1]
    return (total + alive * (1.0 - tail) / tail) * step


def spot_zone_costs(markets: Sequence[SpotMarket], *, here: int, changeover_hours: float, migration_hours: float,
                    migration_usd: float, spot_usd_per_hour: float, switch_back_usd: float = 0.0) -> dict[int, float]:
    """Expected USD per hour of progress for a spot start in each zone that has spot now (by index).

    A start pays its changeover (and, away from ``here`` — where the checkpoint and data lie —
    the migration's transfer time and egress) once, and ``switch_back_usd`` (the risk of switching
    back: a changeover to on-demand when that spot is lost), spread over the hours spot is expected
    to stay in that zone at its present age; each of those hours costs the spot price. The zone
    where a progress hour is cheapest wins: the checkpoint's own zone unless another one's spot
    is expected to last long enough to pay for the move.
    """
    out: dict[int, float] = {}
    for z, m in enumerate(markets):
        if not m.up:
            continue
        overhead_h = changeover_hours + (0.0 if z == here else migration_hours)
        stay = expected_up_hours(m.model, m.age_hours)
        progress = max(stay - overhead_h, 1e-6)
        out[z] = (spot_usd_per_hour * stay + (0.0 if z == here else migration_usd) + switch_back_usd) / progress
    return out


def expected_down_hours(model: AvailabilityModel, age_hours: float) -> float:
    """How much longer an outage that has lasted ``age_hours`` is expected to go on, from the model's down-hazards."""
    return expected_up_hours(AvailabilityModel(model.step_hours, model.down_hazard, model.up_hazard), age_hours)


@dataclass(frozen=True)
class ZoneMove:
    """Where a job should start spot instead of what its home plan chose: ``zone`` (None: the plan's choice stands)."""

    zone: int | None
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)


def spot_zone_move(markets: Sequence[SpotMarket], *, here: int, plan: str, running_on_demand: bool,
                   hours_left: float, work_left_hours: float, changeover_hours: float, migration_hours: float,
                   migration_usd: float, spot_usd_per_hour: float, ondemand_usd_per_hour: float,
                   decision_interval_hours: float) -> ZoneMove:
    """Whether a job whose checkpoint lies in zone ``here`` should move to start spot in another zone.

    ``plan`` is what the single-zone plan chose on ``here``'s market: ``"on-demand"`` (start it, or
    stay on it; ``running_on_demand`` says which) or ``"wait"``. A move is weighed against *that*
    choice, not against on-demand alone:

    - never while the slack no longer covers two changeovers with the migration (the safety net);
    - instead of waiting only when waiting at home is expected to run the slack out: the home
      outage is expected (:func:`expected_down_hours`, at its present age) to outlast the slack
      left beyond two changeovers with the migration. Otherwise waiting is free and the plan,
      which meets spot's return at home without a move, keeps the job there;
    - per zone with spot, the USD per hour of progress (:func:`spot_zone_costs`, with the switch
      back to on-demand when that spot is lost) must be below the on-demand price;
    - and, when the move gives up something that costs nothing more to keep — a running
      on-demand instance (a start on spot there pays a changeover now and one back later) or a
      free wait — the plan of the remote zone itself (:func:`spot_choice` on its model and present,
      the migration's time and its egress at the on-demand price counted in the changeover, the
      slack left) must also prefer a spot start there. Its age-dependent hazards turn down the young
      runs of a flapping market, which the expected run length alone overrates; a job just
      started on on-demand needs no such check (it pays a changeover either way).

    The cheapest zone left wins. Pure: the simulator and the live router call it alike.
    """
    if plan not in ("on-demand", "wait"):
        raise ValueError(f"plan must be 'on-demand' or 'wait', not {plan!r}")
    overhead = changeover_hours + migration_hours
    numbers: dict[str, Any] = {"plan": plan, "slack_hours": round(hours_left - work_left_hours, 3)}
    if must_run_on_demand(hours_left, work_left_hours, overhead, decision_interval_hours):
        return ZoneMove(None, "slack no longer covers two changeovers with the migration: no move", numbers)
    home = markets[here]
    if plan == "wait":
        outage = 0.0 if home.up else expected_down_hours(home.model, home.age_hours)
        numbers["home_outage_hours"] = round(outage, 3)
        if outage < hours_left - work_left_hours - 2 * overhead:
            return ZoneMove(None, "waiting at home is free: its outage is expected to end within the slack",
                            numbers)
    costs = spot_zone_costs(markets, here=here, changeover_hours=changeover_hours, migration_hours=migration_hours,
                            migration_usd=migration_usd, spot_usd_per_hour=spot_usd_per_hour,
                            switch_back_usd=changeover_hours * ondemand_usd_per_hour)
    costs.pop(here, None)  # the checkpoint's own spot was the plan's to take, and it did not
    if running_on_demand or plan == "wait":
        egress_hours = migration_usd / ondemand_usd_per_hour if ondemand_usd_per_hour > 0 else 0.0
        for z in list(costs):
            there = spot_choice(hours_left=hours_left, work_left_hours=work_left_hours,
                                changeover_hours=overhead + egress_hours, spot_usd_per_hour=spot_usd_per_hour,
                                ondemand_usd_per_hour=ondemand_usd_per_hour,
                                running=Market.on_demand if running_on_demand else None, model=markets[z].model,
                                spot_up=True, spot_age_hours=markets[z].age_hours,
                                decision_interval_hours=decision_interval_hours)
            if there.if_available is not Market.spot:
                del costs[z]
    numbers["usd_per_progress_hour"] = {z: round(c, 3) for z, c in sorted(costs.items())}
    best = min(costs, key=lambda z: (costs[z], z), default=None)
    if best is None or costs[best] >= ondemand_usd_per_hour:
        return ZoneMove(None, "no other zone's spot pays for the move", numbers)
    return ZoneMove(best, f"spot in zone {best}: ${costs[best]:.2f} per progress hour against on-demand's "
                          f"${ondemand_usd_per_hour:.2f}", numbers)


@dataclass(frozen=True)
class SpotChoice:
    """What to run: ``if_available`` when a spot launch would succeed now, ``if_unavailable`` otherwise.

    ``None`` means wait (stay pending, try again at the next decision).
    """

    if_available: Market | None
    if_unavailable: Market | None
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)


def must_run_on_demand(hours_left: float, work_left_hours: float, changeover_hours: float,
                       decision_interval_hours: float, changeovers: int = 2) -> bool:
    """The safety net: too little slack for ``changeovers`` changeovers plus one decision interval."""
    return hours_left - work_left_hours < changeovers * changeover_hours + decision_interval_hours


def spot_choice(
    *,
    hours_left: float,
    work_left_hours: float,
    changeover_hours: float,
    spot_usd_per_hour: float,
    ondemand_usd_per_hour: float,
    running: Market | None,
    model: AvailabilityModel,
    spot_up: bool,
    spot_age_hours: float,
    decision_interval_hours: float,
) -> SpotChoice:
    """Spot, on-demand or wait for a job ``running`` nowhere (None) or on on-demand.

    ``spot_up`` and ``spot_age_hours``: what the market's history says now (spot was available
    at the last observation, for that long). ``if_available`` assumes a spot launch now succeeds
    (spot is up, and has been for ``spot_age_hours`` if ``spot_up`` else it just came back);
    ``if_unavailable`` assumes it fails (down, for ``spot_age_hours`` if not ``spot_up`` else just lost).
    """
    numbers: dict[str, Any] = {"hours_left": round(hours_left, 3), "work_left_hours": round(work_left_hours, 3),
                               "slack_hours": round(hours_left - work_left_hours, 3), **model.summary()}
    on_demand_now = Market.on_demand
    if running is Market.spot:
        return SpotChoice(Market.spot, None, "a running spot instance is kept until the market takes it back",
                          numbers)
    if must_run_on_demand(hours_left, work_left_hours, changeover_hours, decision_interval_hours):
        return SpotChoice(on_demand_now, on_demand_now,
                          "slack no longer covers two changeovers: on-demand to the end", numbers)
    step = model.step_hours
    n = int(hours_left / step + 1e-9)
    s = n - math.ceil(work_left_hours / step - 1e-9)
    if s < 0:
        return SpotChoice(on_demand_now, on_demand_now, "no slack left on the plan's steps: on-demand", numbers)
    k = max(1, round(changeover_hours / step)) if changeover_hours > 0 else 0  # a start always costs a step
    ratio = round(spot_usd_per_hour / ondemand_usd_per_hour, 3) if ondemand_usd_per_hour > 0 else 1.0
    # Plans are cached per market model, changeover and price ratio.
    table = plan_table(model, k, ratio, n, s)
    B = model.buckets
    age = min(int(spot_age_hours / step + 1e-9), B - 1)
    x_up = age if spot_up else 0
    x_down = B + (age if not spot_up else 0)
    where = 1 if running is Market.on_demand else 0
    codes = {IDLE: None, SPOT: Market.spot, ON_DEMAND: Market.on_demand}
    if_up = codes[int(table[n, where, x_up, s])]
    if_down = codes[int(table[n, where, x_down, s])]
    if if_down is Market.spot:  # cannot happen in the table; never ask for spot that is not there
        if_down = Market.on_demand
    numbers.update(plan_step_hours=round(step, 4), spot_price_ratio=ratio)
    verdict = {Market.spot: "spot", Market.on_demand: "on-demand", None: "wait"}
    reason = (f"plan over the market's history: if spot can be had, {verdict[if_up]}; "
              f"if not, {verdict[if_down]}")
    if running is None and if_down is Market.on_demand:
        # No regret: on-demand now costs what on-demand later costs, so a job that lost spot (or
        # waits for it) commits to on-demand only once its slack no longer covers a changeover, the
        # decision interval and this outage at the market's observed quantile. Until then waiting is
        # free. (Where spot can be had, the plan's own choice stands: it weighs what a start on
        # flaky spot costs in changeovers and in switching back.)
        outage = outage_quantile_hours(model, spot_age_hours if not spot_up else 0.0)
        numbers["outage_quantile_hours"] = round(outage, 3)
        if hours_left - work_left_hours >= changeover_hours + outage + decision_interval_hours:
            if_down = None
            reason += (f"; but the slack still outlasts a changeover and {OUTAGE_QUANTILE:.0%} of outages "
                       f"({outage:.2f} h): wait for spot rather than on-demand")
    return SpotChoice(if_up, if_down, reason, numbers)
