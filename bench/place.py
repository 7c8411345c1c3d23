"""Lockstep's own cost per placement, without provider latency: one placement pass over a queue of
pending jobs, on SQLite and on PostgreSQL, beside a floor measured in the same run.

    python bench/place.py [--sizes 1000,10000] [--backends sqlite,postgres] [--runs 1]

The market is an in-memory provider that answers at once (standins/memory.py's, with a dict by
client token for its idempotency): what is timed is Lockstep's work, i.e.
ranking, the budget check, the claim (pending → placing under the row lock), the attempt counter, the
allocation intent, recording the launch and placing → provisioning, each a write transaction, as in
production. The queue is written first (``Store.create_jobs`` in batches of 1,000, the API's group
commit; its rate is printed too), then one ``place_pending()`` pass places every job, ``PLACING_AT_ONCE``
at a time.

The floor, measured in the same run on the same store: one short write transaction per job (a
``note_reasons`` of one job, under the same transaction counter as the pass). "× floor" says how many
such writes' worth a placement costs. The load average before and after is printed with the table.
100,000 jobs take several minutes a backend on a 2-core machine: pass ``--sizes 1000,10000,100000``
to measure them, or ``--place 2000`` to place the oldest 2,000 of each queue (placements per second
with that queue waiting, without waiting for all of it; "left" then counts the rest).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from broker.config import BrokerConfig, Settings
from broker.models import Allocation, AllocationState, Job, JobState, Offer, utcnow
from broker.service import Lockstep
from broker.service.runtime import new_job_id
from broker.store import Store
from providers.base import LaunchRequest
from standins.memory import MemoryProvider, offer, spec

PG = "postgresql+psycopg://postgres@127.0.0.1:5432"


class InstantProvider(MemoryProvider):
    """The in-memory market with its idempotency lookup by token (a dict, not a scan of everything it
    holds), so that the provider's own bookkeeping stays out of the figure at 10,000 launches."""

    def __init__(self, name: str, offers: list[Offer]) -> None:
        super().__init__(name, offers)
        self._by_token: dict[str, Allocation] = {}

    async def launch(self, req: LaunchRequest) -> Allocation:
        got = self._by_token.get(req.client_token)
        if got is None:
            rid = f"{self.name}-i{len(self._by_token) + 1}"
            got = Allocation(id=f"{self.name}-{rid}", job_id=req.job_id, attempt=req.attempt, provider=self.name,
                             offer_id=req.offer.id, state=AllocationState.pending, client_token=req.client_token,
                             resource_ids=[rid], nodes=req.nodes, region=req.offer.region, zone=req.offer.zone,
                             usd_per_hour=req.offer.usd_per_hour)
            self._by_token[req.client_token] = self.held[rid] = got
        return got


class WriteCounter:
    """Counts the store's transactions during the pass, by the engine's own events: a write transaction is one
    that ran an INSERT, UPDATE or DELETE before its commit; any other is a read. (The bench's own lookout, not
    the store's: nothing of the project is changed to count.)"""

    def __init__(self, store: Store) -> None:
        self.engine = store.engine
        self.writes = self.reads = 0

    def _statement(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip()[:6].upper() in ("INSERT", "UPDATE", "DELETE"):
            conn.info["lockstep_bench_write"] = True

    def _commit(self, conn: Any) -> None:
        if conn.info.pop("lockstep_bench_write", False):
            self.writes += 1
        else:
            self.reads += 1

    def __enter__(self) -> WriteCounter:
        sa.event.listen(self.engine, "before_cursor_execute", self._statement)
        sa.event.listen(self.engine, "commit", self._commit)
        return self

    def __exit__(self, *exc: object) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._statement)
        sa.event.remove(self.engine, "commit", self._commit)


def new_store(backend: str, tmp: str) -> tuple[Store, object]:
    """A migrated, empty store and what drops it."""
    if backend == "sqlite":
        store = Store(f"sqlite:///{tmp}/place-{secrets.token_hex(3)}.db")
        store.migrate()
        return store, None
    import psycopg
    from psycopg import sql

    name = f"lockstep_bench_{secrets.token_hex(4)}"
    admin = psycopg.connect(host="127.0.0.1", port=5432, user="postgres", dbname="test", autocommit=True,
                            connect_timeout=3)
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    store = Store(f"{PG}/{name}")
    store.migrate()
    return store, (admin, name)


