"""One deadline job on spot and on-demand capacity, tick by tick over a spot availability trace.

The setting of Wu et al., *Can't Be Late: Optimizing Spot Instance Savings under Deadlines*
(NSDI'24): a job needs ``job_hours`` of compute and must finish within ``deadline_hours``.
At every tick of the trace the policy asks for spot (only when the trace says spot can be
had), on-demand, or nothing. Starting an instance — after a preemption, or when switching
between spot and on-demand — costs a changeover delay during which the instance is paid for
but the job makes no progress; progress made before a preemption is kept (the job
checkpoints). Cost = spot price × spot hours + on-demand price × on-demand hours, billed by
the second of use.

All times are whole seconds (the changeover and the job's hours are rounded to the second),
so the engine and the exact optimum (:func:`optimal`) count alike; tests check the optimum
against brute force over every schedule through :func:`simulate` itself.

Policies see the present and the past only: the tick's availability (as a launch attempt
would), where the job runs and how far it got. ``optimal`` sees the whole trace.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import IntEnum
from typing import Any, Protocol

import numpy as np

from broker.errors import SpecError
from broker.models import Fabric, JobSpec, Market, QuoteOption, Workload
from broker.simulate.traces import SpotTrace
from policies.placement import Decision, Situation, candidates, decide, rebalance
from policies.spot import SpotMarket, availability_model, current_run, model_span, plan_step_hours


class Mode(IntEnum):
    idle = 0
    spot = 1
    on_demand = 2


@dataclass(frozen=True)
class DeadlineJob:
    """The job and the prices, as given; :meth:`seconds` turns it into the engine's whole seconds."""

    job_hours: float
    deadline_hours: float
    changeover_hours: float
    spot_price: float
    ondemand_price: float

    def validate(self) -> None:
        """Raise :class:`SpecError` naming the option when the job cannot be simulated."""
        for option, value in (("--job-hours", self.job_hours), ("--deadline-hours", self.deadline_hours)):
            if not math.isfinite(value) or value <= 0:
                raise SpecError(option, f"must be a positive number of hours, not {value:g}")
        if not math.isfinite(self.changeover_hours) or self.changeover_hours < 0:
            raise SpecError("--changeover-hours", f"must be zero or more, not {self.changeover_hours:g}")
        for option, value in (("--spot-price", self.spot_price), ("--ondemand-price", self.ondemand_price)):
            if not math.isfinite(value) or value < 0:
                raise SpecError(option, f"must be a price of zero or more, not {value:g}")
        s = self.seconds()
        if s.deadline < s.work + s.changeover:
            raise SpecError("--deadline-hours", f"{self.deadline_hours:g} h leaves no room for the job: it needs "
                                                f"{self.job_hours:g} h plus one changeover of "
                                                f"{self.changeover_hours:g} h even on on-demand")

    def seconds(self) -> JobSeconds:
        return JobSeconds(work=round(self.job_hours * 3600), deadline=round(self.deadline_hours * 3600),
                          changeover=round(self.changeover_hours * 3600), spot_price=self.spot_price,
                          ondemand_price=self.ondemand_price)


@dataclass(frozen=True)
class JobSeconds:
    work: int
    deadline: int
    changeover: int
    spot_price: float  # USD per hour
    ondemand_price: float

    def price(self, mode: Mode) -> float:
        return self.spot_price if mode is Mode.spot else self.ondemand_price if mode is Mode.on_demand else 0.0


@dataclass(frozen=True)
class Step:
    """What a policy knows at the start of a tick."""

    tick: int
    elapsed: int  # seconds since the job was submitted
    gap: int  # seconds per tick
    available: bool  # spot can be had this tick (a spot launch now would succeed)
    mode: Mode  # where the job runs now (idle right after a preemption)
    done: int  # seconds of work done
    overhead_left: int  # seconds of changeover still to go on the current instance
    preempted: bool  # the job lost its spot instance at this tick
    job: JobSeconds

    @property
    def work_left(self) -> int:
        return self.job.work - self.done

    @property
    def time_left(self) -> int:
        return self.job.deadline - self.elapsed


