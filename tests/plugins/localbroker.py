"""Background brokers started by tests (local-mode `lockstep` commands) live under one temporary directory for
the session and are all stopped at its end, so no test leaves a broker process behind.

``XDG_DATA_HOME`` (which platformdirs reads) rather than ``LOCKSTEP_BROKER_HOME``: tests that run `lockstep`
with the ``LOCKSTEP_*`` variables stripped from the environment start their brokers under it too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _background_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from broker.cli import localbroker

    data = tmp_path_factory.mktemp("xdg-data")
    old = os.environ.get("XDG_DATA_HOME")
    old_home = os.environ.pop(localbroker.HOME_ENV, None)
    os.environ["XDG_DATA_HOME"] = str(data)
    try:
        yield data
    finally:
        base = localbroker.home()
        for d in base.iterdir() if base.is_dir() else []:
            if d.is_dir() and d.name != "inputs":
                localbroker.stop(d, timeout_s=10)
        if old is None:
            os.environ.pop("XDG_DATA_HOME", None)
        else:
            os.environ["XDG_DATA_HOME"] = old
        if old_home is not None:
            os.environ[localbroker.HOME_ENV] = old_home
