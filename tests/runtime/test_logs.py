"""Reading the wrapper's output: lines, statuses, and when a multi-node attempt has ended."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from broker.models import ExitReason, JobExit
from providers.runtime.logs import (
    exit_from_log,
    heartbeat_from_log,
    job_exit,
    parse_heartbeat,
    parse_log,
    parse_status,
    wrapper_silent,
)


def test_lines_keep_time_stream_and_text_and_foreign_lines() -> None:
    text = ("banner from the image\n"
            "2026-12-01T04:07:13.123Z out hello  world\n"
            "2026-12-01T04:07:14.000Z err oops\n"
            "2026-12-01T04:07:14.500Z lockstep command ended: exit code 3 (exited)\n"
            'LOCKSTEP-EXIT {"exit_code": 3, "rank": 1, "reason": "exited"}\n')
    lines = parse_log(text, rank=1)
    assert [(ln.stream, ln.text) for ln in lines] == [
        ("out", "banner from the image"), ("out", "hello  world"), ("err", "oops"),
        ("lockstep", "command ended: exit code 3 (exited)")]
    assert lines[0].at is None and lines[1].at is not None and lines[1].at.microsecond == 123000
    assert all(ln.rank == 1 for ln in lines)
    got = exit_from_log(text)
    assert got is not None and got.exit_code == 3 and got.rank == 1


def test_statuses_that_are_not_statuses() -> None:
    assert parse_status("{not json") is None
    assert parse_status('{"reason": "exited"}') is None
    assert parse_status('{"exit_code": 1, "reason": "bogus"}') is None
    ok = parse_status('{"exit_code": 137, "reason": "max_duration", "last_lines": ["a"]}')
    assert ok is not None and ok.reason is ExitReason.max_duration and not ok.succeeded
    assert exit_from_log("no marker here") is None


def ok(rank: int) -> JobExit:
    return JobExit(exit_code=0, rank=rank)


def test_a_multi_node_attempt_ends_with_its_head_or_its_first_failure() -> None:
    assert job_exit({}, 2) is None
    assert job_exit({1: ok(1)}, 2) is None  # a worker done early: the head still runs
    assert job_exit({0: ok(0)}, 2) == ok(0)
    failed = JobExit(exit_code=3, rank=1)
    assert job_exit({0: ok(0), 1: failed}, 2) == failed
    assert job_exit({2: JobExit(exit_code=1, rank=2), 1: failed}, 3) == failed
    assert job_exit({1: ok(1), 2: ok(2)}, 2) == ok(1)


# --------------------------------------------------------------------------- issue 27: the exit line, the heartbeat


def test_the_exit_line_needs_the_nonce_and_a_line_of_its_own() -> None:
    real = 'LOCKSTEP-EXIT n1 {"exit_code": 3, "reason": "exited"}'
    forged = [
        'x\rLOCKSTEP-EXIT n1 {"exit_code": 0, "reason": "exited"}',  # \r is not a line break
        'x\u2028LOCKSTEP-EXIT n1 {"exit_code": 0, "reason": "exited"}',  # nor a Unicode separator
        'x\x0cLOCKSTEP-EXIT n1 {"exit_code": 0, "reason": "exited"}',  # nor a form feed
        'LOCKSTEP-EXIT n2 {"exit_code": 0, "reason": "exited"}',  # another attempt's nonce
        'LOCKSTEP-EXIT {"exit_code": 0, "reason": "exited"}',  # none
    ]
    text = real + "\r\n" + "\n".join(forged) + "\n"
    got = exit_from_log(text, "n1")
    assert got is not None and got.exit_code == 3
    assert exit_from_log("\n".join(forged[:3]), "n1") is None
    # Without a nonce only the old, nonce-less form is read (and a nonce is never taken for JSON).
    assert exit_from_log(real) is None
    legacy = exit_from_log(forged[-1])
    assert legacy is not None and legacy.exit_code == 0
    # The exit and heartbeat lines are the wrapper's, not the job's output; a \r stays inside its line.
    lines = parse_log(text + 'LOCKSTEP-BEAT n1 {"at": "2026-12-01T04:07:13.123Z"}\n')
    assert [ln.text for ln in lines][:3] == forged[:3]
    assert not any(ln.text.startswith(("LOCKSTEP-EXIT", "LOCKSTEP-BEAT")) for ln in lines)


def test_heartbeats_are_read_from_documents_and_lines() -> None:
    at = datetime(2026, 12, 1, 4, 7, 13, 123000, tzinfo=UTC)
    assert parse_heartbeat('{"at": "2026-12-01T04:07:13.123Z", "seq": 4}') == at
    assert parse_heartbeat(None) is None and parse_heartbeat("{}") is None and parse_heartbeat("[1]") is None
    text = ('LOCKSTEP-BEAT n1 {"at": "2026-12-01T04:00:00.000Z"}\n'
            '2026-12-01T04:07:00.000Z out LOCKSTEP-BEAT n1 {"at": "2026-12-01T09:00:00.000Z"}\n'
            'LOCKSTEP-BEAT n1 {"at": "2026-12-01T04:07:13.123Z"}\n'
            'LOCKSTEP-BEAT n2 {"at": "2026-12-01T05:00:00.000Z"}\n')
    assert heartbeat_from_log(text, "n1") == at


def test_a_wrapper_is_silent_after_three_beats_and_two_polls() -> None:
    since = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)
    kw = {"heartbeat_s": 30.0, "poll_interval_s": 15.0}  # allowance: 90 + 30 = 120 s
    beat = since + timedelta(minutes=10)
    assert not wrapper_silent(beat, since, beat + timedelta(seconds=120), **kw)
    assert wrapper_silent(beat, since, beat + timedelta(seconds=121), **kw)
    # Before the first beat the rendezvous's wait is allowed as well.
    assert not wrapper_silent(None, since, since + timedelta(seconds=900 + 120), rendezvous_wait_s=900, **kw)
    assert wrapper_silent(None, since, since + timedelta(seconds=900 + 121), rendezvous_wait_s=900, **kw)
    # A beat from before this attempt was running (a clock behind) counts from running_since.
    assert not wrapper_silent(since - timedelta(hours=1), since, since + timedelta(seconds=60), **kw)
