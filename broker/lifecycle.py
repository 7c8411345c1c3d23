"""The job lifecycle: every change of a job's state, and what a provider's answer means for a job.

States: pending → placing → provisioning → running → succeeded | failed | cancelled, and
preempted → pending (requeued, resuming from its checkpoint, counted). ``ALLOWED_TRANSITIONS`` in
broker/models.py is the state machine; the store's ``transition`` is the primitive (one row-locked
compare-and-set on the job's state, with its event). :class:`JobLifecycle` is the only caller of that
primitive outside the store: the loops (claims, polls), the router (back to pending), reconciliation
(adopt, requeue what a crash left) and the service (cancel) all change a job's state through it, so each
rule lives once. Claims go in batches (:meth:`JobLifecycle.claim_many`, one write for many jobs). One move
is made with an allocation write, in one transaction, by the allocation ledger (broker/ledger.py, held here as
``ledger``): the launch with placing → provisioning. Every allocation write — what a poll saw, a release, the
booked cost — is the ledger's; :meth:`JobLifecycle.follow` is a dispatch on the state a poll answered
(``_ON_POLL``).

Every change names the states it expects to move from: when another writer (a replica, a reconcile, a
cancel) moved the job first, the store raises ``ConflictError`` and the caller decides what that means
for it (the methods here do not swallow it, except where noted).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from broker.errors import ConflictError, NotFoundError, ProviderError
from broker.heartbeats import wrapper_silence
from broker.ledger import ENDED, NOTICE_AT, NOTICE_DEADLINE, STOP_AT, STOP_REASON, Ledger
from broker.models import (
    TERMINAL_STATES,
    Allocation,
    AllocationState,
    Benchmark,
    BudgetAction,
    Job,
    JobEvent,
    JobExit,
    JobState,
    Notice,
    QuoteOption,
    as_utc,
    utcnow,
)
from broker.secrets import SecretSources, mask
from providers.base import Provider
from providers.capabilities import HasJobLogs, HearsNotices, Launches, RunsBurnIn, SignalsJobs

if TYPE_CHECKING:
    from broker.store import Store

log = logging.getLogger(__name__)

# The allocation state a poll answers when the provider holds nothing any more (no release needed; a preempted
# Vast instance, for one, still exists, stopped, until it is destroyed).
GONE = (AllocationState.released,)
# After a running attempt's release: how long its wrappers may take to log their end (the line below), and how
# often its log is read meanwhile, before its log is kept again (Slurm signals the step a moment after scancel).
FINAL_LOG_WAIT_S = 5.0
# A draining allocation (superseded at the market's notice) is released by the broker this long after the
# market's deadline if the market has not taken it by then, or this long after the notice where it gave none.
DRAIN_GRACE = timedelta(seconds=30)
DRAIN_WITHOUT_DEADLINE = timedelta(minutes=2)
FINAL_LOG_POLL_S = 0.2
WRAPPER_END = " lockstep command ended: "  # the wrapper's last log line (providers/runtime/wrapper.py finish)
# Job states in which a job holds, or is getting, an allocation.
# Records and returns what an allocation's burn-in step has measured so far (one benchmark a node; each
# result is recorded once). The service supplies it: recording judges the result with the health gates.
BurnInResults = Callable[[Job, Allocation], Awaitable[list[Benchmark]]]


@dataclass(frozen=True)
class LaunchTry:
    """One failed launch try, kept in the job's event (``data["tries"]``) with its reason.

    ``kind``: ``capacity``, ``quota``, ``auth``, another provider error's class name, or ``error`` for an
    exception that was no provider error (an adapter bug). ``sku``/``zone``/``market`` are None (and left
    out of the event) for the latter.
    """

    offer_id: str
    provider: str
    error: str
    kind: str
    sku: str | None = None
    zone: str | None = None
    market: str | None = None

    @property
    def rules_out_provider(self) -> bool:
        """An account limit or refused credentials: the provider's other offers would fail alike."""
        return self.kind in ("quota", "auth")

    def as_event(self) -> dict[str, Any]:
        """The JSON the job's event keeps (the keys and their order as the event has always had them)."""
        out: dict[str, Any] = {"offer_id": self.offer_id, "provider": self.provider}
        if self.kind != "error":
            out.update(sku=self.sku, zone=self.zone, market=self.market)
        out.update(error=self.error, kind=self.kind)
        return out


