"""Webhooks: a receiving server on loopback verifies every delivery's signature; a receiver that is down for a
while gets every delivery once it is back; a broker SIGKILLed mid-delivery loses none; SSRF rules; the routes."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from broker.config import EventsConfig, Settings
from broker.errors import SpecError
from broker.models import DeliveryState, Role, WebhookCreate
from broker.service import Lockstep
from broker.specs import parse_spec
from broker.store import Store, open_store
from broker.webhooks import SIGNATURE_HEADER, check_url, sign, verify_signature
from standins.memory import NOW
from tests.api.conftest import Api, spec
from tests.api.served import Served

SECRET = "whsec-test-0123456789abcdef"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Receiver:
    """An HTTP server on a fixed loopback port, in its own thread: it checks each delivery's signature and keeps
    what it got. ``down()`` closes the port (connections refused); ``up()`` opens it again. With ``hang_first``,
    the first request is held unanswered until ``release()``."""

    port: int = field(default_factory=_free_port)
    got: list[dict] = field(default_factory=list)  # verified deliveries: delivery id, event
    bad: list[str] = field(default_factory=list)
    arrived: int = 0
    hang_first: bool = False
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _runner: web.AppRunner | None = None
    _release: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.arrived += 1
        if self.hang_first and self.arrived == 1:
            assert self._release is not None
            await self._release.wait()
        if not verify_signature(SECRET, body, request.headers.get(SIGNATURE_HEADER, ""), time.time()):
            self.bad.append(request.headers.get(SIGNATURE_HEADER, ""))
            return web.Response(status=400)
        self.got.append({"delivery": request.headers["Lockstep-Delivery"], **json.loads(body)})
        return web.Response(status=204)

    def _run(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)  # type: ignore[arg-type]

    def start(self) -> None:
        threading.Thread(target=self._loop.run_forever, daemon=True).start()

        async def make() -> None:
            self._release = asyncio.Event()
        self._run(make())
        self.up()

    def up(self) -> None:
        async def go() -> None:
            app = web.Application()
            app.router.add_post("/hook", self._handle)
            self._runner = web.AppRunner(app, shutdown_timeout=0.1)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()
        self._run(go())

    def down(self) -> None:
        async def go() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
                self._runner = None
        self._run(go())

    def release(self) -> None:
        assert self._release is not None
        self._loop.call_soon_threadsafe(self._release.set)

    def stop(self) -> None:
        self.release()
        self.down()
        self._loop.call_soon_threadsafe(self._loop.stop)

    def cursors(self) -> set[str]:
        return {d["event"]["cursor"] for d in self.got}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.start()
    yield r
    r.stop()


class Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


def _expected(db_url: str, job_ids: list[str]) -> set[str]:
    """The cursors of these jobs' events, as the stream numbers them (no spike alerts here: ``<id>-0``)."""
    with Store(db_url) as store, store.engine.connect() as conn:
        import sqlalchemy as sa

        rows = conn.execute(sa.text("SELECT id, job_id FROM job_events")).all()
    return {f"{r.id}-0" for r in rows if r.job_id in job_ids}


