"""Placement: where market, policies and providers meet.

For a claimed job: rank the offers (policies.ranking), choose a route
(policies.placement: reserved first, on-prem first, burst, spot or on-demand),
then launch on the best candidate. A capacity error moves on to the next
candidate (another zone, type or provider), up to a cap; every failed try is
kept with its reason in the job's event. Multi-node jobs are launched as one
request on one co-located offer: all nodes or none.

Crash safety: the attempt counter and an *intent* allocation (with the idempotency
token the provider will see) are written in one transaction *before* the provider
is called; the launch and the job's move to provisioning in one after. Both are
the allocation ledger's writes (broker/ledger.py). Reconciliation
(broker/reconcile.py) finishes whatever a crash interrupted.

The job's other state changes (back to pending, failed) go through broker/lifecycle.py.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from broker.config import Settings
from broker.errors import (
    REFUSALS,
    CapacityError,
    ConflictError,
    NotFoundError,
    ProviderAuthError,
    ProviderError,
    QuotaError,
    SpecError,
)
from broker.lifecycle import JobLifecycle, LaunchTry
from broker.market import CircuitTicket, Marketplace
from broker.models import (
    Allocation,
    AllocationState,
    Job,
    JobState,
    Market,
    Offer,
    Quote,
    QuoteOption,
    Tenant,
    month_start,
    utcnow,
)
from broker.secrets import SecretSources
from broker.spot_markets import SpotMarkets
from broker.store import LIVE_STATES
from policies.assembly import is_assembled, member_ids
from policies.book import DEFAULT_SPOT_PREEMPTIONS_PER_HOUR
from policies.placement import (
    DECISION_INTERVAL_HOURS,
    Decision,
    Route,
    Situation,
    candidates,
    checkpoint_first,
    checkpoint_place,
    decide,
    progress_hours,
    spot_elsewhere,
    where,
)
from policies.ranking import quote as rank_quote
from policies.spot import SpotMarket
from providers.base import LaunchRequest
from providers.capabilities import Launches, RunsBurnIn
from providers.runtime.manifest import RunRequest

if TYPE_CHECKING:
    from broker.store import Store

log = logging.getLogger(__name__)


TOP_OPTIONS = 50  # launchable options considered per job
HELD_TTL_S = 1.0  # how long a read of the offers live allocations hold is reused


def new_alloc_id() -> str:
    return "a" + secrets.token_hex(8)


def single_unit(offer: Offer) -> bool:
    """An offer only one job can hold at a time (a Vast machine), unlike a cloud instance type."""
    return offer.max_nodes == 1 and not offer.divisible


def unit_ids(offer: Offer) -> list[str]:
    """The single machines a launch on ``offer`` takes: an assembly's members, a single-unit offer itself,
    nothing for capacity many jobs can draw on."""
    if is_assembled(offer.id):
        return member_ids(offer.id)
    return [offer.id] if single_unit(offer) else []


NAMED_NODES = 3  # unhealthy offers named in a pending job's reason; the rest are counted


def _named(q: Quote, code: str, count: int) -> str:
    """For the unhealthy count: which offers (a node's offer id names the node), the first few and how many
    more, so an operator knows which node to look at; '' for the other codes (their offers are fungible)."""
    if code != "unhealthy":
        return ""
    ids = list(dict.fromkeys(r.offer_id for r in q.rejected if r.code == "unhealthy"))
    if not ids:
        return ""
    shown = ids[:NAMED_NODES]
    more = count - len(shown)
    return " (" + ", ".join(shown) + (f" and {more} more" if more > 0 else "") + ")"


@dataclass(frozen=True)
class PlacementResult:
    """The outcome of one placement pass for one job (for callers and tests): the job as it stands after
    the pass, whether it was placed, why, and the launch tries that failed on the way."""

    job: Job
    placed: bool
    reason: str
    tries: list[LaunchTry] = field(default_factory=list)


def error_kind(exc: ProviderError) -> str:
    """How a try's error is named in its record (see :class:`~broker.lifecycle.LaunchTry`)."""
    if isinstance(exc, CapacityError):
        return "capacity"
    if isinstance(exc, QuotaError):
        return "quota"
    if isinstance(exc, ProviderAuthError):
        return "auth"
    return type(exc).__name__


class Router:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        market: Marketplace,
        *,
        clock: Callable[[], datetime] = utcnow,
        preemption_rates: Callable[[], dict[tuple[str, str, str], float]] | None = None,
        on_placed: Callable[[str, str], None] | None = None,
        lifecycle: JobLifecycle | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.market = market
        self.clock = clock
        self.lifecycle = lifecycle or JobLifecycle(store, market.providers, clock=clock)
        self.secrets = SecretSources(settings.secrets)
        self.preemption_rates = preemption_rates or (lambda: {})
        self.on_placed = on_placed  # metrics hook: (provider, outcome)
        self._taken: set[str] = set()  # single-unit offers launched on since the last refresh
        self._taken_at: datetime | None = None
        self._held: tuple[float, set[str]] | None = None  # (monotonic time read, offer ids)
        self.spot_markets = SpotMarkets(store)
        # Quotes of this pass: (book, moment, held offers, {(spec, depth, taken): (quote, its options that can
        # be launched on this book, with the machines each takes)}).
        self._quotes: tuple[object, datetime | None, object,
                            dict[tuple[str, int, frozenset[str]], tuple[Quote, list[tuple[QuoteOption, list[str]]]]]] \
            = (None, None, None, {})
        self._spec_keys: dict[int, tuple[object, str]] = {}  # id(spec) → (spec, its JSON): see _spec_key
        self._tenants: dict[str, tuple[float, Tenant | None]] = {}  # (monotonic time read, caps)

    async def _db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    # ------------------------------------------------------------------ ranking
    def rank(self, job: Job, now: datetime, unhealthy: dict[tuple[str, str], str],
             held: Collection[str] = ()) -> tuple[Quote, list[QuoteOption]]:
        """The job's quote, and the options that can actually be launched now.

        ``held``: offers live allocations hold (any replica); single-unit ones among them are not launchable.
        """
        if self._taken_at != self.market.refreshed_at:  # a refresh shows what is really left
            self._taken.clear()
            self._taken_at = self.market.refreshed_at
        book = self.market.book(unhealthy_hosts=unhealthy, preemption_rates=self.preemption_rates())
        # Taken machines stay in the book until the next refresh: rank past them, or a busy market
        # would show "nothing launchable" long before it runs out.
        held_here = sum(1 for i in held if (o := self.market.find(i)) is not None and single_unit(o))
        top = TOP_OPTIONS + len(self._taken) + held_here
        # Same book, moment, held and taken machines, spec and depth: the same quote. A pass ranks each spec
        # once, not once per job (what is launchable now is filtered below, each time).
        if self._quotes[0] is not book or self._quotes[1] != now or self._quotes[2] is not held:
            self._quotes = (book, now, held, {})
        taken = frozenset(self._taken)
        key = (self._spec_key(job), top, taken)
        hit = self._quotes[3].get(key)
        if hit is None:
            q = rank_quote(book, job.spec, now=now, top=top, max_rejected=20,
                           exclude=taken.union(held))  # no assembly of machines taken
            # What of each option holds for this book (its offer is here and launchable, the machines it
            # takes), worked out once per quote; what changes between jobs is checked below, each time.
            hit = self._quotes[3][key] = (q, [(o, unit_ids(offer)) for o in q.options
                                              if (offer := self.market.find(o.offer_id)) is not None
                                              and self.market.launchable(offer)])
        q, launchable = hit
        options = [o for o, units in launchable
                   if not any(u in self._taken or u in held for u in units)
                   and self.market.circuits[o.provider].admits()]  # an open circuit: not called until its probe
        return q, options[:TOP_OPTIONS]

    def _spec_key(self, job: Job) -> str:
        """The job's spec as the quote cache's key; jobs read together share spec objects (the store), so the
        text is made once per spec object, not once per job."""
        seen = self._spec_keys.get(id(job.spec))
        if seen is not None and seen[0] is job.spec:
            return seen[1]
        if len(self._spec_keys) > 10_000:
            self._spec_keys.clear()
        text = job.spec.model_dump_json()
        self._spec_keys[id(job.spec)] = (job.spec, text)
        return text

    async def held_offers(self) -> set[str]:
        """Offers a live allocation holds, this replica's or another's (an intent counts: it is launching).

        Read at most once a second and shared by concurrent placements: a full read per placement
        grows with the number of live allocations. What the cache misses is caught by ``_taken`` (this
        process's launches), ``_launching_elsewhere`` (other replicas' launches in flight) or, at worst,
        by the provider refusing the rental.
        """
        now = time.monotonic()
        if self._held is None or now - self._held[0] > HELD_TTL_S:
            self._held = (now, {m for o in await self._db(self.store.held_offer_ids) for m in member_ids(o)})
        return self._held[1]

    async def _launching_elsewhere(self) -> set[str]:
        """Offers with an intent on them: launches in flight (few rows, read fresh)."""
        return {m for a in await self._db(self.store.allocations, None, [AllocationState.intent])
                for m in member_ids(a.offer_id)}

    def unplaceable_reason(self, q: Quote, options: list[QuoteOption]) -> str:
        """Why a job cannot be launched anywhere right now ('' when it can)."""
        if not q.options:
            counts = ", ".join(f"{k}: {v}{_named(q, k, v)}"
                               for k, v in sorted(q.rejected_counts.items(), key=lambda kv: -kv[1]))
            return f"no feasible offer ({counts or 'no offers'})"
        if not options:
            shut = sorted({o.provider for o in q.options if o.provider in self.market.circuits
                           and not self.market.circuits[o.provider].admits()})
            if shut:
                return "no launchable offer right now: " + "; ".join(self.market.circuits[p].describe() for p in shut)
            return ("no launchable offer right now: the feasible ones are single machines already taken, "
                    "or come only from the read-only catalog")
        return ""

    async def _tenant(self, name: str) -> Tenant | None:
        """The tenant's caps (None: no such tenant, no caps), read at most once a second per tenant: a pass
        placing thousands of one tenant's jobs reads them once. What is spent and held is read each time."""
        t = time.monotonic()
        hit = self._tenants.get(name)
        if hit is None or t - hit[0] > HELD_TTL_S:
            try:
                tenant: Tenant | None = await self._db(self.store.get_tenant, name)
            except NotFoundError:
                tenant = None
            if len(self._tenants) > 10_000:
                self._tenants.clear()
            hit = self._tenants[name] = (t, tenant)
        return hit[1]

    async def _budget(self, job: Job, now: datetime) -> tuple[float | None, str]:
        """(budget left in USD or None, reason the tenant's caps forbid the job or '')."""
        tenant = await self._tenant(job.tenant)
        if tenant is None:
            return None, ""
        left = None
        if tenant.monthly_budget_usd is not None:
            # What its running jobs are expected to cost yet counts as spent: at 100% projected, nothing new.
            spent = await self._db(self.store.tenant_spend, job.tenant, month_start(now), now)
            committed = await self._db(self.store.tenant_committed, job.tenant, now)
            left = tenant.monthly_budget_usd - spent - committed
            if left <= 0:
                return left, (f"budget: tenant {job.tenant} has spent ${spent:,.2f} (and its running jobs are "
                              f"expected to cost ${committed:,.2f} more) of its "
                              f"${tenant.monthly_budget_usd:,.2f} monthly budget" if committed else
                              f"budget: tenant {job.tenant} has spent ${spent:,.2f} of its "
                              f"${tenant.monthly_budget_usd:,.2f} monthly budget")
        if tenant.max_gpus is not None:
            held = await self._db(self.store.gpus_held, job.tenant)
            if held + job.spec.gpus > tenant.max_gpus:
                return left, (f"budget: tenant {job.tenant} holds {held} GPUs; {job.spec.gpus} more would exceed "
                              f"its cap of {tenant.max_gpus}")
        return left, ""

    def deadline(self, job: Job) -> datetime | None:
        return job.deadline or job.spec.deadline_at(job.created_at)

    def _spot_planned(self, job: Job, options: Sequence[QuoteOption]) -> QuoteOption | None:
        """The first spot option, where the spot plan weighs its market (a deadline, an interruptible job)."""
        spot = next((o for o in options if o.market is Market.spot), None)
        return spot if spot is not None and self.deadline(job) is not None and job.spec.interruptible else None

    def reads_for_situation(self, job: Job, options: Sequence[QuoteOption]) -> bool:
        """Whether :meth:`situation` reads the store for this job (its allocations, or its spot market's
        history). A job claimed with no attempt counted has no allocation (every one is written with its
        attempt: docs/crash-safety.md), so ``history=()`` spares the read."""
        return job.attempts > 0 or self._spot_planned(job, options) is not None

    def situation(self, job: Job, options: Sequence[QuoteOption], now: datetime, *,
                  history: Sequence[Allocation] | None = None) -> Situation:
        """Where the job stands, as the spot plan weighs it: the progress it kept, the market of its first spot
        option (what the broker observed of it), the restart time and the decision interval. Blocking
        (store reads): call it off the event loop, unless :meth:`reads_for_situation` says it reads nothing.
        ``history``: the job's allocations where the caller knows them (read here when None). The simulator
        passes the same (broker/simulate/deadline.py)."""
        allocs = self.store.allocations(job.id) if history is None else history
        done = progress_hours(allocs, now, restart_minutes=self.settings.broker.restart_minutes,
                              checkpoint_minutes=job.spec.checkpoint_minutes)
        deadline = self.deadline(job)
        spot = self._spot_planned(job, options)
        market = None
        if spot is not None and deadline is not None:
            market = self.spot_markets.market(spot, submitted=job.created_at, deadline=deadline, now=now)
        return Situation(now=now, deadline=deadline, done_hours=done, spot_market=market,
                         restart_minutes=self.settings.broker.restart_minutes,
                         decision_interval_hours=DECISION_INTERVAL_HOURS)

    def plan_inputs(self, job: Job, options: Sequence[QuoteOption], now: datetime, *,
                    history: Sequence[Allocation] | None = None) -> tuple[list[QuoteOption], Situation]:
        """The options with the spot ones where the job's checkpoint lies first
        (``policies.placement.checkpoint_first``: the plan weighs that market, a spot start tries it first,
        anywhere else is a move), and :meth:`situation` on them. Blocking (store reads) unless ``history``
        is given."""
        allocs = self.store.allocations(job.id) if history is None else history
        ordered = checkpoint_first(options, checkpoint_place(allocs))
        return ordered, self.situation(job, ordered, now, history=allocs)

    def decide(self, job: Job, options: list[QuoteOption], situation: Situation,
               budget_left: float | None, late_onprem: QuoteOption | None = None) -> Decision:
        """``policies.placement.decide`` for a job waiting to be placed (new, requeued, or waiting for spot)."""
        spot_rates = list(self.preemption_rates().values()) or [DEFAULT_SPOT_PREEMPTIONS_PER_HOUR]
        return decide(
            job.spec, options, max_queue_wait_hours=self.settings.broker.max_queue_wait_hours,
            budget_left_usd=budget_left, preemptions_per_hour=sum(spot_rates) / len(spot_rates), **situation,
            late_onprem=late_onprem,
        )

    def zone_markets(self, job: Job, options: Sequence[QuoteOption], now: datetime) -> dict[str, SpotMarket]:
        """The spot markets of the places (zones, else regions) other than the first spot option's that the
        job's spot options are in, as the spot plan sees them. Blocking (store reads)."""
        deadline = self.deadline(job)
        spots = [o for o in options if o.market is Market.spot]
        if deadline is None or not spots:
            return {}
        out: dict[str, SpotMarket] = {}
        for o in spots:
            if where(o) != where(spots[0]) and where(o) not in out:
                out[where(o)] = self.spot_markets.market(o, submitted=job.created_at, deadline=deadline, now=now)
        return out

    async def elsewhere(self, job: Job, options: list[QuoteOption], situation: Situation,
                         decision: Decision, *, running_on_demand: bool = False) -> tuple[Decision, list[QuoteOption]]:
        """``policies.placement.spot_elsewhere``: where the plan on the first spot option's market chose on-demand
        or to wait (``running_on_demand``: to stay on the running on-demand instance), another zone's spot by
        expected cost (the multi-zone simulator's function). Chosen, the job's spot options are that zone's
        only."""
        home = situation["spot_market"]
        if home is None or decision.allow_spot or decision.route not in (Route.cloud, Route.wait):
            return decision, options
        if len({where(o) for o in options if o.market is Market.spot}) < 2:
            return decision, options
        markets = await self._db(self.zone_markets, job, options, situation["now"])
        decision, place = spot_elsewhere(
            job.spec, options, decision, now=situation["now"], deadline=situation["deadline"],
            done_hours=situation["done_hours"], home=home, markets=markets,
            restart_minutes=situation["restart_minutes"], decision_interval_hours=situation["decision_interval_hours"],
            running_on_demand=running_on_demand)
        if place is None:
            return decision, options
        return decision, [o for o in options if o.market is not Market.spot or where(o) == place]

    # ------------------------------------------------------------------ placing
    async def place(self, job: Job, unhealthy: dict[tuple[str, str], str] | None = None, *,
                    now: datetime | None = None) -> PlacementResult:
        """Place a job the caller has claimed (state placing). Leaves it provisioning or pending.

        ``unhealthy``: the node-health map the caller's pass already read (read here when absent).
        ``now``: the moment the caller's pass ranks for (its quotes are shared by the jobs of the pass).
        """
        now = now or self.clock()
        if unhealthy is None:
            unhealthy = await self._db(self.store.unhealthy_nodes)
        held = await self.held_offers()
        q, options = self.rank(job, now, unhealthy, held)
        budget_left, budget_reason = await self._budget(job, now)
        if budget_reason:
            return await self.back_to_pending(job, budget_reason, [], {"budget": budget_reason})
        if job.spec.max_cost_usd is not None:  # the job's own cap, on what it has not spent yet
            own = job.spec.max_cost_usd - job.spent_usd
            budget_left = own if budget_left is None else min(budget_left, own)
        # A job's own cap beyond what is left of the tenant budget
        if budget_left is not None:
            options = [o for o in options if o.expected_cost_usd <= budget_left]
            if not options and q.options:
                return await self.back_to_pending(
                    job, f"budget: no option fits the ${budget_left:,.2f} left of " + (
                        f"the job's max_cost_usd (${cap:,.2f})" if (cap := job.spec.max_cost_usd) is not None
                        and budget_left == cap - job.spent_usd else f"tenant {job.tenant}'s budget"),
                    [], {"budget_left_usd": round(budget_left, 2)})
        if self.reads_for_situation(job, options):
            options, situation = await self._db(self.plan_inputs, job, options, now)
        else:  # never attempted, no spot market to weigh: nothing to read, no thread hop
            situation = self.situation(job, options, now, history=())
        decision = self.decide(job, options, situation, budget_left, q.late_onprem)
        decision, options = await self.elsewhere(job, options, situation, decision)
        tries_allowed = self.settings.broker.max_launch_tries
        cands = candidates(options, decision)
        if not cands:
            reason = self.unplaceable_reason(q, options) or decision.reason
            return await self.back_to_pending(job, reason, [], decision.as_dict())
        try:  # once per placement, before any provider call: values only in memory (docs/runtime.md)
            secret_values = self.secrets.resolve(job.spec)
        except SpecError as exc:  # the spec names a secret no source has: no market can run it
            failed = await self.lifecycle.fail_placing(job.id, f"cannot launch: {exc}")
            return PlacementResult(failed, False, failed.reason, [])

        tries: list[LaunchTry] = []
        skip: set[str] = set()
        shut: list[str] = []  # providers whose circuit refused a launch this pass
        for opt in cands:
            if len(tries) >= tries_allowed:
                break
            if opt.provider in skip:
                continue
            offer = self.market.find(opt.offer_id)
            if offer is None:  # a refresh since the ranking dropped it
                continue
            circuit = self.market.circuits[opt.provider]
            if not circuit.admits():  # opened during this pass, or another placement holds its one probe
                skip.add(opt.provider)
                shut.append(circuit.describe())
                continue
            units = unit_ids(offer)
            if units:
                # One machine, one renter: skip what this process is launching on (or lost) and what a
                # live allocation of any replica holds, instead of spending a try on a certain refusal.
                # Check and reserve with no await in between, so concurrent placements never pick alike.
                # An assembly takes all its machines (a failed rent keeps them out until the next refresh).
                if any(u in self._taken or u in held for u in units):
                    continue
                self._taken.update(units)
                # Another replica may have written its intent on it since: look again, just before ours.
                if not set(units).isdisjoint(await self._launching_elsewhere()):
                    continue
            ticket = circuit.acquire()
            if ticket is None:  # it closed to us while we looked for intents elsewhere
                self._taken.difference_update(units)
                skip.add(opt.provider)
                shut.append(circuit.describe())
                continue
            try:
                outcome = await self._try(job, opt, offer, decision, tries, secret_values, ticket)
            finally:
                ticket.release()  # a no-op once the launch's outcome is recorded
            if isinstance(outcome, PlacementResult):
                return outcome
            tries.append(outcome)  # failed: on to the next offer (or past this provider)
            if outcome.rules_out_provider:
                skip.add(opt.provider)
        if not tries and shut:
            return await self.back_to_pending(job, "no launchable offer right now: " + "; ".join(shut), tries,
                                              decision.as_dict())
        last = tries[-1].error if tries else "no candidate"
        reason = "; ".join([f"all {len(tries)} launch tries failed; last: {last}", *shut])
        return await self.back_to_pending(job, reason, tries, decision.as_dict())

    async def _try(self, job: Job, opt: QuoteOption, offer: Offer, decision: Decision,
                   tries: Sequence[LaunchTry], secret_values: Mapping[str, SecretStr],
                   ticket: CircuitTicket) -> PlacementResult | LaunchTry:
        """One launch try on ``offer``: the final result (placed, or a reconcile decided the launch), or the
        record of a failed try (the caller moves on). ``tries``: the failed tries before this one.
        ``ticket``: the provider's circuit's leave for the launch call, which records its outcome."""
        provider = self.market.launcher(opt.provider)
        assert provider is not None  # only launchable options are tried
        spec = job.spec
        runtime, installation = self.settings.runtime, self.settings.broker.installation
        if spec.burn_in and isinstance(provider, RunsBurnIn):
            from broker.burnin import burnin_command, job_stem, results_path

            result_dir = str(results_path(self.settings))
        members = [m for i in member_ids(offer.id) if (m := self.market.find(i)) is not None] \
            if is_assembled(offer.id) else []
        reqs: dict[int, LaunchRequest] = {}

        def build(attempt: int) -> Allocation:
            """The attempt's request and its intent (inside the ledger's transaction: pure, no I/O)."""
            launch_spec = spec
            if spec.burn_in and isinstance(provider, RunsBurnIn):
                # Burn-in as the allocation's first step: the probe runs before the user's command.
                launch_spec = spec.model_copy(update={"command": burnin_command(
                    spec.command, result_dir=result_dir, stem=job_stem(job.id, attempt))})
            run = RunRequest.for_launch(launch_spec, job_id=job.id, attempt=attempt, secrets=secret_values,
                                        runtime=runtime)
            req = reqs[attempt] = LaunchRequest(
                job_id=job.id, tenant=job.tenant, attempt=attempt, spec=launch_spec, offer=offer, nodes=opt.nodes,
                installation=installation, run=run, members=members)
            return Allocation(
                id=new_alloc_id(), job_id=job.id, attempt=attempt, provider=opt.provider, offer_id=opt.offer_id,
                state=AllocationState.intent, client_token=req.client_token, nodes=opt.nodes, region=opt.region,
                zone=opt.zone, usd_per_hour=opt.usd_per_hour,
                attrs={"sku": opt.sku, "market": opt.market.value, "option": opt.model_dump_json()},
            )

        # The attempt counter and the intent, one transaction, before the provider call: a crash after the
        # call is then always recoverable, and an attempt's token is never reused.
        alloc = await self.lifecycle.ledger.begin_attempt(job.id, build)
        req = reqs[alloc.attempt]
        try:
            got = await self._launch(provider, req)
        except ProviderError as exc:
            ticket.record(exc)
            if not isinstance(exc, CapacityError):
                self._taken.difference_update(unit_ids(offer))  # not gone, just not launched: others may try it
            failed = LaunchTry(offer_id=opt.offer_id, provider=opt.provider, sku=opt.sku, zone=opt.zone,
                               market=opt.market.value, error=str(exc)[:300], kind=error_kind(exc))
            if not await self._fail_intent(alloc, str(exc)[:500], failed.kind):
                return await self._decided_elsewhere(job, alloc, [*tries, failed])
            if self.on_placed:
                self.on_placed(opt.provider, failed.kind)
            log.info("job %s: %s on %s failed: %s", job.id, opt.sku, opt.zone or opt.region, exc)
            return failed
        except Exception as exc:  # an adapter bug must not lose the job: record, try the next offer
            ticket.record(exc)
            self._taken.difference_update(unit_ids(offer))
            log.exception("job %s: launch on %s raised", job.id, opt.provider)
            failed = LaunchTry(offer_id=opt.offer_id, provider=opt.provider, error=repr(exc)[:300], kind="error")
            if not await self._fail_intent(alloc, repr(exc)[:500]):
                return await self._decided_elsewhere(job, alloc, [*tries, failed])
            return failed
        ticket.record(None)

        decided = decision.as_dict()
        record = await self.lifecycle.ledger.launched(
            alloc, got, reason=self.lifecycle.launched_reason(opt),
            data={"tries": [t.as_event() for t in tries], "allocation": alloc.id, "resource_ids": got.resource_ids,
                  "decision": decided},
            spec=job.spec, placement=opt, decision=decided)
        if record.job is not None:
            if self.on_placed:
                self.on_placed(opt.provider, "placed")
            return PlacementResult(record.job, True, record.job.reason, list(tries))
        if not record.recorded and record.alloc_state is AllocationState.failed:
            # A reconcile gave this intent up while we launched (a launch slower than its stale_after, or an
            # exclusive pass), and requeued the job: what we got belongs to nobody.
            return await self._release_orphan(job, alloc, provider, got, tries)
        latest = await self._db(self.store.get_job, job.id)
        if latest.state in (JobState.provisioning, JobState.running) and record.alloc_state in LIVE_STATES:
            # A reconcile adopted this launch and moved the job on itself: placed all the same.
            return PlacementResult(latest, True, f"launched; adopted by a reconcile meanwhile ({latest.reason})",
                                   list(tries))
        # Cancelled (or requeued) while we launched: give it straight back.
        log.info("job %s was cancelled during launch; releasing %s", job.id, got.resource_ids)
        current = await self._db(self.store.get_allocation, alloc.id)
        await self.lifecycle.release(current, "job cancelled during launch")
        return PlacementResult(await self._db(self.store.get_job, job.id), False, "cancelled during launch",
                               list(tries))

    async def _fail_intent(self, alloc: Allocation, reason: str, kind: str = "error") -> bool:
        """Record a failed launch over its intent (``kind``: :func:`error_kind`, kept in its attrs: a spot market's
        history counts capacity refusals); False when a reconcile decided on the intent first."""
        return await self.lifecycle.ledger.fail_intent(alloc.id, reason, {**alloc.attrs, "error_kind": kind})

    async def _decided_elsewhere(self, job: Job, alloc: Allocation, tries: Sequence[LaunchTry]) -> PlacementResult:
        """A reconcile took this launch's intent over: stop trying other offers and report where the job is."""
        latest = await self._db(self.store.get_job, job.id)
        log.info("job %s: allocation %s was decided by a reconcile during its launch; job is %s",
                 job.id, alloc.id, latest.state.value)
        placed = latest.state in (JobState.provisioning, JobState.running)
        return PlacementResult(latest, placed, f"allocation {alloc.id} was decided by a reconcile during its launch",
                               list(tries))

    async def _release_orphan(self, job: Job, alloc: Allocation, provider: Launches, got: Allocation,
                              tries: Sequence[LaunchTry]) -> PlacementResult:
        """The launch completed after a reconcile gave its intent up (and requeued the job): what it got
        belongs to nobody. Record that first (so no one adopts it meanwhile), then give it back."""
        if not await self.lifecycle.ledger.orphaned(alloc.id, got.resource_ids,
                                                    "launch completed after its intent was given up"):
            return await self._decided_elsewhere(job, alloc, tries)  # adopted after all: the reconcile's now
        log.warning("job %s: launch on %s outlived its intent; releasing %s", job.id, provider.name,
                    got.resource_ids)
        try:
            await provider.release(got)
        except ProviderError as exc:  # recorded as released with its ids: the next reconcile retries
            log.warning("job %s: release of %s failed (%s); reconciliation will retry", job.id,
                        got.resource_ids, exc)
        # The reconcile requeued the job unless it could not list every provider: then do it here.
        return await self.back_to_pending(job, "launch completed after its intent was given up; released",
                                          tries, {})

    async def _launch(self, provider: Launches, req: LaunchRequest) -> Allocation:
        """``provider.launch``; after an error that may have come after the launch went through (a lost
        answer, a timeout, an adapter bug), ask the provider whether this attempt now holds something,
        rather than move on and leave it running unrecorded until the next restart's reconciliation."""
        try:
            return await provider.launch(req)
        except REFUSALS:
            raise  # nothing was launched
        except Exception as launch_error:
            try:
                held = await provider.owned()
            except Exception as exc:  # cannot tell: the launch error stands; reconciliation settles it
                log.warning("job %s: cannot check %s after a failed launch: %s", req.job_id, provider.name, exc)
                raise launch_error from None
            for a in held:
                if a.job_id == req.job_id and a.attempt == req.attempt:
                    log.info("job %s: launch attempt %d on %s went through despite the error",
                             req.job_id, req.attempt, provider.name)
                    return a.model_copy(update={"client_token": a.client_token or req.client_token})
            raise

    async def back_to_pending(self, job: Job, reason: str, tries: Sequence[LaunchTry],
                              decision: dict[str, Any]) -> PlacementResult:
        """Not placed this pass: the claimed job goes back to pending, keeping the tries and the decision
        (unless another writer moved it first: then it stays where that writer put it)."""
        try:
            job = await self.lifecycle.back_to_pending(job.id, reason, tries, decision)
        except ConflictError:
            job = await self._db(self.store.get_job, job.id)
        return PlacementResult(job, False, reason, list(tries))
