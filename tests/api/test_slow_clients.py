"""Slow and broken clients against a real server (aiohttp on loopback, raw sockets as the clients).

A body declared larger than ``api.max_body_bytes`` is refused from its Content-Length, before any of it is
read; a body that does not arrive within ``api.body_timeout_s`` gets a 408; a client that hangs up mid-body
is neither an unhandled error in the log nor a 500 in the metrics; unknown tokens are rate-limited per
client address. The sockets' own timeouts only bound a test that would otherwise hang on a server that
holds the request: nothing here asserts a duration.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.config import ApiConfig
from broker.models import Role
from broker.store import open_store
from tests.api.conftest import Api, _Collector, _serve, _settings, spec

GUARD_S = 20.0  # a socket read gives up after this: a server that holds the request fails the test


@pytest.fixture(scope="module")
def slow_api(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest,
             captured_logs: _Collector) -> Iterator[Api]:
    db_url = f"sqlite:///{tmp_path_factory.mktemp('api-slow') / 'lockstep.db'}"
    with open_store(db_url) as store:
        _, admin = store.create_token("ops", Role.admin)
        _, alice = store.create_token("alpha", Role.user)
    settings = _settings(db_url, ApiConfig(max_body_bytes=64 * 1024, body_timeout_s=0.5,
                                           bad_token_rate_per_s=0.001, bad_token_burst=5))
    server, svc = _serve(settings, request)
    yield Api(server.url, admin, alice, "", db_url, settings, svc)


def _address(api: Api) -> tuple[str, int]:
    host, port = api.url.removeprefix("http://").split(":")
    return host, int(port)


def _send(api: Api, head: str, body: bytes, *, hang_up: bool = False) -> tuple[int, dict] | None:
    """Send a request's head and (part of) its body on a raw socket; the status and JSON body answered, or
    None when ``hang_up`` (the socket is closed without reading)."""
    with socket.create_connection(_address(api), timeout=GUARD_S) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        if hang_up:
            sock.shutdown(socket.SHUT_RDWR)
            return None
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            chunk = sock.recv(65536)  # socket.timeout (a test failure) if the server holds the request
            if not chunk:
                break
            data += chunk
    head_part, _, payload = data.partition(b"\r\n\r\n")
    return int(head_part.split()[1]), json.loads(payload[:_length(data)] or b"{}")


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _post_jobs(api: Api, token: str, declared: int) -> str:
    return (f"POST /v1/jobs HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {declared}\r\n")


def _http_requests(api: Api) -> dict[tuple[str, str], float]:
    scrape = httpx.get(f"{api.url}/metrics", headers={"Authorization": f"Bearer {api.admin}"}, timeout=30).text
    return {(s.labels["route"], s.labels["status"]): s.value
            for fam in text_string_to_metric_families(scrape) for s in fam.samples
            if s.name == "lockstep_http_requests_total"}


def test_a_body_declared_too_large_is_refused_before_it_is_read(slow_api: Api) -> None:
    status, body = _send(slow_api, _post_jobs(slow_api, slow_api.alice, 1_000_000), b"{")
    assert status == 413
    assert body["error"]["code"] == "payload_too_large" and body["error"]["field"] == "body"
    assert "1000000 bytes declared" in body["error"]["message"]


def test_a_body_that_does_not_arrive_gets_a_408(slow_api: Api) -> None:
    status, body = _send(slow_api, _post_jobs(slow_api, slow_api.alice, 500), b'{"name": ')
    assert status == 408
    assert body["error"]["code"] == "request_timeout" and body["error"]["field"] == "body"
    # A whole body still works, and is read once (by the middleware) for the handler.
    r = httpx.post(f"{slow_api.url}/v1/jobs", json=spec("after-slow"),
                   headers={"Authorization": f"Bearer {slow_api.alice}"}, timeout=30)
    assert r.status_code == 201, r.text


async def test_a_client_that_hangs_up_mid_body_is_no_server_error(slow_api: Api, captured_logs: _Collector) -> None:
    before = _http_requests(slow_api)
    logged = len(captured_logs.lines)
    assert _send(slow_api, _post_jobs(slow_api, slow_api.alice, 2000), b'{"name": "x", ', hang_up=True) is None
    route = ("/v1/jobs", "499")
    for _ in range(100):  # the server sees the hang-up when its read fails: wait for it to be counted
        after = _http_requests(slow_api)
        if after.get(route, 0) > before.get(route, 0):
            break
        await asyncio.sleep(0.05)
    assert after.get(route, 0) == before.get(route, 0) + 1
    assert after.get(("/v1/jobs", "500"), 0) == before.get(("/v1/jobs", "500"), 0)
    lines = captured_logs.lines[logged:]
    assert not [x for x in lines if "Traceback" in x or "unhandled" in x.lower() or " ERROR " in x], lines
    assert any("closed the connection before sending its body" in x for x in lines), lines


def test_unknown_tokens_are_rate_limited_per_address(slow_api: Api) -> None:
    with httpx.Client(base_url=slow_api.url, timeout=30) as client:
        codes = [client.get("/v1/offers", headers={"Authorization": f"Bearer guess-{i}"}).status_code
                 for i in range(8)]
        assert codes[:5] == [401] * 5 and codes[5:] == [429] * 3, codes
        limited = client.get("/v1/offers", headers={"Authorization": "Bearer guess-9"})
        assert limited.headers["Retry-After"] and limited.json()["error"]["code"] == "rate_limited"
    # Another client address is not held back by this one's guesses.
    other = httpx.HTTPTransport(local_address="127.0.0.2")
    with httpx.Client(base_url=slow_api.url, timeout=30, transport=other) as client:
        assert client.get("/v1/offers", headers={"Authorization": "Bearer guess-10"}).status_code == 401
        ok = client.get("/v1/jobs", headers={"Authorization": f"Bearer {slow_api.alice}"})
        assert ok.status_code == 200, ok.text