class Policy(Protocol):
    name: str

    def start(self, job: JobSeconds, gap: int) -> None: ...

    def act(self, step: Step) -> Mode: ...


@dataclass
class Segment:
    mode: Mode
    start: int  # seconds from submission
    end: int
    work: int  # seconds of progress made in it


@dataclass
class DeadlineResult:
    policy: str
    cost: float
    spot_hours: float
    ondemand_hours: float
    finish_hour: float | None  # None: the job never finished (the policy left it idle)
    met_deadline: bool
    preemptions: int | None = 0  # None: not tracked (the optimum is a cost, not a replay)
    changeovers: int = 0
    segments: list[Segment] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "cost": round(self.cost, 4), "spot_hours": round(self.spot_hours, 4),
                "ondemand_hours": round(self.ondemand_hours, 4),
                "finish_hour": None if self.finish_hour is None else round(self.finish_hour, 4),
                "met_deadline": self.met_deadline, "preemptions": self.preemptions, "changeovers": self.changeovers}


@dataclass
class Tally:
    """The engine's accounting of one job, tick by tick: the one step both engines (one zone, several) run.

    Where the job runs (mode and zone: idle, where its checkpoint lies), the changeover still to
    go, the progress, what was paid and the segments. :meth:`advance` applies a policy's choice
    for one tick; a start in another zone than the checkpoint's adds ``move_seconds`` of overhead
    and ``move_usd`` of cost (a migration; one zone: never).
    """

    job: JobSeconds
    zone: int = 0
    mode: Mode = Mode.idle
    overhead: int = 0
    done: int = 0
    cost: float = 0.0
    paid: dict[Mode, int] = field(default_factory=lambda: {Mode.spot: 0, Mode.on_demand: 0})
    preemptions: int = 0
    changeovers: int = 0
    moves: int = 0
    finish: int | None = None
    segments: list[tuple[int, Segment]] = field(default_factory=list)

    def see(self, spot_here: bool) -> bool:
        """The tick's spot where the job runs: a spot instance without it is lost (True: preempted now)."""
        if self.mode is Mode.spot and not spot_here:
            self.mode, self.overhead = Mode.idle, 0
            self.preemptions += 1
            return True
        return False

    def advance(self, tick: int, gap: int, want: Mode, where: int = 0, move_seconds: int = 0,
                move_usd: float = 0.0) -> bool:
        """Run ``want`` in zone ``where`` for tick ``tick``; True once the job is done."""
        js = self.job
        launched = want is not Mode.idle and (want is not self.mode or where != self.zone)
        if launched:
            self.overhead = js.changeover
            self.changeovers += 1
            if where != self.zone:  # the checkpoint and the data follow the job
                self.overhead += move_seconds
                self.cost += move_usd
                self.moves += 1
            self.zone = where
        self.mode = want
        if want is Mode.idle:
            return False
        spent_overhead = min(self.overhead, gap)
        work = min(gap - spent_overhead, js.work - self.done)
        used = spent_overhead + work
        self.overhead -= spent_overhead
        self.done += work
        self.paid[want] += used
        self.cost += js.price(want) * used / 3600.0
        start = tick * gap
        last = self.segments[-1] if self.segments else None
        if last and last[0] == self.zone and last[1].mode is want and last[1].end == start and not launched:
            last[1].end, last[1].work = start + used, last[1].work + work
        else:
            self.segments.append((self.zone, Segment(want, start, start + used, work)))
        if self.done >= js.work:
            self.finish = start + used
            return True
        return False

    def result_fields(self, policy: str) -> dict[str, Any]:
        """The fields of a :class:`DeadlineResult` for this run."""
        js = self.job
        return dict(policy=policy, cost=self.cost, spot_hours=self.paid[Mode.spot] / 3600.0,
                    ondemand_hours=self.paid[Mode.on_demand] / 3600.0,
                    finish_hour=None if self.finish is None else self.finish / 3600.0,
                    met_deadline=self.finish is not None and self.finish <= js.deadline,
                    preemptions=self.preemptions, changeovers=self.changeovers,
                    segments=[s for _, s in self.segments])


