"""Fixtures for the job-spec tests: the CLI in this process, and real API servers on SQLite and PostgreSQL.

The servers are started once per module (like tests/api/conftest.py does once per session: a thread
with its own event loop, the catalog provider only, no broker loops), one on a SQLite file and one on
a fresh PostgreSQL database, so a property test can send many bodies to both without restarting them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.api import create_app
from broker.cli import main
from broker.config import ApiConfig, Settings
from broker.models import Role
from broker.service import Lockstep
from broker.store import open_store
from providers.vast.config import VastConfig
from tests.api.conftest import ServerThread

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Ran:
    code: int
    out: str
    err: str


def run_cli(*args: str) -> Ran:
    """`lockstep ARGS` in this process: the same entry point (broker.cli.main) a console script calls."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return Ran(code, out.getvalue(), err.getvalue())


def run_process(*args: str, db: str) -> Ran:
    """`python -m broker ARGS` as a real process on the SQLite file ``db``, with a clean environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["LOCKSTEP_DB"] = f"sqlite:///{db}"
    r = subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=120)
    return Ran(r.returncode, r.stdout, r.stderr)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def strict_json(text: str) -> Any:
    """Parse as RFC 8259 JSON: NaN / Infinity tokens (what a JSON column refuses) are errors."""
    return json.loads(text, parse_constant=_no_constants)


def sqlite_json_valid(db: str, job_id: str) -> bool:
    """SQLite's own verdict on the stored spec: what made `lockstep jobs --json` break in issue 15."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT json_valid(spec) FROM jobs WHERE id = ?", (job_id,)).fetchone()
    return bool(row and row[0])


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No LOCKSTEP_* from the developer's shell changes what the in-process CLI does."""
    for key in [k for k in os.environ if k.startswith("LOCKSTEP_")]:
        monkeypatch.delenv(key)


@dataclass
class Server:
    backend: str
    url: str
    token: str
    db_url: str

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60)


def _serve(db_url: str, backend: str, request: pytest.FixtureRequest) -> Server:
    with open_store(db_url) as store:
        _, token = store.create_token("spec", Role.user, "tests: spec")
    settings = Settings(db_url=db_url, vast=VastConfig(enabled=False),
                        api=ApiConfig(rate_per_s=100_000, burst=100_000, max_body_bytes=4 * 1024 * 1024))
    server = ServerThread(create_app(Lockstep(settings, only_providers=["catalog"]), start_loops=False))
    server.start()
    request.addfinalizer(server.stop)
    return Server(backend, server.url, token, db_url)


@pytest.fixture(scope="module")
def sqlite_server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Server:
    return _serve(f"sqlite:///{tmp_path_factory.mktemp('spec-api') / 'lockstep.db'}", "sqlite", request)


@pytest.fixture(scope="module")
def postgres_server(_pg_databases: Any, request: pytest.FixtureRequest) -> Server:
    return _serve(_pg_databases.create(), "postgres", request)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest) -> Iterator[Server]:
    yield request.getfixturevalue(f"{request.param}_server")
