"""pytest fixtures: moto's EC2 server on loopback, and a fault-injecting proxy in front of it.

- ``moto_server`` (session): moto's ThreadedMotoServer on 127.0.0.1 (free port), started once, with
  dummy credentials set in the environment for the test session only (restored afterwards).
- ``aws_moto`` (function): the server's URL, state reset (POST /moto-api/reset) before the test.
- ``aws_session`` (session): one botocore session for the providers on moto (parses the EC2 model once).
- ``aws_config`` (function): an AwsConfig pointing at moto (us-east-1 only, placement groups off:
  moto does not emulate them; see docs/aws.md).
- ``aws_faults`` (function): a :class:`FaultProxy` (aiohttp on 127.0.0.1, its own thread and loop)
  forwarding to moto, which knows AMI ids per region (``images``: EC2's ``InvalidAMIID.NotFound`` for another
  region's image, which moto itself would launch); ``fail(action, code, zone=None, times=None, region=None)``
  makes it answer that EC2 Action (optionally only for requests whose Placement.AvailabilityZone is ``zone``, or signed
  for ``region``; optionally only ``times`` times) with a real EC2 XML error; ``clear()`` drops the
  rules; ``calls`` lists (action, zone, region) of every request seen, ``actions(name)`` the zones.
- ``aws_proxy_config`` (function): an AwsConfig going through the proxy.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import parse_qs

import pytest
from aiobotocore.session import AioSession
from aiohttp import ClientSession, web

from providers.aws.config import AwsConfig
from tests.conftest import missing

_DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never ask a metadata service for a role
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}
# Long-term keys (no session token): presigned URLs then provably live their lifetime (providers/aws/uploads.py);
# tests of temporary credentials give a session its own.
_UNSET_ENV = ("AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
              "AWS_ENDPOINT_URL")

# EC2 answers these with a 5xx; the rest of its error codes come with a 400.
_SERVER_CODES = {
    "InsufficientInstanceCapacity": 500,
    "InsufficientHostCapacity": 500,
    "InsufficientReservedInstanceCapacity": 500,
    "InternalError": 500,
    "Unavailable": 503,
    "RequestLimitExceeded": 503,
}


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:  # pragma: no cover - moto[server] is a test dependency
        missing(f"moto[server] is not installed ({exc})")
    mp = pytest.MonkeyPatch()
    for key, value in _DUMMY_ENV.items():
        mp.setenv(key, value)
    for key in _UNSET_ENV:
        mp.delenv(key, raising=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        mp.undo()


def _reset(url: str) -> None:
    req = urllib.request.Request(f"{url}/moto-api/reset", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()


@pytest.fixture
def aws_moto(moto_server: str) -> str:
    """moto's URL, with an empty account (instances, tags) for this test."""
    _reset(moto_server)
    return moto_server


MOTO_AMI = "ami-12c6146b"  # an image moto's EC2 knows in every region; real AMI ids are regional


def moto_config(endpoint_url: str, **overrides: object) -> AwsConfig:
    """An AwsConfig on moto. Unless the test says otherwise, each listed region's image is moto's own AMI
    (`regions: all` resolves an SSM parameter the test puts)."""
    regions = overrides.get("regions", ["us-east-1"])
    data: dict[str, object] = {
        "enabled": True,
        "regions": ["us-east-1"],
        "image_id": MOTO_AMI if isinstance(regions, list) else "resolve:ssm:/lockstep/tests/ami",
        "images": {r: MOTO_AMI for r in regions} if isinstance(regions, list) else {},
        "endpoint_url": endpoint_url,
        "region_timeout_s": 60.0,  # the first EC2 call loads moto's data (~2.5 s); CI has 2 slow cores
        "max_attempts": 2,
        "placement_groups": False,  # moto answers CreatePlacementGroup with an HTML 500
        "capacity_reservations": False,  # likewise DescribeCapacityReservations
        "use_pricing_api": False,  # and the Price List API (tests/aws/test_pricing.py stubs it)
    }
    data.update(overrides)
    return AwsConfig.model_validate(data)


@pytest.fixture(scope="session")
def aws_session(moto_server: str) -> AioSession:
    """One botocore session for the moto tests: it parses the EC2 model once, not per provider.

    Credentials are the dummy ones moto_server put in the environment.
    """
    return AioSession()


@pytest.fixture
def aws_config(aws_moto: str) -> AwsConfig:
    return moto_config(aws_moto)


# --------------------------------------------------------------------------- fault proxy


@dataclass
class FaultRule:
    action: str
    code: str
    zone: str | None = None
    region: str | None = None
    times: int | None = None  # None: every time
    status: int = 400
    message: str = ""
    market: str | None = None  # "spot" or "on_demand" (RunInstances' InstanceMarketOptions); None: either

    def matches(self, action: str, zone: str | None, region: str | None, market: str | None = None) -> bool:
        return (
            self.action == action
            and (self.zone is None or self.zone == zone)
            and (self.region is None or self.region == region)
            and (self.market is None or self.market == market)
            and self.times != 0
        )


