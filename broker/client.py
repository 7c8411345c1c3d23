"""RemoteBackend: the CLI's Backend over a Lockstep server (``--server URL --token T``).

It returns the same models as the local backend, so every command prints the
same thing either way, and turns the server's JSON errors back into the
broker.errors class that carries the error's code (``invalid_spec`` → SpecError
with its field, ``not_found`` → NotFoundError, ``conflict`` → ConflictError,
``infeasible`` → NoFeasibleOption), so the CLI exits as it would locally; the
HTTP layer's own refusals are a :class:`RemoteError` (a malformed request: a
SpecError). The token is sent as a bearer header and never appears in an error
message or a repr.
"""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import SecretStr, TypeAdapter

from broker.errors import LockstepError, SpecError, error_from_api
from broker.models import (
    GpuSummary,
    Job,
    JobState,
    Offer,
    PriceFilter,
    PriceSeries,
    Quote,
    Tenant,
    TenantCreate,
    TenantPatch,
    TokenCreate,
    TokenInfo,
)
from policies.offers import OfferFilter

ALL_REJECTED = 1_000_000  # the API's cap on spelled-out rejections: "all of them"
_OFFERS = TypeAdapter(list[Offer])
_GPUS = TypeAdapter(list[GpuSummary])
_TOKENS = TypeAdapter(list[TokenInfo])
_TENANTS = TypeAdapter(list[Tenant])
_SERIES = TypeAdapter(list[PriceSeries])


