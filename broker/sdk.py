"""The Python SDK: :class:`Client` (blocking) and :class:`AsyncClient` (asyncio) for a Lockstep server.

    from broker.sdk import Client

    with Client("http://lockstep.internal:8080", token="lst_…") as ls:
        job = ls.submit({"name": "ft", "gpu": "A100", "gpus": 1, "command": "python train.py"})
        for line in ls.logs(job.id, follow=True):
            print(line.text)
        print(ls.job(job.id).state, ls.job(job.id).spent_usd)

Both speak the HTTP API (docs/api.md) with httpx and hand back the models the server itself uses
(``broker.models``: :class:`~broker.models.Quote`, :class:`~broker.models.Job`, …). Errors are the classes the
server maps (broker/errors.py), rebuilt from its answer: a 422 ``invalid_spec`` is a
:class:`~broker.errors.SpecError` naming the field, ``not_found`` a :class:`~broker.errors.NotFoundError`,
``conflict`` a :class:`~broker.errors.ConflictError`, ``infeasible`` a
:class:`~broker.errors.NoFeasibleOption`; what the HTTP layer refuses (a token, a rate, a server failure, an
unreachable server) is an :class:`ApiError` with its status.

Retries (tenacity) only where a repeat cannot do twice what was asked: a connection that was never made is
always retried; a timeout, a dropped connection, 429 or 502/503/504 only for reads, quotes, cancels and
submissions (which always carry an ``Idempotency-Key`` — one is generated when none is given — so a retried
submission returns the same job). The token travels as a bearer header and is never in a message or a repr.

The command line is a user of this module: ``lockstep --server URL`` and the local background broker
(``lockstep server``) are both reached through :class:`AsyncClient`.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import quote as _quote

import httpx

from broker.errors import ConflictError, LockstepError, NoFeasibleOption, NotFoundError, SpecError, error_from_api

if TYPE_CHECKING:
    from pydantic import TypeAdapter
    from tenacity import RetryCallState

    from broker.models import (
        GpuSummary,
        Job,
        JobDetail,
        JobSpec,
        JobState,
        LogLine,
        Offer,
        PriceFilter,
        PriceSeries,
        Quote,
        StreamEvent,
        Tenant,
        TenantCreate,
        TenantPatch,
        TokenCreate,
        TokenInfo,
    )

# The domain models (and pydantic) are imported when an answer is read, not with this module: `lockstep quote
# --json` through the background broker prints the server's JSON as it came and never needs them.
T = TypeVar("T")

ALL_REJECTED = 1_000_000  # the API's cap on spelled-out rejections: "all of them"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_RETRIES = 3
NDJSON = "application/x-ndjson"
_RETRY_STATUSES = frozenset({429, 502, 503, 504})
_RETRY_AFTER_MAX_S = 30.0



@functools.cache
def _adapter(name: str) -> TypeAdapter[Any]:
    """``list[<model name>]``'s adapter, built on first use."""
    from pydantic import TypeAdapter

    from broker import models

    model: Any = getattr(models, name)
    return TypeAdapter(list[model])


def _models() -> Any:
    from broker import models

    return models


class _Secret:
    """The token, kept out of reprs and messages."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "**********"

EVENTS_PAGE = 500  # events asked for in one page of GET /v1/events (the server's default)
CURSOR_HEADER = "Lockstep-Cursor"  # where a page of events ended, past other tenants' events too


# --------------------------------------------------------------------------- errors


class ApiError(LockstepError):
    """The server (or the way to it) refused or failed a request: ``status`` is the HTTP status (0: no answer),
    ``code`` the API's error code. ``retryable``: whether trying again may succeed."""

    def __init__(self, status: int, code: str, message: str, *, retryable: bool = False,
                 retry_after_s: float | None = None) -> None:
        self.status = status
        self.code = code
        self.retryable = retryable
        self.retry_after_s = retry_after_s
        super().__init__(message)


class Unreachable(ApiError):
    """No answer: the connection failed, timed out or broke off."""


