"""Rent, hybrid or own? Costs per year of each, from the GPU-hours a team really used.

Usage comes from the store's job history (each job's allocations: when they ran, on how many
GPUs), from a pod trace, or from a stated load (GPU-hours a week and the peak: ``usage_from_weekly``);
prices from the bundled catalog through the broker's own ranking, for one node of ``gpus_per_node``
GPUs of the model; owned-hardware costs from the configuration (:class:`providers.slurm.config.OwnedCost`:
capex per node, lifetime, power, PUE, electricity, operations).

Three plans, each priced per year at the observed load (scaled from the observed span):

- **rent**: every GPU-hour in the cloud — spot for work that tolerates preemption, reserved for
  the steady base load when a reservation is cheaper than on-demand, on-demand for the rest;
- **hybrid**: own the number of nodes that makes the total cheapest (at least one, fewer than
  the peak needs) and rent what exceeds them;
- **own for peak**: own enough nodes for the highest hourly load, rent nothing.

Owned GPUs cost their amortised capex and operations every hour, used or not, and power when
used. The break-even utilisation is where an owned GPU-hour in use costs what renting it does;
the break-even time is how long the capex takes to be paid back by what owning saves at the
utilisation the plan's pool would have. The recommendation is the cheapest plan, checked
against the rules of thumb in the design notes; where the numbers disagree with a rule, the
answer says why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from broker.errors import SpecError
from broker.models import JobSpec, Market, QuoteOption, Workload, as_utc
from broker.simulate.cluster import EPOCH, catalog_book, cloud_rates, owned_rates
from broker.simulate.traces import Pod
from policies.ranking import quote
from providers.slurm.config import OwnedCost

HOURS_PER_YEAR = 8766.0
BIN_HOURS = 0.25  # load profile resolution
RESERVED_DISCOUNT = 0.4  # a 1-year reservation vs on-demand of the same provider (AWS: about 40% off)
RESERVABLE = ("aws",)  # providers that sell reservations; the catalog holds their on-demand price
SPOT_OVERHEAD = 0.0208  # the ranking's expected preemption overhead on spot (billed hours per hour of work)
# The design notes' rules of thumb
RENT_BELOW_GPU_HOURS_PER_WEEK = 1000.0
OWN_ABOVE_GPU_HOURS_PER_WEEK = 5000.0
ONPREM_PAYS_ABOVE_UTILISATION = 0.70
BREAK_EVEN_YEARS = (3.0, 4.0)


@dataclass(frozen=True)
class Interval:
    start_h: float
    end_h: float
    gpus: int
    interruptible: bool = False


@dataclass
class Usage:
    """GPU load over an observed span: a profile of GPUs in use per bin."""

    source: str
    span_hours: float
    gpu_hours: float
    interruptible_gpu_hours: float
    profile: np.ndarray  # mean GPUs in use per BIN_HOURS bin

    @property
    def gpu_hours_per_week(self) -> float:
        return self.gpu_hours / self.span_hours * 168.0 if self.span_hours > 0 else 0.0

    @property
    def peak_gpus(self) -> float:
        """The highest hourly load (GPUs in use, averaged over an hour)."""
        per_hour = max(1, round(1.0 / BIN_HOURS))
        n = len(self.profile) // per_hour * per_hour
        hourly = self.profile[:n].reshape(-1, per_hour).mean(axis=1) if n else self.profile
        return float(hourly.max()) if len(hourly) else 0.0


def usage_from_intervals(intervals: Iterable[Interval], source: str, until_h: float | None = None) -> Usage:
    """Build the load profile from run intervals (hours from any common origin).

    The span runs from the first start to the last end, or to ``until_h`` (now, for a history:
    quiet hours since the last job count as unused).
    """
    items = [i for i in intervals if i.end_h > i.start_h and i.gpus > 0]
    if not items:
        raise SpecError("usage", f"{source}: no GPU-hours to advise on")
    t0 = min(i.start_h for i in items)
    t1 = max(max(i.end_h for i in items), until_h if until_h is not None else -math.inf)
    bins = max(1, math.ceil((t1 - t0) / BIN_HOURS))
    load = np.zeros(bins + 1)
    gpu_hours = interruptible = 0.0
    for i in items:
        hours = i.end_h - i.start_h
        gpu_hours += hours * i.gpus
        interruptible += hours * i.gpus if i.interruptible else 0.0
        # spread the interval over the bins it covers, in proportion to the overlap
        a, b = (i.start_h - t0) / BIN_HOURS, (i.end_h - t0) / BIN_HOURS
        ia, ib = int(a), int(b)
        if ia == ib:
            load[ia] += (b - a) * i.gpus
        else:
            load[ia] += (ia + 1 - a) * i.gpus
            load[ia + 1:ib] += i.gpus
            load[ib] += (b - ib) * i.gpus
    return Usage(source, bins * BIN_HOURS, gpu_hours, interruptible, load[:bins])


def usage_from_pods(pods: Sequence[Pod], source: str = "pod trace") -> Usage:
    """A pod trace: each pod runs from its arrival for its run time; QoS ``BE`` tolerates preemption."""
    return usage_from_intervals((Interval(p.arrival_s / 3600.0, (p.arrival_s + p.duration_s) / 3600.0, p.gpus,
                                          p.qos == "BE") for p in pods), source)


WEEK_HOURS = 168.0


def usage_from_weekly(gpu_hours_per_week: float, peak_gpus: int) -> Usage:
    """A stated load (about N GPU-hours a week, peaking at P GPUs) as one week's profile, for the question
    asked before there is a history or a trace.

    Only the total and the peak are known, so the load-duration curve is the simplest one with both: it falls
    in a straight line from the peak, to zero when the mean is at most half the peak (the load is off the rest
    of the week), else to the floor that keeps the mean (2 × mean − peak, always on). The first hour is at the
    peak; the rest is scaled so the week holds exactly N GPU-hours. Nothing is assumed to tolerate preemption.
    """
    weekly, peak = float(gpu_hours_per_week), int(peak_gpus)
    if not (math.isfinite(weekly) and weekly > 0):
        raise SpecError("--gpu-hours-per-week", f"must be a positive number, not {gpu_hours_per_week:g}")
    if peak < 1:
        raise SpecError("--peak-gpus", f"must be at least 1, not {peak_gpus}")
    if weekly > peak * WEEK_HOURS:
        raise SpecError("--gpu-hours-per-week", f"{weekly:g} is more than --peak-gpus {peak} all week "
                        f"({peak * WEEK_HOURS:g} GPU-hours)")
    if weekly < peak:
        raise SpecError("--gpu-hours-per-week", f"{weekly:g} is less than one hour at --peak-gpus {peak}")
    mean = weekly / WEEK_HOURS
    bins = round(WEEK_HOURS / BIN_HOURS)
    x = (np.arange(bins) + 0.5) / bins  # the share of the week, at each bin's middle
    if mean <= peak / 2:
        on = 2 * mean / peak  # the share of the week the load is on
        profile = np.where(x < on, peak * (1 - x / on), 0.0)
    else:
        floor = 2 * mean - peak
        profile = peak - (peak - floor) * x
    first = max(1, round(1.0 / BIN_HOURS))
    profile[:first] = peak
    rest = float(profile[first:].sum() * BIN_HOURS)
    if rest > 0:
        profile[first:] = np.clip(profile[first:] * (weekly - peak * first * BIN_HOURS) / rest, 0, peak)
    return Usage("stated load", WEEK_HOURS, float(profile.sum() * BIN_HOURS), 0.0, profile)


def usage_from_history(usage_rows: Sequence[dict[str, Any]], allocations: Sequence[Any],
                       interruptible_jobs: set[str], now: datetime) -> Usage:
    """The store's history: every allocation that reached a provider, on its job's GPUs.

    ``usage_rows``: ``Store.job_usage()``; ``allocations``: ``Store.allocations()``; an allocation
    runs from its creation to its last update once ended, to ``now`` while live.
    """
    gpus = {r["job_id"]: int(r["gpus"]) for r in usage_rows}
    live = {"pending", "running"}
    intervals = []
    for a in allocations:
        state = a.state.value if hasattr(a.state, "value") else str(a.state)
        if state == "intent" or a.job_id not in gpus:
            continue
        start = as_utc(a.created_at).timestamp() / 3600.0
        end = (as_utc(now) if state in live else as_utc(a.updated_at)).timestamp() / 3600.0
        intervals.append(Interval(start, end, gpus[a.job_id], a.job_id in interruptible_jobs))
    return usage_from_intervals(intervals, "job history", until_h=as_utc(now).timestamp() / 3600.0)


@dataclass(frozen=True)
class Prices:
    """USD per GPU-hour for the model, renting one node of ``gpus_per_node``."""

    gpu: str
    on_demand: float
    on_demand_offer: str
    spot: float | None
    spot_offer: str | None
    reserved: float | None
    reserved_basis: str | None


def catalog_prices(gpu: str, gpus_per_node: int) -> Prices:
    """The ranking's cheapest on-demand and spot options for a node of this model, per GPU-hour."""
    od_rates = cloud_rates(gpu, gpus_per_node, False)
    spot_rates = cloud_rates(gpu, gpus_per_node, True)
    od = od_rates[Market.on_demand]
    spot = spot_rates.get(Market.spot)
    reserved = reserved_basis = None
    reservable = [o for o in cloud_rates_all(gpu, gpus_per_node) if o.provider in RESERVABLE]
    if reservable:
        base = min(reservable, key=lambda o: o.usd_per_hour)
        reserved = base.usd_per_hour * (1 - RESERVED_DISCOUNT) / gpus_per_node
        reserved_basis = f"{base.provider} {base.sku} on-demand × {1 - RESERVED_DISCOUNT:g}"
    return Prices(gpu, od.usd_per_hour / gpus_per_node, f"{od.provider} {od.sku}",
                  None if spot is None else spot.usd_per_hour * (1 + SPOT_OVERHEAD) / gpus_per_node,
                  None if spot is None else f"{spot.provider} {spot.sku}", reserved, reserved_basis)