class RemoteError(LockstepError):
    """The server refused or failed a request; ``status`` is the HTTP status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        super().__init__(message)


def _error(resp: httpx.Response) -> LockstepError:
    """The exception a non-2xx answer stands for; messages come from the body, never from headers."""
    try:
        err = resp.json().get("error") or {}
    except (ValueError, AttributeError):
        err = {}
    code = str(err.get("code") or "http_error")
    message = str(err.get("message") or resp.reason_phrase or "error")
    field = str(err["field"]) if err.get("field") else None
    status = resp.status_code
    known = error_from_api(code, message, field)
    if known is not None:
        return known
    if status in (400, 422):  # the request itself was bad (a parameter, a header, the JSON)
        return SpecError(field or "", message)
    if status == 401:
        return RemoteError(status, code, "the server refused the token (missing, invalid or revoked): "
                                         "set --token or LOCKSTEP_TOKEN")
    if status == 403:
        return RemoteError(status, code, f"not allowed: {message}")
    if status == 429:
        wait = resp.headers.get("Retry-After", "")
        return RemoteError(status, code, f"rate limited by the server{f'; retry in {wait}s' if wait else ''}")
    return RemoteError(status, code, f"server error {status}: {message}")


class RemoteBackend:
    def __init__(self, server: str, token: str | None, *, timeout_s: float = 60.0,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.server = server.rstrip("/")
        self._token = SecretStr(token) if token else None
        headers = {"Accept": "application/json", "User-Agent": "lockstep-cli"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token.get_secret_value()}"
        self._http = httpx.AsyncClient(base_url=self.server, headers=headers, timeout=timeout_s,
                                       transport=transport)

    def __repr__(self) -> str:
        return f"RemoteBackend({self.server!r}, token={'set' if self._token else 'none'})"

    async def _call(self, method: str, path: str, *, json: Any = None, params: Any = None,
                    headers: dict[str, str] | None = None) -> httpx.Response:
        try:
            resp = await self._http.request(method, path, json=json, params=params, headers=headers)
        except httpx.TimeoutException:
            raise LockstepError(f"{self.server}: the server did not answer in time") from None
        except httpx.TransportError as exc:
            raise LockstepError(f"{self.server}: cannot reach the server ({type(exc).__name__})") from None
        if resp.status_code >= 400:
            raise _error(resp)
        return resp

    # ------------------------------------------------------------------ the Backend protocol
    async def quote(self, spec_data: dict, *, top: int, max_rejected: int | None) -> Quote:
        params = {"top": top, "max_rejected": ALL_REJECTED if max_rejected is None else max_rejected}
        resp = await self._call("POST", "/v1/quotes", json=spec_data, params=params)
        return Quote.model_validate_json(resp.content)

    async def offers(self, f: OfferFilter, limit: int | None) -> list[Offer]:
        params: list[tuple[str, str]] = []
        for name, value in f.model_dump(mode="json", exclude_none=True).items():
            for v in value if isinstance(value, list) else [value]:
                params.append((name, str(v).lower() if isinstance(v, bool) else str(v)))
        if limit:
            params.append(("limit", str(limit)))
        resp = await self._call("GET", "/v1/offers", params=params)
        return _OFFERS.validate_json(resp.content)

    async def gpus(self) -> list[GpuSummary]:
        return _GPUS.validate_json((await self._call("GET", "/v1/gpus")).content)

    async def submit(self, spec_data: dict, idempotency_key: str | None) -> Job:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        resp = await self._call("POST", "/v1/jobs", json=spec_data, headers=headers)
        return Job.model_validate_json(resp.content)

    async def jobs(self, states: list[JobState] | None, limit: int) -> list[Job]:
        """Up to ``limit`` jobs, newest first, following the server's pages."""
        out: list[Job] = []
        cursor: str | None = None
        while len(out) < limit:
            params: list[tuple[str, str]] = [("limit", str(min(limit - len(out), 1000)))]
            params += [("state", JobState(s).value) for s in states or []]
            if cursor:
                params.append(("cursor", cursor))
            page = (await self._call("GET", "/v1/jobs", params=params)).json()
            out += [Job.model_validate(j) for j in page["jobs"]]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        return out

    async def status(self, job_id: str) -> Job:
        resp = await self._call("GET", f"/v1/jobs/{_segment(job_id)}")
        return Job.model_validate_json(resp.content)

    async def cancel(self, job_id: str) -> Job:
        resp = await self._call("DELETE", f"/v1/jobs/{_segment(job_id)}")
        return Job.model_validate_json(resp.content)

    # ------------------------------------------------------------------ tokens, tenants, prices (admin ones need
    # an admin token; the server answers 403 otherwise)
    async def create_token(self, body: TokenCreate) -> tuple[TokenInfo, str]:
        data = (await self._call("POST", "/v1/tokens", json=body.model_dump(mode="json"))).json()
        plaintext = str(data.pop("token"))
        return TokenInfo.model_validate(data), plaintext

    async def list_tokens(self, tenant: str | None) -> list[TokenInfo]:
        params = {"tenant": tenant} if tenant else None
        return _TOKENS.validate_json((await self._call("GET", "/v1/tokens", params=params)).content)

    async def revoke_token(self, token_id: str) -> None:
        await self._call("DELETE", f"/v1/tokens/{_segment(token_id)}")

    async def create_tenant(self, body: TenantCreate) -> Tenant:
        resp = await self._call("POST", "/v1/tenants", json=body.model_dump(mode="json", exclude_none=True))
        return Tenant.model_validate_json(resp.content)

    async def list_tenants(self) -> list[Tenant]:
        return _TENANTS.validate_json((await self._call("GET", "/v1/tenants")).content)

    async def update_tenant(self, name: str, patch: TenantPatch) -> Tenant:
        resp = await self._call("PATCH", f"/v1/tenants/{_segment(name)}",
                                json=patch.model_dump(mode="json", exclude_unset=True))
        return Tenant.model_validate_json(resp.content)

    async def price_series(self, f: PriceFilter) -> list[PriceSeries]:
        params = {k: str(v) for k, v in f.model_dump(mode="json", exclude_none=True).items()}
        return _SERIES.validate_json((await self._call("GET", "/v1/prices/series", params=params)).content)

    async def place(self, job_ids: list[str]) -> None:
        """Nothing to do: the server's loops place jobs as they arrive."""

    async def poll(self) -> None:
        """Nothing to do: the server's loops poll the providers."""

    async def aclose(self) -> None:
        await self._http.aclose()


def _segment(value: str) -> str:
    """A path segment, escaped, so an id cannot walk to another route."""
    from urllib.parse import quote

    return quote(value, safe="")