async def test_a_receiver_down_for_a_while_gets_every_delivery_signed(tmp_path: Path, receiver: Receiver) -> None:
    db_url = f"sqlite:///{tmp_path / 'hooks.db'}"
    clock = Clock(NOW)
    settings = Settings(db_url=db_url, events=EventsConfig(
        webhook_allow_private=True, webhook_backoff_initial_s=1.0, webhook_backoff_max_s=8.0,
        webhook_max_attempts=20))
    svc = Lockstep(settings, only_providers=["catalog"], clock=clock)
    try:
        await svc.open_store()
        hook = await svc.create_webhook(WebhookCreate(url=receiver.url, kinds=["job.*"], secret=SECRET),
                                        "alpha", admin=False)
        only_cancels = await svc.create_webhook(WebhookCreate(url=receiver.url, kinds=["job.cancelled"],
                                                              secret=SECRET), "alpha", admin=False)
        receiver.down()
        mine = [(await svc.submit_job(parse_spec(spec(f"hook-{i}")), tenant="alpha"))[0].id for i in range(3)]
        await svc.submit_job(parse_spec(spec("hook-other")), tenant="beta")  # not alpha's: never delivered
        await svc.cancel(mine[0], "alpha")

        assert await svc.deliver_webhooks_now() == 5  # 4 for the first webhook, 1 for the second: all refused
        failing = await svc.webhook_deliveries("alpha", hook.id)
        assert len(failing) == 4 and {d.state for d in failing} == {DeliveryState.pending}
        assert all(d.attempts == 1 and d.last_error == "ConnectError" for d in failing), failing
        assert await svc.deliver_webhooks_now() == 0  # not due again yet (backoff)
        clock.at += timedelta(seconds=30)
        assert await svc.deliver_webhooks_now() == 5  # the second attempt: still down
        assert receiver.arrived == 0

        receiver.up()
        clock.at += timedelta(minutes=5)
        assert await svc.deliver_webhooks_now() == 5
    finally:
        await svc.aclose()

    assert receiver.bad == [] and len(receiver.got) == 5
    assert receiver.cursors() == _expected(db_url, mine)
    by_hook: dict[str, list[dict]] = {}
    for d in receiver.got:
        by_hook.setdefault(d["webhook_id"], []).append(d["event"])
    assert {e["kind"] for e in by_hook[only_cancels.id]} == {"job.cancelled"}
    assert len(by_hook[hook.id]) == 4 and {e["tenant"] for e in by_hook[hook.id]} == {"alpha"}
    with Store(db_url) as store:
        done = store.list_deliveries("alpha", hook.id)
    assert {d.state for d in done} == {DeliveryState.delivered} and {d.attempts for d in done} == {3}


@pytest.mark.timeout(240)
async def test_sigkill_mid_delivery_loses_none(tmp_path: Path, receiver: Receiver) -> None:
    db_url = f"sqlite:///{tmp_path / 'hooks-kill.db'}"
    with open_store(db_url) as store:
        _, alice = store.create_token("alpha", Role.user, "hooks")
    receiver.hang_first = True
    broker = Served(db_url, tmp_path / "serve.log", LOCKSTEP_EVENTS__POLL_INTERVAL_S="0.1",
                    LOCKSTEP_EVENTS__WEBHOOK_ALLOW_PRIVATE="true", LOCKSTEP_EVENTS__WEBHOOK_LEASE_S="2",
                    LOCKSTEP_EVENTS__WEBHOOK_BACKOFF_INITIAL_S="0.2", LOCKSTEP_EVENTS__WEBHOOK_BACKOFF_MAX_S="1")
    try:
        url = await asyncio.to_thread(broker.start)
        auth = {"Authorization": f"Bearer {alice}"}
        async with httpx.AsyncClient(base_url=url, headers=auth, timeout=60) as c:
            made = await c.post("/v1/webhooks", json={"url": receiver.url, "kinds": ["job.*"], "secret": SECRET})
            assert made.status_code == 201, made.text
            assert SECRET not in made.text
            jobs = [(await c.post("/v1/jobs", json=spec(f"kill-{i}"))).json()["id"] for i in range(3)]
        async with asyncio.timeout(60):
            while receiver.arrived == 0:  # noqa: ASYNC110 - the broker's first attempt, held by the receiver
                await asyncio.sleep(0.02)
        assert await asyncio.to_thread(broker.kill) == -9  # mid-delivery: the receiver has not answered
        receiver.release()
        url = await asyncio.to_thread(broker.start)
        async with httpx.AsyncClient(base_url=url, headers=auth, timeout=60) as c:
            assert (await c.delete(f"/v1/jobs/{jobs[1]}")).status_code == 200
        expected = _expected(db_url, jobs)
        assert len(expected) == 4
        async with asyncio.timeout(90):
            while not expected <= receiver.cursors():  # noqa: ASYNC110 - deliveries arrive from the broker
                await asyncio.sleep(0.05)
        async with httpx.AsyncClient(base_url=url, headers=auth, timeout=60) as c:
            [hook] = (await c.get("/v1/webhooks")).json()
            # The receiver counts a delivery when its request arrives; the broker records it delivered when the
            # answer comes back, a moment later: wait (bounded) until no delivery is still in flight.
            async with asyncio.timeout(30):
                while True:
                    deliveries = (await c.get(f"/v1/webhooks/{hook['id']}/deliveries")).json()
                    if len(deliveries) == 4 and all(d["state"] != "pending" for d in deliveries):
                        break
                    await asyncio.sleep(0.05)
    finally:
        broker.stop()
    assert receiver.bad == []
    assert receiver.cursors() == expected  # every event arrived (the interrupted one again, after its lease)
    assert len(deliveries) == 4 and {d["state"] for d in deliveries} == {"delivered"}, deliveries


