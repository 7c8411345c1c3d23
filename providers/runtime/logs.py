"""Reading what the in-job wrapper writes: its log lines, its status, and the job's end. Pure: no I/O."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from broker.models import ExitReason, JobExit, LogLine, as_utc
from providers.runtime.wrapper import EXIT_MARKER

_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) (out|err|lockstep) ?(.*)$")


def parse_log(text: str, rank: int = 0) -> list[LogLine]:
    """The wrapper's lines (``<UTC time> <stream> <text>``); other lines (a container's own banner, a
    market's notes) are kept as they are, without a time."""
    out: list[LogLine] = []
    for raw in text.splitlines():
        if raw.startswith(EXIT_MARKER):
            continue
        m = _LINE.match(raw)
        if m:
            out.append(LogLine(at=as_utc(m.group(1)), stream=m.group(2), text=m.group(3), rank=rank))
        elif raw.strip():
            out.append(LogLine(stream="out", text=raw, rank=rank))
    return out


def exit_from_status(doc: Mapping[str, Any]) -> JobExit | None:
    """A node's ``status.json`` as a :class:`JobExit` (None when it is not one)."""
    try:
        reason = ExitReason(str(doc.get("reason", "exited")))
        return JobExit(exit_code=int(doc["exit_code"]), reason=reason, rank=int(doc.get("rank", 0)),
                       last_lines=[str(x) for x in doc.get("last_lines") or []][-10:])
    except (KeyError, TypeError, ValueError):
        return None


def parse_status(text: str | bytes) -> JobExit | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return exit_from_status(doc) if isinstance(doc, dict) else None


def exit_from_log(text: str) -> JobExit | None:
    """The status in a log's last ``LOCKSTEP-EXIT`` line (markets whose logs API is the only way out)."""
    for raw in reversed(text.splitlines()):
        if raw.startswith(EXIT_MARKER):
            return parse_status(raw[len(EXIT_MARKER):])
    return None


def job_exit(statuses: Mapping[int, JobExit], nodes: int = 1) -> JobExit | None:
    """The attempt's end, from the statuses its nodes reported so far; None while it still runs.

    A node that failed ends the job (the lowest rank among them decides the code); otherwise the job
    ends when its head node (rank 0) ends — ``torchrun``'s rule — or when every node has.
    """
    failed = sorted((r, e) for r, e in statuses.items() if not e.succeeded)
    if failed:
        return failed[0][1]
    if 0 in statuses:
        return statuses[0]
    if nodes and len(statuses) >= nodes:
        return statuses[min(statuses)]
    return None


def last_seen(lines: list[LogLine]) -> datetime | None:
    return max((ln.at for ln in lines if ln.at is not None), default=None)
