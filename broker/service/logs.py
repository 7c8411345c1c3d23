"""A job's log: what its command printed, read through the market's :class:`HasJobLogs` capability while the
job runs, and from the store once it has ended (the lifecycle keeps the last of each node's log at release,
since the machine and the market's copy go with it). Secret values are masked again here, whatever the
wrapper did. docs/runtime.md, "Logs".
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from broker.errors import NotFoundError, ProviderError
from broker.models import TERMINAL_STATES, Allocation, AllocationState, Job, LogLine
from broker.secrets import SecretSources, mask
from broker.service.runtime import Runtime
from providers.capabilities import HasJobLogs
from providers.runtime.logs import parse_log

log = logging.getLogger(__name__)

LIVE = (AllocationState.pending, AllocationState.running, AllocationState.unknown)  # launched, not ended yet


def merge(by_rank: dict[int, list[LogLine]]) -> list[LogLine]:
    """Every node's lines in one list, by time; each node's own lines keep their order (a k-way merge: a line
    without a time, or with a clock that went back, stays after the line before it on its node)."""

    def keyed(rank: int, lines: list[LogLine]) -> list[tuple[float, int, LogLine]]:
        out, last = [], 0.0
        for ln in lines:
            last = ln.at.timestamp() if ln.at is not None else last
            out.append((last, rank, ln))
        return out

    runs = [keyed(rank, lines) for rank, lines in sorted(by_rank.items())]
    return [ln for _, _, ln in heapq.merge(*runs, key=lambda k: (k[0], k[1]))]


def _attempt_of(allocs: list[Allocation]) -> Allocation | None:
    """The job's current or last attempt that reached its market (what its log is the log of)."""
    launched = [a for a in allocs if a.resource_ids and a.state is not AllocationState.intent]
    return launched[-1] if launched else None


@dataclass
class _Cursor:
    """How far a follow has read: the attempt, and the lines of each node given out so far."""

    alloc_id: str = ""
    sent: dict[int, int] = field(default_factory=dict)


class LogsService(Runtime):
    def _masking(self, job: Job) -> list[str]:
        return SecretSources(self.settings.secrets).values(job.spec)

    async def _read(self, job: Job, alloc: Allocation, values: list[str]) -> dict[int, list[LogLine]]:
        """Each node's lines of ``alloc``: the kept copy once it has ended, else the market's."""
        live = alloc.state in LIVE
        kept: dict[int, str] = {} if live else await self.db(self.store.archived_logs, alloc.id)
        if not kept:
            provider = self._providers.get(alloc.provider)
            if not isinstance(provider, HasJobLogs):
                if live:
                    raise NotFoundError(f"job {job.id}: its market ({alloc.provider}) serves no job logs")
                return {}
            kept = {rank: await provider.job_log(alloc, rank=rank) for rank in range(max(alloc.nodes, 1))}
        return {rank: parse_log(mask(text, values), rank) for rank, text in sorted(kept.items())}

    async def job_logs(self, job_id: str, tenant: str | None = None, *, tail: int | None = None) -> list[LogLine]:
        """The job's log so far (its current or last attempt, every node), the last ``tail`` lines when given.
        Another tenant's job is not found."""
        job = await self.db(self.store.get_job, job_id, tenant)
        alloc = _attempt_of(await self.db(self.store.allocations, job.id))
        if alloc is None:
            return []
        lines = merge(await self._read(job, alloc, self._masking(job)))
        return lines[-tail:] if tail is not None and tail > 0 else ([] if tail == 0 else lines)

    async def follow_logs(self, job_id: str, tenant: str | None = None, *, tail: int | None = None,
                          interval_s: float | None = None, drive: bool = False) -> AsyncGenerator[LogLine]:
        """The job's log as it grows: the last ``tail`` lines (all when None), then each new line, read every
        ``interval_s`` (the wrapper ships its log every ``runtime.log_interval_s``), until the job has ended
        and its last lines are out. A requeued job's new attempt follows on, after a ``lockstep`` line saying so.

        The job is looked up now (another tenant's: not found, before anything is sent). ``drive``: poll the
        markets each round (a CLI without a server: nothing else moves the job along).
        """
        job = await self.db(self.store.get_job, job_id, tenant)
        alloc = _attempt_of(await self.db(self.store.allocations, job.id))
        if alloc is not None and alloc.state in LIVE and not isinstance(self._providers.get(alloc.provider),
                                                                         HasJobLogs):
            raise NotFoundError(f"job {job.id}: its market ({alloc.provider}) serves no job logs")
        every = interval_s if interval_s is not None else min(self.settings.runtime.log_interval_s,
                                                               self.settings.broker.poll_interval_s)
        return self._follow(job, tenant, tail, every, drive)

    async def _follow(self, job: Job, tenant: str | None, tail: int | None, every: float,
                      drive: bool) -> AsyncGenerator[LogLine]:
        values = self._masking(job)
        cur = _Cursor()
        first = True
        while True:
            if drive:
                await self.broker.poll_once()
            job = await self.db(self.store.get_job, job.id, tenant)
            ended = job.state in TERMINAL_STATES  # read before the log: its last lines are kept by now
            alloc = _attempt_of(await self.db(self.store.allocations, job.id))
            if alloc is not None:
                if alloc.id != cur.alloc_id:
                    if cur.alloc_id:
                        yield LogLine(stream="lockstep", text=f"attempt {alloc.attempt} on {alloc.provider}")
                    cur = _Cursor(alloc.id)
                try:
                    by_rank = await self._read(job, alloc, values)
                except ProviderError as exc:  # the market did not answer this time: the next round asks again
                    log.warning("log of job %s unreadable this round: %s", job.id, exc)
                    by_rank = {}
                fresh = {r: lines[cur.sent.get(r, 0):] for r, lines in by_rank.items()}
                for r, lines in by_rank.items():
                    cur.sent[r] = max(cur.sent.get(r, 0), len(lines))
                out = merge(fresh)
                if first and tail is not None:
                    out = out[-tail:] if tail > 0 else []
                first = False
                for ln in out:
                    yield ln
            if ended:
                return
            await asyncio.sleep(every)
