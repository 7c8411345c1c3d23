"""Benchmark: price-point ingest rate and 7-day history query latency (issue 8).

Prints, for SQLite and PostgreSQL:
- price points ingested per second through ``Store.add_price_points`` in batches
  (deduplication included: every generated point is a price change, so all are stored);
- median and p99 latency of the 7-day history of one GPU model ("H100-SXM") and of a
  family ("H100": three canonical models) over the stored points, read two ways:
  ``Store.price_series`` (one PriceSeries of columns per series: what the API and the
  charts read) and ``Store.price_history`` (one PricePoint model per point).

Targets (issue 8): ≥ 50,000 points/s into SQLite; ≤ 50 ms for the 7-day history of one GPU
model over 1,000,000 points (both read paths are printed; the target holds for each).
Beside the ingest rate, its reference in the same run and database: the bare rows inserted into an
unindexed scratch table in the same batches. The load average is printed at the start and the end.
Wall time and this process's CPU time are both printed: on a shared machine the wall
figures measure the neighbours too (PostgreSQL's own CPU is not in the client figure).

    python bench/ingest.py                 # 1,000,000 points, both backends
    python bench/ingest.py --points 200000 --backends sqlite

PostgreSQL: LOCKSTEP_BENCH_PG (a SQLAlchemy URL of an admin database) or the local
default postgresql+psycopg://postgres@127.0.0.1:5432/test; a throw-away database is
created and dropped. Skipped with a message when PostgreSQL is down.

The data is synthetic but shaped like AWS spot history: real instance types and GPU
models, 1,480 series (instance type × zone × market, and Vast-style marketplace series) over
90 days, a random walk per series.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import sqlalchemy as sa

from broker.models import Market, PricePoint
from broker.store import Store
from broker.store.prices import POINTS, SERIES, gpu_names, to_us

# Real instance types and their GPUs (AWS), with on-demand-ish hourly prices as the walk's start.
SKUS: list[tuple[str, str, float]] = [
    ("p5.48xlarge", "H100-SXM", 98.32),
    ("p5e.48xlarge", "H200", 110.0),
    ("p4d.24xlarge", "A100-SXM-40GB", 32.77),
    ("p4de.24xlarge", "A100-SXM-80GB", 40.96),
    ("g6e.xlarge", "L40S", 1.86),
    ("g6e.12xlarge", "L40S", 10.49),
    ("g6.xlarge", "L4", 0.80),
    ("g6.12xlarge", "L4", 4.60),
    ("g5.xlarge", "A10G", 1.01),
    ("g5.12xlarge", "A10G", 5.67),
    ("g5.48xlarge", "A10G", 16.29),
    ("g4dn.xlarge", "T4", 0.53),
    ("g4dn.12xlarge", "T4", 3.91),
    ("p3.2xlarge", "V100-16GB", 3.06),
    ("p3dn.24xlarge", "V100-32GB", 31.21),
]
# Vast-style marketplace series for the other H100 models.
VAST_GPUS: list[tuple[str, float]] = [("H100-PCIe", 2.1), ("H100-NVL", 2.6), ("H100-SXM", 2.4), ("RTX-4090", 0.4)]
REGIONS = ["us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1", "ap-northeast-1"]


def make_series() -> list[tuple[str, Market, str, str, str, str, float]]:
    """(provider, market, sku, gpu, region, zone, start price) for ~2,000 series."""
    out = []
    for sku, gpu, price in SKUS:
        for region in REGIONS:
            for z in "abcdef":
                for market in (Market.spot, Market.on_demand):
                    factor = 0.35 if market is Market.spot else 1.0
                    out.append(("aws", market, sku, gpu, region, f"{region}{z}", price * factor))
    for gpu, price in VAST_GPUS:
        for i in range(100):
            out.append(("vast", Market.on_demand, f"{gpu.lower()}-{i}", gpu, "", "", price))
    return out


def make_points(total: int, days: int = 90, seed: int = 7) -> list[PricePoint]:
    """``total`` points spread over ``days`` up to now, each a price change, in time order."""
    rng = random.Random(seed)
    series = make_series()
    per = max(1, total // len(series))
    end = datetime.now(UTC).replace(microsecond=0)
    start = end - timedelta(days=days)
    step = (end - start) / per
    points: list[PricePoint] = []
    for provider, market, sku, gpu, region, zone, price in series:
        offset = timedelta(seconds=rng.uniform(0, step.total_seconds()))
        p = price
        for k in range(per):
            p = round(max(0.01, p * rng.uniform(0.97, 1.03)), 4)
            if points and points[-1].usd_per_hour == p and points[-1].sku == sku:
                p = round(p + 0.0001, 4)  # always a change, so dedup keeps it
            points.append(
                PricePoint(
                    provider=provider,
                    market=market,
                    sku=sku,
                    gpu=gpu,
                    region=region,
                    zone=zone,
                    usd_per_hour=p,
                    at=start + offset + step * k,
                )
            )
    points = points[:total]
    points.sort(key=lambda x: x.at)  # arrive as a tracker would deliver them: by time
    return points


def ingest(store: Store, points: list[PricePoint], batch: int) -> tuple[int, float, float]:
    """(points stored, wall seconds, CPU seconds of this process)."""
    t0, c0 = time.perf_counter(), time.process_time()
    stored = 0
    for i in range(0, len(points), batch):
        stored += store.add_price_points(points[i : i + batch])
    return stored, time.perf_counter() - t0, time.process_time() - c0


def insert_floor(store: Store, points: list[PricePoint], batch: int) -> float:
    """The reference for the ingest rate, same run, same database: the points' bare rows (series number,
    microseconds, price, count) inserted into a scratch table with no index, in the same batches, one
    executemany each — what any ingest must at least pay, with no series resolved and no duplicate
    dropped. Returns points per second (wall)."""
    rows = [{"s": i % 1480, "t": i, "p": p.usd_per_hour, "c": p.count} for i, p in enumerate(points)]
    with store.engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE bench_floor (s integer, t bigint, p double precision, c integer)")
    insert = sa.text("INSERT INTO bench_floor (s, t, p, c) VALUES (:s, :t, :p, :c)")
    t0 = time.perf_counter()
    for i in range(0, len(rows), batch):
        with store.engine.begin() as conn:
            conn.execute(insert, rows[i : i + batch])
    wall = time.perf_counter() - t0
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE bench_floor")
    return len(rows) / wall


def load() -> str:
    return "load average " + " / ".join(f"{x:.1f}" for x in os.getloadavg()) + " (1 / 5 / 15 min)"


def query_latency(read: Callable[..., list[Any]], gpu: str, runs: int) -> tuple[float, float, float, int]:
    """(median wall ms, p99 wall ms, median CPU ms, items) of ``read(gpu=gpu, since=now - 7 days)``."""
    since = datetime.now(UTC) - timedelta(days=7)
    items = len(read(gpu=gpu, since=since))  # warm the cache once
    walls, cpus = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        read(gpu=gpu, since=since)
        walls.append((time.perf_counter() - t0) * 1000)
        cpus.append((time.process_time() - c0) * 1000)
    walls.sort()
    p99 = walls[min(len(walls) - 1, round(0.99 * (len(walls) - 1)))]
    return statistics.median(walls), p99, statistics.median(cpus), items


def sql_latency(store: Store, gpu: str, runs: int) -> float:
    """Median wall ms of the points query alone (rows fetched as tuples, no models built):
    what the index costs, apart from building the models."""
    since = datetime.now(UTC) - timedelta(days=7)
    with store.engine.connect() as conn:
        ids = conn.execute(sa.select(SERIES.c.id).where(SERIES.c.gpu.in_(gpu_names(gpu)))).scalars().all()
        q = (
            sa.select(POINTS.c.series_id, POINTS.c.at_us, POINTS.c.usd_per_hour, POINTS.c.count)
            .where(POINTS.c.series_id.in_(ids), POINTS.c.at_us >= to_us(since))
            .order_by(POINTS.c.series_id, POINTS.c.at_us)
        )
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            conn.execute(q).all()
            times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def run(name: str, url: str, points: list[PricePoint], batch: int, gpus: list[str], runs: int) -> None:
    store = Store(url)
    try:
        store.migrate()
        stored, wall, cpu = ingest(store, points, batch)
        print(
            f"{name:8s} ingest: {stored:,} points in {wall:.1f} s wall = {stored / wall:,.0f} points/s "
            f"(client CPU {cpu:.1f} s = {stored / cpu:,.0f} points/s; batches of {batch:,})"
        )
        floor = insert_floor(store, points, batch)
        print(f"{name:8s} reference, same run: bare rows into an unindexed table {floor:,.0f} points/s "
              f"(ingest = {stored / wall / floor:.2f}× the reference)")
        again = store.add_price_points(points[-batch:])
        print(f"{name:8s} re-ingest of the last batch stored {again} (dedup)")
        for gpu in gpus:
            med, p99, cpu_med, rows = query_latency(store.price_history, gpu, runs)
            s_med, s_p99, s_cpu, n_series = query_latency(store.price_series, gpu, runs)
            sql_med = sql_latency(store, gpu, runs)
            print(
                f"{name:8s} 7-day history for {gpu!r}: {rows:,} points in {n_series} series "
                f"({runs} runs over {stored:,} points)\n"
                f"{'':8s}   as PriceSeries (columns): median {s_med:.1f} ms, p99 {s_p99:.1f} ms wall; "
                f"median client CPU {s_cpu:.1f} ms\n"
                f"{'':8s}   as PricePoint per point:  median {med:.1f} ms, p99 {p99:.1f} ms wall; "
                f"median client CPU {cpu_med:.1f} ms\n"
                f"{'':8s}   points query and fetch only: median {sql_med:.1f} ms"
            )
    finally:
        store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--gpu", default="H100-SXM,H100", help="comma-separated: a model and/or a family")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--backends", default="sqlite,postgres")
    args = ap.parse_args()

    t0 = time.perf_counter()
    points = make_points(args.points)
    # The fixture's million models would otherwise be walked by every full GC pass during the
    # timed reads (seconds each, the p99): a long-running broker holds no such heap.
    gc.freeze()
    print(
        f"generated {len(points):,} points in {len(make_series()):,} series "
        f"({time.perf_counter() - t0:.1f} s, not counted); {os.cpu_count()} CPUs, {load()}"
    )
    backends = args.backends.split(",")
    gpus = args.gpu.split(",")
    if "sqlite" in backends:
        with tempfile.TemporaryDirectory() as tmp:
            run("sqlite", f"sqlite:///{tmp}/bench.db", points, args.batch, gpus, args.runs)
    if "postgres" in backends:
        admin_url = os.environ.get("LOCKSTEP_BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
        try:
            admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.exec_driver_sql("SELECT 1")
        except sa.exc.OperationalError as exc:
            print(f"postgres skipped: {admin_url.split('@')[-1]} is not reachable ({type(exc.orig).__name__})")
            return 0
        db = f"lockstep_bench_{secrets.token_hex(4)}"
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{db}"')
        try:
            url = sa.engine.make_url(admin_url).set(database=db).render_as_string(hide_password=False)
            run("postgres", url, points, args.batch, gpus, args.runs)
        finally:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
            admin.dispose()
    print(load(), "at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