RemoteError = ApiError  # the name the command line used before the SDK


def _retry_after(resp: httpx.Response) -> float | None:
    try:
        return min(float(resp.headers.get("Retry-After", "")), _RETRY_AFTER_MAX_S)
    except ValueError:
        return None


def error_from_response(resp: httpx.Response, *, safe_to_repeat: bool) -> LockstepError:
    """The exception a non-2xx answer stands for; messages come from the body, never from headers."""
    try:
        err = resp.json().get("error") or {}
    except (ValueError, AttributeError):
        err = {}
    code = str(err.get("code") or "http_error")
    message = str(err.get("message") or resp.reason_phrase or "error")
    field_ = str(err["field"]) if err.get("field") else None
    status = resp.status_code
    known = error_from_api(code, message, field_)
    if known is not None:
        return known
    if status in (400, 422):  # the request itself was bad (a parameter, a header, the JSON)
        return SpecError(field_ or "", message)
    retryable = safe_to_repeat and status in _RETRY_STATUSES
    if status == 401:
        return ApiError(status, code, "the server refused the token (missing, invalid or revoked): "
                                      "set --token or LOCKSTEP_TOKEN")
    if status == 403:
        return ApiError(status, code, f"not allowed: {message}")
    if status == 429:
        wait = _retry_after(resp)
        return ApiError(status, code, "rate limited by the server" + (f"; retry in {wait:g}s" if wait else ""),
                        retryable=retryable, retry_after_s=wait)
    return ApiError(status, code, f"server error {status}: {message}", retryable=retryable,
                    retry_after_s=_retry_after(resp))


# --------------------------------------------------------------------------- one request, described once


