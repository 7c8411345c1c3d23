"""The Vast.ai REST API over httpx, as the official CLI calls it (shared/vast-api-notes.md).

Every call is retried on TransientError under the shared policy (:mod:`providers.retry`),
bounded by ``vast.max_attempts`` and by ``vast.retry_budget_s`` (no attempt starts after it: a search runs
inside the broker's ``provider_timeout_s``, and retries past that are wasted calls against Vast's rate
limit), with Vast's Retry-After honoured up to ``vast.retry_after_max_s``; Vast's rate-limit 429s carry
none, so they back off with jitter.

Timeouts follow Vast's CLI: a create (and a log upload request) may take long on a busy host, so it gets
``vast.create_timeout_s`` (120 s, the CLI's); other calls ``vast.timeout_s``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx
from tenacity import AsyncRetrying, stop_after_attempt, stop_before_delay

from broker.errors import TransientError
from providers.retry import retrying, with_retries
from providers.vast.config import VastConfig
from providers.vast.errors import PROVIDER, raise_for, transport_error

log = logging.getLogger(__name__)

LIST_PAGE = 25  # Vast's CLI and SDK ask for 25 and clamp to 1..25: a larger page may be refused
MAX_PAGES = 1000


class VastClient:
    def __init__(self, config: VastConfig) -> None:
        self.config = config
        headers = {"Accept": "application/json"}
        if config.api_key is not None:
            headers["Authorization"] = f"Bearer {config.api_key.get_secret_value()}"
        self._http = httpx.AsyncClient(base_url=config.url.rstrip("/"), headers=headers, timeout=config.timeout_s)
        # The logs API's result URLs are object-storage URLs: fetched with no header, so the key never goes there.
        self._plain = httpx.AsyncClient(timeout=config.timeout_s)

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._plain.aclose()

    def retrying(self) -> AsyncRetrying:
        """The shared retry policy, paced by ``vast.max_attempts``, ``backoff_*`` and ``retry_after_max_s``."""
        cfg = self.config
        policy = retrying(cfg.max_attempts, initial=cfg.backoff_initial_s, max_wait=cfg.backoff_max_s,
                          retry_after_max=cfg.retry_after_max_s)
        return policy.copy(stop=stop_after_attempt(max(1, cfg.max_attempts)) | stop_before_delay(cfg.retry_budget_s))

    async def call(self, method: str, path: str, *, body: Any = None, params: dict[str, str] | None = None,
                   slow: bool = False) -> Any:
        """One API call, retried on TransientError only; the JSON answer or the mapped error. ``slow``: a call
        Vast may take long to answer (a create), given ``vast.create_timeout_s``."""
        return await with_retries(lambda: self.once(method, path, body, params, slow=slow), self.retrying())

    async def once(self, method: str, path: str, body: Any = None, params: dict[str, str] | None = None, *,
                   slow: bool = False) -> Any:
        what = f"{method} {path}"
        timeout = self.config.create_timeout_s if slow else self.config.timeout_s
        try:
            resp = await self._http.request(method, path, json=body, params=params, timeout=timeout)
        except httpx.TransportError as exc:  # timeouts included
            raise transport_error(exc, what) from None
        log.debug("vast %s → %s", what, resp.status_code)
        if resp.status_code >= 300:
            raise_for(resp, what)
        try:
            return resp.json()
        except ValueError:
            raise TransientError(PROVIDER, f"{what}: HTTP {resp.status_code} with a body that is not JSON",
                                 "bad_json") from None

    async def instances(self, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every current instance (all pages of GET /api/v1/instances/)."""
        out: list[dict[str, Any]] = []
        token: str | None = None
        for _ in range(MAX_PAGES):
            params = {"limit": str(LIST_PAGE), "order_by": json.dumps([{"col": "id", "dir": "asc"}])}
            if filters:
                params["select_filters"] = json.dumps(filters)
            if token:
                params["after_token"] = token
            data = await self.call("GET", "/api/v1/instances/", params=params)
            page = data.get("instances") if isinstance(data, dict) else None
            out.extend(i for i in page or [] if isinstance(i, dict))
            nxt = data.get("next_token") if isinstance(data, dict) else None
            if not nxt or nxt == token or not page:
                break
            token = str(nxt)
        return out

    async def instance_log(self, instance_id: str, *, tail: int) -> str:
        """An instance's container log (its last ``tail`` lines) through the logs API.

        ``PUT /api/v0/instances/request_logs/{id}/`` has Vast upload the log and answers its URL; the
        upload takes a moment, so the URL is polled (403/404 until it is there), as Vast's CLI does.
        A gone instance raises :class:`~providers.vast.errors.Refused` (404).
        """
        what = f"PUT /api/v0/instances/request_logs/{instance_id}/"
        data = await self.call("PUT", f"/api/v0/instances/request_logs/{instance_id}/", body={"tail": str(tail)},
                               slow=True)
        url = data.get("result_url") if isinstance(data, dict) else None
        if not url:
            raise TransientError(PROVIDER, f"{what}: no result_url in the answer", "no_log_url")
        loop = asyncio.get_running_loop()
        end = loop.time() + self.config.log_wait_s
        while True:
            try:
                resp = await self._plain.get(str(url))
            except httpx.TransportError as exc:
                raise transport_error(exc, "GET the log's result_url") from None
            if resp.status_code == 200:
                return resp.text
            if resp.status_code not in (403, 404) or loop.time() >= end:
                raise TransientError(PROVIDER, f"{what}: the log was not readable at its result_url "
                                               f"(HTTP {resp.status_code})", "log_not_ready")
            await asyncio.sleep(self.config.log_poll_s)