def _tries(tries: Sequence[LaunchTry]) -> dict[str, Any]:
    return {"tries": [t.as_event() for t in tries]} if tries else {}


ARCHIVE_BYTES = 1 << 20  # the last MiB of each node's log is kept in the store when its allocation ends


# A running job is stopped by the broker this long after its max_duration, if its wrapper (which stops the
# command at max_duration itself) has not ended it: a machine that hangs, a wrapper that died.
MAX_DURATION_MARGIN = timedelta(minutes=2)


def overdue(job: Job, attrs: Mapping[str, str], now: datetime) -> bool:
    """Has a running attempt outlived its spec's max_duration (plus the margin)?"""
    limit = job.spec.max_duration_s
    since = attrs.get("running_since")
    if not limit or not since:
        return False
    return now - datetime.fromisoformat(since) > timedelta(seconds=limit) + MAX_DURATION_MARGIN


@dataclass(frozen=True)
class PlacementWait:
    """What a pending job has been through since it last started waiting to be placed (submitted, or
    requeued after a preemption or a lost allocation): ``rounds`` of launch tries that all failed, and every
    distinct reason it was not placed, oldest first (each failed try's error; a round's reason when it
    tried nothing)."""

    since: datetime
    rounds: int
    reasons: tuple[str, ...]
    summaries: frozenset[str] = frozenset()  # the reasons of rounds whose tries are listed instead

    @classmethod
    def of(cls, job: Job, events: Sequence[JobEvent]) -> PlacementWait:
        since, start = job.created_at, 0
        for i, e in enumerate(events):
            if e.to_state is JobState.pending and e.from_state is not JobState.placing:
                since, start = e.at, i + 1
        rounds = 0
        reasons: dict[str, None] = {}  # insertion-ordered, deduplicated
        summaries: set[str] = set()
        for e in events[start:]:
            if e.from_state is not JobState.placing or e.to_state is not JobState.pending:
                continue
            tries = e.data.get("tries") or []
            if tries and not e.data.get("waits_for_spot"):
                rounds += 1
                summaries.add(e.reason)
            for text in [str(t.get("error", "")) for t in tries] if tries else [e.reason]:
                if text:
                    reasons.setdefault(text)
        return cls(since, rounds, tuple(reasons), frozenset(summaries))


@dataclass(frozen=True)
class PlacementLimits:
    """When a job that cannot be placed gives up (broker.placement_rounds, broker.placement_timeout_s; a
    job's own deadline replaces the timeout). 0 turns a limit off."""

    rounds: int = 0
    timeout_s: float = 0.0

    def may_be_due(self, job: Job, now: datetime) -> bool:
        """A cheap look, no history: could the deadline or the timeout have passed? (The wait began at the
        job's creation or later.)"""
        if job.deadline is not None:
            return now >= job.deadline
        return bool(self.timeout_s) and now >= job.created_at + timedelta(seconds=self.timeout_s)

    def due(self, job: Job, wait: PlacementWait, now: datetime) -> str:
        """Why the job gives up now ('' while it may wait on)."""
        if job.deadline is not None and now >= job.deadline:
            return f"not placed by its deadline ({job.deadline:%Y-%m-%d %H:%M:%S} UTC)"
        if job.deadline is None and self.timeout_s and now >= wait.since + timedelta(seconds=self.timeout_s):
            return f"not placed within {self.timeout_s:g} s of waiting (broker.placement_timeout_s)"
        if self.rounds and wait.rounds >= self.rounds:
            return f"not placed after {wait.rounds} failed launch rounds (broker.placement_rounds)"
        return ""


