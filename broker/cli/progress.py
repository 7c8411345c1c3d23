"""Progress on long work (serve's start-up, a tracker run, a burn-in, a probe), always on stderr.

On a terminal it is a rich spinner with the current step, cleared when the work ends; otherwise (a
pipe, a log file, CI) one line per step, ``lockstep: STEP…``, or with ``--log-format json`` a JSON
log line (logger ``lockstep.progress``) like every other line there. Never on stdout, so ``--json``
output and the lines scripts wait for stay clean.

    with working("polling the markets") as step:
        ...
        step("storing prices")
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any


class Progress:
    """A spinner (terminal) or step lines (otherwise) on stderr until :meth:`done`."""

    def __init__(self, text: str) -> None:
        from rich.console import Console

        self._console = Console(stderr=True, highlight=False)
        self._status: Any = None
        if self._console.is_terminal:
            self._status = self._console.status(text)
            self._status.start()
        else:
            self._line(text)

    def _line(self, text: str) -> None:
        from broker import logconfig

        if logconfig.active_format() == "json":  # stderr is a log pipeline: one more JSON line
            import logging
            import sys

            record = logging.makeLogRecord({"name": "lockstep.progress", "levelname": "INFO",
                                            "levelno": logging.INFO, "msg": text})
            sys.stderr.write(logconfig.JsonFormatter().format(record) + "\n")
            sys.stderr.flush()
        else:
            self._console.print(f"lockstep: {text}…", markup=False, soft_wrap=True)

    def __call__(self, text: str) -> None:
        """The next step."""
        if self._status is not None:
            self._status.update(text)
        else:
            self._line(text)

    def done(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


@contextlib.contextmanager
def working(text: str) -> Iterator[Callable[[str], None]]:
    progress = Progress(text)
    try:
        yield progress
    finally:
        progress.done()
