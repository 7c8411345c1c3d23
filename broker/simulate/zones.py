"""One deadline job over several spot markets at once: zones or regions, one availability trace each.

The single-zone setting of :mod:`broker.simulate.deadline`, widened: at every tick the policy
chooses a mode (idle, spot, on-demand) *and a zone*. Spot runs only where that zone's trace has
it; on-demand runs anywhere. The job's checkpoint (and its data) lies where it last ran — at
first in its home zone — and a start anywhere else pays a :class:`Migration` on top of the
changeover: the time to move data and checkpoint (size over the link's speed), during which
the new instance is paid and the job makes no progress, and the egress price of the bytes.

All times are whole seconds, as in the single-zone engine; :func:`optimal_zones` is the exact,
omniscient optimum over every zone (checked against brute force through :func:`simulate_zones`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import numpy as np

from broker.errors import SpecError
from broker.simulate.deadline import (
    EPOCH,
    DeadlineJob,
    DeadlineResult,
    FollowedMarket,
    JobSeconds,
    Mode,
    Segment,
    Tally,
    _launch,
    _options,
    _sim_spec,
)
from broker.simulate.traces import SpotTrace
from policies.placement import Situation, candidates, decide, rebalance
from policies.spot import SpotMarket, plan_step_hours, spot_zone_move


@dataclass(frozen=True)
class Migration:
    """What moving a job to another zone costs beyond a changeover: ``seconds`` of transfer, ``usd`` of egress."""

    seconds: int = 0
    usd: float = 0.0

    @classmethod
    def of(cls, size_gb: float, egress_usd_per_gb: float, transfer_gbps: float) -> Migration:
        """From the job's data and checkpoint size, the egress price and the link's speed (gigabits a second)."""
        for option, value in (("--data-gb", size_gb), ("--egress-usd-per-gb", egress_usd_per_gb)):
            if not math.isfinite(value) or value < 0:
                raise SpecError(option, f"must be zero or more, not {value:g}")
        if not math.isfinite(transfer_gbps) or transfer_gbps <= 0:
            raise SpecError("--transfer-gbps", f"must be a positive speed, not {transfer_gbps:g}")
        return cls(seconds=round(size_gb * 8.0 / transfer_gbps), usd=size_gb * egress_usd_per_gb)

    @property
    def hours(self) -> float:
        return self.seconds / 3600.0


@dataclass(frozen=True)
class ZoneStep:
    """What a policy knows at the start of a tick, over every zone."""

    tick: int
    elapsed: int
    gap: int
    available: tuple[bool, ...]  # per zone: spot can be had this tick
    mode: Mode
    zone: int  # where the job runs now, or (idle) where its checkpoint lies
    done: int
    overhead_left: int
    preempted: bool
    job: JobSeconds
    migration: Migration

    @property
    def work_left(self) -> int:
        return self.job.work - self.done


class ZonePolicy(Protocol):
    name: str

    def start(self, job: JobSeconds, gap: int, migration: Migration, zones: int) -> None: ...

    def act(self, step: ZoneStep) -> tuple[Mode, int]: ...


@dataclass
class ZoneResult(DeadlineResult):
    moves: int = 0  # starts in a zone other than the checkpoint's
    zone_segments: list[tuple[int, Segment]] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "moves": self.moves}


def aligned(traces: Sequence[SpotTrace], option: str = "--trace") -> tuple[np.ndarray, int]:
    """The traces as one ``(zones, ticks)`` array, cut to the shortest; they must share their tick."""
    if not traces:
        raise SpecError(option, "give at least one trace")
    gaps = {t.gap_seconds for t in traces}
    if len(gaps) > 1:
        raise SpecError(option, f"the traces must share one tick to be aligned in time, not {sorted(gaps)} s")
    n = min(len(t.available) for t in traces)
    return np.stack([t.available[:n] for t in traces]), gaps.pop()


def simulate_zones(job: DeadlineJob | JobSeconds, available: np.ndarray, gap: int, policy: ZonePolicy,
                   migration: Migration = Migration(), home: int = 0) -> ZoneResult:
    """Run ``policy`` tick by tick over ``available`` (zones × ticks, from the job's submission)."""
    js = job.seconds() if isinstance(job, DeadlineJob) else job
    avail = np.asarray(available, dtype=bool)
    Z = avail.shape[0]
    policy.start(js, gap, migration, Z)
    last_tick = (js.deadline + js.work + 2 * (js.changeover + migration.seconds)) // gap + 2
    run = Tally(js, zone=home)
    for tick in range(last_tick):
        here = tuple(bool(avail[z, tick]) if tick < avail.shape[1] else False for z in range(Z))
        preempted = run.see(here[run.zone])
        want, where = policy.act(ZoneStep(tick, tick * gap, gap, here, run.mode, run.zone, run.done, run.overhead,
                                          preempted, js, migration))
        if want is Mode.spot and not here[where]:
            raise RuntimeError(f"policy {policy.name} asked for spot in zone {where} at tick {tick}, when none "
                               "could be had")
        if run.advance(tick, gap, want, where, migration.seconds, migration.usd):
            break
    return ZoneResult(**run.result_fields(policy.name), moves=run.moves, zone_segments=run.segments)


class FixedZones:
    """A given schedule: one (mode, zone) per tick (brute force, tests)."""

    def __init__(self, plan: Sequence[tuple[Mode, int]], name: str = "fixed") -> None:
        self.plan, self.name = list(plan), name

    def start(self, job: JobSeconds, gap: int, migration: Migration, zones: int) -> None:
        pass

    def act(self, step: ZoneStep) -> tuple[Mode, int]:
        return self.plan[step.tick] if step.tick < len(self.plan) else (Mode.idle, step.zone)


class LockstepZones:
    """The broker's policy across zones: the single-zone ``decide`` / ``rebalance`` / ``candidates`` on the market
    where the job's checkpoint lies, and a move to another zone's spot where it beats what that plan chose.

    - The plan runs as in one zone, on the checkpoint's zone (its model from that zone's history,
      its present).
    - Where the plan would run on-demand (start it, or stay on it) or wait, a spot start in another
      zone is weighed against that choice by ``policies.spot.spot_zone_move`` (pure; the live
      router can call it alike): no move while waiting is free (the home outage is expected to end
      within the slack), none that does not cost less than on-demand per hour of progress, and,
      when it gives up a running on-demand instance or a wait, none that the remote zone's own
      plan would not start. No move: the plan's choice where the checkpoint is.
    - A running spot instance is kept.
    """

    name = "lockstep-zones"

    def __init__(self, histories: Sequence[np.ndarray] | np.ndarray, gap: int | None = None) -> None:
        self.histories = [np.asarray(h, dtype=bool) for h in histories]

    def start(self, job: JobSeconds, gap: int, migration: Migration, zones: int) -> None:
        self.job, self.gap, self.migration = job, gap, migration
        self.spec, self.options = _sim_spec(job), _options(job)
        step_h = plan_step_hours(job.deadline / 3600.0)
        hist = self.histories or [np.zeros(0, dtype=bool)] * zones
        self.zones = [FollowedMarket(h, gap, step_h) for h in hist]

    def act(self, step: ZoneStep) -> tuple[Mode, int]:
        markets = [m.see(a) for m, a in zip(self.zones, step.available, strict=True)]
        if step.mode is Mode.spot:
            return Mode.spot, step.zone
        situation = Situation(now=EPOCH + timedelta(seconds=step.elapsed),
                              deadline=EPOCH + timedelta(seconds=self.job.deadline), done_hours=step.done / 3600.0,
                              spot_market=markets[step.zone], restart_minutes=self.job.changeover / 60.0,
                              decision_interval_hours=self.gap / 3600.0)
        if step.mode is Mode.on_demand:
            if not rebalance(self.spec, self.options, **situation).allow_spot:
                return self._instead_of_on_demand(step, markets)
        decision = decide(self.spec, self.options, max_queue_wait_hours=4.0, **situation)
        mode = _launch(candidates(self.options, decision), step.available[step.zone])
        if mode is Mode.on_demand:
            return self._instead_of_on_demand(step, markets)
        if mode is Mode.idle:
            return self._elsewhere(step, markets, "wait", mode)
        return mode, step.zone

    def _instead_of_on_demand(self, step: ZoneStep, markets: list[SpotMarket]) -> tuple[Mode, int]:
        """On-demand where the checkpoint is, or spot elsewhere where a progress hour costs less."""
        return self._elsewhere(step, markets, "on-demand", Mode.on_demand)

    def _elsewhere(self, step: ZoneStep, markets: list[SpotMarket], plan: str, mode: Mode) -> tuple[Mode, int]:
        """The plan's ``mode`` where the checkpoint is, or spot in the zone ``spot_zone_move`` picks."""
        job = self.job
        move = spot_zone_move(markets, here=step.zone, plan=plan, running_on_demand=step.mode is Mode.on_demand,
                              hours_left=(job.deadline - step.elapsed) / 3600.0,
                              work_left_hours=step.work_left / 3600.0, changeover_hours=job.changeover / 3600.0,
                              migration_hours=self.migration.hours, migration_usd=self.migration.usd,
                              spot_usd_per_hour=job.spot_price, ondemand_usd_per_hour=job.ondemand_price,
                              decision_interval_hours=self.gap / 3600.0)
        # spot_zone_move only names a zone its market shows up, which is this tick's trace; kept as a guard
        if move.zone is not None and step.available[move.zone]:
            return Mode.spot, move.zone
        return mode, step.zone


class OneZone:
    """A single-zone policy of :mod:`broker.simulate.deadline` on the home zone's trace alone (the baseline)."""

    def __init__(self, policy: Any, zone: int = 0) -> None:
        self.policy, self.zone, self.name = policy, zone, policy.name

    def start(self, job: JobSeconds, gap: int, migration: Migration, zones: int) -> None:
        self.policy.start(job, gap)

    def act(self, step: ZoneStep) -> tuple[Mode, int]:
        from broker.simulate.deadline import Step

        mode = self.policy.act(Step(step.tick, step.elapsed, step.gap, step.available[self.zone], step.mode,
                                    step.done, step.overhead_left, step.preempted, step.job))
        return mode, self.zone


# --------------------------------------------------------------------------- the exact optimum


def optimal_zones(job: DeadlineJob | JobSeconds, available: np.ndarray, gap: int,
                  migration: Migration = Migration(), home: int = 0) -> ZoneResult:
    """The cheapest schedule over every zone that meets the deadline, knowing every trace (exact).

    :func:`broker.simulate.deadline.optimal`'s dynamic programme, with the zone in the state: at
    tick ``t``, per mode (idle, spot, on-demand) and zone (where it runs, or idle: where its
    checkpoint lies), the least cost per *time lost so far* ``u``. Running keeps ``u``; idling adds a
    tick; stopping is free; a start in the checkpoint's zone adds the changeover, anywhere else
    the changeover plus the migration (and pays the egress), taken as one move over its
    ``ceil(overhead / gap)`` ticks — spot only where the trace has it for all of them. ``u`` moves on
    a lattice of ``gcd(gap, changeover, migration)`` seconds.
    """
    js = job.seconds() if isinstance(job, DeadlineJob) else job
    C, D, d = js.work, js.deadline, js.changeover
    given = np.asarray(available, dtype=bool)
    Z = given.shape[0]
    ticks = -(-D // gap)
    avail = np.zeros((Z, ticks), dtype=bool)
    n_given = min(ticks, given.shape[1])
    avail[:, :n_given] = given[:, :n_given]
    run = np.zeros((Z, ticks + 1), dtype=np.int64)  # run[z, t]: consecutive spot ticks in z from t on
    for t in range(ticks - 1, -1, -1):
        run[:, t] = np.where(avail[:, t], run[:, t + 1] + 1, 0)
    g = math.gcd(gap, d, migration.seconds)
    W = (D - C) // g + 1
    G = gap // g
    price = np.array([0.0, js.spot_price / 3600.0, js.ondemand_price / 3600.0])
    # the two kinds of start: (overhead seconds, egress USD); a start in the checkpoint's zone, or elsewhere
    starts = [(d, 0.0), (d + migration.seconds, migration.usd)]
    ks = [max(1, -(-o // gap)) for o, _ in starts]
    R = max(ks) + 1
    ring = np.full((R, 3, Z, W), np.inf)
    ring[0, 0, home, 0] = 0.0
    u_sec = np.arange(W, dtype=np.int64) * g
    best = math.inf
    best_end = 0

    def relax(t: int, m: int, z: int, lo: int, cost: np.ndarray) -> None:
        n = min(len(cost), W - lo)
        if n > 0:
            cur = ring[t % R, m, z, lo:lo + n]
            np.minimum(cur, cost[:n], out=cur)

    def finish(cost: np.ndarray, hi: int, rest: np.ndarray, lead: int, rate: float,
               ok: np.ndarray | None = None) -> None:
        nonlocal best, best_end
        n = min(hi + 1, W, len(cost))
        if n <= 0:
            return
        fits = u_sec[:n] + lead <= D - C
        if ok is not None:
            fits &= ok[:n]
        total = np.where(fits, cost[:n] + rate * rest[:n], np.inf)
        i = int(np.argmin(total))
        if total[i] < best:
            best, best_end = float(total[i]), int(C + u_sec[i] + lead)

    for t in range(ticks):
        layer = ring[t % R]
        free = layer.min(axis=0)  # (Z, W): stopping is free, and leaves the checkpoint where it ran
        if not np.isfinite(free).any():
            layer.fill(np.inf)
            continue
        done_by = t * gap - u_sec  # progress at tick t for each u
        if t + 1 < ticks:
            for z in range(Z):
                relax(t + 1, 0, z, G, free[z])
        # keep running through this tick
        fin = (t * gap + gap - C) // g
        keep = max(fin + 1, 0)
        for m in (1, 2):
            for z in range(Z):
                if m == 1 and not avail[z, t]:
                    continue
                if fin >= 0:
                    finish(layer[m, z], fin, C - done_by, 0, price[m])
                if t + 1 < ticks and keep < W:
                    relax(t + 1, m, z, keep, layer[m, z, keep:] + price[m] * gap)
        # start somewhere: from the zone's own checkpoint, or from the cheapest checkpoint anywhere
        anywhere = free.min(axis=0)
        for kind, ((over, usd), k) in enumerate(zip(starts, ks, strict=True)):
            Dd = over // g
            fin = (t * gap + k * gap - over - C) // g
            keep = max(fin + 1, 0)
            rest = C - done_by + over
            for z in range(Z):
                src = free[z] if kind == 0 else anywhere
                if not np.isfinite(src).any():
                    continue
                for m in (1, 2):
                    if m == 1 and not avail[z, t]:
                        continue
                    if fin >= 0:
                        ok = None
                        if m == 1:
                            n = min(fin + 1, W)
                            need = -(-(over + C - done_by[:n]) // gap)
                            ok = run[z, t] >= need
                        finish(src + usd, fin, rest, over, price[m], ok)
                    if t + k < ticks and keep < W - Dd and (m == 2 or run[z, t] >= k):
                        relax(t + k, m, z, keep + Dd, src[keep:W - Dd] + usd + price[m] * k * gap)
        layer.fill(np.inf)
    if not math.isfinite(best):
        return ZoneResult("optimal-zones", math.inf, 0.0, 0.0, None, False, preemptions=None)
    return ZoneResult("optimal-zones", best, math.nan, math.nan, best_end / 3600.0, True, preemptions=None)


ZONE_POLICY_NAMES = ("greedy", "uniform-progress", "lockstep", "optimal")


def run_deadline_zones(traces: Sequence[SpotTrace], job: DeadlineJob, policy: str, migration: Migration,
                       start_hour: float = 0.0) -> ZoneResult:
    """One job over several zones' traces (aligned in time; the first is the job's home), under ``policy``.

    ``lockstep`` and ``optimal`` may move the job between zones; ``greedy`` and
    ``uniform-progress`` stay in the home zone (the single-zone baselines).
    """
    from broker.simulate.deadline import POLICIES

    job.validate()
    if policy not in ZONE_POLICY_NAMES:
        raise SpecError("--policy", f"unknown policy {policy!r} across zones (one of {', '.join(ZONE_POLICY_NAMES)})")
    avail, gap = aligned(traces)
    hours = avail.shape[1] * gap / 3600.0
    if not math.isfinite(start_hour) or start_hour < 0:
        raise SpecError("--start-hour", f"must be zero or more, not {start_hour:g}")
    if start_hour + job.deadline_hours > hours + 1e-9:
        raise SpecError("--deadline-hours", f"the traces cover {hours:.2f} h together; a job submitted at hour "
                                            f"{start_hour:g} with a {job.deadline_hours:g} h deadline runs past it")
    first = int(start_hour * 3600 // gap)
    window = avail[:, first:]
    if policy == "optimal":
        return optimal_zones(job, window, gap, migration)
    chosen: ZonePolicy
    if policy == "lockstep":
        chosen = LockstepZones(avail[:, :first], gap)
    else:
        chosen = OneZone(POLICIES[policy]())
    return simulate_zones(job, window, gap, chosen, migration)
