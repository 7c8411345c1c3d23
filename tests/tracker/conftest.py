"""Fixtures for the tracker tests: a webhook receiver on loopback and a controllable clock."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from broker.store import Store


@dataclass
class WebhookReceiver:
    """An aiohttp server on 127.0.0.1: POST /hook records the JSON body; POST /broken answers 500."""

    url: str = ""
    received: list[dict[str, Any]] = field(default_factory=list)
    broken_calls: int = 0
    _runner: web.AppRunner | None = None

    async def _hook(self, request: web.Request) -> web.Response:
        self.received.append(await request.json())
        return web.json_response({"ok": True})

    async def _broken(self, request: web.Request) -> web.Response:
        self.broken_calls += 1
        return web.Response(status=500, text="receiver down")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        app.router.add_post("/broken", self._broken)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture(scope="session")
async def _webhook_server() -> AsyncIterator[WebhookReceiver]:
    server = WebhookReceiver()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def webhook(_webhook_server: WebhookReceiver) -> WebhookReceiver:
    _webhook_server.received.clear()
    _webhook_server.broken_calls = 0
    return _webhook_server


class Clock:
    """The tracker's clock, moved by the test (points of one run share its time)."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kw: float) -> datetime:
        self.now += timedelta(**kw)
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime.now(UTC).replace(microsecond=0))


@pytest.fixture
def lite_store(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Store]:
    """A migrated SQLite store (a copy of the session template), where the backend does not matter."""
    template = request.getfixturevalue("_sqlite_template")
    path = tmp_path / "lockstep.db"
    shutil.copyfile(template, path)
    s = Store(f"sqlite:///{path}")
    yield s
    s.close()