def test_signatures_are_checked_and_refuse_a_changed_body_or_an_old_time() -> None:
    body = b'{"event": 1}'
    header = sign(SECRET, body, 1_700_000_000)
    assert verify_signature(SECRET, body, header, 1_700_000_100)
    assert not verify_signature(SECRET, body + b" ", header, 1_700_000_100)
    assert not verify_signature("another-secret-0123456789", body, header, 1_700_000_100)
    assert not verify_signature(SECRET, body, header, 1_700_000_000 + 3600)  # a replay, an hour later
    assert not verify_signature(SECRET, body, "t=x,v1=00", 1_700_000_000)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/x", "http://10.0.0.5/x", "http://169.254.169.254/latest",
                                 "http://[::1]/x", "http://192.168.1.1/", "ftp://example.com/x",
                                 "https://user:pw@93.184.215.14/x"])
def test_webhook_urls_that_reach_inside_are_refused(url: str) -> None:
    with pytest.raises(SpecError) as err:
        check_url(url, allow_private=False)
    assert err.value.field == "url"


def test_a_public_address_is_allowed_and_loopback_only_when_configured() -> None:
    check_url("https://93.184.215.14/hook", allow_private=False)  # an address: nothing is resolved
    check_url("http://127.0.0.1:9/hook", allow_private=True)


def test_webhook_routes(api: Api) -> None:
    with api.client(api.alice) as alice, api.client(api.bob) as bob, api.client(api.admin) as admin:
        made = alice.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/h", "kinds": ["job.*"],
                                                "secret": SECRET})
        assert made.status_code == 201 and made.json()["tenant"] == "alpha" and SECRET not in made.text
        hook_id = made.json()["id"]
        assert hook_id in {h["id"] for h in alice.get("/v1/webhooks").json()}
        assert hook_id not in {h["id"] for h in bob.get("/v1/webhooks").json()}
        assert hook_id in {h["id"] for h in admin.get("/v1/webhooks").json()}
        assert bob.get(f"/v1/webhooks/{hook_id}/deliveries").status_code == 404
        assert alice.get(f"/v1/webhooks/{hook_id}/deliveries").json() == []
        assert bob.delete(f"/v1/webhooks/{hook_id}").status_code == 404

        short = alice.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/h", "secret": "short"})
        assert short.status_code == 422 and short.json()["error"]["field"] == "secret"
        kinds = alice.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/h", "secret": SECRET, "kinds": ["JOB"]})
        assert kinds.status_code == 422 and kinds.json()["error"]["field"].startswith("kinds")
        other = alice.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/h", "secret": SECRET, "tenant": "beta"})
        assert other.status_code == 422 and other.json()["error"]["field"] == "tenant"

        assert alice.delete(f"/v1/webhooks/{hook_id}").status_code == 204
        assert alice.get("/v1/webhooks").json() == []
