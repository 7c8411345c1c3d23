"""The engine and its sessions: connection setup per backend, transactions, migrations, locks.

:class:`Database` is the base every aggregate of the store builds on (``broker.store.jobs``,
``tenants``, ``nodes``, ``prices``); :class:`broker.store.Store` is all of them over one engine.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def _advisory_key(name: str) -> int:
    """A stable signed 64-bit key for pg_advisory locks."""
    return int.from_bytes(hashlib.sha256(f"lockstep:{name}".encode()).digest()[:8], "big", signed=True)


def make_engine(url: str) -> Engine:
    """An engine with Lockstep's connection setup for SQLite or PostgreSQL."""
    if url.startswith("sqlite"):
        path = sa.engine.make_url(url).database
        if path and path != ":memory:":
            Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        memory = path in (None, "", ":memory:")
        engine = sa.create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            # An in-memory database lives in one connection: share it (tests, dry runs).
            poolclass=StaticPool if memory else None,
        )

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")  # safe with WAL; fsync at checkpoints
            # Price history indexes outgrow the 2 MB default cache at ~100k points, and ingest
            # then pays for page misses; 64 MB (allocated only as used) keeps them in memory.
            cur.execute("PRAGMA cache_size=-65536")
            # Checkpoint the WAL every ~40 MB rather than every 4 MB: bulk price ingest
            # otherwise pays a checkpoint (and its fsync) on nearly every batch.
            cur.execute("PRAGMA wal_autocheckpoint=10000")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
            conn.exec_driver_sql(f"BEGIN {mode}")

        return engine
    return sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)


class Database:
    """One engine and how the store uses it. Thread-safe; one per process is enough."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.dialect = self.engine.dialect.name
        self.is_sqlite = self.dialect == "sqlite"
        # SQLite has one writer at a time. Writers of this process take turns here, in order, instead of
        # meeting in SQLite's busy handler, which sleeps (up to 100 ms a time) rather than waking the next
        # writer when the lock frees: with 32 submitters and the placement loop that sleeping was most of
        # a submission's latency. Other processes on the file still meet in the busy handler.
        self._write_turn = threading.RLock() if self.is_sqlite else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.engine.url.render_as_string(hide_password=True)!r})"

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self, write: bool = True) -> Iterator[Connection]:
        if write and self._write_turn is not None:
            with self._write_turn, self.engine.connect() as conn:
                conn.execution_options(sqlite_begin="IMMEDIATE")
                with conn.begin():
                    yield conn
            return
        with self.engine.connect() as conn, conn.begin():
            yield conn

    def _insert_fn(self) -> Any:
        """The dialect's INSERT (for ``on_conflict_do_…``)."""
        return sqlite_dialect.insert if self.is_sqlite else pg_dialect.insert

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to the newest migration (``alembic upgrade head``); safe to repeat."""
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        with self._tx() as conn:
            self._serialise(conn, "migrate")  # two replicas starting together must not both migrate
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)

    def _serialise(self, conn: Connection, name: str) -> None:
        """Make transactions that call this with ``name`` take turns (PostgreSQL: a transaction-level
        advisory lock, freed at commit or rollback). SQLite's write transactions take turns anyway."""
        if not self.is_sqlite:
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_advisory_key(name))))

    @contextmanager
    def leader_lock(self, name: str) -> Iterator[bool]:
        """Yield True when this process holds the named lock for the duration of the context.

        PostgreSQL: ``pg_try_advisory_lock`` on a dedicated connection, released when the
        context ends (or when the connection dies, so a crashed leader frees it).
        SQLite: always True; a SQLite file has one broker process.
        """
        if self.is_sqlite:
            yield True
            return
        key = _advisory_key(name)
        with self.engine.connect() as conn:
            got = bool(conn.execute(sa.select(sa.func.pg_try_advisory_lock(key))).scalar())
            conn.commit()
            try:
                yield got
            finally:
                if got:
                    try:
                        conn.execute(sa.select(sa.func.pg_advisory_unlock(key)))
                        conn.commit()
                    except sa.exc.DBAPIError:
                        # The connection died: PostgreSQL dropped the lock with the session.
                        conn.invalidate()

    def ping(self) -> bool:
        """True when the database answers (readiness probes)."""
        with self._tx(write=False) as conn:
            conn.execute(sa.text("SELECT 1"))
        return True