@dataclass
class _Call(Generic[T]):
    """A request and how to read its answer; both clients send it their own way."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Any = None
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    safe_to_repeat: bool = True  # a repeat after a lost answer does nothing twice


def _seg(value: str) -> str:
    """A path segment, escaped, so an id cannot walk to another route."""
    return _quote(value, safe="")


def _spec_body(spec: JobSpec | Mapping[str, Any]) -> Any:
    dump = getattr(spec, "model_dump", None)  # a JobSpec (pydantic), told without importing pydantic
    return dump(mode="json") if dump is not None else dict(spec)


def _quote_params(top: int, max_rejected: int | None) -> dict[str, int]:
    return {"top": top, "max_rejected": ALL_REJECTED if max_rejected is None else max_rejected}


def _quote_call(spec: JobSpec | Mapping[str, Any], top: int, max_rejected: int | None) -> _Call[Quote]:
    return _Call("POST", "/v1/quotes", lambda r: _models().Quote.model_validate_json(r.content),
                 params=_quote_params(top, max_rejected), json=_spec_body(spec))


def _quote_json_call(spec: JobSpec | Mapping[str, Any], top: int, max_rejected: int | None) -> _Call[bytes]:
    return _Call("POST", "/v1/quotes", lambda r: r.content, params=_quote_params(top, max_rejected),
                 json=_spec_body(spec))


def _offers_call(limit: int | None, filters: Mapping[str, Any]) -> _Call[list[Offer]]:
    params: list[tuple[str, str]] = []
    for name, value in filters.items():
        if value is None:
            continue
        for v in value if isinstance(value, list | tuple) else [value]:
            v = getattr(v, "value", v)  # an enum member
            params.append((name, str(v).lower() if isinstance(v, bool) else str(v)))
    if limit:
        params.append(("limit", str(limit)))
    return _Call("GET", "/v1/offers", lambda r: _adapter("Offer").validate_json(r.content), params=params)


def _submit_call(spec: JobSpec | Mapping[str, Any], idempotency_key: str | None) -> _Call[Job]:
    # Always a key: a submission whose answer was lost is retried safely and returns the same job.
    key = idempotency_key or f"sdk-{uuid.uuid4().hex}"
    return _Call("POST", "/v1/jobs", _job, json=_spec_body(spec),
                 headers={"Idempotency-Key": key})


def _jobs_page_call(states: Sequence[JobState | str] | None, limit: int, cursor: str | None,
                    tenant: str | None) -> _Call[tuple[list[Job], str | None]]:
    params: list[tuple[str, str]] = [("limit", str(min(limit, 1000)))]
    params += [("state", _models().JobState(s).value) for s in states or []]
    if cursor:
        params.append(("cursor", cursor))
    if tenant:
        params.append(("tenant", tenant))

    def parse(r: httpx.Response) -> tuple[list[Job], str | None]:
        page = r.json()
        return [_models().Job.model_validate(j) for j in page["jobs"]], page.get("next_cursor")

    return _Call("GET", "/v1/jobs", parse, params=params)


def _job(r: httpx.Response) -> Job:
    job: Job = _models().Job.model_validate_json(r.content)
    return job


def _job_detail(r: httpx.Response) -> JobDetail:
    job: JobDetail = _models().JobDetail.model_validate_json(r.content)
    return job


def _job_call(job_id: str) -> _Call[JobDetail]:
    return _Call("GET", f"/v1/jobs/{_seg(job_id)}", _job_detail)


def _cancel_call(job_id: str) -> _Call[Job]:
    return _Call("DELETE", f"/v1/jobs/{_seg(job_id)}", _job)


def _log_line(raw: str | bytes) -> LogLine:
    line: LogLine = _models().LogLine.model_validate_json(raw)
    return line


def _log_lines(r: httpx.Response) -> list[LogLine]:
    return [_log_line(raw) for raw in r.text.splitlines() if raw.strip()]


def _logs_call(job_id: str, tail: int | None) -> _Call[list[LogLine]]:
    params = {"tail": str(tail)} if tail is not None else None
    return _Call("GET", f"/v1/jobs/{_seg(job_id)}/logs", _log_lines, params=params, headers={"Accept": NDJSON})


def _token_created(r: httpx.Response) -> tuple[TokenInfo, str]:
    data = r.json()
    plaintext = str(data.pop("token"))
    return _models().TokenInfo.model_validate(data), plaintext


def _tenant(r: httpx.Response) -> Tenant:
    tenant: Tenant = _models().Tenant.model_validate_json(r.content)
    return tenant


def _nothing(_r: httpx.Response) -> None:
    return None


class _Calls:
    """The operations, each one request: both clients run these the same way."""

    @staticmethod
    def gpus() -> _Call[list[GpuSummary]]:
        return _Call("GET", "/v1/gpus", lambda r: _adapter("GpuSummary").validate_json(r.content))

    @staticmethod
    def tenants() -> _Call[list[Tenant]]:
        return _Call("GET", "/v1/tenants", lambda r: _adapter("Tenant").validate_json(r.content))

    @staticmethod
    def tenant(name: str) -> _Call[Tenant]:
        return _Call("GET", f"/v1/tenants/{_seg(name)}", _tenant)

    @staticmethod
    def create_tenant(body: TenantCreate) -> _Call[Tenant]:
        return _Call("POST", "/v1/tenants", _tenant, json=body.model_dump(mode="json", exclude_none=True),
                     safe_to_repeat=False)

    @staticmethod
    def update_tenant(name: str, patch: TenantPatch) -> _Call[Tenant]:
        return _Call("PATCH", f"/v1/tenants/{_seg(name)}", _tenant,
                     json=patch.model_dump(mode="json", exclude_unset=True))

    @staticmethod
    def create_token(body: TokenCreate) -> _Call[tuple[TokenInfo, str]]:
        return _Call("POST", "/v1/tokens", _token_created, json=body.model_dump(mode="json"), safe_to_repeat=False)

    @staticmethod
    def tokens(tenant: str | None) -> _Call[list[TokenInfo]]:
        return _Call("GET", "/v1/tokens", lambda r: _adapter("TokenInfo").validate_json(r.content),
                     params={"tenant": tenant} if tenant else None)

    @staticmethod
    def revoke_token(token_id: str) -> _Call[None]:
        return _Call("DELETE", f"/v1/tokens/{_seg(token_id)}", _nothing)

    @staticmethod
    def price_series(f: PriceFilter) -> _Call[list[PriceSeries]]:
        params = {k: str(v) for k, v in f.model_dump(mode="json", exclude_none=True).items()}
        return _Call("GET", "/v1/prices/series", lambda r: _adapter("PriceSeries").validate_json(r.content),
                     params=params)


def _stream_event(raw: str | bytes) -> StreamEvent:
    event: StreamEvent = _models().StreamEvent.model_validate_json(raw)
    return event


def _events_page_call(since: str | None) -> _Call[tuple[list[StreamEvent], str | None]]:
    """One page of events after ``since`` and the cursor it ended at (the header: it moves on past other
    tenants' events even when none of the caller's came)."""
    params = {"limit": str(EVENTS_PAGE), **({"since": since} if since else {})}

    def parse(r: httpx.Response) -> tuple[list[StreamEvent], str | None]:
        events = [_stream_event(raw) for raw in r.text.splitlines() if raw.strip()]
        return events, r.headers.get(CURSOR_HEADER) or (events[-1].cursor if events else since)

    return _Call("GET", "/v1/events", parse, params=params, headers={"Accept": NDJSON})


def _follow_params(cursor: str | None) -> dict[str, str]:
    return {"follow": "true", **({"since": cursor} if cursor else {})}


# --------------------------------------------------------------------------- retries


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, ApiError) and exc.retryable


def _wait(initial_s: float) -> Callable[[RetryCallState], float]:
    from tenacity import wait_random_exponential

    backoff = wait_random_exponential(multiplier=initial_s, max=10.0)  # full jitter

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, ApiError) and exc.retry_after_s:
            return exc.retry_after_s  # the server said when
        return backoff(state)

    return wait


def _transport_error(base: str, exc: httpx.TransportError, call: _Call[Any]) -> Unreachable:
    # A connection never made sent nothing: always safe to try again. Anything later only for safe calls.
    never_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout)
    what = "did not answer in time" if isinstance(exc, httpx.TimeoutException) else \
        f"cannot reach the server ({type(exc).__name__})"
    return Unreachable(0, "unreachable", f"{base}: {what}", retryable=never_sent or call.safe_to_repeat)


class _Base:
    def __init__(self, base_url: str, token: str | None, *, retries: int, backoff_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = _Secret(token) if token else None
        self.retries = max(0, retries)
        self.backoff_s = backoff_s

    @property
    def _tls(self) -> bool:
        """Whether TLS settings matter: a plain http:// server (the local broker on loopback) needs no
        certificate store, whose loading is most of a client's set-up time."""
        return not self.base_url.startswith("http://")

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "lockstep-sdk"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token.get_secret_value()}"
        return headers

    def _retry_args(self) -> dict[str, Any]:
        from tenacity import retry_if_exception, stop_after_attempt

        return {"retry": retry_if_exception(_retryable), "stop": stop_after_attempt(self.retries + 1),
                "wait": _wait(self.backoff_s), "reraise": True}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.base_url!r}, token={'set' if self._token else 'none'})"


