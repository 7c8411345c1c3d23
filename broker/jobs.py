"""Job lifecycle: the broker's loops (refresh, place, poll) and what a poll means for a job.

States: pending → placing → provisioning → running → succeeded | failed |
cancelled, and preempted → pending (requeued, resuming from its checkpoint,
counted). Every transition is a stored event with its time and reason.

One ``Broker`` per process. With PostgreSQL several may run against one
store: a job is claimed by a row-locked state change (pending → placing with
``expected={pending}``), so two replicas never place the same job.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from broker.config import Settings
from broker.errors import ConflictError, NotFoundError, ProviderError
from broker.market import Marketplace
from broker.models import (
    TERMINAL_STATES,
    Allocation,
    AllocationState,
    Job,
    JobState,
    utcnow,
)
from broker.reconcile import reconcile
from broker.router import Placement, Router
from providers.capabilities import RunsBurnIn

if TYPE_CHECKING:
    from broker.burnin import BurnIn
    from broker.store import Store

log = logging.getLogger(__name__)

ENDED = (AllocationState.released, AllocationState.failed, AllocationState.succeeded, AllocationState.preempted)
RETRY_AFTER = timedelta(seconds=15)  # a job that could not be placed waits this long before the next try
# Reconciliation runs at start and then this often: it resolves what a crashed replica left (its placing
# jobs and intents, once older than reconcile's stale_after) and retries releases that failed.
RECONCILE_EVERY_S = 300.0


class Broker:
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
        burnin: BurnIn | None = None,
    ) -> None:
        self.burnin = burnin  # for burn-in results (recorded and judged by broker.burnin)
        self.settings = settings
        self.store = store
        self.market = market
        self.clock = clock
        self.worker = worker or f"broker-{secrets.token_hex(4)}"
        self.router = Router(settings, store, market, clock=clock, preemption_rates=preemption_rates,
                             on_placed=on_placed)
        self.wake = wake or asyncio.Event()
        self._retry_at: dict[str, datetime] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._sem = asyncio.Semaphore(8)
        self._reconciled_at: float | None = None  # loop time of the last reconciliation

    async def _db(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, *args, **kwargs)

    # ------------------------------------------------------------------ placing
    async def claim(self, job_id: str) -> Job | None:
        """Claim one pending job for this worker; None when another worker got it first."""
        try:
            return await self._db(self.store.transition, job_id, JobState.placing, f"claimed by {self.worker}",
                                  {"worker": self.worker}, {JobState.pending}, claimed_by=self.worker,
                                  claimed_at=self.clock())
        except (ConflictError, NotFoundError):
            return None

    async def place_pending(self, job_ids: list[str] | None = None) -> list[Placement]:
        """One placement pass over pending jobs (all, or those named). Returns what happened to each."""
        now = self.clock()
        pending = await self._db(self.store.jobs_in_states, [JobState.pending])
        if job_ids is not None:
            wanted = set(job_ids)
            pending = [j for j in pending if j.id in wanted]
        else:
            pending = [j for j in pending if self._retry_at.get(j.id, now) <= now]
        results: list[Placement] = []
        unhealthy = await self._db(self.store.unhealthy_nodes) if pending else {}
        held = await self.router.held_offers() if pending else set()
        # Same spec, same book, same moment: same verdict. Many jobs share a spec (a sweep, a
        # batch), and ranking is the CPU cost of a pass, so each distinct spec is ranked once.
        verdicts: dict[str, str] = {}

        def unplaceable(job: Job) -> str:
            key = job.spec.model_dump_json()
            if key not in verdicts:
                verdicts[key] = self.router.unplaceable_reason(*self.router.rank(job, now, unhealthy, held))
            return verdicts[key]

        async def one(job: Job) -> None:
            # Look before claiming: a job nothing can run stays pending without churning events.
            why = unplaceable(job)
            if why:
                self._retry_at[job.id] = now + RETRY_AFTER
                if job.reason != why:
                    await self._db(self.store.update_job, job.id, reason=why)
                results.append(Placement(job, False, why, []))
                return
            async with self._sem:
                claimed = await self.claim(job.id)
                if claimed is None:
                    return
                try:
                    res = await self.router.place(claimed, unhealthy)
                except Exception as exc:  # never leave a claimed job stuck in placing
                    log.exception("placing %s", job.id)
                    res = await self.router._back_to_pending(claimed, f"placement error: {exc!r}"[:300], [], {})
                if not res.placed:
                    self._retry_at[job.id] = self.clock() + RETRY_AFTER
                results.append(res)

        await asyncio.gather(*(one(j) for j in pending))
        return results

    # ------------------------------------------------------------------ polling
    async def poll_once(self) -> int:
        """Poll every live allocation and move its job along. Returns how many were polled."""
        allocs: list[Allocation] = await self._db(self.store.live_allocations)
        polled = 0
        for alloc in allocs:
            if alloc.state is AllocationState.intent:
                continue  # the router is launching it, or reconciliation will resolve it
            provider = self.market.providers.get(alloc.provider)
            if provider is None:
                continue
            try:
                status = await provider.poll(alloc)
            except ProviderError as exc:
                log.warning("poll %s on %s: %s", alloc.id, alloc.provider, exc)
                continue
            polled += 1
            await self._apply(alloc, status.state, status.reason, status.hosts)
        return polled

    async def _apply(self, alloc: Allocation, state: AllocationState, reason: str, hosts: list[str]) -> None:
        now = self.clock()
        try:
            job: Job = await self._db(self.store.get_job, alloc.job_id)
        except NotFoundError:
            return
        if job.state in TERMINAL_STATES:
            if state not in ENDED:  # a finished job still holding capacity: give it back
                await self._release(alloc, f"job is {job.state.value}")
            return
        attrs = dict(alloc.attrs)
        if hosts:
            attrs["hosts"] = ",".join(hosts)
        if state is AllocationState.running and "running_since" not in attrs:
            attrs["running_since"] = now.isoformat()
        if state is not alloc.state or attrs != alloc.attrs:
            await self._db(self.store.update_allocation, alloc.id, state=state, attrs=attrs,
                           reason=reason or alloc.reason)
        spent = job.spent_usd + self._cost(alloc, attrs, now) if state in ENDED else job.spent_usd
        if job.spec.burn_in and self.burnin is not None and isinstance(
                self.market.providers.get(alloc.provider), RunsBurnIn) and state in (
                AllocationState.running, AllocationState.succeeded, AllocationState.failed):
            bad = await self._burn_in_failure(job, alloc)
            if bad and state is AllocationState.running:
                try:
                    await self.requeue(job, alloc, bad, spent)
                except ConflictError:
                    pass
                return

        try:
            if state is AllocationState.running and job.state is JobState.provisioning:
                where = ", ".join(hosts) if hosts else alloc.zone or alloc.region
                await self._db(self.store.transition, job.id, JobState.running, f"running on {where}",
                               {"allocation": alloc.id}, {JobState.provisioning})
            elif state is AllocationState.succeeded:
                await self._db(self.store.transition, job.id, JobState.succeeded, reason or "finished",
                               {"allocation": alloc.id}, {JobState.provisioning, JobState.running},
                               spent_usd=spent)
            elif state is AllocationState.failed:
                await self._db(self.store.transition, job.id, JobState.failed, reason or "failed at provider",
                               {"allocation": alloc.id}, {JobState.provisioning, JobState.running},
                               spent_usd=spent)
            elif state is AllocationState.preempted:
                await self.requeue(job, alloc, reason or "preempted by the provider", spent)
            elif state is AllocationState.released:
                # Gone without us releasing it (e.g. cancelled outside Lockstep): requeue it.
                await self.requeue(job, alloc, reason or "allocation disappeared at the provider", spent)
        except ConflictError:
            pass  # someone else moved the job (cancel); the next poll sees the new state

    async def _burn_in_failure(self, job: Job, alloc: Allocation) -> str:
        """Record what the allocation's burn-in step measured; the reason when a node failed it, else ''."""
        from broker.burnin import collect_burnin, job_stem

        assert self.burnin is not None
        benches = await collect_burnin(self.burnin, alloc.provider, job_stem(job.id, alloc.attempt))
        bad = [b for b in benches if not b.healthy]
        return f"burn-in failed on {bad[0].target}: {bad[0].reason}" if bad else ""

    @staticmethod
    def _cost(alloc: Allocation, attrs: dict[str, str], now: datetime) -> float:
        since = attrs.get("running_since")
        if not since:
            return 0.0
        hours = max((now - datetime.fromisoformat(since)).total_seconds(), 0.0) / 3600.0
        return hours * alloc.usd_per_hour

    async def requeue(self, job: Job, alloc: Allocation, reason: str, spent: float) -> None:
        """preempted → pending: the job resumes from its checkpoint on the next placement."""
        await self._release(alloc, reason, state=AllocationState.preempted)
        await self._db(self.store.transition, job.id, JobState.preempted, reason, {"allocation": alloc.id},
                       {JobState.provisioning, JobState.running}, preemptions=job.preemptions + 1, spent_usd=spent)
        await self._db(self.store.transition, job.id, JobState.pending,
                       f"requeued after preemption #{job.preemptions + 1}; resumes from its last checkpoint",
                       {}, {JobState.preempted})
        self._retry_at.pop(job.id, None)
        self.wake.set()

    async def _release(self, alloc: Allocation, reason: str,
                       state: AllocationState = AllocationState.released) -> None:
        provider = self.market.providers.get(alloc.provider)
        if provider is not None:
            try:
                await provider.release(alloc)
            except ProviderError as exc:
                log.warning("release %s: %s (reconciliation will retry)", alloc.id, exc)
                return
        await self._db(self.store.update_allocation, alloc.id, state=state, reason=reason)

    # ------------------------------------------------------------------ loops
    async def _loop(self, name: str, interval: float, fn: Callable[[], Any], wake: asyncio.Event | None = None):
        while not self._stop.is_set():
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
                wake.clear()

    async def reconcile_periodic(self) -> None:
        """A reconciliation beside this process's own placement loop (never exclusive)."""
        if self._reconciled_at is not None and \
                asyncio.get_running_loop().time() - self._reconciled_at < RECONCILE_EVERY_S * 0.9:
            return  # the loop's first turn comes right after the start-up pass
        self._reconciled_at = asyncio.get_running_loop().time()
        report = await reconcile(self.store, self.market.providers, clock=self.clock, exclusive=False)
        if report.released or report.failed_intents or report.requeued or report.to_provisioning:
            log.info("periodic reconciliation: %s", report)

    async def start(self, *, reconcile_first: bool = True) -> None:
        if reconcile_first:
            await self.market.refresh()
            report = await reconcile(self.store, self.market.providers, clock=self.clock)
            log.info("reconciliation: %s", report)
        self._reconciled_at = asyncio.get_running_loop().time()
        b = self.settings.broker
        self._stop.clear()
        self._tasks = [
            asyncio.create_task(self._loop("refresh", b.refresh_interval_s, self.market.refresh)),
            asyncio.create_task(self._loop("place", b.place_interval_s, self.place_pending, self.wake)),
            asyncio.create_task(self._loop("poll", b.poll_interval_s, self.poll_once)),
            asyncio.create_task(self._loop("reconcile", RECONCILE_EVERY_S, self.reconcile_periodic)),
        ]

    async def stop(self) -> None:
        self._stop.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
