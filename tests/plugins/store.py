"""pytest fixtures: the store, on SQLite (a file) and on the local PostgreSQL.

- ``pg_url`` (session): a fresh database ``lockstep_test_<random>`` on the
  PostgreSQL at 127.0.0.1:5432 (trust auth, user postgres or root), dropped at
  the end of the session. PostgreSQL down → ``tests.conftest.missing``.
- ``pg_database`` (function): a factory for more fresh, empty databases (dropped
  at the end of the session) for migration tests.
- ``sqlite_url`` (function): a file in the test's tmp dir.
- ``store`` (function, parametrized sqlite/postgres): a migrated, empty Store.
  Migrations run once per session per backend; each test then gets a copy of
  the migrated SQLite file, or the PostgreSQL tables truncated — fast.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from broker.store import Store
from broker.tables import metadata
from tests.conftest import missing

PG_HOST = os.environ.get("LOCKSTEP_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("LOCKSTEP_TEST_PG_PORT", "5432"))
PG_ADMIN_DB = os.environ.get("LOCKSTEP_TEST_PG_DB", "test")


def _admin_connect() -> tuple[psycopg.Connection, str] | str:
    """An autocommit connection to the admin database and the user that worked, or why none did."""
    errors: list[str] = []
    for user in ("postgres", "root"):
        try:
            conn = psycopg.connect(
                host=PG_HOST, port=PG_PORT, user=user, dbname=PG_ADMIN_DB, autocommit=True, connect_timeout=5
            )
            return conn, user
        except psycopg.Error as exc:
            errors.append(f"{user}: {type(exc).__name__}")
    return f"PostgreSQL at {PG_HOST}:{PG_PORT}/{PG_ADMIN_DB} is not reachable ({'; '.join(errors)})"


class _PgDatabases:
    """Creates throw-away databases and drops them all at the end."""

    def __init__(self, conn: psycopg.Connection, user: str) -> None:
        self.conn = conn
        self.user = user
        self.names: list[str] = []

    def create(self) -> str:
        name = f"lockstep_test_{secrets.token_hex(6)}"
        self.conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self.names.append(name)
        return f"postgresql+psycopg://{self.user}@{PG_HOST}:{PG_PORT}/{name}"

    def drop_all(self) -> None:
        for name in self.names:
            self.conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        self.conn.close()


@pytest.fixture(scope="session")
def _pg_databases() -> Iterator[_PgDatabases]:
    got = _admin_connect()
    if isinstance(got, str):
        missing(got)
        return
    dbs = _PgDatabases(*got)
    yield dbs
    dbs.drop_all()


@pytest.fixture(scope="session")
def pg_url(_pg_databases: _PgDatabases) -> str:
    """URL of a fresh PostgreSQL database for this session."""
    return _pg_databases.create()


@pytest.fixture
def pg_database(_pg_databases: _PgDatabases) -> Callable[[], str]:
    """Factory: another fresh, empty PostgreSQL database (dropped at the end of the session)."""
    return _pg_databases.create


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'lockstep.db'}"


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file; tests get copies of it."""
    path = tmp_path_factory.mktemp("store-template") / "template.db"
    store = Store(f"sqlite:///{path}")
    store.migrate()
    with store.engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    return path


@pytest.fixture(scope="session")
def _pg_store(pg_url: str) -> Iterator[Store]:
    store = Store(pg_url)
    store.migrate()
    yield store
    store.close()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A migrated, empty Store on each backend."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("_sqlite_template")
        path = tmp_path / "lockstep.db"
        shutil.copyfile(template, path)
        s = Store(f"sqlite:///{path}")
        yield s
        s.close()
        return
    pg: Store = request.getfixturevalue("_pg_store")
    tables = ", ".join(t.name for t in metadata.sorted_tables)
    with pg.engine.begin() as conn:
        conn.exec_driver_sql(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")
    yield pg
