"""Migrations: run on an empty database, idempotent, and match broker/tables.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from broker.store import MIGRATIONS_DIR, Store
from broker.tables import metadata


def _check(url: str) -> None:
    store = Store(url)
    try:
        assert sa.inspect(store.engine).get_table_names() == []
        store.migrate()
        store.migrate()  # idempotent
        names = set(sa.inspect(store.engine).get_table_names())
        assert {t.name for t in metadata.sorted_tables} | {"alembic_version"} == names
        with store.engine.connect() as conn:
            head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == head
            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": False})
            diff = compare_metadata(ctx, metadata)
        assert diff == [], f"migrations and broker/tables.py disagree: {diff}"
    finally:
        store.close()


def test_migrations_on_empty_sqlite(sqlite_url: str) -> None:
    _check(sqlite_url)


def test_migrations_on_empty_postgres(pg_database: Callable[[], str]) -> None:
    _check(pg_database())


def test_migrations_ship_inside_the_package() -> None:
    assert (MIGRATIONS_DIR / "env.py").is_file()
    assert (MIGRATIONS_DIR / "versions" / "0001_initial.py").is_file()
    assert MIGRATIONS_DIR.parent.name == "broker"


def test_sqlite_file_in_new_directory(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "lockstep.db"
    store = Store(f"sqlite:///{path}")
    store.migrate()
    store.close()
    assert path.is_file()


def test_0002_backfills_latest_prices(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    try:
        store.migrate("0001")
        with store.engine.begin() as conn:
            for at, price in (("2026-03-01 12:00:00.000000", 10.0), ("2026-03-01 13:00:00.000000", 12.0)):
                conn.execute(
                    sa.text(
                        "INSERT INTO price_points (provider, market, sku, gpu, region, zone, stat, usd_per_hour, at)"
                        " VALUES ('aws', 'spot', 'p5.48xlarge', 'H100-SXM', 'us-east-1', 'us-east-1a', 'price',"
                        " :p, :at)"
                    ),
                    {"p": price, "at": at},
                )
        store.migrate()
        latest = store.latest_price_point("aws", "spot", "p5.48xlarge", "us-east-1", "us-east-1a")
        assert latest is not None and latest.usd_per_hour == 12.0
        assert store.last_seen("aws") is not None and store.last_seen("aws").hour == 13  # type: ignore[union-attr]
    finally:
        store.close()
