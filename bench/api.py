"""API throughput and latency from 32 concurrent clients, each figure beside a bare aiohttp handler
measured in the same run.

    python bench/api.py [--clients 32] [--seconds 2] [--runs 3] [--spec examples/single-node-8gpu.yaml]
                        [--backends sqlite,postgres] [--workers 1,2]

Starts, in other processes on loopback: a bare aiohttp server (reads the body, answers a small JSON
document), ``lockstep serve`` on SQLite, and ``lockstep serve --workers N`` on PostgreSQL for each N
(a fresh database each, dropped at the end; skipped when PostgreSQL does not answer). Every Lockstep
server runs its broker loops (refresh, placement, polling) with the bundled catalog as its market, so
submitted jobs are looked at by the placement loop while more arrive. The rate limit is lifted.

Each run drives, in turn: the bare handler; ``POST /v1/quotes`` with one spec (a client repeating
itself: the quote is ranked once a second, answered from memory otherwise); ``POST /v1/quotes`` with
a new spec every request (each one ranked and serialised); ``POST /v1/jobs`` on each server. Runs are
interleaved (every target once per run), and min / median over the runs are printed, with the ratio
to the bare handler of the same run and the server's CPU per request (all its threads; all workers).
The load average before and after says how busy the machine was.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent
PG = "postgresql+psycopg://postgres@127.0.0.1:5432"


# --------------------------------------------------------------------------- the bare server


def bare_server() -> None:
    from aiohttp import web

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"ok": True})

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/bare", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"lockstep: serving on http://127.0.0.1:{port}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


# --------------------------------------------------------------------------- driving


def _proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process and its children (the workers), Linux /proc."""
    own = _proc_cpu(pid)
    if own is None:
        return None
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                own += _proc_cpu(int(entry.name)) or 0.0
    return own


@dataclass
class Result:
    name: str
    seconds: float
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    server_cpu_s: float | None = None

    @property
    def cpu_ms_per_request(self) -> float:
        if self.server_cpu_s is None or not self.latencies:
            return float("nan")
        return self.server_cpu_s / len(self.latencies) * 1000

    @property
    def rps(self) -> float:
        return len(self.latencies) / self.seconds

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        if len(self.latencies) == 1:
            return self.latencies[0] * 1000
        return statistics.quantiles(self.latencies, n=100, method="inclusive")[int(q) - 1] * 1000


async def drive(name: str, url: str, body: Callable[[int], bytes], headers: dict[str, str], clients: int,
                seconds: float, pid: int, warmup: float = 0.5) -> Result:
    connector = aiohttp.TCPConnector(limit=clients)
    count = 0
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        stop_at = time.perf_counter() + warmup
        result = Result(name, seconds)

        async def worker(record: bool) -> None:
            nonlocal count
            while time.perf_counter() < stop_at:
                count += 1
                data = body(count)
                t0 = time.perf_counter()
                async with session.post(url, data=data) as resp:
                    await resp.read()
                    status = resp.status
                if record:
                    result.latencies.append(time.perf_counter() - t0)
                    result.statuses[status] = result.statuses.get(status, 0) + 1

        await asyncio.gather(*(worker(False) for _ in range(clients)))  # warm caches and connections
        started, cpu0 = time.perf_counter(), cpu_seconds(pid)
        stop_at = started + seconds
        await asyncio.gather(*(worker(True) for _ in range(clients)))
        result.seconds = time.perf_counter() - started
        cpu1 = cpu_seconds(pid)
        if cpu0 is not None and cpu1 is not None:
            result.server_cpu_s = cpu1 - cpu0
    return result


def start(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                            cwd=ROOT)
    assert proc.stdout is not None
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("lockstep: serving on "):
            return proc, line.split()[-1]
    proc.kill()
    raise SystemExit(f"{cmd[:4]}: the server did not start")


def pg_databases(count: int) -> tuple[list[str], Callable[[], None]] | None:
    """``count`` fresh PostgreSQL databases and a function that drops them; None when PostgreSQL is down."""
    try:
        import psycopg
        from psycopg import sql

        admin = psycopg.connect(host="127.0.0.1", port=5432, user="postgres", dbname="test", autocommit=True,
                                connect_timeout=3)
    except Exception:
        return None
    names = [f"lockstep_bench_{secrets.token_hex(4)}" for _ in range(count)]
    for n in names:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(n)))

    def drop() -> None:
        for n in names:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(n)))
        admin.close()

    return [f"{PG}/{n}" for n in names], drop


