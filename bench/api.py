"""API throughput and latency: POST /v1/quotes and POST /v1/jobs from 32 concurrent clients.

    python bench/api.py [--clients 32] [--seconds 10] [--spec examples/single-node-8gpu.yaml]

Starts `lockstep serve` (catalog provider only, SQLite in a temp dir, rate
limit lifted) and a bare aiohttp server in two other processes on loopback,
drives each from this process with aiohttp clients, and prints requests per
second and p50/p99 latency. The bare server answers a small JSON document
after reading the body: the ratio of the two says what Lockstep costs above
the framework (and this client) on the same machine in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent


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


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc), to tell our cost from a busy machine's."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


async def drive(name: str, url: str, body: bytes, headers: dict[str, str], clients: int, seconds: float,
                pid: int, warmup: float = 1.0) -> Result:
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        stop_at = time.perf_counter() + warmup
        result = Result(name, seconds)

        async def worker(record: bool) -> None:
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                async with session.post(url, data=body) as resp:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--spec", default=str(ROOT / "examples" / "single-node-8gpu.yaml"))
    ap.add_argument("--bare-server", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.bare_server:
        bare_server()
        return

    spec = json.dumps(yaml.safe_load(Path(args.spec).read_text())).encode()
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{tmp}/bench.db"
        from broker.models import Role
        from broker.store import open_store

        with open_store(db) as store:
            _, token = store.create_token("bench", Role.admin, "bench/api.py")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
        env.update(LOCKSTEP_API__RATE_PER_S="1e9", LOCKSTEP_API__BURST="1000000000",
                   LOCKSTEP_LOG_LEVEL="WARNING")
        lockstep, url = start([sys.executable, "-m", "broker", "--db", db, "serve", "--port", "0"], env)
        bare, bare_url = start([sys.executable, __file__, "--bare-server"], env)
        try:
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            n, t = args.clients, args.seconds
            runs = [
                asyncio.run(drive("bare aiohttp", f"{bare_url}/bare", spec, headers, n, t, bare.pid)),
                asyncio.run(drive("POST /v1/quotes", f"{url}/v1/quotes", spec, headers, n, t, lockstep.pid)),
                asyncio.run(drive("POST /v1/jobs", f"{url}/v1/jobs", spec, headers, n, t, lockstep.pid)),
            ]
        finally:
            for proc in (lockstep, bare):
                proc.terminate()
                proc.wait(10)

    bare_rps = runs[0].rps
    print(f"{args.clients} clients, {args.seconds:g} s each, spec {Path(args.spec).name}, "
          f"{os.cpu_count()} CPUs, client and servers on this machine")
    print(f"{'target':<18}{'requests':>10}{'req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'vs bare':>9}"
          f"{'server CPU ms/req':>19}  statuses")
    for r in runs:
        print(f"{r.name:<18}{len(r.latencies):>10}{r.rps:>10.0f}{r.pct(50):>9.1f}{r.pct(99):>9.1f}"
              f"{r.rps / bare_rps:>8.2f}x{r.cpu_ms_per_request:>19.2f}  {dict(sorted(r.statuses.items()))}")
    print("server CPU ms/req: CPU the server process spent per request (all threads); 1000 / it is the "
          "rate one otherwise idle core would sustain")


if __name__ == "__main__":
    main()
