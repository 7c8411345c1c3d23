"""The broker's background loops: refresh the offer book, place pending jobs, poll live allocations,
reconcile, and offer running on-demand jobs a move back to spot (the spot plan's periodic decision).
They decide *when* things happen; what a placement does is the router's (broker/router.py),
what a job's state becomes is the lifecycle's (broker/lifecycle.py), and what a crash left is
reconciliation's (broker/reconcile.py).

One ``BrokerLoops`` per process. With PostgreSQL several may run against one store: a job is claimed by a
row-locked state change (pending → placing, only from pending), so two replicas never place the same job.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from broker.budgets import BudgetAlert, BudgetWatch
from broker.config import Settings
from broker.errors import ProviderError
from broker.ledger import ENDED
from broker.lifecycle import BurnInResults, JobLifecycle, PlacementLimits, PlacementWait
from broker.market import CircuitOpen, Marketplace
from broker.models import Allocation, AllocationState, Job, JobSpec, JobState, Market, utcnow
from broker.reconcile import ReconcileReport, reconcile
from broker.router import PlacementResult, Router
from broker.secrets import SecretSources
from policies.placement import rebalance
from providers.capabilities import ReportsEnd

if TYPE_CHECKING:
    from broker.store import Store

log = logging.getLogger(__name__)

RETRY_AFTER = timedelta(seconds=15)  # a job that could not be placed waits this long before the next try
# Reconciliation runs at start and then this often: it resolves what a crashed replica left (its placing
# jobs and intents, once older than reconcile's stale_after) and retries releases that failed.
RECONCILE_EVERY_S = 300.0
PLACING_AT_ONCE = 8  # placements (launches) in flight at once in one pass
CLAIM_BATCH = 2 * PLACING_AT_ONCE  # jobs claimed in one write
# Passes woken by submissions start at most this often: a burst of submissions is placed by one pass
# rather than one pass (and one look over the pending queue) per submission.
PLACE_MIN_GAP_S = 0.25
# A pass woken by submissions looks only at the jobs this process was told of (``hints``: just submitted,
# just requeued) and at the retries that came due, without reading every pending job's id; a full look
# over the queue (which also finds other processes' jobs) is made at least this often.
FULL_LOOK_EVERY_S = 1.0
POLLING_AT_ONCE = 16  # provider polls in flight at once in one poll pass
# The end watch looks this often (never less often than the poll) for the wrapper's report of its command's end
# on the allocations the last poll saw running, where the market can say so apart from a poll (ReportsEnd): the
# machine is then released at once, not up to a poll interval later (issue 24 item 4).
END_WATCH_S = 0.25
MAX_HINTS = 100_000  # past this, hints are dropped: the next full look finds those jobs anyway


class BrokerLoops:
    """The refresh, place, poll and reconcile loops over one store and one offer book.

    ``burn_in``: records an allocation's burn-in results (the service's health gates judge them); without
    it, burn-in results are not collected.
    """

    def __init__(
        self,
        settings: Settings,
        store: Store,
        market: Marketplace,
        *,
        clock: Callable[[], datetime] = utcnow,
        worker: str | None = None,
        preemption_rates: Callable[[], dict[tuple[str, str, str], float]] | None = None,
        on_placed: Callable[[str, str], None] | None = None,
        wake: asyncio.Event | None = None,
        burn_in: BurnInResults | None = None,
        hints: set[str] | None = None,
        on_budget_alert: BudgetAlert | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.market = market
        self.clock = clock
        self.worker = worker or f"broker-{secrets.token_hex(4)}"
        self.lifecycle = JobLifecycle(store, market.providers, clock=clock, burn_in=burn_in,
                                      secrets=SecretSources(settings.secrets))
        self.router = Router(settings, store, market, clock=clock, preemption_rates=preemption_rates,
                             on_placed=on_placed, lifecycle=self.lifecycle)
        self.budgets = BudgetWatch(settings, store, self.lifecycle, clock=clock, on_alert=on_budget_alert)
        self.wake = wake or asyncio.Event()
        self.hints: set[str] = hints if hints is not None else set()  # job ids to look at in a woken pass
        self._woken = False  # the last wait of the place loop ended on ``wake``
        self._full_look_at: float | None = None  # loop time of the last full look over the queue
        self._retry_at: dict[str, datetime] = {}
        b = settings.broker
        self.limits = PlacementLimits(b.placement_rounds, b.placement_timeout_s)
        # A pending job's wait, read from its events, by (job, its last change): read again when it changed.
        self._waits: dict[str, tuple[tuple[object, ...], PlacementWait]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._sem = asyncio.Semaphore(PLACING_AT_ONCE)
        self._reconciled_at: float | None = None  # loop time of the last reconciliation
        self.reconciled: tuple[datetime, ReconcileReport] | None = None  # the last completed one (metrics)
        # The end watch's view: allocations the last poll saw running on a market that reports ends; the ids
        # being followed right now (by a poll or by the watch: one follower at a time, so one release); and
        # those the watch closed since the poll pass in progress read its list (that pass skips them).
        self._running: dict[str, Allocation] = {}
        self._following: set[str] = set()
        self._closed: set[str] = set()

    # ------------------------------------------------------------------ placing
    async def _place_tick(self) -> list[PlacementResult]:
        """The place loop's pass: a quick one when woken by a submission soon after a full one."""
        t = asyncio.get_running_loop().time()
        quick = self._woken and self._full_look_at is not None and t - self._full_look_at < FULL_LOOK_EVERY_S
        return await self.place_pending(quick=quick)

    async def place_pending(self, job_ids: list[str] | None = None, *, quick: bool = False) -> list[PlacementResult]:
        """One placement pass over pending jobs (all, or those named). Returns what happened to each.

        ``quick``: only the jobs in ``hints`` and the retries now due, not a look over every pending job."""
        now = self.clock()
        hinted: set[str] = set()
        if job_ids is None:  # this pass looks at every hinted job (a full one at every pending job)
            hinted = set(self.hints)
            self.hints.difference_update(hinted)
        if job_ids is not None:
            pending = await asyncio.to_thread(self.store.jobs_in_states, [JobState.pending], job_ids)
        elif quick:
            due = [*hinted, *(k for k, at in self._retry_at.items() if at <= now)]
            due = [k for k in dict.fromkeys(due) if self._retry_at.get(k, now) <= now]
            pending = await asyncio.to_thread(self.store.jobs_in_states, [JobState.pending], due) if due else []
        else:
            self._full_look_at = asyncio.get_running_loop().time()
            # Look over every pending job's id, but read in full (spec and all) only those due a try now:
            # a queue of thousands waiting out RETRY_AFTER costs a light scan, not thousands of models.
            heads = await asyncio.to_thread(self.store.job_heads, JobState.pending)
            waiting = {job_id for job_id, _ in heads}  # forget the waits of jobs no longer pending
            self._waits = {k: v for k, v in self._waits.items() if k in waiting}
            self._retry_at = {k: v for k, v in self._retry_at.items() if k in waiting}
            due = [job_id for job_id, _ in heads if self._retry_at.get(job_id, now) <= now]
            pending = await asyncio.to_thread(self.store.jobs_in_states, [JobState.pending], due) if due else []
        results: list[PlacementResult] = []
        unhealthy = await asyncio.to_thread(self.store.unhealthy_nodes) if pending else {}
        held = await self.router.held_offers() if pending else set()
        # Same spec, same book, same moment: same verdict. Many jobs share a spec (a sweep, a
        # batch), and ranking is the CPU cost of a pass, so each distinct spec is ranked once.
        verdicts: dict[str, str] = {}
        by_object: dict[int, tuple[JobSpec, str]] = {}  # jobs read together share spec objects (store)
        waits: list[tuple[Job, str]] = []  # jobs that stay pending, and why

        def unplaceable(job: Job) -> str:
            seen = by_object.get(id(job.spec))
            if seen is not None and seen[0] is job.spec:
                return seen[1]
            key = job.spec.model_dump_json()
            if key not in verdicts:
                verdicts[key] = self.router.unplaceable_reason(*self.router.rank(job, now, unhealthy, held))
            by_object[id(job.spec)] = (job.spec, verdicts[key])
            return verdicts[key]

        def stays(job: Job) -> bool:
            """Look before claiming: a job nothing can run stays pending without churning events."""
            why = unplaceable(job)
            if why:
                self._retry_at[job.id] = now + RETRY_AFTER
                waits.append((job, why))  # written for the whole pass at once, below
                results.append(PlacementResult(job, False, why))
            return bool(why)

        async def one(claimed: Job) -> None:
            async with self._sem:
                try:
                    res = await self.router.place(claimed, unhealthy, now=now)
                except Exception as exc:  # never leave a claimed job stuck in placing
                    log.exception("placing %s", claimed.id)
                    res = await self.router.back_to_pending(claimed, f"placement error: {exc!r}"[:300], [], {})
                if not res.placed:
                    self._retry_at[claimed.id] = self.clock() + RETRY_AFTER
                    if res.tries and res.job.state is JobState.pending and self.limits.rounds and \
                            await self._give_up(res.job, self.clock(), results):
                        return
                results.append(res)

        async def batch(jobs: list[Job]) -> None:
            """Claim a batch in one write, then place what was claimed (``PLACING_AT_ONCE`` at a time)."""
            async with lanes:
                claimed = await self.lifecycle.claim_many([j.id for j in jobs], self.worker)
                await asyncio.gather(*(one(c) for c in claimed))

        # Jobs that cannot be placed now are settled here, without a task each (a queue of thousands
        # of one unplaceable spec is a loop, not thousands of tasks), handing the event loop back now and
        # then so that requests are not held up by a long pass.
        to_place: list[Job] = []
        for i, job in enumerate(pending):
            if self.limits.may_be_due(job, now) and await self._give_up(job, now, results):
                continue
            if not stays(job):
                to_place.append(job)
            if i % 256 == 255:
                await asyncio.sleep(0)
        # Claims go in batches, one write each; two batches at a time, so the next batch is claimed while
        # this one is placed, and few jobs sit claimed but not yet being placed.
        lanes = asyncio.Semaphore(2)
        await asyncio.gather(*(batch(to_place[i:i + CLAIM_BATCH]) for i in range(0, len(to_place), CLAIM_BATCH)))
        await self.lifecycle.note_waiting_many(waits)
        return results

    async def _give_up(self, job: Job, now: datetime, results: list[PlacementResult]) -> bool:
        """Fail a pending job past its placement limits (rounds, timeout or its own deadline), with every
        reason it collected. True when it did (the result is appended)."""
        key = (job.updated_at, job.attempts, job.preemptions)
        cached = self._waits.get(job.id)
        if cached is not None and cached[0] == key:
            wait = cached[1]
        else:
            wait = await self.lifecycle.placement_wait(job)
            self._waits[job.id] = (key, wait)
        why = self.limits.due(job, wait, now)
        if not why:
            return False
        failed = await self.lifecycle.give_up(job, why, wait)
        if failed is None:  # moved by another writer meanwhile
            return False
        log.info("job %s failed: %s", job.id, failed.reason)
        self._retry_at.pop(job.id, None)
        self._waits.pop(job.id, None)
        results.append(PlacementResult(failed, False, failed.reason))
        return True

    # ------------------------------------------------------------------ rebalancing
    async def rebalance_running(self) -> list[Job]:
        """The spot plan's periodic decision: each running on-demand job that tolerates preemption and has a
        deadline is offered a move to spot (``policies.placement.rebalance``, the function the simulator's
        ``lockstep`` calls at every tick for such a job). A move is break before make, through the lifecycle:
        the on-demand allocation is released and the job requeued, and the next placement pass — woken at
        once — decides again (``decide``, spot first). Returns the jobs moved."""
        now = self.clock()
        allocs = await asyncio.to_thread(self.store.live_allocations)
        on_demand = [a for a in allocs if a.state is AllocationState.running
                     and a.attrs.get("market") == Market.on_demand.value]
        if not on_demand:
            return []
        unhealthy = await asyncio.to_thread(self.store.unhealthy_nodes)
        held = await self.router.held_offers()
        moved: list[Job] = []
        for alloc in on_demand:
            try:
                requeued = await self._rebalance_one(alloc, now, unhealthy, held)
            except Exception:  # one job's trouble (gone meanwhile, a store error) must not stop the others
                log.exception("rebalancing the job of %s", alloc.id)
                continue
            if requeued is not None:
                self._retry_at.pop(requeued.id, None)
                moved.append(requeued)
        if moved:
            self.wake.set()
        return moved

    async def _rebalance_one(self, alloc: Allocation, now: datetime, unhealthy: dict[tuple[str, str], str],
                             held: set[str]) -> Job | None:
        job: Job = await asyncio.to_thread(self.store.get_job, alloc.job_id)
        if job.state is not JobState.running or not job.spec.interruptible or self.router.deadline(job) is None:
            return None
        _, options = self.router.rank(job, now, unhealthy, held)
        options, situation = await asyncio.to_thread(self.router.plan_inputs, job, options, now)
        decision = rebalance(job.spec, options, **situation)
        if not decision.allow_spot:  # staying in its own zone's market: is another zone's spot worth the move?
            decision, _ = await self.router.elsewhere(job, options, situation, decision, running_on_demand=True)
        if not decision.allow_spot:
            return None
        log.info("job %s: %s", job.id, decision.reason)
        return await self.lifecycle.rebalance_to_spot(job, alloc, decision.as_dict())

    async def rebalance_periodic(self) -> None:
        if self.settings.broker.rebalance_interval_s > 0:
            await self.rebalance_running()

    # ------------------------------------------------------------------ polling
    async def poll_once(self) -> int:
        """Poll every live allocation and let the lifecycle move its job along. Returns how many were polled.

        The polls of one pass run concurrently (``POLLING_AT_ONCE`` at a time): a pass takes about one
        round trip to the slowest market, not one per allocation, so a command that ended is seen — and its
        machine released — within one poll interval however many allocations are live."""
        allocs: list[Allocation] = await asyncio.to_thread(self.store.followed_allocations)  # draining too
        live = {a.id for a in allocs}
        self._closed.clear()  # only what the watch closes from now on was read live into this pass's list
        self._running = {k: v for k, v in self._running.items() if k in live}
        sem = asyncio.Semaphore(POLLING_AT_ONCE)

        async def one(alloc: Allocation) -> bool:
            async with sem:
                return await self._poll_one(alloc)

        polled = await asyncio.gather(*(one(a) for a in allocs if a.state is not AllocationState.intent))
        try:  # budgets hold while jobs run: weighed after every poll pass (broker/budgets.py)
            await self.budgets.check()
        except Exception:
            log.exception("budget check")
        return sum(polled)

    async def watch_ends(self) -> int:
        """One look of the end watch: each allocation the last poll saw running whose market reports ends
        (:class:`~providers.capabilities.ReportsEnd`) is asked whether its wrapper reported the command's end;
        one that did is polled and followed at once — its job ended, its machine released and its cost booked
        by the same code as a poll's, one follower at a time (a poll of the same allocation waits its turn and
        then skips it). Returns how many were followed."""
        watched = [a for a in self._running.values() if a.id not in self._following]
        if not watched:
            return 0
        sem = asyncio.Semaphore(POLLING_AT_ONCE)

        async def one(alloc: Allocation) -> bool:
            provider = self.market.launcher(alloc.provider)
            if not isinstance(provider, ReportsEnd) or alloc.id in self._following:
                return False
            async with sem:
                try:
                    reported = await provider.end_reported(alloc)
                except ProviderError as exc:  # unreadable now: the poll decides as before
                    log.info("end report of %s not read: %s", alloc.id, exc)
                    return False
                if not reported or alloc.id in self._following or alloc.id not in self._running:
                    return False
                await self._poll_one(alloc, closes=True)
                return True

        return sum(await asyncio.gather(*(one(a) for a in watched)))

    async def _poll_one(self, alloc: Allocation, *, closes: bool = False) -> bool:
        """Poll one allocation (an intent is the router's, or reconciliation's); True when the market answered.
        ``closes``: the end watch's call (what it closes, a poll pass that read it before then skips)."""
        if alloc.id in self._following or alloc.id in self._closed:
            return False  # the other follower has it (or has just closed it): one release, one booking
        self._following.add(alloc.id)
        try:
            return await self._follow_one(alloc, closes)
        finally:
            self._following.discard(alloc.id)

    async def _follow_one(self, alloc: Allocation, closes: bool) -> bool:
        provider = self.market.launcher(alloc.provider)
        if provider is None:
            return False
        if closes:  # the watch's copy is the last poll's: read what that poll wrote (and whether it is over)
            alloc = await asyncio.to_thread(self.store.get_allocation, alloc.id)
            if alloc.state in ENDED:
                self._running.pop(alloc.id, None)
                return False
        try:
            status = await self.market.circuits[alloc.provider].call(functools.partial(provider.poll, alloc))
        except CircuitOpen:
            return False  # not called while its circuit is open; polled again once it closes
        except ProviderError as exc:
            log.warning("poll %s on %s: %s", alloc.id, alloc.provider, exc)
            return False
        try:
            moved = await self.lifecycle.follow(alloc, status.state, status.reason, status.hosts, status.exit,
                                                started_at=status.started_at, usd_per_hour=status.usd_per_hour)
        except Exception:  # one allocation's trouble must not stop the others' polls
            log.exception("following %s", alloc.id)
            return True
        if status.state is AllocationState.running and isinstance(provider, ReportsEnd):
            self._running[alloc.id] = alloc
        else:
            self._running.pop(alloc.id, None)
            if closes and status.state is not AllocationState.pending:
                self._closed.add(alloc.id)
        if moved is JobState.pending:  # requeued: place it again at once
            self._retry_at.pop(alloc.job_id, None)
            if len(self.hints) < MAX_HINTS:
                self.hints.add(alloc.job_id)
            self.wake.set()
        return True

    # ------------------------------------------------------------------ loops
    async def _loop(self, name: str, interval: float, fn: Callable[[], Awaitable[Any]],
                    wake: asyncio.Event | None = None, min_gap: float = 0.0) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            started = loop.time()
            try:
                await fn()
            except Exception:
                log.exception("broker loop %s", name)
            waiters = [asyncio.ensure_future(self._stop.wait())]
            if wake is not None:
                waiters.append(asyncio.ensure_future(wake.wait()))
            _, pending = await asyncio.wait(waiters, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
            for p in pending:
                p.cancel()
            if wake is not None:
                self._woken = wake.is_set()
                wake.clear()
            rest = started + min_gap - loop.time()
            if rest > 0 and not self._stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), rest)

    async def reconcile_periodic(self) -> None:
        """A reconciliation beside this process's own placement loop (never exclusive)."""
        if self._reconciled_at is not None and \
                asyncio.get_running_loop().time() - self._reconciled_at < RECONCILE_EVERY_S * 0.9:
            return  # the loop's first turn comes right after the start-up pass
        self._reconciled_at = asyncio.get_running_loop().time()
        report = await reconcile(self.store, self.market.providers, clock=self.clock, exclusive=False,
                                 lifecycle=self.lifecycle)
        self.reconciled = (self.clock(), report)
        if report.released or report.failed_intents or report.requeued or report.to_provisioning or report.rebooked:
            log.info("periodic reconciliation: %s", report)

    async def start(self, *, reconcile_first: bool = True) -> None:
        """Start the loops; first (by default) refresh the book and reconcile what a crash may have left."""
        if reconcile_first:
            await self.market.refresh()
            report = await reconcile(self.store, self.market.providers, clock=self.clock, lifecycle=self.lifecycle)
            self.reconciled = (self.clock(), report)
            log.info("reconciliation: %s", report)
        self._reconciled_at = asyncio.get_running_loop().time()
        b = self.settings.broker
        self._stop.clear()
        self._tasks = [
            asyncio.create_task(self._loop("refresh", b.refresh_interval_s, self.market.refresh)),
            asyncio.create_task(self._loop("place", b.place_interval_s, self._place_tick, self.wake,
                                           min(PLACE_MIN_GAP_S, b.place_interval_s))),
            asyncio.create_task(self._loop("poll", b.poll_interval_s, self.poll_once)),
            asyncio.create_task(self._loop("end watch", min(END_WATCH_S, b.poll_interval_s), self.watch_ends)),
            asyncio.create_task(self._loop("reconcile", RECONCILE_EVERY_S, self.reconcile_periodic)),
        ]
        if b.rebalance_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._loop("rebalance", b.rebalance_interval_s,
                                                              self.rebalance_periodic)))

    async def stop(self) -> None:
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