def summary(rows: list[Result], bare: list[Result]) -> str:
    rps = [r.rps for r in rows]
    p99 = [r.pct(99) for r in rows]
    ratio = [r.rps / b.rps for r, b in zip(rows, bare, strict=True)]
    cpu = [r.cpu_ms_per_request for r in rows]
    statuses: dict[int, int] = {}
    for r in rows:
        for k, v in r.statuses.items():
            statuses[k] = statuses.get(k, 0) + v
    return (f"{rows[0].name:<34}{min(rps):>8.0f}{statistics.median(rps):>8.0f}{min(p99):>8.1f}"
            f"{statistics.median(p99):>8.1f}{min(ratio):>7.2f}x{statistics.median(ratio):>6.2f}x"
            f"{statistics.median(cpu):>9.2f}  {dict(sorted(statuses.items()))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=2.0, help="measured seconds per target per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--spec", default=str(ROOT / "examples" / "single-node-8gpu.yaml"))
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--workers", default="1,2", help="worker counts to run on PostgreSQL")
    ap.add_argument("--bare-server", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_server:
        bare_server()
        return

    spec_doc = yaml.safe_load(Path(args.spec).read_text())
    spec = json.dumps(spec_doc).encode()
    varied = json.dumps({**spec_doc, "name": "q-@@@"}).encode()

    def same(_: int) -> bytes:
        return spec

    def each_new(i: int) -> bytes:
        return varied.replace(b"@@@", str(i).encode())

    backends = args.backends.split(",")
    workers = [int(w) for w in args.workers.split(",") if w] if "postgres" in backends else []
    pg = pg_databases(len(workers)) if workers else None
    if workers and pg is None:
        print("PostgreSQL at 127.0.0.1:5432 does not answer: its figures are skipped")
        workers = []
    from broker.models import Role
    from broker.store import open_store

    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env.update(LOCKSTEP_API__RATE_PER_S="1000000", LOCKSTEP_API__BURST="1000000", LOCKSTEP_LOG_LEVEL="WARNING",
               PYTHONPATH=str(ROOT))
    servers: list[tuple[str, subprocess.Popen[str], str, str]] = []  # (label, process, url, token)
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        urls: list[tuple[str, str, int]] = []
        if "sqlite" in backends:
            urls.append(("SQLite", f"sqlite:///{tmp}/bench.db", 1))
        for n, url in zip(workers, pg[0] if pg else [], strict=False):
            urls.append((f"PostgreSQL, {n} worker{'s' if n > 1 else ''}", url, n))
        bare, bare_url = start([sys.executable, __file__, "--bare-server"], env)
        try:
            for label, db, n in urls:
                with open_store(db) as store:
                    _, token = store.create_token("bench", Role.admin, "bench/api.py")
                proc, url = start([sys.executable, "-m", "broker", "--db", db, "serve", "--port", "0",
                                   "--workers", str(n)], env)
                servers.append((label, proc, url, token))
            results: dict[str, list[Result]] = {}

            def add(r: Result) -> None:
                results.setdefault(r.name, []).append(r)

            n_clients, t = args.clients, args.seconds
            for _ in range(args.runs):
                add(asyncio.run(drive("bare aiohttp", f"{bare_url}/bare", same, {}, n_clients, t, bare.pid)))
                for label, proc, url, token in servers:
                    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
                    if label == "SQLite" or len(servers) == 1:
                        add(asyncio.run(drive("POST /v1/quotes, one spec", f"{url}/v1/quotes", same, headers,
                                              n_clients, t, proc.pid)))
                        add(asyncio.run(drive("POST /v1/quotes, each spec new", f"{url}/v1/quotes", each_new,
                                              headers, n_clients, t, proc.pid)))
                    add(asyncio.run(drive(f"POST /v1/jobs, {label}", f"{url}/v1/jobs", same, headers, n_clients, t,
                                          proc.pid)))
        finally:
            for _, proc, _, _ in servers:
                proc.terminate()
            for proc in [bare, *(s[1] for s in servers)]:
                if proc is bare:
                    proc.terminate()
                proc.wait(60)
            if pg is not None:
                pg[1]()
    load1 = os.getloadavg()

    print(f"{args.clients} clients, {args.seconds:g} s per target per run, {args.runs} interleaved runs, spec "
          f"{Path(args.spec).name}, {os.cpu_count()} CPUs shared by client and servers; load average "
          f"{load0[0]:.1f} before, {load1[0]:.1f} after; broker loops running")
    print(f"{'target':<34}{'req/s':>16}{'p99 ms':>16}{'vs bare (same run)':>14}{'CPU':>9}")
    print(f"{'':<34}{'min':>8}{'median':>8}{'min':>8}{'median':>8}{'min':>8}{'median':>7}{'ms/req':>9}  statuses")
    bare_runs = results["bare aiohttp"]
    for rows in results.values():
        print(summary(rows, bare_runs))
    print("CPU ms/req: CPU the server spent per request (all threads, all workers), median over runs; "
          "1000 / it is the rate one otherwise idle core would sustain")


if __name__ == "__main__":
    main()
