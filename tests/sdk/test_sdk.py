"""The SDK (broker/sdk.py) against a real `lockstep serve` process on loopback, its jobs run on the local Vast-API
server (standins/vastapi): submit → follow the log → the exit code → the spend; a spec error raises the SDK's
SpecError naming the field; a submission whose answer was lost is retried with its idempotency key and returns
the same job (a loopback proxy in front of the server loses the first answer); the blocking Client does what
the AsyncClient does; a job's state changes arrive through ``events(follow=True)`` and again from a cursor.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import aclosing, closing
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from aiohttp import web

from broker.api import start_server
from broker.models import TERMINAL_STATES, Job, JobState, Role, StreamEvent
from broker.sdk import ApiError, AsyncClient, Client, NotFoundError, SpecError, Unreachable
from broker.store import open_store
from standins.vastapi.server import VastApiServer
from tests.plugins.vast import VAST_TEST_KEY

ROOT = Path(__file__).resolve().parents[2]


def job_spec(name: str, command: str) -> dict:
    return {"name": name, "gpu": ["RTX-4090", "RTX-3090"], "gpus": 1, "providers": ["vast"],
            "markets": ["on_demand"], "workload": {"hours": 1}, "disk_gb": 20, "command": command}


@dataclass
class Served:
    url: str
    token: str
    other: str  # another tenant's token
    tmp: Path


@pytest.fixture
async def served(request: pytest.FixtureRequest, tmp_path: Path, vast_api: VastApiServer) -> AsyncIterator[Served]:
    """A `lockstep serve` on loopback; ``api`` settings from an indirect parameter, if any."""
    db_url = f"sqlite:///{tmp_path / 'lockstep.db'}"
    with open_store(db_url) as store:
        _, token = store.create_token("alpha", Role.user)
        _, other = store.create_token("beta", Role.user)
    config = tmp_path / "lockstep.yaml"
    config.write_text(yaml.safe_dump({
        "db_url": db_url,
        "broker": {"installation": "sdk", "poll_interval_s": 0.5, "place_interval_s": 0.3},
        "runtime": {"log_interval_s": 0.3, "grace_s": 2.0},
        "vast": {"enabled": True, "url": vast_api.url, "min_reliability": 0.0, "verified_only": False},
        "catalog": {"enabled": False},
        "api": getattr(request, "param", {}),
    }))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env.update(PYTHONPATH=str(ROOT), LOCKSTEP_VAST_API_KEY=VAST_TEST_KEY)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker", "--config", str(config), "serve", "--port", "0", env=env, cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
        assert line.startswith("lockstep: serving on "), line
        yield Served(line.split()[-1], token, other, tmp_path)
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 60)


async def test_submit_follow_the_log_exit_code_and_spend(served: Served) -> None:
    async with AsyncClient(served.url, served.token) as ls:
        assert served.token not in repr(ls)
        job = await ls.submit(job_spec("sdk-run", 'echo "one"; echo "two"; exit 3'))
        assert isinstance(job, Job) and job.tenant == "alpha"
        lines = [ln.text async for ln in ls.logs(job.id, follow=True)]  # ends by itself when the job ends
        assert [t for t in lines if t in ("one", "two")] == ["one", "two"]
        for _ in range(600):  # released and booked in the poll that saw the end
            job = await ls.job(job.id)
            if job.state in TERMINAL_STATES and job.spent_usd > 0:
                break
            await asyncio.sleep(0.2)
        assert job.state is JobState.failed and "exit code 3" in job.reason, job.reason
        assert job.spent_usd > 0 and job.accruing_usd == 0
        assert job.id in {j.id for j in await ls.jobs(states=[JobState.failed])}
        tail = [ln async for ln in ls.logs(job.id, tail=1)]  # kept in the store after the machine is gone
        assert len(tail) == 1

        with pytest.raises(NotFoundError):
            [ln async for ln in ls.logs("j-nope")]
    async with AsyncClient(served.url, served.other) as theirs:
        with pytest.raises(NotFoundError):
            await theirs.job(job.id)  # another tenant's job


async def test_a_spec_error_names_the_field(served: Served) -> None:
    async with AsyncClient(served.url, served.token) as ls:
        with pytest.raises(SpecError) as bad:
            await ls.submit({**job_spec("bad", "true"), "gpus": 12, "gpus_per_node": 8})
        assert bad.value.field == "gpus_per_node"
        with pytest.raises(SpecError) as bad:
            await ls.quote({"name": "q", "gpus": -1})
        assert bad.value.field == "gpus"
        assert await ls.jobs() == []  # nothing stored


class LosingProxy:
    """A loopback proxy in front of the server that forwards every request, and for the first ``lose`` POSTs
    to /v1/jobs throws the server's answer away and answers 502: the job was stored, the client never heard."""

    def __init__(self, upstream: str, lose: int) -> None:
        self.upstream, self.lose, self.posts = upstream, lose, 0
        self.keys: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with httpx.AsyncClient(base_url=self.upstream, timeout=60) as up:
            r = await up.request(request.method, request.path_qs, content=body, headers=headers)
        if request.method == "POST" and request.path == "/v1/jobs":
            self.posts += 1
            self.keys.append(request.headers.get("Idempotency-Key", ""))
            if self.posts <= self.lose:
                return web.json_response({"error": {"code": "bad_gateway", "message": "answer lost"}}, status=502)
        return web.Response(status=r.status_code, body=r.content, content_type="application/json")


