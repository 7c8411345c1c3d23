"""A GPU cluster trace replayed against an on-prem pool that can burst to the cloud.

Jobs arrive as in the trace (arrival, GPUs, run time) at an on-prem pool of ``onprem_gpus``
(nodes of ``gpus_per_node``) and, depending on the policy, queue there or run in the cloud.

- **Cloud**: the options the broker's own ranking gives for the job (``policies.ranking.quote``
  over the bundled catalog, ``gpu`` model), per GPU count: the cheapest on-demand and, for jobs
  that tolerate preemption, the cheapest spot option. Spot can be had when the spot trace says
  so (the trace repeats when the cluster trace is longer) and every running spot job is lost
  when it goes; a cloud start (boot and restore) takes ``restart_minutes``, paid, no progress.
- **On-prem**: one queue in arrival order; whenever GPUs free up, every queued job that fits
  starts (best fit on a node), as ``providers.slurm.QueueModel`` assumes. Owned GPUs cost their
  amortised capex and operations every hour of the simulation (used or not) plus power when used.
- **Deadlines** (the trace has none): a job may wait as long as it runs, at least
  ``slack_min_hours`` and at most ``slack_max_hours``: deadline = arrival + run time + that slack.
  Jobs of QoS class ``BE`` (best effort) tolerate preemption (checkpoint and resume); others do not.

Policies: ``onprem-only`` (queue for the pool), ``cloud-only`` (on-demand cloud for every job),
``cheapest-first`` (the cheapest market that can start the job now: on-prem at its amortised
price when GPUs are free, else spot, else on-demand) and ``lockstep`` — the broker's
``policies.placement.decide`` and ``candidates`` on the options above (on-prem with the queue
wait ``QueueModel`` estimates, the way the Slurm provider quotes it), at placement and after
each preemption, ``rebalance`` for interruptible jobs running on on-demand, and the spot plan
with the spot market's history.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

import numpy as np

from broker.errors import SpecError
from broker.models import CostBreakdown, Fabric, JobSpec, Market, QuoteOption, Workload
from broker.simulate.traces import Pod, SpotTrace
from policies.book import OfferBook
from policies.placement import candidates, decide, rebalance
from policies.ranking import quote
from policies.risk import DEFAULT_PREEMPTIONS_PER_HOUR, trace_preemption_rate
from policies.spot import SpotMarket, availability_model, current_run, model_span, plan_step_hours
from providers.catalog.offers import catalog_offers
from providers.slurm import api
from providers.slurm.config import OwnedCost
from providers.slurm.queue import QueueModel

CLUSTER_POLICIES = ("onprem-only", "cloud-only", "cheapest-first", "lockstep")
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class ClusterConfig:
    onprem_gpus: int
    gpus_per_node: int = 8
    gpu: str = "H100"
    max_queue_wait_hours: float = 4.0
    restart_minutes: float = 10.0
    slack_min_hours: float = 1.0
    slack_max_hours: float = 24.0
    owned: OwnedCost = field(default_factory=OwnedCost)

    def validate(self) -> None:
        if self.onprem_gpus < 0:
            raise SpecError("--onprem-gpus", f"must be zero or more, not {self.onprem_gpus}")
        if self.gpus_per_node < 1:
            raise SpecError("--gpus-per-node", f"must be at least 1, not {self.gpus_per_node}")


@dataclass
class SimJob:
    id: int
    arrival: float  # hours
    gpus: int
    duration: float  # hours of work
    interruptible: bool
    deadline: float
    done: float = 0.0
    first_start: float | None = None
    finish: float | None = None
    burst: bool = False
    running: str = ""  # "" | "owned" | "spot" | "on_demand"
    started: float = 0.0  # current attempt's start (hours)
    progress_from: float = 0.0  # when progress starts (after the changeover)
    attempt: int = 0
    waiting_spot: bool = False
    node: int = -1


@dataclass
class ClusterResult:
    policy: str
    onprem_gpus: int
    jobs: int
    hours: float
    cost: float
    cost_by_market: dict[str, float]
    gpu_hours_by_market: dict[str, float]
    mean_wait_hours: float
    p95_wait_hours: float
    deadline_misses: int
    burst_share: float
    preemptions: int = 0
    onprem_utilisation: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        r2 = lambda d: {k: round(v, 2) for k, v in d.items()}  # noqa: E731
        return {"policy": self.policy, "onprem_gpus": self.onprem_gpus, "jobs": self.jobs,
                "hours": round(self.hours, 2), "cost": round(self.cost, 2), "cost_by_market": r2(self.cost_by_market),
                "gpu_hours_by_market": r2(self.gpu_hours_by_market),
                "mean_wait_hours": round(self.mean_wait_hours, 4), "p95_wait_hours": round(self.p95_wait_hours, 4),
                "deadline_misses": self.deadline_misses, "burst_share": round(self.burst_share, 4),
                "preemptions": self.preemptions, "onprem_utilisation": round(self.onprem_utilisation, 4)}


def deadline_for(arrival: float, duration: float, cfg: ClusterConfig) -> float:
    """The documented rule: a job may wait as long as it runs, within [slack_min, slack_max] hours."""
    return arrival + duration + min(max(duration, cfg.slack_min_hours), cfg.slack_max_hours)


def owned_rates(owned: OwnedCost, gpus_per_node: int) -> tuple[float, float]:
    """(fixed USD per owned GPU-hour, paid every hour; power USD per GPU-hour in use)."""
    hours = 8766.0
    fixed = (owned.capex_usd / (owned.lifetime_years * hours) + owned.ops_usd_per_year / hours) / gpus_per_node
    power = owned.power_kw * owned.pue * owned.usd_per_kwh / gpus_per_node
    return fixed, power


@lru_cache(maxsize=1)
def catalog_book() -> OfferBook:
    """The bundled catalog as the ranking's offer book (built once)."""
    return OfferBook.build(list(catalog_offers()))