def drop(handle: object) -> None:
    if handle is None:
        return
    from psycopg import sql

    admin, name = handle  # type: ignore[misc]
    admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    admin.close()


async def one(backend: str, n: int, tmp: str, place: int | None = None) -> dict[str, float]:
    store, handle = new_store(backend, tmp)
    try:
        offers = [offer("mem", f"x{i}", 1.0 + i / 10, zone=f"z{i % 4}") for i in range(20)]
        provider = InstantProvider("mem", offers)
        settings = Settings(db_url=store.url, broker=BrokerConfig(installation="bench"))
        svc = Lockstep(settings, providers={"mem": provider}, store=store)
        await svc.refresh()
        job_spec = spec()
        t0 = time.perf_counter()
        for start in range(0, n, 1000):
            now = utcnow()
            store.create_jobs([(Job(id=new_job_id(), spec=job_spec, created_at=now, updated_at=now), None)
                               for _ in range(min(1000, n - start))])
        submit_s = time.perf_counter() - t0

        # The floor: one short write transaction per job, on this store, now.
        ids = [j for j, _ in store.job_heads(JobState.pending)][: min(n, 2000)]
        # Under the same lookout as the pass (its engine listeners cost a little on every statement).
        with WriteCounter(store):
            t0 = time.perf_counter()
            for job_id in ids:
                store.note_reasons({job_id: "bench floor"})
            floor_s = (time.perf_counter() - t0) / len(ids)

        some = None if place is None or place >= n else [j for j, _ in store.job_heads(JobState.pending)][:place]
        counter = WriteCounter(store)
        cpu0, t0 = time.process_time(), time.perf_counter()
        with counter:
            results = await svc.broker.place_pending(some)
        pass_s, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
        placed = sum(1 for r in results if r.placed)
        left = len(store.job_heads(JobState.pending))
        await svc.aclose()
        return {"n": n, "submit_per_s": n / submit_s, "pass_s": pass_s, "cpu_s": cpu_s, "placed": placed,
                "left": left, "per_s": placed / pass_s, "floor_ms": floor_s * 1000,
                "x_floor": (pass_s / max(placed, 1)) / floor_s,
                "writes": counter.writes / max(placed, 1), "reads": counter.reads / max(placed, 1)}
    finally:
        if handle is None:
            store.close()
        else:
            store.close()
            drop(handle)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--place", type=int, default=None,
                    help="place only the oldest N of the queue (the pass over a long queue, cut short); default all")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sizes = [int(s) for s in args.sizes.split(",")]
    load0 = os.getloadavg()
    rows: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="lockstep-place-") as tmp:
        for _ in range(args.runs):
            for n in sizes:
                for backend in args.backends.split(","):
                    try:
                        rows.setdefault((backend, n), []).append(asyncio.run(one(backend, n, tmp, args.place)))
                    except Exception as exc:  # PostgreSQL down: say so, go on
                        if backend == "sqlite":
                            raise
                        print(f"{backend}: skipped ({type(exc).__name__}: {exc})")
                        break
    load1 = os.getloadavg()
    print(f"one placement pass over N pending one-GPU jobs, a provider that answers at once; {os.cpu_count()} CPUs; "
          f"load average {load0[0]:.1f} before, {load1[0]:.1f} after; {args.runs} run(s), median shown")
    print(f"{'backend':<11}{'pending':>9}{'pass s':>9}{'CPU s':>8}{'placed/s':>10}{'floor ms':>10}{'× floor':>9}"
          f"{'writes':>8}{'reads':>7}{'placed':>8}{'left':>6}{'queued/s':>10}")
    for (backend, n), rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"{backend:<11}{n:>9,}{med['pass_s']:>9.2f}{med['cpu_s']:>8.2f}{med['per_s']:>10.0f}"
              f"{med['floor_ms']:>10.2f}{med['x_floor']:>9.1f}{med['writes']:>8.2f}{med['reads']:>7.2f}"
              f"{int(med['placed']):>8}{int(med['left']):>6}"
              f"{med['submit_per_s']:>10,.0f}")
    print("placed/s: jobs placed / the pass's wall time; floor: one write transaction of one job on the same store "
          "in the same run; × floor: a placement's wall time in floors (single-write equivalents); writes, "
          "reads: the store's write and read transactions per placement, counted; queued/s: the queue written "
          "by create_jobs in batches of 1,000")


if __name__ == "__main__":
    main()
