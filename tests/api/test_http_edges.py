"""HTTP edges (issue 23): a NUL in a path, query or header is a 400 naming it on both stores with no ERROR
logged; a followed log ends soon after its client goes, and SIGTERM stops a server with follows open; a flood of
unknown tokens from one address never throttles a valid token from it; the access log says 499 as the metrics do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.api import create_app
from broker.api.handlers import ROUTES
from broker.config import ApiConfig
from broker.models import Role
from broker.service import Lockstep
from broker.store import open_store
from tests.api.conftest import ServerThread, _settings, spec

ROOT = Path(__file__).resolve().parents[2]


class Served:
    def __init__(self, db_url: str, api: ApiConfig) -> None:
        with open_store(db_url) as store:
            _, self.admin = store.create_token("ops", Role.admin)
            _, self.alice = store.create_token("alpha", Role.user)
        self.db_url = db_url
        self.svc = Lockstep(_settings(db_url, api), only_providers=["catalog"])
        self.server = ServerThread(create_app(self.svc, start_loops=False))
        self.url = self.server.start()

    def client(self, token: str | None) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"} if token else {},
                            timeout=60)

    def on_loop(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.server.loop).result(30)  # type: ignore[arg-type]


def _generous() -> ApiConfig:
    return ApiConfig(rate_per_s=100_000, burst=100_000, bad_token_rate_per_s=100_000, bad_token_burst=100_000)


@pytest.fixture(params=["sqlite", "postgres"])
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    url = f"sqlite:///{tmp_path / 'edges.db'}" if request.param == "sqlite" else request.getfixturevalue(
        "pg_database")()
    s = Served(url, _generous())
    yield s
    s.server.stop()


# --------------------------------------------------------------------------- characters no store can hold


def test_a_nul_in_any_path_or_query_parameter_is_a_400_naming_it_on_both_stores(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    tried = 0
    with served.client(served.admin) as c:
        for r in ROUTES:
            if r.public or r.docs:
                continue
            params = re.findall(r"{(\w+)}", r.path)
            path = re.sub(r"{\w+}", "j1%00x", r.path)
            if params:
                got = c.request(r.method, path)
                assert got.status_code == 400, (r.method, r.path, got.text)
                assert got.json()["error"]["field"] == params[0], (r.path, got.text)
                tried += 1
            got = c.request(r.method, re.sub(r"{\w+}", "j1", r.path) + "?tenant=alpha%00&limit=1")
            assert got.status_code == 400 and got.json()["error"]["field"] == "tenant", (r.path, got.text)
            tried += 1
        # A key that holds NUL is named as the query; a lone surrogate (no UTF-8) is refused like NUL.
        got = c.get("/v1/jobs?a%00b=1")
        assert got.status_code == 400 and got.json()["error"]["field"] == "query"
    assert tried >= 20
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


async def _raw(url: str, head: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(4096), 30)
    writer.close()
    return data


def test_a_nul_in_a_header_is_a_400_logged_as_one_info_line(served: Served,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    got = asyncio.run(_raw(served.url, b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                                       + served.admin.encode() + b"\r\nX-Trace: a\x00b\r\n\r\n"))
    assert got.startswith(b"HTTP/1.") and b" 400 " in got.split(b"\r\n")[0]
    assert b"header" in got.lower()  # the parser's reason names what it refused
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    refused = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert refused and all(r.levelno == logging.INFO and r.exc_info is None for r in refused)


# --------------------------------------------------------------------------- followed logs


def _follow_tasks(loop: asyncio.AbstractEventLoop) -> int:
    # the pump of each followed answer (broker/api/follow.py; the logs' and the event stream's alike)
    return sum(1 for t in asyncio.all_tasks(loop) if "follow_ndjson" in t.get_coro().__qualname__)  # type: ignore[union-attr]


async def _open_follows(url: str, token: str, job_id: str, n: int, path: str = "") -> list[asyncio.StreamWriter]:
    """``n`` follows of the job's log (or of ``path``), each open once its headers came."""
    host, port = url.removeprefix("http://").split(":")
    writers = []
    for _ in range(n):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET {path or f'/v1/jobs/{job_id}/logs?follow=true'} HTTP/1.1\r\nHost: x\r\n"
                     f"Authorization: Bearer {token}\r\n\r\n".encode())
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 200"), head
        writers.append(writer)
    return writers


def test_two_hundred_dropped_follows_end_within_seconds(tmp_path: Path) -> None:
    s = Served(f"sqlite:///{tmp_path / 'f.db'}", _generous())
    try:
        with s.client(s.alice) as c:
            job = c.post("/v1/jobs", json=spec("quiet"))
            assert job.status_code == 201, job.text
        job_id = job.json()["id"]  # pending forever here: no broker loops, nothing printed

        async def scenario() -> None:
            writers = await _open_follows(s.url, s.alice, job_id, 200)
            for _ in range(200):  # a client has its headers a moment before its handler starts following
                if _follow_tasks(s.server.loop) >= 200:
                    break
                await asyncio.sleep(0.05)
            assert _follow_tasks(s.server.loop) == 200
            for w in writers:
                w.transport.abort()  # the clients vanish without a word

        asyncio.run(scenario())
        deadline = time.monotonic() + 5
        while _follow_tasks(s.server.loop) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _follow_tasks(s.server.loop) == 0, f"{_follow_tasks(s.server.loop)} follows still open after 5 s"
    finally:
        s.server.stop()


