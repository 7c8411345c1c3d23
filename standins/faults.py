"""A market's API that fails now and then: an HTTP proxy on 127.0.0.1 (aiohttp, in the caller's event loop) in
front of a stand-in's API, answering a seeded fraction of the requests with a fault instead of the market's
answer (bench/leaks.py ``--faults RATE``):

- ``503``: a 503 before the request reaches the market (its error body in the market's own shape);
- ``500``: likewise a 500;
- ``drop``: the connection closed with no answer, before the request reaches the market;
- ``lost``: the request reaches the market, which acts on it, and the connection is closed before its answer
  comes back (the worst case for a call that is not idempotent: a launch the caller never hears of).

Whether the n-th request (in the order the proxy receives them) is faulted, and how, depends on the seed and n
alone (``random.Random(f"{seed}:{n}")``), so a schedule is reproducible; which call is the n-th depends on how
the broker's calls interleave. ``spare`` names requests never faulted (counted in ``spared``), from the request
and its body: bench/leaks.py spares the instances' own presigned S3 transfers, so the faults stay on the broker's
calls to the market. ``kinds`` narrows the faults drawn (a test of one kind on one call: every RunInstances lost).

``replay`` gives a request an idempotency key: a request whose key has been answered with a success before is
answered with that answer again, never forwarded (``replayed`` counts them). :func:`ec2_client_token` is EC2's
own (RunInstances with the same ClientToken returns the first call's reservation), which moto lacks: without it a
transport retry after a ``lost`` answer would buy a second instance at moto that EC2 would not.

For tests/ and bench/, never the product (standins/__init__.py).
"""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit, urlunsplit

from aiohttp import ClientSession, ClientTimeout, web

KINDS = ("503", "500", "drop", "lost")
_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}

ErrorBody = Callable[[web.Request, int], tuple[bytes, str]]
ReplayKey = Callable[[web.Request, bytes], str | None]


def ec2_client_token(request: web.Request, body: bytes) -> str | None:
    """RunInstances' ClientToken: EC2 answers a repeat with the first call's reservation (idempotent launches)."""
    if request.method != "POST" or b"Action=RunInstances" not in body:
        return None
    form = parse_qs(body.decode("utf-8", "replace"))
    if form.get("Action") != ["RunInstances"] or not form.get("ClientToken"):
        return None
    return "RunInstances:" + form["ClientToken"][0]


def plain_error(request: web.Request, status: int) -> tuple[bytes, str]:
    """What a struggling server, or a proxy before it, answers: the status and a line of text (no error of the
    market's own: slurmrestd's ``errors`` list would say Slurm refused the request itself)."""
    return f"{status} {HTTPStatus(status).phrase}: injected by the fault proxy\n".encode(), "text/plain"


def vast_error(request: web.Request, status: int) -> tuple[bytes, str]:
    """The Vast API's JSON error (``success``/``error``/``msg``)."""
    text = f"injected {status} by the fault proxy"
    return json.dumps({"success": False, "error": "server_error", "msg": text}).encode(), "application/json"


def aws_error(request: web.Request, status: int) -> tuple[bytes, str]:
    """EC2's query-protocol error for an EC2 call (``Action=``), S3's REST error for the rest."""
    code = {503: ("Unavailable", "ServiceUnavailable"), 500: ("InternalError", "InternalError")}[status]
    message = f"injected {status} by the fault proxy"
    request_id = str(uuid.uuid4())
    if request.method == "HEAD":
        return b"", "application/xml"
    if request.content_type == "application/x-www-form-urlencoded" or "Action" in request.query:
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code[0]}</Code>'
                f"<Message>{message}</Message></Error></Errors><RequestID>{request_id}</RequestID></Response>")
    else:
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code[1]}</Code><Message>{message}'
                f"</Message><RequestId>{request_id}</RequestId></Error>")
    return body.encode(), "application/xml"


class FaultProxy:
    """``await FaultProxy(upstream, rate, seed).start()``; ``url_for(url)`` is ``url`` through the proxy."""

    def __init__(self, upstream: str, rate: float, seed: int, *, error_body: ErrorBody = plain_error,
                 spare: Callable[[web.Request, bytes], bool] | None = None, replay: ReplayKey | None = None,
                 kinds: tuple[str, ...] = KINDS) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"a fault rate is a fraction (0 to 1), not {rate}")
        if not kinds or set(kinds) - set(KINDS):
            raise ValueError(f"fault kinds are some of {', '.join(KINDS)}, not {kinds}")
        self.kinds = kinds
        parts = urlsplit(upstream)
        self.upstream = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        self.rate = rate
        self.seed = seed
        self.error_body = error_body
        self.spare = spare
        self.replay = replay
        self.seen = 0  # requests received, spared ones included
        self.spared = 0
        self.replayed = 0
        self._answers: dict[str, tuple[int, bytes, dict[str, str]]] = {}  # replay key → the first success
        self.faults: Counter[str] = Counter()  # kind → how many
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None

    def url_for(self, url: str) -> str:
        """``url`` with the proxy's scheme, host and port (same path)."""
        proxy, parts = urlsplit(self.url), urlsplit(url)
        return urlunsplit((proxy.scheme, proxy.netloc, parts.path, parts.query, parts.fragment))

    def fault_of(self, n: int) -> str | None:
        """The fault of the n-th request (from 0), or None: a function of the seed and n alone."""
        rng = random.Random(f"{self.seed}:{n}")
        return rng.choice(self.kinds) if rng.random() < self.rate else None

    @property
    def total(self) -> int:
        return sum(self.faults.values())

    async def start(self) -> FaultProxy:
        self._session = ClientSession(timeout=ClientTimeout(total=120), auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        n = self.seen
        self.seen += 1
        if self.spare is not None and self.spare(request, body):
            self.spared += 1
            kind = None
        else:
            kind = self.fault_of(n)
        if kind is not None:
            self.faults[kind] += 1
        if kind in ("503", "500"):
            status = int(kind)
            payload, content_type = self.error_body(request, status)
            return web.Response(status=status, body=payload, headers={"Content-Type": content_type})
        if kind == "drop":
            return self._drop(request)
        key = self.replay(request, body) if self.replay is not None else None
        if key is not None and key in self._answers:
            self.replayed += 1
            status, payload, out = self._answers[key]
        else:
            status, payload, out = await self._forward(request, body)
            if key is not None and status < 300:
                self._answers[key] = (status, payload, out)
        if kind == "lost":  # the market acted; its answer never arrives
            return self._drop(request)
        return web.Response(status=status, body=payload, headers=out)

    async def _forward(self, request: web.Request, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(request.method, f"{self.upstream}{request.rel_url}", data=body,
                                         headers=headers, allow_redirects=False) as resp:
            payload = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP - {"content-encoding"}}
            return resp.status, payload, out

    @staticmethod
    def _drop(request: web.Request) -> web.StreamResponse:
        """Close the connection without a byte of answer (the client sees it dropped)."""
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=599)  # never sent: the transport is gone
