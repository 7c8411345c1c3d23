"""``--clock-at WHEN``: run the tests with the wall clock moved to WHEN, ticking on from there (time-machine).

WHEN is an ISO instant (``2027-12-31T23:59:59Z``: the last second of a year) or an offset from now
(``+365d``). A test that mixes a fixed instant with the wall clock, or that breaks at a month's or a year's
end, fails under it: scripts/test runs the tests that touch time at such instants (issue 23), so the next
time bomb fails the commit that adds it. Only this process's clock moves (``time.time``, ``datetime.now``);
``time.monotonic`` and subprocesses keep the real one. Run with ``TZ=...`` for a daylight-saving change.
"""

from __future__ import annotations

import datetime as dt
import os
import re

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--clock-at", default=os.environ.get("LOCKSTEP_TEST_CLOCK_AT") or None,
                     help="run with the wall clock at this ISO instant, or this offset from now (+365d, -2h)")


def _when(text: str) -> dt.datetime:
    m = re.fullmatch(r"([+-])(\d+(?:\.\d+)?)([dhms])", text.strip())
    if m:
        unit = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}[m.group(3)]
        delta = dt.timedelta(**{unit: float(m.group(2))})
        return dt.datetime.now(dt.UTC) + (delta if m.group(1) == "+" else -delta)
    when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def pytest_configure(config: pytest.Config) -> None:
    at = config.getoption("--clock-at")
    if not at:
        return
    import time_machine

    # A POSIX timestamp, not an aware datetime: time-machine would set TZ from the datetime's zone, and the
    # daylight-saving run needs the TZ it was started with.
    traveller = time_machine.travel(_when(at).timestamp(), tick=True)
    traveller.start()
    config.stash[_KEY] = (at, traveller)


def pytest_unconfigure(config: pytest.Config) -> None:
    found = config.stash.get(_KEY, None)
    if found is not None:
        found[1].stop()


def pytest_report_header(config: pytest.Config) -> str | None:
    found = config.stash.get(_KEY, None)
    if found is None:
        return None
    return f"wall clock moved: {found[0]} (now {dt.datetime.now(dt.UTC).isoformat()}, TZ={os.environ.get('TZ', '')})"


_KEY = pytest.StashKey[tuple[str, object]]()