def test_sigterm_stops_a_server_with_follows_open_within_five_seconds(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with open_store(f"sqlite:///{db}") as store:
        _, token = store.create_token("alpha", Role.user)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["LOCKSTEP_BROKER__PLACE_INTERVAL_S"] = "3600"  # the job stays pending: its follows stay open
    proc = subprocess.Popen([sys.executable, "-m", "broker", "--db", str(db), "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[-1]
        assert url.startswith("http://"), url
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
            job_id = c.post("/v1/jobs", json=spec("quiet")).json()["id"]

        async def scenario() -> float:
            writers = await _open_follows(url, token, job_id, 20)
            # and quiet event streams: nothing happens after "now", so only the server's stopping ends them
            writers += await _open_follows(url, token, job_id, 5, "/v1/events?follow=true&since=now")
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            with contextlib.suppress(subprocess.TimeoutExpired):  # a bounded wait for the process to end
                await asyncio.to_thread(proc.wait, 30)
            for w in writers:
                w.close()
            return time.monotonic() - sent

        took = asyncio.run(scenario())
        assert proc.returncode == 0 and took < 5, (took, proc.returncode)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


# --------------------------------------------------------------------------- the bad-token limiter


def test_a_flood_of_unknown_tokens_never_throttles_a_valid_token_from_the_same_address(tmp_path: Path) -> None:
    s = Served(f"sqlite:///{tmp_path / 'l.db'}", ApiConfig(rate_per_s=100_000, burst=100_000,
                                                             bad_token_rate_per_s=0.01, bad_token_burst=2))
    try:
        with open_store(s.db_url) as store:  # made after the server started, as `lockstep tokens create` would
            _, fresh = store.create_token("beta", Role.user)

        async def flood() -> tuple[list[int], list[int]]:
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as c:
                async def one(token: str) -> int:
                    return (await c.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"})).status_code

                bad = [f"lst_stranger{i:04d}" for i in range(60)]
                good = [s.alice, fresh] * 10
                order = [t for pair in zip(bad, good + [""] * 40, strict=True) for t in pair if t]
                codes = await asyncio.gather(*(one(t) for t in order))
                by = dict(zip(order, codes, strict=True))
                return [by[t] for t in bad], [c for t, c in zip(order, codes, strict=True) if t in good]

        bad_codes, good_codes = asyncio.run(flood())
        # (lookups already in flight when the limit is reached still answer 401: the limit is on lookups begun)
        assert bad_codes.count(429) >= 40 and set(bad_codes) <= {401, 429}
        assert set(good_codes) == {200}, good_codes
    finally:
        s.server.stop()


# --------------------------------------------------------------------------- access log = metrics


def test_a_client_that_hangs_up_mid_body_is_499_in_the_access_log_and_the_metrics(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    s = Served(f"sqlite:///{tmp_path / 'a.db'}", _generous())
    try:
        async def hang_up() -> None:
            host, port = s.url.removeprefix("http://").split(":")
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {s.alice}\r\n"
                         "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"na".encode())
            await writer.drain()
            await asyncio.sleep(0.3)
            writer.transport.abort()

        asyncio.run(hang_up())
        deadline = time.monotonic() + 10
        access: list[str] = []
        while not access and time.monotonic() < deadline:
            access = [r.getMessage() for r in caplog.records if r.name == "lockstep.access" and "POST" in
                      r.getMessage()]
            time.sleep(0.05)
        assert access and '" 499 ' in access[0], access
        from broker.api.keys import METRICS

        statuses = {smp.labels["status"] for m in s.server.app[METRICS].http_requests.collect()
                    for smp in m.samples if smp.name.endswith("_total")}
        assert "499" in statuses and "400" not in statuses
    finally:
        s.server.stop()


def test_a_key_twice_in_a_json_body_is_a_422_naming_it(tmp_path: Path) -> None:
    s = Served(f"sqlite:///{tmp_path / 'd.db'}", _generous())
    try:
        with s.client(s.alice) as c:
            got = c.post("/v1/jobs", content=b'{"name": "twice", "gpu": ["H100"], "gpus": 8, "gpus": 16, '
                                             b'"workload": {"hours": 2}}', headers={"Content-Type": "application/json"})
            assert got.status_code == 422 and got.json()["error"]["field"] == "gpus", got.text
            assert "twice" in got.json()["error"]["message"]
            assert c.get("/v1/jobs").json()["jobs"] == []  # nothing was accepted
    finally:
        s.server.stop()
