"""Migrations: run on an empty database, idempotent, and match broker/tables.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
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


def _alembic(store: Store, action: str, revision: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        getattr(command, action)(cfg, revision)


OLD_POINTS = [  # (zone, stat, price, count, at as stored by 0003: naive UTC text / timestamptz)
    ("us-east-1a", "price", 10.0, None, "2026-03-01 12:00:00.000000"),
    ("us-east-1a", "price", 12.5, None, "2026-03-01 13:00:00.123456"),
    ("us-east-1b", "price", 9.0, None, "2026-03-01 12:30:00.000001"),
    ("", "min", 2.1, 40, "2026-03-01 12:45:59.999999"),
]


def _check_0004(url: str) -> None:
    store = Store(url)
    try:
        store.migrate("0003")
        # SQLite stores naive UTC text; PostgreSQL timestamptz.
        at_sql = ":at" if store.is_sqlite else "CAST(:at || '+00' AS TIMESTAMP WITH TIME ZONE)"
        with store.engine.begin() as conn:
            for zone, stat, price, count, at in OLD_POINTS:
                provider = "vast" if stat == "min" else "aws"
                conn.execute(
                    sa.text(
                        "INSERT INTO price_points (provider, market, sku, gpu, region, zone, stat, usd_per_hour,"
                        " count, at) VALUES (:provider, 'spot', 'p5.48xlarge', 'H100-SXM', :region, :zone, :stat,"
                        f" :price, :count, {at_sql})"
                    ),
                    {"provider": provider, "region": "us-east-1" if zone else "", "zone": zone, "stat": stat,
                     "price": price, "count": count, "at": at},
                )
            # 0003's latest table knew the first aws series only, and is behind its history (it names
            # the 12:00 point, history has 13:00): the newest point comes from history.
            conn.execute(sa.text(
                "INSERT INTO price_latest (provider, market, sku, region, zone, stat, gpu, usd_per_hour, count, at)"
                " SELECT provider, market, sku, region, zone, stat, gpu, usd_per_hour, count, at FROM price_points"
                " WHERE zone = 'us-east-1a' ORDER BY at LIMIT 1"
            ))
        store.migrate()
        expected = sorted(
            (zone, stat, price, count, datetime.fromisoformat(at).replace(tzinfo=UTC))
            for zone, stat, price, count, at in OLD_POINTS
        )
        got = sorted((p.zone, p.stat, p.usd_per_hour, p.count, p.at) for p in store.price_history(gpu="H100"))
        assert got == expected
        latest = store.latest_price_point("aws", "spot", "p5.48xlarge", "us-east-1", "us-east-1a")
        assert latest is not None and latest.usd_per_hour == 12.5
        assert latest.at == datetime(2026, 3, 1, 13, 0, 0, 123456, tzinfo=UTC)
        assert store.last_seen("aws") == latest.at
        only_in_history = store.latest_price_point("aws", "spot", "p5.48xlarge", "us-east-1", "us-east-1b")
        assert only_in_history is not None and only_in_history.usd_per_hour == 9.0
        assert store.latest_price_point("vast", "spot", "p5.48xlarge", "", "", "min").count == 40  # type: ignore[union-attr]
        # Ingest carries on from the migrated history: an older point is ignored, a newer one stored.
        old = store.price_history(zone="us-east-1b")[0]
        assert store.add_price_points([old.model_copy(update={"usd_per_hour": 1.0})]) == 0
        assert store.add_price_points([old.model_copy(update={"usd_per_hour": 1.0, "at": latest.at})]) == 1
        # And back: 0003's layout holds the same points again.
        _alembic(store, "downgrade", "0003")
        with store.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT zone, usd_per_hour FROM price_points ORDER BY at, zone")).all()
            assert [tuple(r) for r in rows] == [
                ("us-east-1a", 10.0), ("us-east-1b", 9.0), ("", 2.1), ("us-east-1a", 12.5), ("us-east-1b", 1.0),
            ]
            assert conn.execute(sa.text("SELECT count(*) FROM price_latest")).scalar() == 3
        store.migrate()
        assert len(store.price_history()) == 5
    finally:
        store.close()


def test_0004_moves_history_to_series_on_sqlite(sqlite_url: str) -> None:
    _check_0004(sqlite_url)


def test_0004_moves_history_to_series_on_postgres(pg_database: Callable[[], str]) -> None:
    _check_0004(pg_database())


def _check_0005(url: str) -> None:
    """Existing spend moves onto the allocations (each job's newest ended one), so a job's allocations add up
    to its spent_usd and month-to-date spend keeps what was booked; down and up again."""
    store = Store(url)
    try:
        store.migrate("0004")
        now = "2026-12-01 10:00:00.000000"
        ts = ":at" if store.is_sqlite else "CAST(:at || '+00' AS TIMESTAMP WITH TIME ZONE)"
        with store.engine.begin() as conn:
            for job_id, spent in (("j-done", 7.5), ("j-live", 0.0)):
                conn.execute(sa.text(
                    "INSERT INTO jobs (id, tenant, state, reason, spec, fingerprint, decision, gpus, created_at,"
                    f" updated_at, attempts, preemptions, spent_usd) VALUES (:id, 'acme', 'succeeded', '', '{{}}',"
                    f" 'f', '{{}}', 1, {ts}, {ts}, 2, 1, :spent)"), {"id": job_id, "spent": spent, "at": now})
            for alloc_id, job_id, state, at in (("a-1", "j-done", "preempted", "2026-12-01 08:00:00.000000"),
                                                ("a-2", "j-done", "succeeded", "2026-12-01 09:00:00.000000"),
                                                ("a-3", "j-live", "running", "2026-12-01 09:30:00.000000")):
                conn.execute(sa.text(
                    "INSERT INTO allocations (id, job_id, attempt, provider, offer_id, state, client_token,"
                    " resource_ids, nodes, region, zone, usd_per_hour, created_at, updated_at, reason, attrs)"
                    f" VALUES (:id, :job, 1, 'aws', '', :state, '', '[\"i-1\"]', 1, '', '', 3.0, {ts}, {ts}, '',"
                    " '{}')"), {"id": alloc_id, "job": job_id, "state": state, "at": at})
        store.migrate()
        allocs = {a.id: a for job in ("j-done", "j-live") for a in store.allocations(job)}
        assert (allocs["a-1"].cost_usd, allocs["a-2"].cost_usd, allocs["a-3"].cost_usd) == (0.0, 7.5, None)
        assert allocs["a-2"].ended_at == datetime(2026, 12, 1, 9, tzinfo=UTC) and allocs["a-3"].ended_at is None
        assert store.tenant_spend("acme", datetime(2026, 12, 1, tzinfo=UTC),
                                  datetime(2026, 12, 1, 10, tzinfo=UTC)) == pytest.approx(7.5 + 1.5)
        store.archive_log("a-2", 0, "2026-12-01T08:59:00.000Z out bye\n")
        _alembic(store, "downgrade", "0004")
        with store.engine.connect() as conn:
            assert "job_logs" not in sa.inspect(conn).get_table_names()
            assert "cost_usd" not in {c["name"] for c in sa.inspect(conn).get_columns("allocations")}
        store.migrate()
        assert store.get_allocation("a-2").cost_usd == 7.5
    finally:
        store.close()


def test_0005_books_existing_spend_on_allocations_on_sqlite(sqlite_url: str) -> None:
    _check_0005(sqlite_url)


def test_0005_books_existing_spend_on_allocations_on_postgres(pg_database: Callable[[], str]) -> None:
    _check_0005(pg_database())