def cloud_rates_all(gpu: str, gpus: int) -> list[QuoteOption]:
    """Every on-demand option the ranking gives for a node of this model (for the reservable ones)."""
    spec = JobSpec(name="advise", gpu=[gpu], gpus=gpus, workload=Workload(hours=1.0))
    return [o for o in quote(catalog_book(), spec, now=EPOCH, top=200).options if o.market is Market.on_demand]


@dataclass
class Plan:
    name: str
    usd_per_year: float
    owned_gpus: int
    owned_utilisation: float | None
    rented_gpu_hours_per_year: float
    detail: dict[str, float] = field(default_factory=dict)


def _rent_cost(load: np.ndarray, interruptible_share: float, prices: Prices, scale: float) -> tuple[float, dict]:
    """Renting a load profile (GPUs per bin): reserved base when cheaper, spot for interruptible work."""
    gpu_hours = float(load.sum() * BIN_HOURS)
    base = float(np.percentile(load, 10)) if len(load) else 0.0  # present 90% of the time
    reserved_gpus = 0.0
    detail: dict[str, float] = {}
    if prices.reserved is not None and prices.reserved < prices.on_demand and base > 0:
        reserved_gpus = math.floor(base)
    hours = len(load) * BIN_HOURS
    reserved_cost = reserved_gpus * hours * (prices.reserved or 0.0)
    above = float(np.clip(load - reserved_gpus, 0, None).sum() * BIN_HOURS)
    spot_hours = above * interruptible_share if prices.spot is not None and prices.spot < prices.on_demand else 0.0
    od_hours = above - spot_hours
    cost = reserved_cost + spot_hours * (prices.spot or 0.0) + od_hours * prices.on_demand
    detail.update(reserved_gpus=reserved_gpus, reserved_usd=reserved_cost * scale,
                  spot_gpu_hours=spot_hours * scale, spot_usd=spot_hours * (prices.spot or 0.0) * scale,
                  on_demand_gpu_hours=od_hours * scale, on_demand_usd=od_hours * prices.on_demand * scale,
                  rented_gpu_hours=gpu_hours * scale)
    return cost * scale, detail


