"""The event stream, read from the store: every job event (state changes, and whatever else a part of the
broker records in a job's history, such as a budget alert) and every price spike alert, in the order the
store gave them ids.

Nothing is kept in memory between calls except which id gaps have been seen (below), so a follower
resumed from its cursor after a broker restart sees every event exactly once: the cursor is the last
``job_events.id`` and ``spike_alerts.id`` it has been given (``"<job event id>-<spike id>"``).

Id gaps on PostgreSQL. Ids come from sequences, taken when a row is inserted, not when its transaction
commits: a transition that took id 10 may commit after one that took id 11. A reader that moved past 11
would never see 10. So on PostgreSQL a page stops at the first missing id until that gap has been seen for
``GAP_SETTLE_S`` (a rolled-back transaction leaves a gap for ever); on SQLite writers take turns and a
rolled-back id is reused, so there are no such gaps.
"""

from __future__ import annotations

import heapq
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Row

from broker.errors import SpecError
from broker.models import JobState, StreamEvent, as_utc
from broker.store.engine import Database
from broker.tables import JobEventRow, JobRow, SpikeAlertRow, table_of

EVENTS = table_of(JobEventRow)
JOBS = table_of(JobRow)
ALERTS = table_of(SpikeAlertRow)
GAP_SETTLE_S = 10.0  # longer than any one store transaction that writes a job event takes to commit
SCAN = 500  # rows read per source per page
R = TypeVar("R", bound=Row)  # any row shape
_CURSOR = re.compile(r"^(\d{1,18})-(\d{1,18})$")

SELECT_JOB_EVENTS = (
    sa.select(EVENTS.c.id, EVENTS.c.job_id, EVENTS.c.at, EVENTS.c.from_state, EVENTS.c.to_state, EVENTS.c.reason,
              EVENTS.c.data, JOBS.c.tenant)
    .join(JOBS, JOBS.c.id == EVENTS.c.job_id)
    .where(EVENTS.c.id > sa.bindparam("after"))
    .order_by(EVENTS.c.id)
    .limit(sa.bindparam("scan"))
)
SELECT_SPIKES = (
    sa.select(ALERTS.c.id, ALERTS.c.series, ALERTS.c.start, ALERTS.c.peak, ALERTS.c.baseline)
    .where(ALERTS.c.id > sa.bindparam("after"))
    .order_by(ALERTS.c.id)
    .limit(sa.bindparam("scan"))
)


@dataclass(frozen=True, order=True)
class EventCursor:
    """Where a reader of the stream stands: the last job event id and the last spike alert id passed."""

    job: int = 0
    spike: int = 0

    def __str__(self) -> str:
        return f"{self.job}-{self.spike}"

    @classmethod
    def parse(cls, text: str, field: str = "since") -> EventCursor:
        m = _CURSOR.match(text.strip())
        if m is None:
            raise SpecError(field, "not an event cursor (a line's 'cursor', 'now' or '0-0')")
        return cls(int(m.group(1)), int(m.group(2)))


def event_kind(to_state: str, data: dict[str, Any] | None) -> str:
    """A job event's kind: its own ``data.kind`` when the part that wrote it named one (``budget.alert``),
    else ``job.<the state it moved to>``."""
    kind = (data or {}).get("kind")
    return kind if isinstance(kind, str) and kind else f"job.{to_state}"


class EventStore(Database):
    """The event stream (``GET /v1/events``, webhooks' outbox filling)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._gaps: dict[tuple[str, int], float] = {}  # (source, first missing id) → when first seen
        self._gaps_lock = threading.Lock()
        self.gap_settle_s = GAP_SETTLE_S

    def events_end(self) -> EventCursor:
        """The cursor past every event stored now (``since=now``)."""
        with self._tx(write=False) as conn:
            job = conn.execute(sa.select(sa.func.max(EVENTS.c.id))).scalar() or 0
            spike = conn.execute(sa.select(sa.func.max(ALERTS.c.id))).scalar() or 0
        return EventCursor(int(job), int(spike))

    def events_after(self, since: EventCursor, tenant: str | None = None,
                     limit: int = 500) -> tuple[list[StreamEvent], EventCursor]:
        """Up to ``limit`` events after ``since`` that ``tenant`` may see (None: all), oldest first, and the
        cursor to read on from (past other tenants' events as well)."""
        with self._tx(write=False) as conn:
            jobs = conn.execute(SELECT_JOB_EVENTS, {"after": since.job, "scan": SCAN}).all()
            spikes = conn.execute(SELECT_SPIKES, {"after": since.spike, "scan": SCAN}).all()
        jobs = self._settled("job", since.job, jobs)
        spikes = self._settled("spike", since.spike, spikes)
        merged = heapq.merge((("job", r) for r in jobs), (("spike", r) for r in spikes),
                             key=lambda e: as_utc(e[1][2]))  # each source stays in id order
        out: list[StreamEvent] = []
        at = since
        for source, row in merged:
            if source == "job":
                at = EventCursor(int(row.id), at.spike)
                if tenant is not None and row.tenant != tenant:
                    continue
                data = dict(row.data or {})
                out.append(StreamEvent(
                    cursor=str(at), kind=event_kind(row.to_state, data), at=as_utc(row.at), tenant=row.tenant,
                    job_id=row.job_id, from_state=JobState(row.from_state) if row.from_state else None,
                    to_state=JobState(row.to_state), reason=row.reason or "", data=data))
            else:
                at = EventCursor(at.job, int(row.id))
                out.append(StreamEvent(
                    cursor=str(at), kind="price.spike", at=as_utc(row.start),
                    reason=f"peak {row.peak:.4g} $/h vs baseline {row.baseline:.4g} $/h",
                    data={"series": row.series, "peak_usd_per_hour": row.peak,
                          "baseline_usd_per_hour": row.baseline}))
            if len(out) >= limit:
                break
        return out, at

    def _settled(self, source: str, after: int, rows: Sequence[R]) -> Sequence[R]:
        """``rows`` up to the first id gap that may still fill (PostgreSQL; see the module doc)."""
        if self.is_sqlite:
            return rows
        expected = after + 1
        now = time.monotonic()
        with self._gaps_lock:
            for i, r in enumerate(rows):
                if r.id != expected:
                    seen = self._gaps.setdefault((source, expected), now)
                    if now - seen < self.gap_settle_s:
                        return rows[:i]
                expected = r.id + 1
            if len(self._gaps) > 10_000:  # settled gaps nobody will ask about again
                self._gaps = {k: v for k, v in self._gaps.items() if now - v < self.gap_settle_s}
        return rows
