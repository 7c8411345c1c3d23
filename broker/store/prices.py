"""Prices in the store: series, their points, each series' newest point, and the spike alerts on them.

:class:`PriceStore` is the price aggregate of :class:`broker.store.Store`. Layout, chosen for bulk
ingest and "one GPU model over a window" reads (see broker/tables.py and migration 0004):

- ``price_series``: one row per (provider, market, sku, region, zone, stat) with its
  GPU model and newest stored point;
- ``price_points``: (series_id, at_us, usd_per_hour, count), clustered on
  (series_id, at_us); time is integer microseconds since the epoch, UTC.

History is append-only and change-only per series: a point no newer than the series'
newest is ignored (re-polls overlap), and a point at the same price as the one before
it is not stored again, so a price is valid until the next point of its series.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from broker.errors import NotFoundError, StoreError
from broker.gpus import FAMILIES, GPU_SPECS
from broker.models import Market, PriceFilter, PricePoint, PriceSeries, PriceSeriesKey, SeriesKey
from broker.store.engine import Database
from broker.tables import PricePointRow, PriceSeriesRow, SpikeAlertRow, table_of

POINTS = table_of(PricePointRow)
SERIES = table_of(PriceSeriesRow)
ALERTS = table_of(SpikeAlertRow)

SERIES_KEYS: tuple[str, ...] = ("provider", "market", "sku", "region", "zone", "stat")
PRICE_BATCH = 5000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
# Above this many series a read scans the points instead of naming every series id
# (SQLite allows 32,766 parameters in a statement, psycopg 65,535).
_MAX_IDS = 10_000
_MARKET_VALUES: dict[str, str] = {m.value: m.value for m in Market}  # Market members hash as their value
_SERIES_COLS = (SERIES.c.id, *(SERIES.c[k] for k in SERIES_KEYS), SERIES.c.gpu)
_LATEST_COLS = (*_SERIES_COLS, SERIES.c.last_at, SERIES.c.last_usd, SERIES.c.last_count)
_SQLITE_POINT_INSERT = "INSERT INTO price_points (series_id, at_us, usd_per_hour, count) VALUES (?, ?, ?, ?)"
_SERIES_UPDATE = "UPDATE price_series SET gpu = {p}, last_at = {p}, last_usd = {p}, last_count = {p} WHERE id = {p}"
_PG_POINT_COPY = "COPY price_points (series_id, at_us, usd_per_hour, count) FROM STDIN"


def to_us(at: datetime) -> int:
    """Microseconds since the epoch; a naive datetime is taken as UTC."""
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return (at - EPOCH) // _US


def from_us(us: int) -> datetime:
    """The UTC datetime of microseconds since the epoch (exact, unlike float seconds)."""
    return EPOCH + timedelta(microseconds=us)


def gpu_names(gpu: str) -> list[str]:
    """Canonical names a GPU filter matches: the name itself, its family, or a prefix ("H100")."""
    names = {gpu}
    names.update(FAMILIES.get(gpu, ()))
    names.update(n for n in GPU_SPECS if n.startswith(gpu + "-"))
    return sorted(names)


class PriceStore(Database):
    """Price history and spike alerts."""

    # ------------------------------------------------------------------ writing

    def add_price_points(self, points: list[PricePoint]) -> int:
        """Append price points (change-only, see the module doc); returns how many rows were stored.

        One transaction: the batch's series are read, missing series created, new points
        inserted in bulk and each touched series' newest point updated. Writers take turns
        (on PostgreSQL an advisory lock; SQLite's write transactions are exclusive): two
        replicas ingesting at once would otherwise both store a point past the same newest one.
        """
        if not points:
            return 0
        by_series: dict[SeriesKey, list[PricePoint]] = {}
        for p in points:
            market = _MARKET_VALUES.get(p.market) or Market(p.market).value
            key = (p.provider, market, p.sku, p.region, p.zone, p.stat)
            by_series.setdefault(key, []).append(p)
        inserted = 0
        with self._tx() as conn:
            # One lock for all price writers rather than row locks per series: ingest comes from
            # the one leader tracker, and row locks taken in two rounds (existing series, then
            # those just created) deadlocked two writers in testing.
            self._serialise(conn, "price-ingest")
            known = self._series_rows(conn, by_series)
            missing = [k for k in by_series if k not in known]
            if missing:
                self._create_series(conn, {k: by_series[k][0].gpu for k in missing})
                known.update(self._series_rows(conn, missing))
            rows: list[tuple[int, int, float, int | None]] = []
            updates: list[tuple[Any, ...]] = []
            for key, series in by_series.items():
                sid, last_at, last_usd = known[key][0], known[key][8], known[key][9]
                # Integer times first: they order naive (UTC) and aware datetimes alike.
                stamps = [to_us(p.at) for p in series]
                newest: PricePoint | None = None
                for i in sorted(range(len(series)), key=stamps.__getitem__):  # stable; linear when in order
                    p, at_us = series[i], stamps[i]
                    if last_at is not None and at_us <= last_at:
                        continue
                    if p.usd_per_hour == last_usd:
                        continue
                    rows.append((sid, at_us, p.usd_per_hour, p.count))
                    last_at, last_usd, newest = at_us, p.usd_per_hour, p
                if newest is not None:
                    updates.append((newest.gpu, last_at, last_usd, newest.count, sid))
                if len(rows) >= PRICE_BATCH:
                    inserted += self._insert_points(conn, rows)
                    rows = []
            if rows:
                inserted += self._insert_points(conn, rows)
            if updates:
                param = "?" if self.is_sqlite else "%s"
                conn.exec_driver_sql(_SERIES_UPDATE.format(p=param), updates)
        return inserted

    def _series_rows(self, conn: Connection, keys: Iterable[tuple[str, ...]]) -> dict[tuple[str, ...], Any]:
        """The price_series rows (``_LATEST_COLS``) of the given series keys.

        One query per (provider, market, stat) with the batch's SKUs, filtered to the exact
        series here: a 6-column tuple IN over thousands of series compiles slower than
        reading a few extra rows.
        """
        wanted = set(keys)
        groups: dict[tuple[str, str, str], set[str]] = {}
        for provider, market, sku, _region, _zone, stat in wanted:
            groups.setdefault((provider, market, stat), set()).add(sku)
        out: dict[tuple[str, ...], Any] = {}
        for (provider, market, stat), skus in groups.items():
            sku_list = sorted(skus)
            for i in range(0, len(sku_list), 500):
                q = sa.select(*_LATEST_COLS).where(
                    SERIES.c.provider == provider,
                    SERIES.c.market == market,
                    SERIES.c.stat == stat,
                    SERIES.c.sku.in_(sku_list[i : i + 500]),
                )
                for row in conn.execute(q).all():
                    key = tuple(row[1:7])
                    if key in wanted:
                        out[key] = row
        return out

    def _create_series(self, conn: Connection, gpus: dict[tuple[str, ...], str]) -> None:
        """Insert series rows; one a concurrent writer created first is left as it is."""
        stmt = self._insert_fn()(SERIES).on_conflict_do_nothing(index_elements=list(SERIES_KEYS))
        conn.execute(stmt, [{**dict(zip(SERIES_KEYS, k, strict=True)), "gpu": gpu} for k, gpu in gpus.items()])

    def _insert_points(self, conn: Connection, rows: list[tuple[int, int, float, int | None]]) -> int:
        """Bulk insert, the fastest way each driver offers: SQLite's executemany, PostgreSQL's COPY."""
        if self.is_sqlite:
            conn.exec_driver_sql(_SQLITE_POINT_INSERT, rows)
        else:
            driver = conn.connection.driver_connection  # psycopg's connection; None only once closed
            assert driver is not None
            with driver.cursor() as cur, cur.copy(_PG_POINT_COPY) as copy:
                for r in rows:
                    copy.write_row(r)
        return len(rows)

    # ------------------------------------------------------------------ newest points

    @staticmethod
    def _latest_point(row: Any) -> PricePoint:
        return PricePoint(**_key_fields(row), usd_per_hour=row.last_usd, count=row.last_count, at=from_us(row.last_at))

    def latest_price_point(
        self, provider: str, market: Market | str, sku: str, region: str, zone: str, stat: str = "price"
    ) -> PricePoint | None:
        """The newest stored point of one series (kept even after its history is pruned)."""
        key = (provider, Market(market).value, sku, region, zone, stat)
        return self.latest_price_points([key]).get(key)

    def latest_price_points(self, keys: Iterable[tuple[str, ...]]) -> dict[tuple[str, ...], PricePoint]:
        """The newest stored point of each series (provider, market, sku, region, zone, stat), in one
        read; series with no point are absent."""
        wanted = [(p, Market(m).value, sku, r, z, st) for p, m, sku, r, z, st in keys]
        with self._tx(write=False) as conn:
            rows = self._series_rows(conn, wanted)
        return {key: self._latest_point(row) for key, row in rows.items() if row.last_at is not None}

    def last_seen(self, provider: str, region: str | None = None) -> datetime | None:
        """Time of the newest stored point of a provider (and region), for incremental polling."""
        q = sa.select(sa.func.max(SERIES.c.last_at)).where(SERIES.c.provider == provider)
        if region is not None:
            q = q.where(SERIES.c.region == region)
        with self._tx(write=False) as conn:
            value = conn.execute(q).scalar()
        return None if value is None else from_us(int(value))

    # ------------------------------------------------------------------ reading history

    @staticmethod
    def _series_conditions(f: PriceFilter) -> list[Any]:
        """WHERE conditions on price_series for a GPU (model, family or prefix) and the key columns."""
        conds: list[Any] = [SERIES.c.gpu.in_(gpu_names(f.gpu))] if f.gpu else []
        keys = f.model_dump(mode="json", include=set(SERIES_KEYS), exclude_none=True)
        conds += [SERIES.c[col] == value for col, value in keys.items()]
        return conds

    def _points(
        self,
        conn: Connection,
        series: Any,
        since: datetime | None,
        until: datetime | None,
        order: tuple[Any, ...],
        limit: int | None = None,
    ) -> Sequence[Any]:
        """(series_id, at_us, usd_per_hour, count) rows of the given series (ids, a subquery of ids,
        or None: all) in a window."""
        q = sa.select(POINTS.c.series_id, POINTS.c.at_us, POINTS.c.usd_per_hour, POINTS.c.count)
        if series is not None:
            q = q.where(POINTS.c.series_id.in_(series))
        if since is not None:
            q = q.where(POINTS.c.at_us >= to_us(since))
        if until is not None:
            q = q.where(POINTS.c.at_us < to_us(until))
        q = q.order_by(*order)
        if limit is not None:
            q = q.limit(limit)
        return conn.execute(q).all()  # fetchall: row-by-row fetchone cost more than the query

    def _read(self, f: PriceFilter, order: tuple[Any, ...]) -> tuple[dict[int, Any], Sequence[Any]]:
        """Matching series (rows by id) and their points (the newest ``f.limit`` when set), in one
        read transaction.

        Up to ``_MAX_IDS`` series the points query names their ids, so each series is a range
        scan of the primary key; past that it selects them by a subquery with the same filters
        (or, with none, scans all points). Points of a series created after the series were read
        (PostgreSQL reads each statement at its own snapshot) are left out.
        """
        conds = self._series_conditions(f)
        with self._tx(write=False) as conn:
            series = {row[0]: row for row in conn.execute(sa.select(*_SERIES_COLS).where(*conds)).all()}
            if not series:
                return series, []
            if len(series) <= _MAX_IDS:
                which: Any = sorted(series)
            else:
                which = sa.select(SERIES.c.id).where(*conds) if conds else None
            rows = self._points(conn, which, f.since, f.until, order, f.limit)
        if len(series) > _MAX_IDS:
            rows = [r for r in rows if r[0] in series]
        return series, rows

    def price_history(self, f: PriceFilter | None = None, /, **filters: Any) -> list[PricePoint]:
        """Stored points matching ``f``, oldest first (ties by series); ``f.limit`` keeps the newest.
        Its fields may be given as keywords instead: ``price_history(provider="aws", stat="price")``."""
        f = _filter(f, filters)
        if f.limit is None:
            order: tuple[Any, ...] = (POINTS.c.at_us, POINTS.c.series_id)
        else:
            order = (POINTS.c.at_us.desc(), POINTS.c.series_id.desc())
        series, rows = self._read(f, order)
        keys = {sid: _key_fields(row) for sid, row in series.items()}
        out = [
            PricePoint(**keys[sid], usd_per_hour=usd, count=count, at=from_us(at_us))
            for sid, at_us, usd, count in rows
        ]
        if f.limit is not None:
            out.reverse()
        return out

    def price_series(self, f: PriceFilter | None = None, /, **filters: Any) -> list[PriceSeries]:
        """The same points as :meth:`price_history`, one :class:`PriceSeries` (columns) per series
        with points in the window, in series-key order. The read path for charts and the API."""
        f = _filter(f, filters)
        if f.limit is None:
            series, rows = self._read(f, (POINTS.c.series_id, POINTS.c.at_us))
        else:  # the newest points, then back in series order
            series, rows = self._read(f, (POINTS.c.at_us.desc(), POINTS.c.series_id.desc()))
            rows = sorted(rows, key=lambda r: (r[0], r[1]))
        out: list[PriceSeries] = []
        for sid, group in _runs(rows):
            out.append(
                PriceSeries(
                    **_key_fields(series[sid]),
                    at=[from_us(r[1]) for r in group],
                    usd_per_hour=[r[2] for r in group],
                    count=[r[3] for r in group],
                )
            )
        out.sort(key=lambda s: s.key)
        return out

    # ------------------------------------------------------------------ retention

    def compact_prices(self, older_than: datetime, bucket_seconds: int = 3600) -> int:
        """Keep the last point per series per time bucket before ``older_than``; returns rows deleted."""
        if bucket_seconds <= 0:
            raise StoreError("bucket_seconds must be positive")
        width = bucket_seconds * 1_000_000
        q = (
            sa.select(POINTS.c.series_id, POINTS.c.at_us)
            .where(POINTS.c.at_us < to_us(older_than))
            .order_by(POINTS.c.series_id, POINTS.c.at_us)
        )
        doomed: list[tuple[int, int]] = []
        with self._tx() as conn:
            prev: tuple[int, int] | None = None
            prev_row: tuple[int, int] | None = None
            for sid, at_us in conn.execute(q):
                bucket = (sid, at_us // width)
                if bucket == prev and prev_row is not None:
                    doomed.append(prev_row)  # a later point in the same bucket replaces it
                prev, prev_row = bucket, (sid, at_us)
            if doomed:
                param = "?" if self.is_sqlite else "%s"
                conn.exec_driver_sql(f"DELETE FROM price_points WHERE series_id = {param} AND at_us = {param}", doomed)
        return len(doomed)

    def prune_prices(self, older_than: datetime) -> int:
        """Delete every point before ``older_than`` (series and their newest points stay); returns rows deleted."""
        with self._tx() as conn:
            return conn.execute(POINTS.delete().where(POINTS.c.at_us < to_us(older_than))).rowcount or 0


    # ------------------------------------------------------------------ spike alerts

    def add_alert(self, series: dict[str, Any], start: datetime, peak: float, baseline: float) -> int:
        with self._tx() as conn:
            res = conn.execute(
                ALERTS.insert().values(
                    series=json.loads(json.dumps(series, default=str)),
                    start=start,
                    peak=peak,
                    baseline=baseline,
                )
            )
            key = res.inserted_primary_key
            assert key is not None  # a one-row insert always has its new id
            return int(key[0])

    def update_alert(self, alert_id: int, *, peak: float | None = None, end: datetime | None = None) -> None:
        """Raise an alert's peak (never lowers it) and/or close it at ``end``."""
        values: dict[str, Any] = {}
        if peak is not None:
            values["peak"] = sa.case((ALERTS.c.peak < peak, peak), else_=ALERTS.c.peak)
        if end is not None:
            values["end"] = end
        q = ALERTS.update().where(ALERTS.c.id == alert_id)
        with self._tx() as conn:
            if values:
                n = conn.execute(q.values(**values)).rowcount
            else:
                n = len(conn.execute(sa.select(ALERTS.c.id).where(ALERTS.c.id == alert_id)).all())
        if not n:
            raise NotFoundError(f"alert {alert_id} not found")

    def alerts(self, open_only: bool = False, since: datetime | None = None) -> list[dict[str, Any]]:
        """Alerts newest first, as dicts (id, series, start, end, peak, baseline).

        ``since`` keeps alerts active at or after that time (started since, or ended since, or open).
        """
        q = sa.select(ALERTS)
        if open_only:
            q = q.where(ALERTS.c.end.is_(None))
        if since is not None:
            q = q.where(sa.or_(ALERTS.c.start >= since, ALERTS.c.end.is_(None), ALERTS.c.end >= since))
        with self._tx(write=False) as conn:
            rows = conn.execute(q.order_by(ALERTS.c.start.desc(), ALERTS.c.id.desc())).mappings()
            return [dict(r) for r in rows]


def _filter(f: PriceFilter | None, fields: dict[str, Any]) -> PriceFilter:
    """``f``, or a PriceFilter of the keyword fields (validated like any other)."""
    if fields:
        if f is not None:
            raise TypeError("give a PriceFilter or its fields as keywords, not both")
        return PriceFilter(**fields)
    return f or PriceFilter()


def _key_fields(row: Any) -> dict[str, Any]:
    """PriceSeriesKey fields of a price_series row (``_SERIES_COLS`` first)."""
    return dict(PriceSeriesKey.model_validate(row, from_attributes=True))


def _runs(rows: Sequence[Any]) -> Iterator[tuple[int, Sequence[Any]]]:
    """Consecutive rows with the same series id (rows come ordered by series)."""
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i][0] != rows[start][0]:
            yield rows[start][0], rows[start:i]
            start = i