def _owned_plan(name: str, usage: Usage, owned_gpus: int, prices: Prices, owned: OwnedCost,
                gpus_per_node: int, scale: float) -> Plan:
    fixed, power = owned_rates(owned, gpus_per_node)
    load = usage.profile
    served = np.minimum(load, owned_gpus)
    served_hours = float(served.sum() * BIN_HOURS)
    hours = len(load) * BIN_HOURS
    owned_cost = (owned_gpus * hours * fixed + served_hours * power) * scale
    share = usage.interruptible_gpu_hours / usage.gpu_hours if usage.gpu_hours else 0.0
    rent, rent_detail = _rent_cost(np.clip(load - owned_gpus, 0, None), share, prices, scale)
    util = served_hours / (owned_gpus * hours) if owned_gpus and hours else None
    return Plan(name, owned_cost + rent, owned_gpus, util, rent_detail["rented_gpu_hours"],
                {"owned_usd": owned_cost, "rent_usd": rent, **{f"rent_{k}": v for k, v in rent_detail.items()}})


@dataclass
class Advice:
    usage: dict[str, float | str]  # the figures, and "source": where they came from
    prices: dict[str, Any]
    owned_cost: dict[str, float]
    plans: list[dict[str, Any]]
    recommendation: str
    reason: str
    break_even_utilisation: float | None
    break_even_years: float | None
    break_even_at_utilisation: float
    rules: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rule_volume(weekly: float) -> str:
    if weekly < RENT_BELOW_GPU_HOURS_PER_WEEK:
        return "rent"
    return "own" if weekly > OWN_ABOVE_GPU_HOURS_PER_WEEK else "hybrid"