@lru_cache(maxsize=64)
def cloud_rates(gpu: str, gpus: int, interruptible: bool) -> dict[Market, QuoteOption]:
    """The broker's ranking for one hour of a job of this shape: the best option per cloud market."""
    best: dict[Market, QuoteOption] = {}
    for market in (Market.on_demand, Market.spot) if interruptible else (Market.on_demand,):
        spec = JobSpec(name="cluster-job", gpu=[gpu], gpus=gpus, workload=Workload(hours=1.0), markets=[market],
                       interruptible=interruptible)
        q = quote(catalog_book(), spec, now=EPOCH, top=1)
        if q.options:
            best[market] = q.options[0]
    if Market.on_demand not in best:
        raise SpecError("--gpu", f"the bundled catalog has no on-demand offer for {gpus} × {gpu}")
    return best


def _scaled(o: QuoteOption, hours: float) -> QuoteOption:
    return o.model_copy(update={"expected_hours": (o.expected_hours or 0.0) * hours,
                                "expected_cost_usd": o.expected_cost_usd * hours})


class SpotAvailability:
    """The spot trace over the cluster's hours (repeated when shorter)."""

    def __init__(self, trace: SpotTrace) -> None:
        self.trace = trace
        self.gap_h = trace.gap_seconds / 3600.0
        self.n = len(trace.available)

    def tick(self, t: float) -> int:
        return int(t / self.gap_h + 1e-9)

    def up(self, t: float) -> bool:
        return bool(self.trace.available[self.tick(t) % self.n])

    def next_drop(self, t: float) -> float:
        """When spot next goes away after ``t`` (inf if it never does)."""
        i = self.tick(t)
        a = self.trace.available
        for j in range(i + 1, i + 1 + self.n):
            if not a[j % self.n]:
                return j * self.gap_h
        return math.inf

    def ticks(self, start: int, end: int) -> np.ndarray:
        """Availability of ticks ``[start, end)`` of the repeated trace."""
        return self.trace.available[np.arange(max(0, start), end) % self.n]