async def test_an_idempotent_retry_returns_the_same_job(served: Served) -> None:
    proxy = LosingProxy(served.url, lose=1)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner, url = await start_server(app, "127.0.0.1", 0)
    try:
        async with AsyncClient(url, served.token, backoff_s=0.01) as ls:
            job = await ls.submit(job_spec("idem", "sleep 60"))  # the first answer is lost: retried
            assert proxy.posts == 2 and proxy.keys[0] == proxy.keys[1] and proxy.keys[0]  # the same key
            again = await ls.submit(job_spec("idem", "sleep 60"), idempotency_key=proxy.keys[0])
            assert again.id == job.id
            assert [j.id for j in await ls.jobs()] == [job.id]  # one job, not two
            await ls.cancel(job.id)
        async with AsyncClient(url, served.token, retries=0) as once:
            proxy.lose, proxy.posts = 1, 0
            with pytest.raises(ApiError) as lost:
                await once.submit(job_spec("idem-2", "true"))
            assert lost.value.status == 502 and proxy.posts == 1  # no retries asked: one try
    finally:
        await runner.cleanup()


async def test_the_blocking_client_and_an_unreachable_server(served: Served) -> None:
    def blocking() -> tuple[int, int, str]:
        with Client(served.url, served.token) as ls:
            gpus = ls.gpus()
            offers = ls.offers(gpu="RTX-4090", limit=3)
            q = ls.quote(job_spec("q", "true"), top=2)
            return len(gpus), len(offers), q.options[0].provider

    n_gpus, n_offers, provider = await asyncio.to_thread(blocking)
    assert n_gpus > 0 and 0 < n_offers <= 3 and provider == "vast"

    def unreachable() -> None:
        with Client("http://127.0.0.1:9", served.token, retries=1, backoff_s=0.01) as ls:
            ls.jobs()

    with pytest.raises(Unreachable, match="cannot reach the server") as down:
        await asyncio.to_thread(unreachable)
    assert served.token not in str(down.value)


# The second server ends every followed stream after a second: the clients reopen it from their last cursor
# several times while the job runs (the server does what a restart would), and still see each change once.
@pytest.mark.parametrize("served", [{}, {"log_follow_max_s": 1.0}], ids=["one-stream", "reopened"], indirect=True)
async def test_a_jobs_state_changes_arrive_as_events_resumable_from_a_cursor(served: Served) -> None:
    """``AsyncClient.events(follow=True)`` and the blocking ``Client.events(follow=True)`` (in a thread) both
    follow the live stream while a job runs; each hands back the server's StreamEvent, and the job's history
    read again from any event's cursor is the rest of it, once."""
    def ended(e: StreamEvent) -> bool:
        return e.to_state is not None and e.to_state in TERMINAL_STATES

    def follow_blocking() -> list[StreamEvent]:
        got: list[StreamEvent] = []
        with Client(served.url, served.token) as ls, closing(ls.events(follow=True)) as stream:
            for e in stream:
                got.append(e)
                if ended(e):
                    return got
        return got

    async with AsyncClient(served.url, served.token) as ls:
        async def follow() -> list[StreamEvent]:
            got: list[StreamEvent] = []
            async with aclosing(ls.events(since="now", follow=True)) as stream:  # closed on leaving: no open stream
                async for e in stream:
                    got.append(e)
                    if ended(e):
                        break
            return got

        live = asyncio.create_task(follow())
        blocking = asyncio.create_task(asyncio.to_thread(follow_blocking))
        await asyncio.sleep(1.5)  # both followers connected ("now" is pinned to a cursor when they start)
        job = await ls.submit(job_spec("sdk-events", 'echo "done"'))
        async with asyncio.timeout(180):
            seen, seen_blocking = await live, await blocking
        assert all(isinstance(e, StreamEvent) for e in seen)
        assert {e.job_id for e in seen} == {job.id} and {e.tenant for e in seen} == {"alpha"}
        job = await ls.job(job.id)
        history = [(ev.from_state, ev.to_state) for ev in job.events if ev.to_state is not None]
        changes = [(e.from_state, e.to_state) for e in seen if e.kind.startswith("job.")]
        assert changes == history and changes[0][1] is JobState.pending and len(changes) >= 3, changes
        assert all(e.kind == f"job.{e.to_state.value}" for e in seen if e.to_state is not None)
        assert [e.cursor for e in seen_blocking] == [e.cursor for e in seen]
        assert len({e.cursor for e in seen}) == len(seen)  # none repeated

        # Resume after the second event, as a follower that lost its connection there would.
        rest = [e async for e in ls.events(since=seen[1].cursor)]
        assert [e.cursor for e in rest] == [e.cursor for e in seen[2:]]
        everything = [e async for e in ls.events()]  # from the oldest kept: this tenant's only
        assert [e.cursor for e in everything] == [e.cursor for e in seen]
    async with AsyncClient(served.url, served.other) as theirs:
        assert [e async for e in theirs.events()] == []  # another tenant's job is not in their stream