class JobLifecycle:
    """Every job state change, over one store (and, for what a poll means, the providers).

    ``providers``: used to give back what a requeued or finished job still holds (polls only).
    ``burn_in``: records a burn-in step's results for :meth:`follow`; without it burn-in is not judged.
    """

    def __init__(
        self,
        store: Store,
        providers: Mapping[str, Provider] | None = None,
        *,
        clock: Callable[[], datetime] = utcnow,
        burn_in: BurnInResults | None = None,
        secrets: SecretSources | None = None,
    ) -> None:
        self.store = store
        self.providers: Mapping[str, Provider] = providers if providers is not None else {}
        self.clock = clock
        self.ledger = Ledger(store, self.providers, clock=clock)  # every allocation write
        self.burn_in = burn_in
        self.secrets = secrets  # to mask a job's secret values in the log kept at its end

    async def _move(self, job_id: str, to: JobState, reason: str, data: dict[str, Any] | None,
                    expected: set[JobState] | None, **fields: Any) -> Job:
        """The store's ``transition``, off the event loop."""
        return await asyncio.to_thread(self.store.transition, job_id, to, reason, data, expected, **fields)

    # ------------------------------------------------------------------ placement
    async def claim(self, job_id: str, worker: str) -> Job | None:
        """pending → placing for ``worker``; None when another worker got it first (or it is gone)."""
        claimed = await self.claim_many([job_id], worker)
        return claimed[0] if claimed else None

    async def claim_many(self, job_ids: Sequence[str], worker: str) -> list[Job]:
        """pending → placing for ``worker``, for each of the jobs still pending, in one write (a placement
        pass's batch); the jobs claimed, in order. A job another worker got first is left out."""
        jobs: list[Job] = await asyncio.to_thread(self.store.claim_many, list(job_ids), worker, self.clock())
        return jobs

    async def note_waiting(self, job: Job, reason: str) -> None:
        """Say why a pending job stays pending (no state change, no event; written only when it changed)."""
        await self.note_waiting_many([(job, reason)])

    async def note_waiting_many(self, notes: Sequence[tuple[Job, str]]) -> None:
        """:meth:`note_waiting` for many jobs in one write (a placement pass's worth); only jobs still
        pending are changed."""
        changed = {job.id: reason for job, reason in notes if job.reason != reason}
        if changed:
            await asyncio.to_thread(self.store.note_reasons, changed)

    @staticmethod
    def launched_reason(option: QuoteOption) -> str:
        """How a job's move to provisioning names its launch (the ledger writes it with the launch)."""
        return f"launched on {option.provider} {option.sku} in {option.zone or option.region} ({option.market.value})"

    async def back_to_pending(self, job_id: str, reason: str, tries: Sequence[LaunchTry] = (),
                              decision: dict[str, Any] | None = None) -> Job:
        """placing → pending: not placed this time (the failed tries and the decision are kept).

        A round whose decision was spot or nothing (``on_demand_fallback`` false: the spot plan chose to wait
        for spot rather than pay for on-demand) is marked ``waits_for_spot``: its failed spot launches are the
        waiting the plan chose, not failed rounds (the job's deadline bounds it, and the plan's safety net
        turns to on-demand in time)."""
        fields: dict[str, Any] = {} if decision is None else {"decision": decision}
        data = _tries(tries)
        if data and decision and decision.get("on_demand_fallback") is False:
            data["waits_for_spot"] = True
        return await self._move(job_id, JobState.pending, reason, data, {JobState.placing}, **fields)

    async def rebalance_to_spot(self, job: Job, alloc: Allocation, decision: dict[str, Any]) -> Job | None:
        """running → pending, break before make: the job's on-demand allocation is given back (recorded as
        released), its cost added, and the job placed again — where the spot plan (``decision``, kept in the
        event) expects spot. Not a preemption: nothing is counted. None when the release failed (the job keeps
        running; the next rebalance tries again) or another writer moved the job first."""
        if (await asyncio.to_thread(self.store.get_allocation, alloc.id)).state is not AllocationState.running:
            return None  # another writer (a replica's rebalance, a poll) got to it first
        await self.release(alloc, "rebalanced: moving the job from on-demand to spot")
        current = await asyncio.to_thread(self.store.get_allocation, alloc.id)
        if current.state is not AllocationState.released:
            return None
        try:
            return await self._move(job.id, JobState.pending,
                                    "requeued to move from on-demand to spot; resumes from its last checkpoint",
                                    {"allocation": alloc.id, "rebalance": decision}, {JobState.running})
        except ConflictError:
            return None

    async def placement_wait(self, job: Job) -> PlacementWait:
        """The job's current wait to be placed, read from its events."""
        return PlacementWait.of(job, await asyncio.to_thread(self.store.events, job.id))

    async def give_up(self, job: Job, why: str, wait: PlacementWait) -> Job | None:
        """pending → failed: the job could not be placed within its limits; its reason names every distinct
        reason it collected (the event keeps them as a list). None when another writer moved it first."""
        reasons = list(wait.reasons)
        if job.reason and job.reason not in reasons and job.reason not in wait.summaries:
            # why it waits now (not every wait leaves an event)
            reasons.append(job.reason)
        text = f"{why}: " + "; ".join(reasons) if reasons else why
        try:
            data = {"reasons": reasons, "rounds": wait.rounds, "waiting_since": wait.since.isoformat()}
            return await self._move(job.id, JobState.failed, text[:4000], data, {JobState.pending})
        except (ConflictError, NotFoundError):
            return None

    async def fail_placing(self, job_id: str, reason: str) -> Job:
        """placing → failed: the job cannot be launched as it is (its spec names a secret no source has)."""
        return await self._move(job_id, JobState.failed, reason, None, {JobState.placing})

    async def adopt(self, job_id: str, alloc: Allocation) -> Job:
        """placing → provisioning: a restart found the launch a crash interrupted, and adopted it."""
        placement = QuoteOption.model_validate_json(alloc.attrs["option"]) if "option" in alloc.attrs else None
        return await self._move(job_id, JobState.provisioning,
                                f"adopted {alloc.provider} allocation {alloc.id} after a broker restart",
                                {"allocation": alloc.id}, {JobState.placing}, placement=placement)

    async def requeue_interrupted(self, job_id: str) -> Job:
        """placing → pending: a placement a crash interrupted, with nothing launched to adopt."""
        return await self.back_to_pending(job_id, "requeued: placement was interrupted by a broker restart")

    async def requeue_lost(self, job: Job) -> Job:
        """provisioning/running → pending: reconciliation found its allocation gone at the provider.

        A running job counts it as a preemption (preempted first); one still provisioning goes straight back.
        """
        if job.state is JobState.running:
            await self._move(job.id, JobState.preempted, "allocation gone at the provider", {},
                             {JobState.running}, preemptions=job.preemptions + 1)
        return await self._move(job.id, JobState.pending, "requeued: its allocation is gone at the provider", {},
                                {JobState.provisioning, JobState.preempted})

    # ------------------------------------------------------------------ cancel
    async def cancel(self, job_id: str, reason: str) -> Job:
        """Any unfinished state → cancelled (giving back what it holds is the caller's part)."""
        return await self._move(job_id, JobState.cancelled, reason, None, None)

    # ------------------------------------------------------------------ what a poll means
    async def follow(self, alloc: Allocation, state: AllocationState, reason: str, hosts: list[str],
                     exit: JobExit | None = None, *, started_at: datetime | None = None,
                     usd_per_hour: float | None = None) -> JobState | None:
        """Move the allocation's job along after a poll answered ``state``; returns the job's new state, or
        None when it did not change (unchanged, or another writer moved it first: the next poll sees it).

        What the poll saw is recorded by the ledger first (``started_at``, ``usd_per_hour``: the market's own
        start of its billing and its price, where it reports them); then one handler per answered state
        decides (:attr:`_ON_POLL`). A
        finished job's allocation that still runs is given back; a running job past its ``max_duration`` (plus
        the wrapper's margin) is stopped; burn-in results are judged while it runs and when it ends.

        ``exit``: how the command ended, as its wrapper reported (succeeded/failed polls). The job ends with
        its exit code and last lines, and its machines are given back at once — a cloud machine still
        shutting down, a marketplace container sitting exited — so billing stops within this poll (also when
        the market reports the end without an exit status). Every allocation that ends has its cost booked
        into its job once (the ledger's ``book_end``) and, where the market serves logs, its last log kept.
        """
        try:
            job: Job = await asyncio.to_thread(self.store.get_job, alloc.job_id)
        except NotFoundError:
            return None
        if job.state in TERMINAL_STATES:
            await self._after_end(job, alloc, state, reason)
            return None
        if alloc.state is AllocationState.draining:  # superseded: followed to its end, never moves its job
            await self._follow_draining(alloc, state, reason)
            return None
        alloc = await self.ledger.observe(alloc, state, reason, hosts, started_at, usd_per_hour)
        try:
            if state is AllocationState.running and overdue(job, alloc.attrs, self.clock()):
                return await self._stop_overdue(job, alloc)
            if state is AllocationState.running:  # a wrapper that stopped beating: its machine would bill for ever
                silent = await wrapper_silence(self.providers.get(alloc.provider), alloc, self.clock())
                if silent:
                    return await self.requeue_preempted(job, alloc, silent)
                notice = await self._notice(job, alloc)
                if notice is not None:
                    return await self.replace_at_notice(job, alloc, notice)
            if state in self._JUDGES_BURN_IN and job.spec.burn_in and self.burn_in is not None and isinstance(
                    self.providers.get(alloc.provider), RunsBurnIn):
                bad = await self._burn_in_failure(job, alloc)
                if bad and state is AllocationState.running:
                    return await self.requeue_preempted(job, alloc, bad)
            handler = self._ON_POLL.get(state)
            return None if handler is None else await handler(self, job, alloc, state, reason, hosts, exit)
        except ConflictError:
            return None  # someone else moved the job (a cancel); the next poll sees the new state

    _JUDGES_BURN_IN = (AllocationState.running, AllocationState.succeeded, AllocationState.failed)

    async def _after_end(self, job: Job, alloc: Allocation, state: AllocationState, reason: str) -> None:
        """A finished job's allocation: record it when gone already (a release a crash interrupted before it
        was recorded) and book it; give it back when it still holds capacity (its command's end included)."""
        if state in GONE:
            await self.ended(alloc, state, reason or f"job is {job.state.value}")
        else:
            await self.release(alloc, f"job is {job.state.value}",
                               state=state if state in ENDED else AllocationState.released)

    async def _stop_overdue(self, job: Job, alloc: Allocation) -> JobState:
        moved = (await self._move(
            job.id, JobState.failed, f"max_duration {job.spec.max_duration} exceeded: stopped and released",
            {"allocation": alloc.id, "exit_reason": "max_duration"}, {JobState.running})).state
        await self.release(alloc, "max_duration exceeded", state=AllocationState.failed)
        return moved

    async def _on_queued(self, job: Job, alloc: Allocation, state: AllocationState, reason: str, hosts: list[str],
                         exit: JobExit | None) -> JobState | None:
        """Accepted, not started: waiting in the market's queue, accruing nothing; the job says so."""
        if job.state is JobState.provisioning:
            why = f"queued in {alloc.provider}" + (f": {reason}" if reason else "")
            if job.reason != why:
                await asyncio.to_thread(self.store.note_reasons, {job.id: why}, JobState.provisioning)
        return None

    async def _on_running(self, job: Job, alloc: Allocation, state: AllocationState, reason: str,
                          hosts: list[str], exit: JobExit | None) -> JobState | None:
        if job.state is not JobState.provisioning:
            return None
        where = ", ".join(hosts) if hosts else alloc.zone or alloc.region
        return (await self._move(job.id, JobState.running, f"running on {where}", {"allocation": alloc.id},
                                 {JobState.provisioning})).state

    async def _on_end(self, job: Job, alloc: Allocation, state: AllocationState, reason: str, hosts: list[str],
                      exit: JobExit | None) -> JobState | None:
        """The command ended: the machines are idle from now on, whether the wrapper's status came back
        (``exit``) or the market only says it stopped (a Vast container that exited still bills until it is
        destroyed). The job ends first, then its machines are given back in this same poll (last log kept, cost
        booked): a crash in between leaves a finished job holding an allocation, which the next poll gives back
        and books — never a finished job taken for a preempted one."""
        ended = exit.describe() if exit is not None else reason or state.value
        ok = state is AllocationState.succeeded
        why = (f"finished: {exit.describe()}" if exit is not None else reason or "finished") if ok else (
            f"failed: {exit.describe()}" if exit is not None else reason or "failed at provider")
        if STOP_REASON in alloc.attrs:  # it ended after it was told to stop for its cost
            why = f"{alloc.attrs[STOP_REASON]}: stopped; {why}"
        if job.state is JobState.provisioning:
            # It started and ended between two polls: record that it ran, from when it really started (the
            # wrapper's report, else the market's), so the job's events say it ran before they say how it ended.
            await self._ran_unseen(job, alloc, hosts, exit)
        data: dict[str, Any] = {"allocation": alloc.id}
        if exit is not None:
            data.update(exit_code=exit.exit_code, exit_reason=exit.reason.value, node=exit.rank,
                        last_lines=exit.last_lines)
        moved = (await self._move(job.id, JobState.succeeded if ok else JobState.failed, why, data,
                                  {JobState.provisioning, JobState.running})).state
        await self.release(alloc, f"the job's command ended ({ended})", state=state)
        return moved

    async def _ran_unseen(self, job: Job, alloc: Allocation, hosts: list[str], exit: JobExit | None) -> None:
        started = exit.started_at if exit is not None and exit.started_at is not None else (
            as_utc(alloc.attrs["running_since"]) if alloc.attrs.get("running_since") else None)
        where = ", ".join(hosts) if hosts else alloc.zone or alloc.region
        data: dict[str, Any] = {"allocation": alloc.id, "seen": "ended"}
        if started is not None:
            data["started_at"] = started.isoformat()
        await self._move(job.id, JobState.running, f"running on {where}", data, {JobState.provisioning})

    async def _on_preempted(self, job: Job, alloc: Allocation, state: AllocationState, reason: str,
                            hosts: list[str], exit: JobExit | None) -> JobState | None:
        if STOP_REASON in alloc.attrs:
            # Signalled to stop for its cost, it ended on that signal (a market that reads a stop by signal as
            # its machine going away, AWS's): the end the broker asked for, not a preemption to requeue.
            return await self._on_end(job, alloc, AllocationState.failed, reason or "stopped by its signal",
                                      hosts, exit)
        return await self.requeue_preempted(job, alloc, reason or "preempted by the provider")

    async def _on_gone(self, job: Job, alloc: Allocation, state: AllocationState, reason: str, hosts: list[str],
                       exit: JobExit | None) -> JobState | None:
        """Gone without us releasing it (e.g. cancelled outside Lockstep): requeue it."""
        return await self.requeue_preempted(job, alloc, reason or "allocation disappeared at the provider")

    async def stop_for_cost(self, job: Job, alloc: Allocation, reason: str, action: BudgetAction,
                            grace_s: float) -> JobState | None:
        """A running (or provisioning) job whose tenant's budget is spent, or that reached its own max_cost_usd
        (``reason`` says which): per ``action``, nothing (``continue``), stopped now (``stop``: failed with the
        reason, its machines released and booked), or SIGTERM where its market can signal, then stopped
        ``grace_s`` later unless it ended first (``signal_then_stop``; where the market cannot signal, at
        once). Returns the job's new state, or None while it runs on."""
        if action is BudgetAction.continue_:
            return None
        if action is BudgetAction.signal_then_stop and grace_s > 0:
            due = alloc.attrs.get(STOP_AT)
            if due is not None and self.clock() < datetime.fromisoformat(due):
                return None  # signalled: its checkpoint window is still open
            provider = self.providers.get(alloc.provider)
            if due is None and isinstance(provider, SignalsJobs) and alloc.state is AllocationState.running:
                try:
                    await provider.signal(alloc, "TERM")
                except ProviderError as exc:
                    log.warning("job %s: SIGTERM for its cost not sent (%s): stopping it now", job.id, exc)
                else:
                    await self.ledger.stop_requested(alloc, self.clock() + timedelta(seconds=grace_s), reason)
                    await asyncio.to_thread(self.store.note_event, job.id, f"{reason}: SIGTERM sent; released in "
                                            f"{grace_s:g} s unless it ends first", {"allocation": alloc.id,
                                                                                   "stop": "signal_then_stop"})
                    return None
        try:
            moved = (await self._move(job.id, JobState.failed, f"{reason}: stopped and released",
                                      {"allocation": alloc.id, "exit_reason": "budget"},
                                      {JobState.provisioning, JobState.running})).state
        except ConflictError:
            return None
        await self.release(alloc, reason)
        return moved

    # What a poll's answer means for the job: one handler per allocation state (none: nothing to do).
    _ON_POLL: dict[AllocationState, Callable[..., Awaitable[JobState | None]]] = {
        AllocationState.pending: _on_queued,
        AllocationState.running: _on_running,
        AllocationState.succeeded: _on_end,
        AllocationState.failed: _on_end,
        AllocationState.preempted: _on_preempted,
        AllocationState.released: _on_gone,
    }

    async def _burn_in_failure(self, job: Job, alloc: Allocation) -> str:
        """Record what the allocation's burn-in step measured; the reason when a node failed it, else ''."""
        assert self.burn_in is not None
        bad = [b for b in await self.burn_in(job, alloc) if not b.healthy]
        return f"burn-in failed on {bad[0].target}: {bad[0].reason}" if bad else ""

    # ------------------------------------------------------------------ interruption notices (issue 30)
    async def _notice(self, job: Job, alloc: Allocation) -> Notice | None:
        """The market's interruption notice for a running attempt of a job that resumes from checkpoints."""
        provider = self.providers.get(alloc.provider)
        if job.state is not JobState.running or not job.spec.interruptible or not isinstance(provider, HearsNotices):
            return None
        try:
            return await provider.notice(alloc)
        except ProviderError as exc:  # unreadable now: the next poll reads again
            log.info("notice of %s not read: %s", alloc.id, exc)
            return None

    async def replace_at_notice(self, job: Job, alloc: Allocation, notice: Notice) -> JobState | None:
        """Make before break: at the market's notice the allocation becomes ``draining`` (still billing, its
        command checkpointing on the wrapper's signal) and the job is requeued at once, counted as a preemption,
        so its replacement is placed now rather than after the machine is taken. A crash between the two writes
        leaves a running job with no live allocation, which reconciliation requeues the same way."""
        when = f", the machine goes at {notice.deadline:%H:%M:%S} UTC" if notice.deadline else ""
        reason = (f"interruption notice from {alloc.provider}" + (f" ({notice.action})" if notice.action else "")
                  + f"{when}: placed again now; this machine checkpoints until then")
        try:
            alloc = await self.ledger.supersede(alloc, notice, reason)
        except ConflictError:
            return None  # decided meanwhile (a release, a cancel): the next poll sees it
        await self._move(job.id, JobState.preempted, reason,
                         {"allocation": alloc.id, "notice": notice.model_dump(mode="json", exclude_none=True)},
                         {JobState.running}, preemptions=job.preemptions + 1)
        return (await self._move(job.id, JobState.pending,
                                 f"requeued at the notice (preemption #{job.preemptions + 1}); resumes from its last "
                                 "checkpoint", {}, {JobState.preempted})).state

    async def _follow_draining(self, alloc: Allocation, state: AllocationState, reason: str) -> None:
        """A superseded allocation: booked once the market takes it or its command ends (after its checkpoint);
        given back by the broker if the market has not taken it shortly after its deadline."""
        if state in GONE:
            await self.ended(alloc, AllocationState.preempted, reason or "taken by the market after its notice")
            return
        if state in ENDED:
            await self.release(alloc, "superseded at the notice: its command ended", state=AllocationState.preempted)
            return
        deadline = alloc.attrs.get(NOTICE_DEADLINE)
        limit = (as_utc(deadline) + DRAIN_GRACE if deadline else
                 as_utc(alloc.attrs.get(NOTICE_AT) or alloc.updated_at) + DRAIN_WITHOUT_DEADLINE)
        if self.clock() >= limit:
            await self.release(alloc, "superseded at the notice: its deadline passed", state=AllocationState.preempted)

    async def requeue_preempted(self, job: Job, alloc: Allocation, reason: str) -> JobState:
        """provisioning/running → preempted → pending: the allocation is given back (recorded as preempted, its
        cost booked), the preemption counted, and the job resumes from its checkpoint on the next placement."""
        await self.release(alloc, reason, state=AllocationState.preempted)
        await self._move(job.id, JobState.preempted, reason, {"allocation": alloc.id},
                         {JobState.provisioning, JobState.running}, preemptions=job.preemptions + 1)
        return (await self._move(job.id, JobState.pending,
                                 f"requeued after preemption #{job.preemptions + 1}; resumes from its last checkpoint",
                                 {}, {JobState.preempted})).state

    # ------------------------------------------------------------------ the end of an allocation
    async def release(self, alloc: Allocation, reason: str, state: AllocationState = AllocationState.released,
                      *, raise_errors: bool = False) -> None:
        """Give an allocation back to its provider and record it as ``state``, its cost booked into its job and
        the last of its log kept (docs/runtime.md). A failed release is left unrecorded (still live), so
        reconciliation retries it; with ``raise_errors`` the ProviderError reaches the caller too.

        Crash safety (the ledger's writes): the moment the release call begins is written on the record first
        (``releasing_at``) and cleared when the call fails. A crash after the machine is gone but before the
        record says so leaves that mark; the next end of the same record (a poll, a reconcile) books the cost
        up to it. Booking is the store's compare-and-set on ``cost_usd IS NULL``: never twice.
        """
        provider = self.providers.get(alloc.provider)
        if isinstance(provider, Launches) and (alloc.resource_ids or alloc.state is not AllocationState.intent):
            # Its command is stopped by this release (a draining one's too: its checkpoint's last lines).
            was_running = alloc.state in (AllocationState.running, AllocationState.draining)
            alloc = await self.ledger.releasing(alloc)
            if isinstance(provider, HasJobLogs) and alloc.resource_ids:
                try:
                    await self.archive_logs(alloc, provider)
                except Exception:  # keeping the log must never keep a machine billing
                    log.exception("log of %s not kept", alloc.id)
            try:
                await provider.release(alloc)
            except ProviderError as exc:
                log.warning("release %s: %s (reconciliation will retry)", alloc.id, exc)
                await self.ledger.release_failed(alloc)
                if raise_errors:
                    raise
                return
            ended_at = self.clock()  # billing stopped just now
            if isinstance(provider, HasJobLogs) and alloc.resource_ids and was_running:
                try:  # what it printed as the release stopped it, where the market's copy outlives the machine
                    await self._archive_final(alloc, provider)
                except Exception:
                    log.exception("log of %s not kept", alloc.id)
            await self.ledger.book_end(alloc, state, reason, ended_at=ended_at)
            return
        await self.ended(alloc, state, reason)

    async def ended(self, alloc: Allocation, state: AllocationState, reason: str,
                    ended_at: datetime | None = None) -> Allocation:
        """Record an allocation that no longer holds anything as ``state``, its cost booked once (the ledger's
        ``book_end``: the market's billed time × its price); ``ended_at``: the caller's release just returned."""
        return await self.ledger.book_end(alloc, state, reason, ended_at=ended_at)

    async def _archive_final(self, alloc: Allocation, provider: HasJobLogs) -> None:
        """Keep the log again once the released attempt's wrappers have logged their end (bounded by
        ``FINAL_LOG_WAIT_S``): the release stopped its command, and what it printed as it stopped comes after
        the copy kept before. A market whose copy went with the machine (Vast: '') keeps that earlier copy."""
        give_up = asyncio.get_running_loop().time() + FINAL_LOG_WAIT_S
        while True:
            texts = [await provider.job_log(alloc, rank=r) for r in range(max(alloc.nodes, 1))]
            if not any(texts):
                return
            if all(WRAPPER_END in t for t in texts) or asyncio.get_running_loop().time() >= give_up:
                break
            await asyncio.sleep(FINAL_LOG_POLL_S)
        await self.archive_logs(alloc, provider)

    async def archive_logs(self, alloc: Allocation, provider: HasJobLogs) -> None:
        """Keep the last of each node's log in the store, secret values masked: the machine, and the market's
        copy of its log, go with the release. A log that cannot be read now is left (a warning), never a
        reason not to release."""
        values: list[str] = []
        if self.secrets is not None:
            try:
                job = await asyncio.to_thread(self.store.get_job, alloc.job_id)
                values = self.secrets.values(job.spec)
            except NotFoundError:
                return
        for rank in range(max(alloc.nodes, 1)):
            try:
                text = await provider.job_log(alloc, rank=rank)
            except (ProviderError, OSError) as exc:
                log.warning("log of %s (node %d) not kept: %s", alloc.id, rank, exc)
                continue
            if not text:
                continue
            text = mask(text, values)
            truncated = len(text.encode()) > ARCHIVE_BYTES
            if truncated:
                tail = text.encode()[-ARCHIVE_BYTES:].decode(errors="ignore")
                text = tail[tail.find("\n") + 1:]
            await asyncio.to_thread(self.store.archive_log, alloc.id, rank, text, truncated=truncated)