def _check(resp: httpx.Response, call: _Call[Any]) -> httpx.Response:
    if resp.status_code >= 400:
        raise error_from_response(resp, safe_to_repeat=call.safe_to_repeat)
    return resp


# --------------------------------------------------------------------------- asyncio


class AsyncClient(_Base):
    """A Lockstep server from asyncio code. Close it (``async with``, or :meth:`aclose`).

    ``transport``: an httpx transport (a unix socket's, a test's); ``retries``: repeats of a safe request."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES, backoff_s: float = 0.2,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        super().__init__(base_url, token, retries=retries, backoff_s=backoff_s)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self._headers(), timeout=timeout_s,
                                       transport=transport, verify=self._tls)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _once(self, call: _Call[T]) -> T:
        try:
            resp = await self._http.request(call.method, call.path, params=call.params, json=call.json,
                                            headers=call.headers or None)
        except httpx.TransportError as exc:
            raise _transport_error(self.base_url, exc, call) from None
        return call.parse(_check(resp, call))

    async def _run(self, call: _Call[T]) -> T:
        from tenacity import AsyncRetrying

        async for attempt in AsyncRetrying(**self._retry_args()):
            with attempt:
                return await self._once(call)
        raise AssertionError("unreachable")  # pragma: no cover - reraise=True ends the loop with the error

    # -- quotes and offers
    async def quote(self, spec: JobSpec | Mapping[str, Any], *, top: int = 10,
                    max_rejected: int | None = None) -> Quote:
        """Rank every offer for ``spec``; ``max_rejected``: how many rejected offers to spell out (None: all)."""
        return await self._run(_quote_call(spec, top, max_rejected))

    async def quote_json(self, spec: JobSpec | Mapping[str, Any], *, top: int = 10,
                         max_rejected: int | None = None) -> bytes:
        """The quote as the server's JSON document, unparsed (to pass on, or print)."""
        return await self._run(_quote_json_call(spec, top, max_rejected))

    async def offers(self, *, limit: int | None = None, **filters: Any) -> list[Offer]:
        """The offer book, cheapest per GPU-hour first; filters: gpu, min_gpus, fabric, market, max_price,
        provider, region (lists where the API takes several)."""
        return await self._run(_offers_call(limit, filters))

    async def gpus(self) -> list[GpuSummary]:
        return await self._run(_Calls.gpus())

    # -- jobs
    async def submit(self, spec: JobSpec | Mapping[str, Any], *, idempotency_key: str | None = None) -> Job:
        """Submit a job; the same ``idempotency_key`` again returns the same job."""
        return await self._run(_submit_call(spec, idempotency_key))

    async def jobs(self, *, states: Sequence[JobState | str] | None = None, limit: int = 50,
                   tenant: str | None = None) -> list[Job]:
        """Up to ``limit`` jobs, newest first, following the server's pages."""
        out: list[Job] = []
        cursor: str | None = None
        while len(out) < limit:
            page, cursor = await self._run(_jobs_page_call(states, limit - len(out), cursor, tenant))
            out += page
            if not cursor:
                break
        return out

    async def job(self, job_id: str) -> JobDetail:
        """One job with its events and the allocations its markets handed out (``GET /v1/jobs/{id}``)."""
        return await self._run(_job_call(job_id))

    async def cancel(self, job_id: str) -> Job:
        return await self._run(_cancel_call(job_id))

    async def logs(self, job_id: str, *, tail: int | None = None, follow: bool = False) -> AsyncIterator[LogLine]:
        """The job's log lines; with ``follow``, each new line as it comes until the job has ended (or the
        server's ``api.log_follow_max_s``). An unknown job raises before the first line."""
        if not follow:
            for line in await self._run(_logs_call(job_id, tail)):
                yield line
            return
        params = {"follow": "true", **({"tail": str(tail)} if tail is not None else {})}
        async for raw in self._stream(f"/v1/jobs/{_seg(job_id)}/logs", params):
            yield _log_line(raw)

    async def events(self, *, since: str | None = None, follow: bool = False) -> AsyncIterator[StreamEvent]:
        """Events (``GET /v1/events``: job state changes with their reasons, budget alerts, price spikes) the
        token may see, oldest first, after ``since`` (an event's ``cursor``, ``"now"``, or None: the oldest
        kept). Without ``follow``, every page up to now; with it, then each new one as it happens, for as long
        as the caller iterates: a stream the server ends or that breaks off (a restart) is reopened from the
        last cursor, so nothing is missed or repeated. Pass the last event's ``cursor`` as ``since`` to resume
        in another process."""
        cursor = since
        while True:
            try:
                # Catch up page by page first: each page ends at a concrete cursor, so a reopened stream
                # never starts again from "the oldest" or from a later "now".
                while True:
                    page, cursor = await self._run(_events_page_call(cursor))
                    for event in page:
                        yield event
                    if len(page) < EVENTS_PAGE:
                        break
                if not follow:
                    return
                async for raw in self._stream("/v1/events", _follow_params(cursor)):
                    event = _stream_event(raw)
                    cursor = event.cursor
                    yield event
                # the server ends a followed stream after api.log_follow_max_s: go on from the last cursor
            except Unreachable:
                if not follow:
                    raise

    async def _stream(self, path: str, params: Mapping[str, str]) -> AsyncIterator[str]:
        """The NDJSON lines of a streamed answer, with no read timeout (a quiet stream sends nothing a while)."""
        call: _Call[None] = _Call("GET", path, _nothing, params=params)
        req = self._http.build_request("GET", path, params=params, headers={"Accept": NDJSON},
                                       timeout=httpx.Timeout(self._http.timeout.connect, read=None))
        from tenacity import AsyncRetrying

        async for attempt in AsyncRetrying(**self._retry_args()):
            with attempt:
                try:
                    resp = await self._http.send(req, stream=True)
                except httpx.TransportError as exc:
                    raise _transport_error(self.base_url, exc, call) from None
                if resp.status_code >= 400:
                    await resp.aread()
                    await resp.aclose()
                    _check(resp, call)
        try:
            async for raw in resp.aiter_lines():
                if raw.strip():
                    yield raw
        except httpx.TransportError as exc:
            raise Unreachable(0, "unreachable", f"{self.base_url}: the stream broke off ({type(exc).__name__})",
                              retryable=True) from None
        finally:
            await resp.aclose()

    # -- tenants, tokens, prices (admin ones need an admin token; the server answers 403 otherwise)
    async def tenants(self) -> list[Tenant]:
        return await self._run(_Calls.tenants())

    async def tenant(self, name: str) -> Tenant:
        return await self._run(_Calls.tenant(name))

    async def create_tenant(self, body: TenantCreate) -> Tenant:
        return await self._run(_Calls.create_tenant(body))

    async def update_tenant(self, name: str, patch: TenantPatch) -> Tenant:
        return await self._run(_Calls.update_tenant(name, patch))

    async def create_token(self, body: TokenCreate) -> tuple[TokenInfo, str]:
        """A new token's record and its plaintext (shown once)."""
        return await self._run(_Calls.create_token(body))

    async def tokens(self, tenant: str | None = None) -> list[TokenInfo]:
        return await self._run(_Calls.tokens(tenant))

    async def revoke_token(self, token_id: str) -> None:
        await self._run(_Calls.revoke_token(token_id))

    async def price_series(self, f: PriceFilter) -> list[PriceSeries]:
        return await self._run(_Calls.price_series(f))


