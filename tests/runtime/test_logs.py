"""Reading the wrapper's output: lines, statuses, and when a multi-node attempt has ended."""

from __future__ import annotations

from broker.models import ExitReason, JobExit
from providers.runtime.logs import exit_from_log, job_exit, parse_log, parse_status


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