def advise(usage: Usage, prices: Prices, owned: OwnedCost, gpus_per_node: int = 8) -> Advice:
    """Price the three plans, recommend the cheapest and check it against the rules of thumb."""
    scale = HOURS_PER_YEAR / usage.span_hours
    fixed, power = owned_rates(owned, gpus_per_node)
    share = usage.interruptible_gpu_hours / usage.gpu_hours if usage.gpu_hours else 0.0
    rent_cost, rent_detail = _rent_cost(usage.profile, share, prices, scale)
    rent = Plan("rent", rent_cost, 0, None, rent_detail["rented_gpu_hours"], rent_detail)
    peak_nodes = max(1, math.ceil(usage.peak_gpus / gpus_per_node - 1e-9))
    own = _owned_plan("own for peak", usage, peak_nodes * gpus_per_node, prices, owned, gpus_per_node, scale)
    hybrids = [_owned_plan("hybrid", usage, k * gpus_per_node, prices, owned, gpus_per_node, scale)
               for k in range(1, peak_nodes)]
    hybrid = min(hybrids, key=lambda p: p.usd_per_year) if hybrids else None
    plans = [rent] + ([hybrid] if hybrid else []) + [own]
    best = min(plans, key=lambda p: p.usd_per_year)
    verdict = {"rent": "rent", "hybrid": "hybrid", "own for peak": "own"}[best.name]
    # break-even: an owned GPU-hour in use (fixed / u + power) against renting it on-demand
    margin = prices.on_demand - power
    be_util = fixed / margin if margin > 0 else None
    util = best.owned_utilisation if best.owned_utilisation is not None else owned.utilisation
    be_years = payback_years(prices.on_demand, owned, gpus_per_node, util)
    weekly = usage.gpu_hours_per_week
    reason = (f"{best.name} costs ${best.usd_per_year:,.0f} a year at {weekly:,.0f} GPU-hours a week "
              f"(peak {usage.peak_gpus:,.1f} GPUs); " + "; ".join(
                  f"{p.name}: ${p.usd_per_year:,.0f}" for p in plans if p is not best))
    rules = _rules(verdict, weekly, usage, prices, be_util, util, fixed, power, owned, gpus_per_node)
    return Advice(
        usage={"source": usage.source, "span_hours": round(usage.span_hours, 2),
               "gpu_hours": round(usage.gpu_hours, 2), "gpu_hours_per_week": round(weekly, 1),
               "mean_gpus": round(usage.gpu_hours / usage.span_hours, 2), "peak_gpus": round(usage.peak_gpus, 2),
               "interruptible_share": round(share, 4)},
        prices={k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(prices).items()},
        owned_cost={"fixed_usd_per_gpu_hour": round(fixed, 4), "power_usd_per_gpu_hour": round(power, 4),
                    "capex_usd_per_node": owned.capex_usd, "lifetime_years": owned.lifetime_years},
        plans=[{"name": p.name, "usd_per_year": round(p.usd_per_year, 2), "owned_gpus": p.owned_gpus,
                "owned_utilisation": None if p.owned_utilisation is None else round(p.owned_utilisation, 4),
                "rented_gpu_hours_per_year": round(p.rented_gpu_hours_per_year, 1),
                "detail": {k: round(v, 2) for k, v in p.detail.items()}} for p in plans],
        recommendation=verdict, reason=reason,
        break_even_utilisation=None if be_util is None else round(be_util, 4),
        break_even_years=None if be_years is None else round(be_years, 2),
        break_even_at_utilisation=round(util, 4), rules=rules,
    )


