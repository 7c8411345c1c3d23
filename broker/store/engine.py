"""The engine and its sessions: connection setup per backend, transactions, migrations, locks.

:class:`Database` is the base every aggregate of the store builds on (``broker.store.jobs``,
``tenants``, ``nodes``, ``prices``); :class:`broker.store.Store` is all of them over one engine.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
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
            # Sent to the driver directly: SQLAlchemy's statement path costs more than the BEGIN itself.
            mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
            statement = f"BEGIN {mode}"
            try:
                conn.connection.driver_connection.execute(statement)  # type: ignore[union-attr]
            except engine.dialect.loaded_dbapi.Error as exc:
                raise _wrapped(conn, statement, (), exc) from exc

        return engine
    return sa.create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)


def _wrapped(conn: Connection, statement: str, params: Any, exc: Exception) -> BaseException:
    """A driver's error as SQLAlchemy raises it (``sa.exc.IntegrityError``, ``OperationalError``…), the connection
    invalidated when the error says it is lost, as SQLAlchemy's own statement path does."""
    dialect = conn.dialect
    lost = dialect.is_disconnect(exc, conn.connection.dbapi_connection, None)  # type: ignore[arg-type]
    if lost:
        conn.invalidate(exc)
    return sa.exc.DBAPIError.instance(statement, params, exc, dialect.loaded_dbapi.Error, connection_invalidated=lost,
                                      dialect=dialect)


class JSONText(str):
    """A JSON value already serialised, by ``json.dumps`` as the JSON type's own bind would: a :class:`Prepared`
    statement's JSON bind hands it to the driver as it is instead of serialising it again."""


def _json_bind(proc: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    def process(value: Any) -> Any:
        if type(value) is JSONText:
            return str(value)  # the driver's own str
        return proc(value) if proc is not None else value

    return process


class Prepared:
    """A hot statement compiled once for one engine's dialect and run on the driver's cursor (:meth:`Database._run`),
    past SQLAlchemy's per-statement path (its compiled-cache lookup, bind processing, result set-up), which costs
    several times what the driver's ``execute`` does. What that path does is done here with the same parts, got
    once: the SQL text as SQLAlchemy compiles it (PostgreSQL's bind casts and all), each bind's value (a literal of
    the statement, or the parameter of its key) through its column type's own bind processor (the JSON and datetime
    binds), and each ``RETURNING`` column through its type's result processor (``row``: a dict by column name).
    Only statements without expanding (``IN``) parameters, one row of parameters at a time."""

    def __init__(self, stmt: Any, dialect: sa.Dialect, column_keys: Sequence[str] | None = None,
                 returns: Sequence[sa.ColumnElement[Any]] = ()) -> None:
        compiled = stmt.compile(dialect=dialect, column_keys=list(column_keys) if column_keys is not None else None)
        self.sql: str = compiled.string
        self.dialect = dialect
        by_name = {name: bind for bind, name in compiled.bind_names.items()}
        names = list(compiled.positiontup or ()) if compiled.positional else list(by_name)
        assert not any(by_name[n].expanding for n in names), "expanding parameters are not prepared"
        self.positional = bool(compiled.positional)
        self.names = names
        # (name in the SQL, the parameter's key or None for a literal, the literal, the type's bind processor)
        self.binds: list[tuple[str, str | None, Any, Callable[[Any], Any] | None]] = []
        for n in names:
            bind = by_name[n]
            typ = bind.type.dialect_impl(dialect)
            proc = typ.bind_processor(dialect)
            if isinstance(bind.type, sa.JSON) or isinstance(getattr(bind.type, "impl", None), sa.JSON):
                proc = _json_bind(proc)  # takes JSONText as it is
            self.binds.append((n, bind.key if bind.required else None, bind.effective_value, proc))
        self.returns = [(c.name, c.type.dialect_impl(dialect)) for c in returns]
        self._results: list[tuple[str, Callable[[Any], Any] | None]] | None = None

    def params(self, values: Mapping[str, Any]) -> tuple[Any, ...] | dict[str, Any]:
        """The driver's parameters for ``values`` (by key), processed."""
        got = []
        for _, key, literal, proc in self.binds:
            value = values[key] if key is not None else literal
            got.append(value if proc is None else proc(value))
        if self.positional:
            return tuple(got)
        return dict(zip(self.names, got, strict=True))

    def row(self, cursor: Any, raw: Sequence[Any] | None) -> dict[str, Any] | None:
        """A ``RETURNING`` row (``raw``, from ``cursor``) by column name, its values as SQLAlchemy would read them."""
        if raw is None:
            return None
        results = self._results
        if results is None:  # the driver's column types (PostgreSQL's) choose some processors: read at the first row
            results = self._results = [(name, typ.result_processor(self.dialect, d[1]))
                                       for (name, typ), d in zip(self.returns, cursor.description, strict=True)]
        return {name: proc(v) if proc is not None else v for (name, proc), v in zip(results, raw, strict=True)}


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
        self._prepared: dict[tuple[Any, ...], Prepared] = {}

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

    def _prepare(self, stmt: Any, column_keys: Sequence[str] | None = None,
                 returns: Sequence[sa.ColumnElement[Any]] = ()) -> Prepared:
        """``stmt`` (a statement built once, at import) compiled for this engine once, for :meth:`_run`."""
        key = (stmt, None if column_keys is None else tuple(column_keys))
        got = self._prepared.get(key)
        if got is None:
            got = self._prepared[key] = Prepared(stmt, self.engine.dialect, column_keys, returns)
        return got

    def _run(self, conn: Connection, prepared: Prepared, values: Mapping[str, Any]) -> dict[str, Any] | None:
        """Run ``prepared`` with ``values`` on the driver's cursor of ``conn``, in its transaction; the first row
        it returns (by column name), or None. The engine's ``before_cursor_execute`` and ``after_cursor_execute``
        listeners hear the statement as through SQLAlchemy's own path (tests/broker/kill_between_writes.py and
        bench/place.py count writes by them); a driver's error is raised as SQLAlchemy raises it."""
        params = prepared.params(values)
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            dispatch = conn.dispatch
            if dispatch.before_cursor_execute:
                dispatch.before_cursor_execute(conn, cursor, prepared.sql, params, None, False)
            try:
                cursor.execute(prepared.sql, params)
            except conn.dialect.loaded_dbapi.Error as exc:
                raise _wrapped(conn, prepared.sql, params, exc) from exc
            if dispatch.after_cursor_execute:
                dispatch.after_cursor_execute(conn, cursor, prepared.sql, params, None, False)
            return prepared.row(cursor, cursor.fetchone()) if prepared.returns else None
        finally:
            cursor.close()

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