class Cluster:
    def __init__(self, pods: Sequence[Pod], cfg: ClusterConfig, spot: SpotAvailability, policy: str) -> None:
        cfg.validate()
        if policy not in CLUSTER_POLICIES:
            raise SpecError("--policy", f"unknown policy {policy!r} (one of {', '.join(CLUSTER_POLICIES)})")
        self.cfg, self.spot, self.policy = cfg, spot, policy
        self.jobs = [SimJob(i, p.arrival_s / 3600.0, p.gpus, p.duration_s / 3600.0, p.qos == "BE",
                            deadline_for(p.arrival_s / 3600.0, p.duration_s / 3600.0, cfg)) for i, p in enumerate(pods)]
        too_big = [j for j in self.jobs if j.gpus > cfg.gpus_per_node]
        if too_big:
            raise SpecError("--gpus-per-node", f"job {pods[too_big[0].id].name} needs {too_big[0].gpus} GPUs on one "
                                               f"node; nodes hold {cfg.gpus_per_node}")
        pool = 0 if policy == "cloud-only" else cfg.onprem_gpus  # renting everything: nothing owned
        n_nodes = -(-pool // cfg.gpus_per_node) if pool else 0
        self.node_gpus = [min(cfg.gpus_per_node, pool - i * cfg.gpus_per_node) for i in range(n_nodes)]
        self.free = list(self.node_gpus)
        self.queue: list[SimJob] = []  # on-prem, arrival order
        self.onprem_running: dict[int, SimJob] = {}
        self.events: list[tuple[float, int, str, int]] = []
        self.seq = itertools.count()
        self.fixed_rate, self.power_rate = owned_rates(cfg.owned, cfg.gpus_per_node)
        self.owned_price = cfg.owned.usd_per_node_hour() / cfg.gpus_per_node  # what the Slurm provider quotes
        self.cost = {"owned": 0.0, "spot": 0.0, "on_demand": 0.0}
        self.gpu_hours = {"owned": 0.0, "spot": 0.0, "on_demand": 0.0}
        self.preemptions = 0
        self.cloud_running: dict[int, SimJob] = {}
        self.waiting: dict[int, SimJob] = {}  # pending for spot (lockstep)
        self.tick_scheduled = False
        self.drop_at: float | None = None
        rate = trace_preemption_rate({"metadata": {"gap_seconds": spot.trace.gap_seconds},
                                      "data": spot.trace.available.astype(int).tolist()})
        self.preempt_rate = rate.per_hour if rate.instance_hours > 0 else DEFAULT_PREEMPTIONS_PER_HOUR
        self.models: dict[tuple[tuple[int, int], float], Any] = {}
        self.attempt_of: dict[int, int] = {}  # the cloud attempt a "cloud_done" event belongs to
        self.job_quotes: dict[int, tuple[JobSpec, list[QuoteOption]]] = {}

    # ------------------------------------------------------------------ events
    def push(self, t: float, kind: str, job_id: int = -1) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, job_id))

    def run(self) -> ClusterResult:
        for j in self.jobs:
            self.push(j.arrival, "arrive", j.id)
        now = 0.0
        while self.events:
            now, _, kind, jid = heapq.heappop(self.events)
            if kind == "arrive":
                self.place(self.jobs[jid], now)
            elif kind == "onprem_done":
                self.onprem_done(self.jobs[jid], now)
            elif kind == "cloud_done":
                job = self.jobs[jid]
                if job.running in ("spot", "on_demand") and job.attempt == self.attempt_of.get(jid):
                    self.cloud_end(job, now, finished=True)
            elif kind == "spot_drop":
                self.spot_drop(now)
            elif kind == "tick":
                self.tick(now)
        return self.result(now)

    # ------------------------------------------------------------------ on-prem
    def enqueue(self, job: SimJob, now: float) -> None:
        self.queue.append(job)
        self.schedule(now)

    def schedule(self, now: float) -> None:
        """Start every queued job that fits, in order (best fit: the fullest node that has room)."""
        still = []
        for pos, job in enumerate(self.queue):
            if not any(self.free):  # nothing free: the rest of the queue waits as it is
                still.extend(self.queue[pos:])
                break
            fits = [i for i, f in enumerate(self.free) if f >= job.gpus]
            if not fits:
                still.append(job)
                continue
            node = min(fits, key=lambda i: (self.free[i], i))
            self.free[node] -= job.gpus
            job.node, job.running, job.started, job.progress_from = node, "owned", now, now
            if job.first_start is None:
                job.first_start = now
            self.onprem_running[job.id] = job
            self.push(now + job.duration - job.done, "onprem_done", job.id)
        self.queue = still

    def onprem_done(self, job: SimJob, now: float) -> None:
        self.free[job.node] += job.gpus
        del self.onprem_running[job.id]
        self.gpu_hours["owned"] += job.gpus * (now - job.started)
        job.done, job.finish, job.running = job.duration, now, ""
        self.schedule(now)

    def queue_wait(self, job: SimJob, now: float) -> float:
        """The on-prem wait the live broker would quote: ``QueueModel`` over the pool's nodes and jobs."""
        nodes = [api.NodeInfo(name=f"n{i}", state=frozenset({"IDLE"}), gpu_type="", gpus_total=g,
                              gpus_used=g - self.free[i], features=(), partitions=("p",))
                 for i, g in enumerate(self.node_gpus)]
        infos = []
        now_s = now * 3600.0
        for r in self.onprem_running.values():
            infos.append(api.JobInfo(job_id=r.id, name="", state="RUNNING", flags=frozenset(), reason="",
                                     comment="", partition="p", nodes=(f"n{r.node}",), node_count=1, gpu_type="",
                                     gpus_per_node=r.gpus, constraints="", time_limit_min=(r.duration - r.done) * 60,
                                     submit_time=None, start_time=r.started * 3600.0,
                                     end_time=(r.started + r.duration - r.done) * 3600.0))
        for q in self.queue:
            infos.append(api.JobInfo(job_id=q.id, name="", state="PENDING", flags=frozenset(), reason="",
                                     comment="", partition="p", nodes=(), node_count=1, gpu_type="",
                                     gpus_per_node=q.gpus, constraints="", time_limit_min=(q.duration - q.done) * 60,
                                     submit_time=q.arrival * 3600.0, start_time=None, end_time=None))
        return QueueModel(nodes, infos, now_s).wait_hours(job.gpus, 1)

    # ------------------------------------------------------------------ cloud
    def launch_cloud(self, job: SimJob, market: str, now: float) -> None:
        job.running, job.started = market, now
        job.progress_from = now + self.cfg.restart_minutes / 60.0
        job.attempt += 1
        job.burst = True
        if job.first_start is None:
            job.first_start = now
        self.cloud_running[job.id] = job
        self.attempt_of[job.id] = job.attempt
        self.push(job.progress_from + job.duration - job.done, "cloud_done", job.id)
        if market == "spot":
            self.watch_drop(now)
        if market == "on_demand" and job.interruptible and self.policy == "lockstep":
            self.want_tick(now)

    def price(self, job: SimJob, market: str) -> float:
        return cloud_rates(self.cfg.gpu, job.gpus, job.interruptible)[Market(market)].usd_per_hour

    def cloud_end(self, job: SimJob, now: float, finished: bool) -> None:
        hours = now - job.started
        self.cost[job.running] += self.price(job, job.running) * hours
        self.gpu_hours[job.running] += job.gpus * hours
        job.done = min(job.duration, job.done + max(0.0, now - job.progress_from))
        del self.cloud_running[job.id]
        was = job.running
        job.running = ""
        if finished:
            job.done, job.finish = job.duration, now
        elif was == "spot":
            self.preemptions += 1
            self.place(job, now)

    def watch_drop(self, now: float) -> None:
        if self.drop_at is None or self.drop_at <= now:
            self.drop_at = self.spot.next_drop(now)
            if math.isfinite(self.drop_at):
                self.push(self.drop_at, "spot_drop")

    def spot_drop(self, now: float) -> None:
        self.drop_at = None
        for job in [j for j in self.cloud_running.values() if j.running == "spot"]:
            self.cloud_end(job, now, finished=False)

    def want_tick(self, now: float) -> None:
        if not self.tick_scheduled:
            self.tick_scheduled = True
            self.push((self.spot.tick(now) + 1) * self.spot.gap_h, "tick")

    def tick(self, now: float) -> None:
        """A retry pass (what the broker does every few seconds): waiting jobs and on-demand moves."""
        self.tick_scheduled = False
        for job in list(self.waiting.values()):
            del self.waiting[job.id]
            self.place(job, now)
        for job in [j for j in self.cloud_running.values() if j.running == "on_demand" and j.interruptible]:
            done = min(job.duration, job.done + max(0.0, now - job.progress_from))
            spec, options = self.spec_options(job, now)
            move = rebalance(spec, options, now=EPOCH + timedelta(hours=now),
                             deadline=EPOCH + timedelta(hours=job.deadline), done_hours=done,
                             spot_market=self.spot_market(job, now), restart_minutes=self.cfg.restart_minutes,
                             decision_interval_hours=self.spot.gap_h)
            if move.allow_spot:  # break before make, as the broker's rebalance step: placed again at once
                self.cloud_end(job, now, finished=False)
                self.place(job, now)
        if self.waiting or any(j.running == "on_demand" and j.interruptible for j in self.cloud_running.values()):
            self.want_tick(now)

    # ------------------------------------------------------------------ decisions
    def spec_options(self, job: SimJob, now: float, with_onprem: bool = False) -> tuple[JobSpec, list[QuoteOption]]:
        # the job's spec and its cloud options do not change between its decisions: built once
        # (policies are pure: they never change what they are given)
        kept = self.job_quotes.get(job.id)
        if kept is None:
            spec = JobSpec(name=f"job-{job.id}", gpu=[self.cfg.gpu], gpus=job.gpus,
                           workload=Workload(hours=job.duration), interruptible=job.interruptible,
                           checkpoint_minutes=1e-6)
            rates = cloud_rates(self.cfg.gpu, job.gpus, job.interruptible)
            cloud = [_scaled(rates[m], job.duration) for m in (Market.spot, Market.on_demand) if m in rates]
            kept = self.job_quotes[job.id] = (spec, cloud)
        spec, cloud = kept
        left = job.duration - job.done
        options = list(cloud)
        if with_onprem and self.node_gpus and job.gpus <= max(self.node_gpus):
            wait = self.queue_wait(job, now)
            wait = wait if math.isfinite(wait) else api.UNLIMITED_JOB_HOURS * 7
            price = self.owned_price * job.gpus
            options.append(QuoteOption(
                offer_id="slurm:owned", provider="slurm", market=Market.owned, sku="pool", region="onprem", zone="",
                nodes=1, gpus_per_node=job.gpus, gpu=self.cfg.gpu, fabric=Fabric.none, fabric_gbps=0.0,
                usd_per_hour=price, expected_hours=left + wait, expected_cost_usd=price * left,
                breakdown=CostBreakdown(compute_hours=left, comm_hours=0.0, queue_wait_hours=wait)))
        options.sort(key=lambda o: o.expected_cost_usd)
        return spec, options

    def spot_market(self, job: SimJob, now: float) -> SpotMarket:
        """The market as the broker knows it: the model of the day of submission, the present from the trace."""
        gap = self.spot.trace.gap_seconds
        span = model_span(self.spot.tick(job.arrival), gap)
        step = plan_step_hours(job.deadline - job.arrival)
        model = self.models.get((span, step))
        if model is None:
            model = self.models[(span, step)] = availability_model(self.spot.ticks(*span), gap, step_hours=step)
        here = self.spot.tick(now)
        up, age = current_run(self.spot.ticks(here - int(24 / self.spot.gap_h), here + 1), gap)
        return SpotMarket(model, up, age)

    def place(self, job: SimJob, now: float) -> None:
        if self.policy == "onprem-only":
            self.enqueue(job, now)
        elif self.policy == "cloud-only":
            self.launch_cloud(job, "on_demand", now)
        elif self.policy == "cheapest-first":
            self.cheapest_first(job, now)
        else:
            self.lockstep(job, now)

    def cheapest_first(self, job: SimJob, now: float) -> None:
        rates = cloud_rates(self.cfg.gpu, job.gpus, job.interruptible)
        choices = [(rates[m].usd_per_hour, m.value) for m in rates]
        if any(f >= job.gpus for f in self.free):
            choices.append((self.owned_price * job.gpus, "owned"))
        for _, market in sorted(choices):
            if market == "owned":
                self.enqueue(job, now)
                return
            if market == "spot" and not self.spot.up(now):
                continue
            self.launch_cloud(job, market, now)
            return
        self.launch_cloud(job, "on_demand", now)

    def lockstep(self, job: SimJob, now: float) -> None:
        spec, options = self.spec_options(job, now, with_onprem=True)
        decision = decide(spec, options, now=EPOCH + timedelta(hours=now),
                          deadline=EPOCH + timedelta(hours=job.deadline),
                          max_queue_wait_hours=self.cfg.max_queue_wait_hours,
                          preemptions_per_hour=self.preempt_rate, done_hours=job.done,
                          spot_market=self.spot_market(job, now) if job.interruptible else None,
                          restart_minutes=self.cfg.restart_minutes, decision_interval_hours=self.spot.gap_h)
        for o in candidates(options, decision):
            if o.market is Market.owned:
                self.enqueue(job, now)
                return
            if o.market is Market.spot and not self.spot.up(now):
                continue
            if o.market in (Market.spot, Market.on_demand):
                self.launch_cloud(job, o.market.value, now)
                return
        self.waiting[job.id] = job  # nothing launched: pending until the next pass
        self.want_tick(now)

    # ------------------------------------------------------------------ result
    def result(self, end: float) -> ClusterResult:
        hours = max(end, max((j.finish or 0.0) for j in self.jobs))
        pool = sum(self.node_gpus)
        owned_fixed = pool * hours * self.fixed_rate
        self.cost["owned"] = owned_fixed + self.gpu_hours["owned"] * self.power_rate
        waits = np.array([(j.first_start - j.arrival) for j in self.jobs if j.first_start is not None])
        misses = sum(1 for j in self.jobs if j.finish is None or j.finish > j.deadline + 1e-9)
        return ClusterResult(
            policy=self.policy, onprem_gpus=pool, jobs=len(self.jobs), hours=hours,
            cost=sum(self.cost.values()), cost_by_market=dict(self.cost), gpu_hours_by_market=dict(self.gpu_hours),
            mean_wait_hours=float(waits.mean()) if len(waits) else 0.0,
            p95_wait_hours=float(np.percentile(waits, 95)) if len(waits) else 0.0,
            deadline_misses=misses, burst_share=sum(1 for j in self.jobs if j.burst) / max(1, len(self.jobs)),
            preemptions=self.preemptions,
            onprem_utilisation=self.gpu_hours["owned"] / (pool * hours) if pool and hours else 0.0,
        )


def run_cluster(pods: Sequence[Pod], cfg: ClusterConfig, spot: SpotTrace, policy: str) -> ClusterResult:
    """Replay ``pods`` under ``policy`` (one of CLUSTER_POLICIES)."""
    return Cluster(pods, cfg, SpotAvailability(spot), policy).run()
