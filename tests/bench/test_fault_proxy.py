"""standins/faults.py, the proxy bench/leaks.py --faults puts in front of a market's API: its schedule is the
seed's, and each fault does what it says (a 503 or 500 that never reaches the market, a connection dropped
before it, an answer lost after the market acted); spared requests pass. Over a real upstream on loopback."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator

import botocore.session
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from botocore.parsers import create_parser

from standins.faults import KINDS, FaultProxy, aws_error, ec2_client_token


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[str, list[str]]]:
    hits: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        hits.append(request.path_qs)
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/api/v0", hits
    finally:
        await runner.cleanup()


def test_the_schedule_is_the_seeds_and_has_every_kind() -> None:
    schedule = [FaultProxy("http://127.0.0.1:9", 0.5, 3).fault_of(n) for n in range(60)]
    assert schedule == [FaultProxy("http://127.0.0.1:9", 0.5, 3).fault_of(n) for n in range(60)]
    assert schedule != [FaultProxy("http://127.0.0.1:9", 0.5, 4).fault_of(n) for n in range(60)]
    assert set(schedule) == {None, *KINDS}
    assert {FaultProxy("http://127.0.0.1:9", 0.0, 3).fault_of(n) for n in range(60)} == {None}


async def test_each_fault_does_what_it_says(upstream: tuple[str, list[str]]) -> None:
    url, hits = upstream
    proxy = await FaultProxy(url, 0.5, 3).start()
    try:
        target = proxy.url_for(f"{url}/instances/?q=1")
        assert target.startswith(proxy.url) and target.endswith("/api/v0/instances/?q=1")
        async with httpx.AsyncClient(timeout=10) as client:
            for n in range(24):
                kind = proxy.fault_of(n)
                before = len(hits)
                if kind in ("drop", "lost"):
                    with pytest.raises(httpx.RemoteProtocolError):
                        await client.get(target)
                    assert len(hits) == before + (kind == "lost")  # lost: the market acted, its answer dropped
                    continue
                resp = await client.get(target)
                if kind is None:
                    assert resp.status_code == 200 and resp.json() == {"ok": True}
                    assert hits[-1] == "/api/v0/instances/?q=1"
                else:
                    assert resp.status_code == int(kind) and len(hits) == before  # never reached the market
        expected = Counter(k for k in (proxy.fault_of(n) for n in range(24)) if k is not None)
        assert proxy.faults == expected and proxy.total == sum(expected.values()) > 0 and proxy.seen == 24
    finally:
        await proxy.stop()


async def test_spared_requests_pass_and_the_rest_never_reach_the_market(upstream: tuple[str, list[str]]) -> None:
    url, hits = upstream
    proxy = await FaultProxy(url, 1.0, 3, spare=lambda request, body: "X-Amz-Signature" in request.query).start()
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            resp = await client.get(proxy.url_for(f"{url}/bucket/key?X-Amz-Signature=abc"))
            assert resp.status_code == 200 and hits == ["/api/v0/bucket/key?X-Amz-Signature=abc"]
            for _ in range(6):
                try:
                    assert (await client.get(proxy.url_for(f"{url}/bucket/key"))).status_code in (500, 503)
                except httpx.RemoteProtocolError:
                    pass
        assert len(hits) == 1 + proxy.faults["lost"] and proxy.spared == 1 and proxy.total == 6
    finally:
        await proxy.stop()


@pytest.mark.parametrize(("status", "code"), [(503, "Unavailable"), (500, "InternalError")])
def test_aws_errors_parse_as_ec2s_own(status: int, code: str) -> None:
    """botocore reads the injected EC2 answer as EC2's error (a retryable server error, by its code)."""
    ec2 = aws_error(make_mocked_request("POST", "/", headers={"Content-Type": "application/x-www-form-urlencoded"}),
                    status)
    session = botocore.session.get_session()
    shape = session.get_service_model("ec2").operation_model("DescribeInstances").output_shape
    assert shape is not None
    parsed = create_parser("ec2").parse({"status_code": status, "headers": {}, "body": ec2[0]}, shape)
    assert parsed["Error"]["Code"] == code
    s3 = aws_error(make_mocked_request("GET", "/bucket/key"), status)
    shape = session.get_service_model("s3").operation_model("GetObject").output_shape
    assert shape is not None
    parsed = create_parser("rest-xml").parse({"status_code": status, "headers": {}, "body": s3[0]}, shape)
    assert parsed["Error"]["Code"] == {"Unavailable": "ServiceUnavailable"}.get(code, code)


async def test_a_launch_repeated_with_its_client_token_is_answered_once_as_ec2_does(
        upstream: tuple[str, list[str]]) -> None:
    """moto ignores ClientToken; EC2 answers a repeat with the first reservation, and so does the proxy."""
    url, hits = upstream
    seed = next(s for s in range(100) if FaultProxy(url, 0.5, s).fault_of(0) == "lost"
                and FaultProxy(url, 0.5, s).fault_of(1) is None and FaultProxy(url, 0.5, s).fault_of(2) is None)
    proxy = await FaultProxy(url, 0.5, seed, error_body=aws_error, replay=ec2_client_token).start()
    launch = {"Action": "RunInstances", "ClientToken": "job-1-attempt-1", "MinCount": "1"}
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            with pytest.raises(httpx.RemoteProtocolError):  # the market acted; the answer was lost
                await client.post(proxy.url, data=launch)
            again = await client.post(proxy.url, data=launch)  # the caller's retry
            assert again.status_code == 200 and again.json() == {"ok": True}
            other = await client.post(proxy.url, data={**launch, "ClientToken": "job-2-attempt-1"})
            assert other.status_code == 200
        assert len(hits) == 2 and proxy.replayed == 1  # one launch per token reached the market
    finally:
        await proxy.stop()