_SCOPE_RE = re.compile(r"Credential=[^/,]+/\d{8}/([a-z0-9-]+)/")


def signed_region(authorization: str) -> str | None:
    """The region of a SigV4 credential scope (the only part of the header this proxy reads)."""
    m = _SCOPE_RE.search(authorization)
    return m.group(1) if m else None


def ec2_error_xml(code: str, message: str) -> bytes:
    """EC2's error body, as the query protocol sends it."""
    request_id = str(uuid.uuid4())
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
        f"<RequestID>{request_id}</RequestID></Response>"
    ).encode()


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of moto that can fail chosen EC2 actions."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.url = ""
        self.calls: list[tuple[str, str | None, str | None]] = []  # (action, zone, region)
        # region → the AMI ids that exist there. AMI ids are regional on EC2 (moto launches any id anywhere):
        # with a region listed, RunInstances of another image there answers InvalidAMIID.NotFound, as EC2 does.
        self.images: dict[str, set[str]] = {}
        self._rules: list[FaultRule] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aws-fault-proxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None

    # -- control (any thread)

    def fail(
        self,
        action: str,
        code: str,
        zone: str | None = None,
        times: int | None = None,
        *,
        region: str | None = None,
        message: str = "",
        market: str | None = None,
    ) -> FaultRule:
        """Answer ``action`` (e.g. 'RunInstances') with EC2 error ``code``.

        Only for requests placed in ``zone`` (Placement.AvailabilityZone) or signed for ``region``
        when given; only the next ``times`` matching requests when given; only spot (``market="spot"``) or
        on-demand (``"on_demand"``) launches when given.
        """
        rule = FaultRule(
            action=action,
            code=code,
            zone=zone,
            region=region,
            times=times,
            status=_SERVER_CODES.get(code, 400),
            message=message or f"injected {code} by the test proxy",
            market=market,
        )
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
            self.calls.clear()
            self.images.clear()

    def actions(self, action: str) -> list[str | None]:
        """Zones of the ``action`` requests seen (None where the request named no zone)."""
        with self._lock:
            return [z for a, z, _r in self.calls if a == action]

    # -- server (its own thread and loop, independent of the tests' loop)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("fault proxy did not start")

    def stop(self) -> None:
        fut = asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop)
        fut.result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._startup())
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    async def _startup(self) -> None:
        self._session = ClientSession()
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        port = sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def _shutdown(self) -> None:
        if self._runner:
            await self._runner.cleanup()
        if self._session:
            await self._session.close()

    def _match(self, action: str, zone: str | None, region: str | None,
               market: str | None = None) -> FaultRule | None:
        with self._lock:
            self.calls.append((action, zone, region))
            for rule in self._rules:
                if rule.matches(action, zone, region, market):
                    if rule.times is not None:
                        rule.times -= 1
                    return rule
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        form = parse_qs(body.decode("utf-8", "replace")) if body else {}
        form.update({k: [v] for k, v in request.query.items()})
        action = (form.get("Action") or [""])[0]
        zone = (form.get("Placement.AvailabilityZone") or [None])[0]
        region = signed_region(request.headers.get("Authorization", ""))
        market = (form.get("InstanceMarketOptions.MarketType") or ["on_demand"])[0]
        rule = self._match(action, zone, region, market) if action else None
        image = (form.get("ImageId") or [""])[0]
        known = self.images.get(region or "")
        if rule is None and action == "RunInstances" and known is not None and image not in known:
            rule = FaultRule(action, "InvalidAMIID.NotFound", message=f"The image id '[{image}]' does not exist")
        if rule is not None:
            return web.Response(
                status=rule.status, body=ec2_error_xml(rule.code, rule.message), content_type="text/xml"
            )
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self._session.request(
            request.method, f"{self.upstream}{request.rel_url}", data=body, headers=headers
        ) as resp:
            payload = await resp.read()
            out_headers = {
                k: v
                for k, v in resp.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding")
            }
            return web.Response(status=resp.status, body=payload, headers=out_headers)


@pytest.fixture(scope="session")
def aws_fault_proxy(moto_server: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(moto_server)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def aws_faults(aws_fault_proxy: FaultProxy, aws_moto: str) -> Iterator[FaultProxy]:
    """The proxy, with no rules, in front of a freshly reset moto."""
    aws_fault_proxy.clear()
    yield aws_fault_proxy
    aws_fault_proxy.clear()


@pytest.fixture
def aws_proxy_config(aws_faults: FaultProxy) -> AwsConfig:
    return moto_config(aws_faults.url)