def _rules(verdict: str, weekly: float, usage: Usage, prices: Prices, be_util: float | None, util: float,
           fixed: float, power: float, owned: OwnedCost, gpn: int) -> list[dict[str, Any]]:
    """The design notes' rules of thumb against these numbers, each with why when they disagree."""
    out = []
    says = _rule_volume(weekly)
    why = ""
    if says != verdict:
        mean = usage.gpu_hours / usage.span_hours
        owned_hour = fixed / max(util, 1e-9) + power
        if verdict == "rent":
            why = (f"renting costs ${prices.on_demand:.2f} per GPU-hour ({prices.on_demand_offer}); an owned GPU "
                   f"costs ${owned_hour:.2f} per GPU-hour used at the {util:.0%} utilisation a pool would see here")
        elif usage.peak_gpus > 1.25 * mean and verdict == "hybrid":
            why = (f"the load is bursty (peak {usage.peak_gpus:.1f} GPUs, mean {mean:.1f}): nodes for the peak "
                   f"would sit idle; owning the base and renting the peaks is cheaper")
        elif verdict in ("own", "hybrid"):
            why = (f"owned GPUs cost ${fixed + power:.2f} per GPU-hour at full use against ${prices.on_demand:.2f} "
                   f"rented, and the load fills {'whole nodes' if verdict == 'own' else 'part of a node'} "
                   f"({mean:.1f} GPUs on average in nodes of {gpn})")
        else:
            why = "the prices and the load's shape, not its volume alone, decide"
    out.append({"rule": "under 1,000 GPU-hours a week rent, 1,000-5,000 hybrid, above 5,000 own",
                "rule_says": says, "numbers_say": verdict, "agrees": says == verdict, "why": why})
    if be_util is not None:
        agrees = abs(be_util - ONPREM_PAYS_ABOVE_UTILISATION) <= 0.1
        out.append({"rule": "on-prem pays above about 70% utilisation", "rule_says": "70%",
                    "numbers_say": f"{be_util:.0%}", "agrees": agrees,
                    "why": "" if agrees else (
                        f"at ${prices.on_demand:.2f} per rented GPU-hour an owned GPU (${fixed:.2f} per hour owned, "
                        f"${power:.2f} power when used) pays above {be_util:.0%}")})
    # The rule describes a pool that just pays (about 70% utilisation): check it there.
    years = payback_years(prices.on_demand, owned, gpn, ONPREM_PAYS_ABOVE_UTILISATION)
    if years is not None:
        lo, hi = BREAK_EVEN_YEARS
        agrees = lo - 0.25 <= years <= hi + 0.25
        saving = (prices.on_demand - power) * ONPREM_PAYS_ABOVE_UTILISATION * HOURS_PER_YEAR
        out.append({"rule": "break-even in 3-4 years (at 70% utilisation)", "rule_says": "3-4 years",
                    "numbers_say": f"{years:.1f} years", "agrees": agrees,
                    "why": "" if agrees else (
                        f"at 70% utilisation an owned GPU saves ${saving:,.0f} a year of renting at "
                        f"${prices.on_demand:.2f}/GPU-hour, less ${owned.ops_usd_per_year / gpn:,.0f} of operations, "
                        f"against ${owned.capex_usd / gpn:,.0f} of capex")})
    return out


def payback_years(rent_usd_per_gpu_hour: float, owned: OwnedCost, gpus_per_node: int,
                  utilisation: float) -> float | None:
    """Years for an owned GPU's capex to be paid back by the renting it replaces (None: never)."""
    _, power = owned_rates(owned, gpus_per_node)
    saving = ((rent_usd_per_gpu_hour - power) * HOURS_PER_YEAR * utilisation
              - owned.ops_usd_per_year / gpus_per_node)
    return owned.capex_usd / gpus_per_node / saving if saving > 0 else None
