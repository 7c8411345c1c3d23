"""GET /v1/events: every job state change a tenant may see, from the store, resumable from a cursor; a real
`lockstep serve` is SIGKILLed between state changes and a follower resumed from its cursor sees each exactly
once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from broker.models import JobState, Role
from broker.store import Store, open_store
from tests.api.conftest import Api, spec
from tests.api.served import Served


class Follower:
    """Follows /v1/events of one token; on any disconnect it comes back from its last cursor, to whichever
    URL the broker now serves on."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.url = ""
        self.events: list[dict] = []
        self.cursor: str | None = None
        self.connections = 0

    async def run(self) -> None:
        while True:
            if not self.url:
                await asyncio.sleep(0.05)
                continue
            params = {"follow": "true", **({"since": self.cursor} if self.cursor else {})}
            try:
                async with httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(30, read=None),
                                             headers={"Authorization": f"Bearer {self.token}"}) as c, \
                        c.stream("GET", "/v1/events", params=params) as r:
                    assert r.status_code == 200, await r.aread()
                    self.connections += 1
                    async for line in r.aiter_lines():
                        if line.strip():
                            e = json.loads(line)
                            self.events.append(e)
                            self.cursor = e["cursor"]
            except (httpx.HTTPError, OSError):
                await asyncio.sleep(0.05)  # the broker is down: try again (it comes back on a new port)

    async def until(self, n: int, limit_s: float = 90) -> None:
        async with asyncio.timeout(limit_s):
            while len(self.events) < n:  # noqa: ASYNC110 - lines arrive from another task's stream
                await asyncio.sleep(0.02)


def _post(url: str, token: str, name: str) -> str:
    r = httpx.post(f"{url}/v1/jobs", json=spec(name), headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def _cancel(url: str, token: str, job_id: str) -> None:
    r = httpx.delete(f"{url}/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"}, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.timeout(240)
async def test_a_follower_resumed_after_sigkill_sees_every_change_exactly_once(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'events.db'}"
    with open_store(db_url) as store:
        _, alice = store.create_token("alpha", Role.user, "events")
        _, bob = store.create_token("beta", Role.user, "events")
    broker = Served(db_url, tmp_path / "serve.log", LOCKSTEP_EVENTS__POLL_INTERVAL_S="0.05")
    follower = Follower(alice)
    task = asyncio.create_task(follower.run())
    try:
        follower.url = await asyncio.to_thread(broker.start)
        a1 = await asyncio.to_thread(_post, follower.url, alice, "ev-a1")
        await asyncio.to_thread(_post, follower.url, bob, "ev-b1")  # another tenant's: never seen
        await follower.until(1)

        # Killed between state changes; one change happens while no broker runs (another process's write).
        assert await asyncio.to_thread(broker.kill) == -9
        with Store(db_url) as store:
            store.transition(a1, JobState.cancelled, reason="cancelled while the broker was down")
        follower.url = await asyncio.to_thread(broker.start)
        await follower.until(2)

        a2 = await asyncio.to_thread(_post, follower.url, alice, "ev-a2")
        await asyncio.to_thread(_post, follower.url, bob, "ev-b2")
        assert await asyncio.to_thread(broker.kill) == -9  # right after a change: the follower may not have it yet
        follower.url = await asyncio.to_thread(broker.start)
        await asyncio.to_thread(_cancel, follower.url, alice, a2)
        await follower.until(4)
        await asyncio.sleep(0.3)  # time for a duplicate to show, if one were coming
    finally:
        task.cancel()
        broker.stop()

    assert follower.connections >= 3
    with Store(db_url) as store:
        expected = [(e.job_id, e.to_state.value) for j in (a1, a2) for e in store.events(j)]
    got = [(e["job_id"], e["to_state"]) for e in follower.events]
    assert sorted(got) == sorted(expected) and len(got) == 4, got  # every change, once, only alpha's
    assert got[1] == (a1, "cancelled") and follower.events[1]["reason"] == "cancelled while the broker was down"
    assert {e["tenant"] for e in follower.events} == {"alpha"}
    assert len({e["cursor"] for e in follower.events}) == 4


def test_a_page_of_events_its_cursor_and_bad_input(api: Api) -> None:
    with api.client(api.alice) as alice, api.client(api.bob) as bob, api.client(api.admin) as admin:
        start = alice.get("/v1/events", params={"since": "now"})
        assert start.status_code == 200 and start.text == ""
        cursor = start.headers["Lockstep-Cursor"]
        mine = alice.post("/v1/jobs", json=spec("page-a")).json()["id"]
        theirs = bob.post("/v1/jobs", json=spec("page-b")).json()["id"]
        alice.delete(f"/v1/jobs/{mine}")

        page = alice.get("/v1/events", params={"since": cursor})
        assert page.headers["Content-Type"].startswith("application/x-ndjson")
        lines = [json.loads(x) for x in page.text.splitlines()]
        assert [(e["job_id"], e["kind"]) for e in lines] == [(mine, "job.pending"), (mine, "job.cancelled")]
        assert lines[1]["from_state"] == "pending" and lines[1]["reason"]
        # Resuming from a line's cursor gives what came after it, nothing before.
        rest = alice.get("/v1/events", params={"since": lines[0]["cursor"]}).text.splitlines()
        assert [json.loads(x)["kind"] for x in rest] == ["job.cancelled"]
        # The page's end is past bob's event too: nothing more for alice there.
        assert alice.get("/v1/events", params={"since": page.headers["Lockstep-Cursor"]}).text == ""
        # An admin sees both tenants.
        everything = [json.loads(x) for x in admin.get("/v1/events", params={"since": cursor}).text.splitlines()]
        assert {e["job_id"] for e in everything} >= {mine, theirs}
        one = alice.get("/v1/events", params={"since": cursor, "limit": 1}).text.splitlines()
        assert len(one) == 1

        for bad in ("yesterday", "1-", "-1-0", "12"):
            r = alice.get("/v1/events", params={"since": bad})
            assert r.status_code == 400 and r.json()["error"]["field"] == "since", r.text
        assert alice.get("/v1/events", params={"limit": 0}).json()["error"]["field"] == "limit"