# --------------------------------------------------------------------------- blocking


class Client(_Base):
    """A Lockstep server from ordinary (blocking) code; the same operations as :class:`AsyncClient`."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES, backoff_s: float = 0.2,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(base_url, token, retries=retries, backoff_s=backoff_s)
        self._http = httpx.Client(base_url=self.base_url, headers=self._headers(), timeout=timeout_s,
                                  transport=transport, verify=self._tls)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _once(self, call: _Call[T]) -> T:
        try:
            resp = self._http.request(call.method, call.path, params=call.params, json=call.json,
                                      headers=call.headers or None)
        except httpx.TransportError as exc:
            raise _transport_error(self.base_url, exc, call) from None
        return call.parse(_check(resp, call))

    def _run(self, call: _Call[T]) -> T:
        from tenacity import Retrying

        for attempt in Retrying(**self._retry_args()):
            with attempt:
                return self._once(call)
        raise AssertionError("unreachable")  # pragma: no cover

    def quote(self, spec: JobSpec | Mapping[str, Any], *, top: int = 10, max_rejected: int | None = None) -> Quote:
        return self._run(_quote_call(spec, top, max_rejected))

    def quote_json(self, spec: JobSpec | Mapping[str, Any], *, top: int = 10, max_rejected: int | None = None) -> bytes:
        return self._run(_quote_json_call(spec, top, max_rejected))

    def offers(self, *, limit: int | None = None, **filters: Any) -> list[Offer]:
        return self._run(_offers_call(limit, filters))

    def gpus(self) -> list[GpuSummary]:
        return self._run(_Calls.gpus())

    def submit(self, spec: JobSpec | Mapping[str, Any], *, idempotency_key: str | None = None) -> Job:
        return self._run(_submit_call(spec, idempotency_key))

    def jobs(self, *, states: Sequence[JobState | str] | None = None, limit: int = 50,
             tenant: str | None = None) -> list[Job]:
        out: list[Job] = []
        cursor: str | None = None
        while len(out) < limit:
            page, cursor = self._run(_jobs_page_call(states, limit - len(out), cursor, tenant))
            out += page
            if not cursor:
                break
        return out

    def job(self, job_id: str) -> JobDetail:
        return self._run(_job_call(job_id))

    def cancel(self, job_id: str) -> Job:
        return self._run(_cancel_call(job_id))

    def logs(self, job_id: str, *, tail: int | None = None, follow: bool = False) -> Iterator[LogLine]:
        if not follow:
            yield from self._run(_logs_call(job_id, tail))
            return
        params = {"follow": "true", **({"tail": str(tail)} if tail is not None else {})}
        for raw in self._stream(f"/v1/jobs/{_seg(job_id)}/logs", params):
            yield _log_line(raw)

    def events(self, *, since: str | None = None, follow: bool = False) -> Iterator[StreamEvent]:
        """As :meth:`AsyncClient.events`."""
        cursor = since
        while True:
            try:
                while True:
                    page, cursor = self._run(_events_page_call(cursor))
                    yield from page
                    if len(page) < EVENTS_PAGE:
                        break
                if not follow:
                    return
                for raw in self._stream("/v1/events", _follow_params(cursor)):
                    event = _stream_event(raw)
                    cursor = event.cursor
                    yield event
            except Unreachable:
                if not follow:
                    raise

    def _stream(self, path: str, params: Mapping[str, str]) -> Iterator[str]:
        call: _Call[None] = _Call("GET", path, _nothing, params=params)
        req = self._http.build_request("GET", path, params=params, headers={"Accept": NDJSON},
                                       timeout=httpx.Timeout(self._http.timeout.connect, read=None))
        from tenacity import Retrying

        for attempt in Retrying(**self._retry_args()):
            with attempt:
                try:
                    resp = self._http.send(req, stream=True)
                except httpx.TransportError as exc:
                    raise _transport_error(self.base_url, exc, call) from None
                if resp.status_code >= 400:
                    resp.read()
                    resp.close()
                    _check(resp, call)
        try:
            for raw in resp.iter_lines():
                if raw.strip():
                    yield raw
        except httpx.TransportError as exc:
            raise Unreachable(0, "unreachable", f"{self.base_url}: the stream broke off ({type(exc).__name__})",
                              retryable=True) from None
        finally:
            resp.close()

    def tenants(self) -> list[Tenant]:
        return self._run(_Calls.tenants())

    def tenant(self, name: str) -> Tenant:
        return self._run(_Calls.tenant(name))

    def create_tenant(self, body: TenantCreate) -> Tenant:
        return self._run(_Calls.create_tenant(body))

    def update_tenant(self, name: str, patch: TenantPatch) -> Tenant:
        return self._run(_Calls.update_tenant(name, patch))

    def create_token(self, body: TokenCreate) -> tuple[TokenInfo, str]:
        return self._run(_Calls.create_token(body))

    def tokens(self, tenant: str | None = None) -> list[TokenInfo]:
        return self._run(_Calls.tokens(tenant))

    def revoke_token(self, token_id: str) -> None:
        self._run(_Calls.revoke_token(token_id))

    def price_series(self, f: PriceFilter) -> list[PriceSeries]:
        return self._run(_Calls.price_series(f))


__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "ConflictError",
    "LockstepError",
    "NoFeasibleOption",
    "NotFoundError",
    "SpecError",
    "Unreachable",
    "error_from_response",
]