def simulate(job: DeadlineJob | JobSeconds, available: np.ndarray | Sequence[bool], gap: int,
             policy: Policy) -> DeadlineResult:
    """Run ``policy`` tick by tick; ``available`` starts at the job's submission (ticks past its end: no spot)."""
    js = job.seconds() if isinstance(job, DeadlineJob) else job
    avail = [bool(a) for a in available]
    policy.start(js, gap)
    # A policy that idles forever must not hang the simulator: past this it is reported unfinished.
    last_tick = (js.deadline + js.work + 2 * js.changeover) // gap + 2
    run = Tally(js)
    for tick in range(last_tick):
        here = avail[tick] if tick < len(avail) else False
        preempted = run.see(here)
        want = policy.act(Step(tick, tick * gap, gap, here, run.mode, run.done, run.overhead, preempted, js))
        if want is Mode.spot and not here:
            raise RuntimeError(f"policy {policy.name} asked for spot at tick {tick}, when none could be had")
        if run.advance(tick, gap, want):
            break
    return DeadlineResult(**run.result_fields(policy.name))


# --------------------------------------------------------------------------- baseline policies


def _ticks_up(seconds: int, gap: int) -> int:
    return -(-seconds // gap) * gap


def _ticks_down(seconds: int, gap: int) -> int:
    return (seconds // gap) * gap


class OnDemand:
    """The baseline: on-demand from start to finish."""

    name = "ondemand"

    def start(self, job: JobSeconds, gap: int) -> None:
        pass

    def act(self, step: Step) -> Mode:
        return Mode.on_demand


class Fixed:
    """A given schedule: one mode per tick (brute force, tests)."""

    def __init__(self, plan: Sequence[Mode], name: str = "fixed") -> None:
        self.plan, self.name = list(plan), name

    def start(self, job: JobSeconds, gap: int) -> None:
        pass

    def act(self, step: Step) -> Mode:
        return self.plan[step.tick] if step.tick < len(self.plan) else Mode.idle


def must_finish_now(step: Step, changeovers: int = 1) -> bool:
    """True when the time left, in whole ticks, no longer covers the work left plus ``changeovers`` changeovers.

    The last moment a fresh instance still finishes in time: from here a policy that is not
    already running past its changeover must run on-demand (the "safety net" of the paper).
    """
    gap = step.gap
    need = _ticks_up(step.work_left + changeovers * step.job.changeover, gap)
    return need >= _ticks_down(step.time_left, gap)


class Greedy:
    """Spot whenever it can be had; idle otherwise; on-demand once the slack is gone, to the end."""

    name = "greedy"

    def start(self, job: JobSeconds, gap: int) -> None:
        pass

    def act(self, step: Step) -> Mode:
        if must_finish_now(step):
            # Keep a spot instance that runs (its progress keeps pace with the clock); else on-demand.
            if step.mode is Mode.spot and step.overhead_left == 0:
                return Mode.spot
            return Mode.spot if step.job.changeover == 0 and step.available else Mode.on_demand
        return Mode.spot if step.available else Mode.idle


class UniformProgress:
    """*Can't Be Late*'s Uniform Progress, as the paper states it (§5, with its two refinements).

    Progress should keep up with the line ``work × elapsed / deadline``:
    spot whenever it can be had; when it cannot, on-demand only while the job is behind
    the line, idle while ahead. Hysteresis: on on-demand, the job stays there unless spot can
    be had and it is ahead of the line by two changeovers' worth (``(t + 2d) × C / D``).
    Safety net: with too little time left for the work and two changeovers, an idle or
    on-demand job goes (stays) on-demand; with too little for one, even a spot job whose
    instance is still starting moves to on-demand (a running spot instance is kept).
    """

    name = "uniform-progress"

    def start(self, job: JobSeconds, gap: int) -> None:
        pass

    def act(self, step: Step) -> Mode:
        job = step.job
        rate = job.work / job.deadline
        behind = step.done < step.elapsed * rate
        far_ahead = step.done > (step.elapsed + 2 * job.changeover) * rate
        want = Mode.spot if step.available else (Mode.on_demand if behind else Mode.idle)
        if step.mode is Mode.on_demand and (not step.available or not far_ahead):
            want = Mode.on_demand
        if step.mode is not Mode.spot and must_finish_now(step, changeovers=2):
            want = Mode.on_demand
        if must_finish_now(step):
            if step.mode is Mode.spot and step.overhead_left == 0:
                want = Mode.spot
            else:
                want = Mode.spot if job.changeover == 0 and step.available else Mode.on_demand
        return want


# --------------------------------------------------------------------------- the broker's own policy

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # the simulated submission time (policies take time as an argument)
CHECKPOINT_MINUTES = 1e-6  # the model keeps all progress at a preemption: the changeover is the only loss


def _sim_spec(job: JobSeconds) -> JobSpec:
    return JobSpec(name="simulated", gpu=["V100-16GB"], gpus=1, workload=Workload(hours=job.work / 3600.0),
                   interruptible=True, checkpoint_minutes=CHECKPOINT_MINUTES)


def _options(job: JobSeconds) -> list[QuoteOption]:
    """The quote the broker would hold: one spot and one on-demand option for the whole job."""
    hours = job.work / 3600.0

    def option(market: Market, price: float) -> QuoteOption:
        return QuoteOption(offer_id=f"sim:{market.value}", provider="sim", market=market, sku="sim", region="sim",
                           zone="sim", nodes=1, gpus_per_node=1, gpu="V100-16GB", fabric=Fabric.none, fabric_gbps=0.0,
                           usd_per_hour=price, expected_hours=hours, expected_cost_usd=price * hours,
                           interruptible=market is Market.spot)

    return [option(Market.spot, job.spot_price), option(Market.on_demand, job.ondemand_price)]


def _launch(cands: list[QuoteOption], available: bool) -> Mode:
    """Walk the candidates as the router does: a spot launch fails when the trace has no spot."""
    for o in cands:
        if o.market is Market.spot and available:
            return Mode.spot
        if o.market in (Market.on_demand, Market.reserved):
            return Mode.on_demand
    return Mode.idle  # every try failed: the job stays pending until the next pass


class FollowedMarket:
    """One availability series followed tick by tick: its model (from the history) and its present run.

    What ``policies.spot.spot_market`` computes from the whole series, kept incrementally (both
    engines, one zone or several, follow their markets through it).
    """

    def __init__(self, history: np.ndarray, gap: int, step_hours: float) -> None:
        start, end = model_span(len(history), gap)
        self.model = availability_model(history[start:end], gap, step_hours=step_hours)
        self.gap = gap
        self.up, self.run_ticks = current_run(history, gap)[0], 0
        if len(history):
            self.run_ticks = round(current_run(history, gap)[1] * 3600 / gap) + 1

    def see(self, available: bool) -> SpotMarket:
        # as policies.spot.spot_market computes it from the whole series, kept incrementally
        if available == self.up and self.run_ticks:
            self.run_ticks += 1
        else:
            self.up, self.run_ticks = available, 1
        return SpotMarket(self.model, self.up, (self.run_ticks - 1) * self.gap / 3600.0)


class Lockstep:
    """The broker's policy, through the same pure functions the live broker calls, at the same decision points.

    - A job waiting to be placed (at submission, after a preemption or a rebalance, and at every
      retry while it waits) goes through ``policies.placement.decide`` and ``candidates``,
      launched in order (spot fails when the trace has none) — the router's placement
      (``Router.place``).
    - A job running on on-demand is offered ``policies.placement.rebalance`` at every tick — the
      broker's rebalance step (``BrokerLoops.rebalance_running``); a move is break before make:
      the on-demand instance is given up and the job placed again at once (``decide``).
    - A running spot instance runs until the trace takes it.

    Inputs, as the broker passes them (``Router.situation``): the progress kept (``done_hours``),
    the market from ``policies.spot`` — its model from the availability history before the job's
    submission (``history``: the week before it, ``policies.spot.model_span``; none: the prior
    alone), its present (up or down, since when) from the same series up to now — the
    changeover as the restart time, and the tick as the decision interval.
    """

    name = "lockstep"

    def __init__(self, history: np.ndarray | Sequence[bool] = (), gap: int | None = None, *,
                 record: bool = False) -> None:
        self.history = np.asarray(history, dtype=bool)
        self.history_gap = gap
        # record: keep every call — (tick, "decide" or "rebalance", its situation, its decision) — for tests
        self.calls: list[tuple[int, str, Situation, Decision]] | None = [] if record else None

    def start(self, job: JobSeconds, gap: int) -> None:
        self.job, self.gap = job, gap
        self.spec = _sim_spec(job)
        self.options = _options(job)
        self.market = FollowedMarket(self.history, gap, plan_step_hours(job.deadline / 3600.0))
        self.restart_minutes = job.changeover / 60.0

    def situation(self, step: Step, market: SpotMarket) -> Situation:
        return Situation(now=EPOCH + timedelta(seconds=step.elapsed),
                         deadline=EPOCH + timedelta(seconds=self.job.deadline), done_hours=step.done / 3600.0,
                         spot_market=market, restart_minutes=self.restart_minutes,
                         decision_interval_hours=self.gap / 3600.0)

    def act(self, step: Step) -> Mode:
        market = self.market.see(step.available)
        if step.mode is Mode.spot:
            return Mode.spot
        situation = self.situation(step, market)
        if step.mode is Mode.on_demand:
            move = rebalance(self.spec, self.options, **situation)
            if self.calls is not None:
                self.calls.append((step.tick, "rebalance", situation, move))
            if not move.allow_spot:
                return Mode.on_demand
            # released: placed again at once, as a pending job
        decision = decide(self.spec, self.options, max_queue_wait_hours=4.0, **situation)
        if self.calls is not None:
            self.calls.append((step.tick, "decide", situation, decision))
        return _launch(candidates(self.options, decision), step.available)


# --------------------------------------------------------------------------- the exact optimum


def optimal(job: DeadlineJob | JobSeconds, available: np.ndarray | Sequence[bool], gap: int, *,
            split: bool = True) -> DeadlineResult:
    """The cheapest schedule that meets the deadline, knowing the whole trace (exact).

    Dynamic programming over ticks × where the job runs × *time lost so far*: at tick ``t`` a job
    that made progress ``P`` has lost ``u = t × gap − P`` seconds to idling and changeovers, and
    it can still finish in time only while ``u ≤ deadline − work`` (the slack): a job finishes
    after ``work + u`` seconds. Running a tick keeps ``u``; idling adds ``gap``; a start adds the
    changeover, taken as one move over its ``k = ceil(changeover / gap)`` ticks (at least one: an
    omniscient schedule never starts a spot instance that is lost before it makes progress), and
    stopping is free. ``u`` moves on a lattice of ``gcd(gap, changeover)`` seconds, so each tick
    holds ``slack / lattice + 1`` states per mode. ``split`` also carries the seconds paid on the
    way, which divides the cost into spot and on-demand hours (the cost alone needs less work).
    """
    js = job.seconds() if isinstance(job, DeadlineJob) else job
    C, D, d = js.work, js.deadline, js.changeover
    ticks = -(-D // gap)
    avail = np.zeros(ticks, dtype=bool)
    given = np.asarray(available, dtype=bool)[:ticks]
    avail[:len(given)] = given
    run = np.zeros(ticks + 1, dtype=np.int64)  # run[t]: consecutive available ticks from t on
    for t in range(ticks - 1, -1, -1):
        run[t] = run[t + 1] + 1 if avail[t] else 0
    g = math.gcd(gap, d) if d else gap
    W = (D - C) // g + 1  # states u = 0 .. slack, in lattice units
    G, Dd = gap // g, d // g
    k = max(1, -(-d // gap))
    per_s = np.array([0.0, js.spot_price / 3600.0, js.ondemand_price / 3600.0])
    u_sec = np.arange(W, dtype=np.int64) * g
    inf = np.inf
    # layer t: cost (and paid seconds), shape (3, W): idle, spot running, on-demand running. A move
    # reaches at most k ticks ahead, so layers t .. t+k are kept in a ring of k+1 (unreached: inf).
    R = k + 1
    ring_cost = np.full((R, 3, W), inf)
    ring_paid = np.zeros((R, 3, W)) if split else None

    def relax(t: int, rows: slice, lo: int, cost: np.ndarray, paid: np.ndarray | None) -> None:
        """Offer ``cost`` (and ``paid``) to states ``u = lo, lo+1, …`` of the modes ``rows`` at tick ``t``."""
        n = min(cost.shape[-1], W - lo)
        if n <= 0:
            return
        cur = ring_cost[t % R, rows, lo:lo + n]
        if ring_paid is None or paid is None:
            np.minimum(cur, cost[..., :n], out=cur)
            return
        better = cost[..., :n] < cur
        tp = ring_paid[t % R, rows, lo:lo + n]
        np.copyto(cur, cost[..., :n], where=better)
        np.copyto(tp, np.broadcast_to(paid[..., :n], tp.shape), where=better)

    best = [inf, 0.0, 0]  # cost, paid seconds, finish second

    def finish(t: int, cost: np.ndarray, paid: np.ndarray | None, hi: int, rate: float, lead: int,
               ok: np.ndarray | None = None) -> None:
        """States ``u ≤ hi`` finish in this move: ``lead`` seconds of changeover, then the work left."""
        n = min(hi + 1, W)
        if n <= 0:
            return
        u = u_sec[:n]
        rest = C - (t * gap - u) + lead  # seconds paid in this move
        fits = u + lead <= D - C  # done at work + u + lead
        if ok is not None:
            fits &= ok
        total = np.where(fits, cost[:n] + rate * rest, inf)
        i = int(np.argmin(total))
        if total[i] < best[0]:
            best[:] = [float(total[i]), float((paid[i] if paid is not None else 0.0) + rest[i]), int(C + u[i] + lead)]

    ring_cost[0, 0, 0] = 0.0
    cols = np.arange(W)
    step_on = per_s * gap  # a tick of running, per mode
    step_off = step_on.copy()
    step_off[1] = inf  # a spot instance is lost at this tick: it can only stop
    start_on = per_s * k * gap  # a start (k ticks), per mode
    start_off = start_on.copy()
    start_off[1] = inf
    steps_col = {True: step_on[1:, None], False: step_off[1:, None]}
    starts_col = {True: start_on[1:, None], False: start_off[1:, None]}
    for t in range(ticks):
        cost = ring_cost[t % R]
        paid = ring_paid[t % R] if ring_paid is not None else None
        if paid is None:
            free, free_paid = cost.min(axis=0), None
        else:
            pick = cost.argmin(axis=0)
            free, free_paid = cost[pick, cols], paid[pick, cols]
        if free.min() == inf:  # nothing reached this tick (costs are never NaN)
            continue
        spot_ok = bool(avail[t])
        step = step_on if spot_ok else step_off
        if t + 1 < ticks:
            relax(t + 1, slice(0, 1), G, free[None, :], None if free_paid is None else free_paid[None, :])
        # keep running: the job is done within this tick for u ≤ fin
        fin = (t * gap + gap - C) // g
        if fin >= 0:
            for m in (1, 2):
                if np.isfinite(step[m]):
                    finish(t, cost[m], None if paid is None else paid[m], fin, per_s[m], 0)
        keep = max(fin + 1, 0)
        if t + 1 < ticks and keep < W:
            relax(t + 1, slice(1, 3), keep, cost[1:, keep:] + steps_col[spot_ok],
                  None if paid is None else paid[1:, keep:] + gap)
        # start an instance (k ticks, u grows by the changeover); done within the start for u ≤ fin
        fin = (t * gap + k * gap - d - C) // g
        if fin >= 0:
            if spot_ok:
                n = min(fin + 1, W)
                need = -(-(d + C - (t * gap - u_sec[:n])) // gap)  # ticks of spot the finish uses
                finish(t, free, free_paid, fin, per_s[1], d, ok=run[t] >= need)
            finish(t, free, free_paid, fin, per_s[2], d)
        keep = max(fin + 1, 0)
        if t + k < ticks and keep < W - Dd:
            relax(t + k, slice(1, 3), keep + Dd, free[None, keep:W - Dd] + starts_col[spot_ok and bool(run[t] >= k)],
                  None if free_paid is None else np.broadcast_to(free_paid[keep:] + k * gap, (2, W - keep)))
        # this tick's layer is done: it is tick t+R's now
        cost.fill(inf)
        if paid is not None:
            paid.fill(0.0)
    best_cost, best_paid, best_end = best
    if not math.isfinite(best_cost):
        return DeadlineResult("optimal", math.inf, 0.0, 0.0, None, False, preemptions=None)
    p, q = js.spot_price, js.ondemand_price
    spot_s = od_s = math.nan
    if split:  # cost = (p × spot + q × on-demand) / 3600 and paid = spot + on-demand
        spot_s = min(max((q * best_paid - 3600.0 * best_cost) / (q - p), 0.0), best_paid) if q != p else 0.0
        od_s = best_paid - spot_s
    starts = round((best_paid - C) / d) if d else 0  # every start pays one changeover
    return DeadlineResult("optimal", best_cost, spot_s / 3600.0, od_s / 3600.0, best_end / 3600.0, True,
                          preemptions=None, changeovers=starts)


# --------------------------------------------------------------------------- registry

def make_policy(name: str, history: np.ndarray | Sequence[bool] = (), gap: int | None = None) -> Policy:
    """A fresh policy by name; ``history``: the trace before the job's submission (what lockstep learns from)."""
    if name == "lockstep":
        return Lockstep(history, gap)
    return POLICIES[name]()


POLICIES: dict[str, Callable[[], Policy]] = {
    "ondemand": OnDemand,
    "greedy": Greedy,
    "uniform-progress": UniformProgress,
}
POLICY_NAMES = ("ondemand", "greedy", "uniform-progress", "lockstep", "optimal")


def run_deadline(trace: SpotTrace, job: DeadlineJob, policy: str, start_hour: float = 0.0) -> DeadlineResult:
    """One job submitted ``start_hour`` hours into ``trace``, under ``policy`` (a name of POLICY_NAMES).

    The trace must cover the job's whole window (submission to deadline); the part before the
    submission is the history ``lockstep`` learns the market from.
    """
    job.validate()
    if policy not in POLICY_NAMES:
        raise SpecError("--policy", f"unknown policy {policy!r} (one of {', '.join(POLICY_NAMES)})")
    if not math.isfinite(start_hour) or start_hour < 0:
        raise SpecError("--start-hour", f"must be zero or more, not {start_hour:g}")
    if start_hour + job.deadline_hours > trace.hours + 1e-9:
        raise SpecError("--deadline-hours", f"the trace covers {trace.hours:.2f} h; a job submitted at hour "
                                            f"{start_hour:g} with a {job.deadline_hours:g} h deadline runs past it")
    first = int(start_hour * 3600 // trace.gap_seconds)
    window = trace.available[first:]
    if policy == "optimal":
        return optimal(job, window, trace.gap_seconds)
    return simulate(job, window, trace.gap_seconds, make_policy(policy, trace.available[:first], trace.gap_seconds))
