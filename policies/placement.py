"""Placement policies: reserved first, on-prem first with bursting, spot while slack lasts.

Pure functions over quote options and numbers: the current time is an argument
and nothing here does I/O, so the same decisions replay in a simulator over
recorded traces.

- **Reserved first**: unused reserved capacity is already paid for; its
  marginal price is what the operator configured (often 0). It goes first.
- **Burst**: owned hardware is paid for too, so on-prem goes next — unless its
  queue would make the job miss its deadline, or the wait exceeds the
  configured limit, and the cloud's extra cost fits the tenant's budget.
  ``onprem_only`` never bursts; ``cloud_ok: false`` never leaves.
- **Spot vs on-demand** (after Wu et al., *Can't Be Late*, NSDI'24): a job that
  tolerates preemption uses spot while its deadline has slack for the preemptions
  it may suffer; as slack runs out it falls back to on-demand so it still finishes
  in time. Given the market's availability history (``spot_market``) and the
  progress the job has kept (``done_hours``), the choice is planned instead
  (policies.spot): spot if it can be had, and otherwise on-demand *or wait* — a
  decision with ``on_demand_fallback=False`` leaves the job pending until spot can
  be had — and a job running on on-demand moves back to spot when the plan says so
  (:func:`rebalance`, the decision the broker takes for running on-demand jobs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, TypedDict

from broker.models import Allocation, AllocationState, JobSpec, Market, QuoteOption
from policies.spot import SpotChoice, SpotMarket, spot_choice, spot_zone_move

CLOUD_MARKETS = frozenset({Market.spot, Market.on_demand})
# How long until the live broker decides again for a pending job (its retry, 15 s) plus a poll (5 s)
# and some launch latency: the margin the spot plan's safety net keeps.
DECISION_INTERVAL_HOURS = 1.0 / 60.0


class Situation(TypedDict):
    """Where a job stands for :func:`decide` and :func:`rebalance`: the arguments both take, built alike by the
    live router (``Router.situation``) and the simulator (broker/simulate/)."""

    now: datetime
    deadline: datetime | None
    done_hours: float
    spot_market: SpotMarket | None
    restart_minutes: float
    decision_interval_hours: float


class Route(StrEnum):
    """Where a decision sends a job."""

    reserved = "reserved"  # capacity already paid for
    onprem = "onprem"  # the owned pool
    cloud = "cloud"  # new capacity: spot or on-demand
    wait = "wait"  # nowhere now (must stay on-prem, or waiting for spot is worth it)


@dataclass(frozen=True)
class Decision:
    """What the policies chose and the numbers behind it (stored on the job)."""

    route: Route
    reason: str
    allow_spot: bool
    numbers: dict[str, Any] = field(default_factory=dict)
    # False: spot or nothing — when no spot can be had the job waits (stays pending) rather than
    # paying for on-demand, because its deadline has slack to spare.
    on_demand_fallback: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def spot_allowed(
    spec: JobSpec,
    *,
    now: datetime,
    deadline: datetime | None,
    on_demand_hours: float | None,
    preemptions_per_hour: float,
    restart_minutes: float = 10.0,
    safety: float = 1.1,
) -> tuple[bool, dict[str, float]]:
    """Uniform progress: spot only while the slack covers the losses spot may cause.

    Slack is the time left before the deadline minus what the rest of the job
    needs on on-demand capacity (× a safety margin). Spot's expected cost in
    time is one restart plus half a checkpoint interval per preemption.
    """
    numbers: dict[str, float] = {}
    if not spec.interruptible:
        return False, numbers
    if deadline is None or on_demand_hours is None:
        return True, numbers
    left_h = (deadline - now).total_seconds() / 3600.0
    need_h = on_demand_hours * safety
    per_event_h = (spec.checkpoint_minutes / 2.0 + restart_minutes) / 60.0
    expected_loss_h = on_demand_hours * preemptions_per_hour * per_event_h + per_event_h
    slack = left_h - need_h
    numbers.update(hours_left=round(left_h, 3), on_demand_hours=round(on_demand_hours, 3),
                   slack_hours=round(slack, 3), spot_expected_loss_hours=round(expected_loss_h, 3))
    return slack > expected_loss_h, numbers


def progress_hours(allocations: Iterable[Allocation], now: datetime, *, restart_minutes: float,
                   checkpoint_minutes: float) -> float:
    """Work a job has kept from its attempts, in hours (``done_hours`` for :func:`decide` and :func:`rebalance`).

    Each allocation counts from ``attrs["running_since"]`` to its end (``ended_at`` once it ended — the
    ledger's, on the broker's clock — else its last update; ``now`` while it runs), less the restart it
    began with; a preempted one also loses half a checkpoint interval of work. Allocations that never ran
    count nothing. Whole seconds.
    """
    total = 0.0
    for a in allocations:
        since = a.attrs.get("running_since")
        if not since:
            continue
        end = now if a.state in (AllocationState.pending, AllocationState.running) else (a.ended_at or a.updated_at)
        ran = (end - datetime.fromisoformat(since)).total_seconds() / 3600.0
        kept = max(0.0, ran - restart_minutes / 60.0)
        if a.state is AllocationState.preempted:
            kept = max(0.0, kept - checkpoint_minutes / 120.0)
        total += kept
    return round(total * 3600.0) / 3600.0  # to the second, as the simulator counts


def decide(
    spec: JobSpec,
    options: Sequence[QuoteOption],
    *,
    now: datetime,
    deadline: datetime | None,
    max_queue_wait_hours: float,
    budget_left_usd: float | None = None,
    preemptions_per_hour: float = 0.05,
    done_hours: float = 0.0,
    spot_market: SpotMarket | None = None,
    restart_minutes: float = 10.0,
    decision_interval_hours: float = DECISION_INTERVAL_HOURS,
    late_onprem: QuoteOption | None = None,
) -> Decision:
    """Choose where to route a job among its feasible options (already ranked by job cost).

    ``late_onprem``: the cheapest on-prem option the quote rejected because it would finish after the
    deadline (``Quote.late_onprem``); a job that may leave bursts with its wait, the deadline and both costs.

    ``done_hours``: progress the job has kept from earlier attempts (on the on-demand options'
    speed); the work left is what the spot choice weighs. ``spot_market``: the availability
    history of the market the job's first spot option is in; with it (and a deadline), spot vs
    on-demand vs waiting is planned (policies.spot), without it the slack rule decides.
    ``decision_interval_hours``: how long until the broker decides again for this job.
    """
    reserved = [o for o in options if o.market is Market.reserved]
    onprem = [o for o in options if o.market is Market.owned]
    if not onprem and late_onprem is not None and deadline is not None and spec.cloud_ok and not spec.onprem_only:
        onprem = [late_onprem]  # it misses the deadline: the branch below bursts and says by how much
    on_demand = [o for o in options if o.market is Market.on_demand]
    cloud = [o for o in options if o.market in CLOUD_MARKETS]

    od_hours = min((o.expected_hours for o in on_demand if o.expected_hours is not None), default=None)
    work_left = None if od_hours is None else max(od_hours - done_hours, 0.0)
    fallback = True
    planned = _planned(spec, options, now=now, deadline=deadline, work_left=work_left, running=None,
                       spot_market=spot_market, restart_minutes=restart_minutes,
                       decision_interval_hours=decision_interval_hours)
    if planned is not None:
        allow_spot = planned.if_available is Market.spot
        fallback = not allow_spot or planned.if_unavailable is Market.on_demand
        spot_numbers = {**planned.numbers, "spot_plan": planned.reason}
    else:
        allow_spot, spot_numbers = spot_allowed(spec, now=now, deadline=deadline, on_demand_hours=work_left,
                                                preemptions_per_hour=preemptions_per_hour,
                                                restart_minutes=restart_minutes)
    if reserved and not (spec.onprem_only or not spec.cloud_ok):
        return Decision(Route.reserved, "unused reserved capacity is already paid for", allow_spot,
                        {"reserved_usd_per_hour": reserved[0].usd_per_hour, **spot_numbers})

    if not onprem:
        if spec.onprem_only or not spec.cloud_ok:
            return Decision(Route.wait, "job must stay on-prem and no on-prem capacity fits it now", False,
                            spot_numbers)
        if planned is not None and planned.if_available is None and planned.if_unavailable is None:
            return Decision(Route.wait, f"waiting for a better moment: {planned.reason}", False, spot_numbers,
                            on_demand_fallback=False)
        return Decision(Route.cloud, "no on-prem capacity fits this job", allow_spot, spot_numbers,
                        on_demand_fallback=fallback)

    best = onprem[0]
    wait = best.breakdown.queue_wait_hours if best.breakdown else 0.0
    # Includes the queue wait; unknown without a workload (and then no deadline is allowed): the wait.
    finish_h = best.expected_hours if best.expected_hours is not None else wait
    numbers: dict[str, Any] = {"onprem_queue_wait_hours": round(wait, 3), "onprem_finish_hours": round(finish_h, 3),
                               "max_queue_wait_hours": max_queue_wait_hours, **spot_numbers}
    misses = False
    if deadline is not None:
        hours_left = (deadline - now).total_seconds() / 3600.0
        numbers.update(hours_to_deadline=round(hours_left, 3), deadline=deadline.isoformat())
        misses = finish_h > hours_left
    too_long = wait > max_queue_wait_hours
    if spec.onprem_only or not spec.cloud_ok or not (misses or too_long):
        why = "owned hardware is already paid for"
        if misses or too_long:
            why = "job must stay on-prem, so it waits for the on-prem queue"
        return Decision(Route.onprem, why, False, numbers)

    trigger = "on-prem queue would miss the deadline" if misses else (
        f"on-prem wait {wait:.2f} h exceeds the limit {max_queue_wait_hours:g} h")
    usable_cloud = [o for o in cloud if allow_spot or o.market is not Market.spot]
    if not usable_cloud:
        return Decision(Route.onprem, f"{trigger}, but no cloud option fits; staying on-prem", False, numbers)
    cheapest = usable_cloud[0]
    extra = cheapest.expected_cost_usd - best.expected_cost_usd
    numbers.update(cloud_cost_usd=cheapest.expected_cost_usd, onprem_cost_usd=best.expected_cost_usd,
                   extra_cost_usd=round(extra, 2))
    if budget_left_usd is not None:
        numbers["budget_left_usd"] = round(budget_left_usd, 2)
        if cheapest.expected_cost_usd > budget_left_usd:
            return Decision(Route.onprem, f"{trigger}, but bursting would exceed the tenant's budget", False, numbers)
    # A burst is for time: it never waits for spot.
    return Decision(Route.cloud, f"burst: {trigger}", allow_spot, numbers)


def _planned(spec: JobSpec, options: Sequence[QuoteOption], *, now: datetime, deadline: datetime | None,
             work_left: float | None, running: Market | None, spot_market: SpotMarket | None,
             restart_minutes: float, decision_interval_hours: float) -> SpotChoice | None:
    """The planned spot choice, or None when there is nothing to plan (no history, deadline or prices)."""
    spot = next((o for o in options if o.market is Market.spot), None)
    od = next((o for o in options if o.market is Market.on_demand), None)
    if (spot_market is None or not spec.interruptible or deadline is None or work_left is None
            or spot is None or od is None):
        return None
    changeover_h = (restart_minutes + spec.checkpoint_minutes / 2.0) / 60.0
    return spot_choice(
        hours_left=(deadline - now).total_seconds() / 3600.0, work_left_hours=work_left,
        changeover_hours=changeover_h, spot_usd_per_hour=spot.usd_per_hour, ondemand_usd_per_hour=od.usd_per_hour,
        running=running, model=spot_market.model, spot_up=spot_market.up, spot_age_hours=spot_market.age_hours,
        decision_interval_hours=decision_interval_hours,
    )


def rebalance(
    spec: JobSpec,
    options: Sequence[QuoteOption],
    *,
    now: datetime,
    deadline: datetime | None,
    done_hours: float,
    spot_market: SpotMarket | None,
    restart_minutes: float = 10.0,
    decision_interval_hours: float = DECISION_INTERVAL_HOURS,
) -> Decision:
    """For a job running on on-demand: move to spot now, or stay.

    ``allow_spot`` True means: give the on-demand instance up and place the job again (the
    broker's rebalance step: :func:`decide` then chooses, with the progress kept, and spot is
    first among its candidates); it is True only when the plan prefers spot from on-demand and
    the market was last seen with spot (``spot_market.up``). False: stay on on-demand. Without a
    market history or a deadline there is nothing to gain that is worth a changeover, and the job stays.
    """
    od_hours = min((o.expected_hours for o in options
                    if o.market is Market.on_demand and o.expected_hours is not None), default=None)
    work_left = None if od_hours is None else max(od_hours - done_hours, 0.0)
    planned = _planned(spec, options, now=now, deadline=deadline, work_left=work_left, running=Market.on_demand,
                       spot_market=spot_market, restart_minutes=restart_minutes,
                       decision_interval_hours=decision_interval_hours)
    if planned is None:
        return Decision(Route.cloud, "stay on on-demand: nothing to plan a move with", False, on_demand_fallback=False)
    # Break before make: the move gives the on-demand instance up first, so it is made only while the
    # market was last seen with spot (a launch then is likely to succeed).
    wants = planned.if_available is Market.spot
    move = wants and spot_market is not None and spot_market.up
    why = ("move to spot: the plan says so and spot was last seen available" if move else
           "stay on on-demand: the plan would move to spot, but spot was last seen gone" if wants else
           "stay on on-demand")
    return Decision(Route.cloud, f"{why} ({planned.reason})", move, planned.numbers, on_demand_fallback=False)


def where(option: QuoteOption) -> str:
    """An option's spot market's place: its zone, else its region (as the broker's market keys name it)."""
    return option.zone or option.region


def checkpoint_place(allocations: Iterable[Allocation]) -> str | None:
    """Where a job's checkpoint and data lie: the zone (else region) of the last of its allocations that ran
    (``allocations`` in the order they were made; None: none ran, or it ran where no place is recorded)."""
    place = None
    for a in allocations:
        if a.attrs.get("running_since"):
            place = a.zone or a.region or None
    return place


def checkpoint_first(options: Sequence[QuoteOption], place: str | None) -> list[QuoteOption]:
    """The options with the spot ones in ``place`` (:func:`checkpoint_place`) ahead of the other spot options,
    each group in its rank order; every other option keeps its position.

    The first spot option's market is the one the spot plan weighs and the one a spot start tries first, so a
    job that ran before plans on — and restarts in — the market where its checkpoint lies, and a start in any
    other place is a move weighed by :func:`spot_elsewhere`, as the multi-zone simulator plans on the
    checkpoint's zone (broker/simulate/zones.py). A place none of the spot options is in changes nothing."""
    if place is None:
        return list(options)
    spots = [o for o in options if o.market is Market.spot]
    ordered = iter([o for o in spots if where(o) == place] + [o for o in spots if where(o) != place])
    return [next(ordered) if o.market is Market.spot else o for o in options]


def spot_elsewhere(
    spec: JobSpec,
    options: Sequence[QuoteOption],
    decision: Decision,
    *,
    now: datetime,
    deadline: datetime | None,
    done_hours: float,
    home: SpotMarket,
    markets: Mapping[str, SpotMarket],
    restart_minutes: float = 10.0,
    decision_interval_hours: float = DECISION_INTERVAL_HOURS,
    running_on_demand: bool = False,
) -> tuple[Decision, str | None]:
    """Across zones, live: where :func:`decide` on the first spot option's market (``home``) chose on-demand or to
    wait — or, ``running_on_demand``, where :func:`rebalance` keeps a running on-demand job where it is — a spot
    start in another zone or region the spec allows (``markets``, by :func:`where`) is weighed against that choice
    by ``policies.spot.spot_zone_move``, the function the multi-zone simulator calls (broker/simulate/zones.py).
    Each other place is weighed with its own cheapest spot option's price; the cheapest per progress hour that
    pays for the move wins. The options' costs already carry moving the job's
    data to their place (the ranking's egress); the move adds the difference in egress between the two
    places' options, and no checkpoint transfer (its size is not in the spec).

    Returns the decision (unchanged, or spot there with its numbers under ``zone_move``) and the place chosen
    (None: none)."""
    if decision.allow_spot or decision.route not in (Route.cloud, Route.wait) or deadline is None \
            or not spec.interruptible:
        return decision, None
    spots = [o for o in options if o.market is Market.spot]
    od = next((o for o in options if o.market is Market.on_demand and o.expected_hours is not None), None)
    if not spots or od is None or od.expected_hours is None:
        return decision, None
    first = spots[0]
    cheapest: dict[str, QuoteOption] = {}
    for o in spots:
        if where(o) != where(first) and where(o) in markets:
            cheapest.setdefault(where(o), o)
    plan = "wait" if decision.route is Route.wait and not running_on_demand else "on-demand"
    hours_left = (deadline - now).total_seconds() / 3600.0
    work_left = max(od.expected_hours - done_hours, 0.0)
    changeover_h = (restart_minutes + spec.checkpoint_minutes / 2.0) / 60.0
    best: tuple[float, str, str] | None = None
    weighed: dict[str, Any] = {}
    for place, opt in cheapest.items():
        egress_here = first.breakdown.egress_usd if first.breakdown else 0.0
        egress_there = opt.breakdown.egress_usd if opt.breakdown else 0.0
        move = spot_zone_move(
            [home, markets[place]], here=0, plan=plan, running_on_demand=running_on_demand, hours_left=hours_left,
            work_left_hours=work_left, changeover_hours=changeover_h, migration_hours=0.0,
            migration_usd=max(egress_there - egress_here, 0.0), spot_usd_per_hour=opt.usd_per_hour,
            ondemand_usd_per_hour=od.usd_per_hour, decision_interval_hours=decision_interval_hours)
        weighed[place] = move.reason
        if move.zone == 1:
            cost = float(move.numbers["usd_per_progress_hour"][1])
            if best is None or cost < best[0]:
                best = (cost, place, move.reason)
    if best is None:
        if not weighed:
            return decision, None
        return replace(decision, numbers={**decision.numbers, "zone_move": weighed}), None
    cost, place, why = best
    verb = "move to spot in" if running_on_demand else "spot in"
    return Decision(Route.cloud, f"{verb} {place} instead ({why})", True,
                    {**decision.numbers, "zone_move": {**weighed, "chosen": place, "usd_per_progress_hour":
                                                       round(cost, 3)}},
                    on_demand_fallback=decision.route is Route.cloud), place


def candidates(options: Sequence[QuoteOption], decision: Decision) -> list[QuoteOption]:
    """The options to try, in order, for a decision (the router walks them on capacity errors)."""
    if decision.route is Route.wait:
        return []
    if decision.route is Route.reserved:
        # reserved, then owned; then (if those fail) new capacity, spot only when allowed
        order = [Market.reserved, Market.owned, Market.on_demand] + ([Market.spot] if decision.allow_spot else [])
    elif decision.route is Route.onprem:
        order = [Market.owned]
    else:
        order = ([Market.spot] if decision.allow_spot else [])
        if decision.on_demand_fallback:
            order += [Market.on_demand, Market.reserved]
    out: list[QuoteOption] = []
    for market in order:
        out.extend(o for o in options if o.market is market)
    return out
