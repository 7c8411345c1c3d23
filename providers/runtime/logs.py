"""Reading what the in-job wrapper writes: its log lines, its status, and the job's end. Pure: no I/O."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from broker.models import ExitReason, JobExit, LogLine, Notice, as_utc
from providers.runtime.wrapper import BEAT_MARKER, EXIT_MARKER

_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) (out|err|lockstep) ?(.*)$")


def lines_of(text: str) -> list[str]:
    """The log's lines, split on ``\\n`` only (a ``\\r``, a form feed or a Unicode separator inside a line is
    the line's own text: a command cannot start a line of its own with them); a trailing ``\\r`` dropped."""
    out = text.split("\n")
    if out and not out[-1]:
        out.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in out]


def parse_log(text: str, rank: int = 0) -> list[LogLine]:
    """The wrapper's lines (``<UTC time> <stream> <text>``); other lines (a container's own banner, a
    market's notes) are kept as they are, without a time. The wrapper's exit and heartbeat lines are not
    the job's output."""
    out: list[LogLine] = []
    for raw in lines_of(text):
        if raw.startswith((EXIT_MARKER, BEAT_MARKER)):
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
        started = doc.get("started_at")
        return JobExit(exit_code=int(doc["exit_code"]), reason=reason, rank=int(doc.get("rank", 0)),
                       last_lines=[str(x) for x in doc.get("last_lines") or []][-10:],
                       started_at=as_utc(str(started)) if started else None)
    except (KeyError, TypeError, ValueError):
        return None


def parse_status(text: str | bytes) -> JobExit | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return exit_from_status(doc) if isinstance(doc, dict) else None


def _marked(nonce: str, marker: str) -> str:
    return f"{marker}{nonce} " if nonce else marker


def exit_from_log(text: str, nonce: str = "") -> JobExit | None:
    """The status in a log's last ``LOCKSTEP-EXIT <nonce> {...}`` line (markets whose logs API is the only way
    out). Only a whole line (``\\n`` boundaries) that starts with the marker and this attempt's nonce counts
    (:func:`~providers.runtime.manifest.exit_nonce`); without a nonce, only the nonce-less form of older
    wrappers."""
    prefix = _marked(nonce, EXIT_MARKER)
    for raw in reversed(lines_of(text)):
        if raw.startswith(prefix) and (nonce or raw[len(prefix):].startswith("{")):
            return parse_status(raw[len(prefix):])
    return None


def parse_heartbeat(text: str | bytes | None) -> datetime | None:
    """When a wrapper's heartbeat document (``heartbeat-<rank>.json``) says it was alive; None if it is not one."""
    if not text:
        return None
    try:
        doc = json.loads(text)
        return as_utc(str(doc["at"])) if isinstance(doc, dict) else None
    except (KeyError, TypeError, ValueError):
        return None


def parse_notice(text: str | bytes | None) -> Notice | None:
    """The interruption notice a wrapper's heartbeat document carries (``notice``, docs/runtime.md), or a notice
    file itself (``notice-<rank>.json``: the same document, bare); None when it carries none, or only a rebalance
    recommendation (reported, not acted on)."""
    if not text:
        return None
    try:
        doc = json.loads(text)
        raw = (doc.get("notice") if "notice" in doc else doc) if isinstance(doc, dict) else None
        if not isinstance(raw, dict) or raw.get("kind") != "interruption":
            return None
        return Notice(kind="interruption", source=str(raw.get("source") or ""), action=str(raw.get("action") or ""),
                      deadline=as_utc(str(raw["deadline"])) if raw.get("deadline") else None,
                      seen_at=as_utc(str(raw["seen_at"])) if raw.get("seen_at") else None,
                      rank=int(raw.get("rank") or 0))
    except (KeyError, TypeError, ValueError):
        return None


def heartbeat_from_log(text: str, nonce: str = "") -> datetime | None:
    """The last ``LOCKSTEP-BEAT <nonce> {...}`` line's time (Vast: the container's stdout is the only way out)."""
    prefix = _marked(nonce, BEAT_MARKER)
    for raw in reversed(lines_of(text)):
        if raw.startswith(prefix):
            return parse_heartbeat(raw[len(prefix):])
    return None


def wrapper_silent(last_beat: datetime | None, running_since: datetime, now: datetime, *, heartbeat_s: float,
                   poll_interval_s: float, rendezvous_wait_s: float = 0.0) -> bool:
    """Has a running attempt's wrapper gone silent, so its machine must be released?

    The lifecycle asks this of each running allocation whose market serves heartbeats: silent means no beat
    for three heartbeats plus two polls (the wrapper beats from its main loop, so a wrapper stuck or dead
    stops). Before the first beat the rendezvous's wait is allowed too (the heartbeat starts after it).
    Beats carry the machine's clock: a skew larger than the allowance reads as silence (docs/runtime.md).
    """
    allowance = timedelta(seconds=3 * heartbeat_s + 2 * poll_interval_s)
    if last_beat is None:
        return now - running_since > allowance + timedelta(seconds=rendezvous_wait_s)
    return now - max(last_beat, running_since) > allowance


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
