"""A real Lockstep API server on 127.0.0.1, started once per test session.

The server runs in its own thread with its own event loop (aiohttp AppRunner +
TCPSite on port 0), over a SQLite store in a tmp dir and the bundled catalog
provider only. A thread, not the test loop, so that sync tests, subprocesses
(the CLI, schemathesis) and async tests can all talk to it. Broker loops are
not started: job states change only through the API, so tests are
deterministic. A second, "tight" server has a tiny rate limit for 429 tests.

Tokens are made on the store before the server starts (as `lockstep tokens
create` would). Every log record of the session is kept in ``captured_logs``
so tests can prove no secret reached a log.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from pydantic import SecretStr

from broker.api import create_app, start_server
from broker.config import ApiConfig, EventsConfig, Settings
from broker.models import Role
from broker.service import Lockstep
from broker.store import open_store
from providers.vast.config import VastConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
FAKE_VAST_KEY = "vastkey-" + "9f3c2b7e1d" * 4  # a provider secret that must never come back


class ServerThread:
    """An aiohttp app served from a background thread until stop()."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="lockstep-api-test", daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self._runner, self.url = self.loop.run_until_complete(start_server(self.app, "127.0.0.1", 0))
        except BaseException as exc:  # report start failures to the test, not to a dead thread
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self._runner.cleanup())
        self.loop.close()

    def start(self) -> str:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("API server did not start within 60 s")
        if self._error is not None:
            raise RuntimeError(f"API server failed to start: {self._error!r}")
        return self.url

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)


@dataclass
class Api:
    url: str
    admin: str  # plaintext tokens
    alice: str  # tenant "alpha"
    bob: str  # tenant "beta"
    db_url: str
    settings: Settings
    svc: Lockstep
    secrets: list[str] = field(default_factory=list)
    app: web.Application | None = None

    def client(self, token: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


class _Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        self.lines.append(f"{record.name} {record.levelname} {text}")


@pytest.fixture(scope="session")
def captured_logs() -> Iterator[_Collector]:
    """Every record from the broker and aiohttp (access log included) for the whole session."""
    handler = _Collector()
    root = logging.getLogger()
    watched = [logging.getLogger(n) for n in ("broker", "lockstep", "aiohttp", "providers")]
    old = [lg.level for lg in watched]
    root.addHandler(handler)
    for lg in watched:
        lg.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    for lg, level in zip(watched, old, strict=True):
        lg.setLevel(level)


def _settings(db_url: str, api: ApiConfig) -> Settings:
    # Webhook URLs on loopback are allowed here (receivers in tests); no name is ever resolved then.
    return Settings(db_url=db_url, api=api, vast=VastConfig(enabled=False, api_key=SecretStr(FAKE_VAST_KEY)),
                    events=EventsConfig(webhook_allow_private=True))


def _serve(settings: Settings, request: pytest.FixtureRequest) -> tuple[ServerThread, Lockstep]:
    svc = Lockstep(settings, only_providers=["catalog"])
    server = ServerThread(create_app(svc, start_loops=False))
    server.start()
    request.addfinalizer(server.stop)
    return server, svc


@pytest.fixture(scope="session")
def api(tmp_path_factory: pytest.TempPathFactory, captured_logs: _Collector,
        request: pytest.FixtureRequest) -> Api:
    db_url = f"sqlite:///{tmp_path_factory.mktemp('api') / 'lockstep.db'}"
    with open_store(db_url) as store:
        _, admin = store.create_token("ops", Role.admin, "tests: admin")
        _, alice = store.create_token("alpha", Role.user, "tests: alice")
        _, bob = store.create_token("beta", Role.user, "tests: bob")
    # A generous rate (unknown tokens too) so schemathesis and the other tests never meet the limit here.
    settings = _settings(db_url, ApiConfig(rate_per_s=100_000, burst=100_000, max_body_bytes=64 * 1024,
                                           bad_token_rate_per_s=100_000, bad_token_burst=100_000))
    server, svc = _serve(settings, request)
    return Api(server.url, admin, alice, bob, db_url, settings, svc,
               secrets=[admin, alice, bob, FAKE_VAST_KEY])


@pytest.fixture(scope="session")
def tight_api(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Api:
    """A server whose tenants get 3 requests, then 1 every ~17 minutes: the 4th request is a 429."""
    db_url = f"sqlite:///{tmp_path_factory.mktemp('api-tight') / 'lockstep.db'}"
    with open_store(db_url) as store:
        _, admin = store.create_token("ops", Role.admin)
        _, alice = store.create_token("alpha", Role.user)
        _, bob = store.create_token("beta", Role.user)
    settings = _settings(db_url, ApiConfig(rate_per_s=0.001, burst=3))
    server, svc = _serve(settings, request)
    return Api(server.url, admin, alice, bob, db_url, settings, svc)


@pytest.fixture(scope="session")
def fuzz_api(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Api:
    """A server of its own for schemathesis: the fuzzer creates, patches and revokes at random."""
    db_url = f"sqlite:///{tmp_path_factory.mktemp('api-fuzz') / 'lockstep.db'}"
    with open_store(db_url) as store:
        _, admin = store.create_token("ops", Role.admin, "schemathesis")
        _, alice = store.create_token("alpha", Role.user)
    # No broker loops here: a job stays pending, so a followed log (?follow=true) would never end by itself; the
    # server ends it after log_follow_max_s, as it does any follow that outlives that.
    settings = _settings(db_url, ApiConfig(rate_per_s=100_000, burst=100_000, max_body_bytes=256 * 1024,
                                           bad_token_rate_per_s=100_000, bad_token_burst=100_000,
                                           log_follow_max_s=1.0))
    server, svc = _serve(settings, request)
    return Api(server.url, admin, alice, "", db_url, settings, svc, app=server.app)


def spec(name: str = "api-test", **over: object) -> dict:
    """A small valid job spec as JSON data."""
    data: dict = {"name": name, "gpu": ["H100"], "gpus": 8, "workload": {"hours": 2}}
    data.update(over)
    return data
