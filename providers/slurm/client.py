"""slurmrestd over httpx: JWT auth, API version negotiation, error mapping and bounded retries.

Everything that differs between slurmrestd versions is in :mod:`providers.slurm.api`;
this client speaks paths and bodies from there and hands the provider flat shapes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from typing import Any

import httpx
from tenacity import AsyncRetrying

import providers.slurm.api as api
from broker.errors import BadRequestError, TransientError
from providers.retry import retrying
from providers.slurm.auth import TokenAuth
from providers.slurm.config import SlurmConfig
from providers.slurm.errors import raise_for

log = logging.getLogger(__name__)
PROVIDER = "slurm"


class SlurmClient:
    """One slurmrestd: requests in, parsed answers or mapped errors out."""

    def __init__(self, config: SlurmConfig) -> None:
        self.config = config
        self._version: str | None = config.api_version
        self._version_lock = asyncio.Lock()
        self._client: httpx.AsyncClient | None = None
        self._auth = TokenAuth(config)
        if config.token is not None and config.token_file:
            log.warning("slurm: both token and token_file are set; using token, so token_file (and its "
                        "rotation) is ignored")

    @property
    def negotiated(self) -> str | None:
        return self._version

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                base_url=self.config.url,
                timeout=self.config.timeout_s,
                headers={"X-SLURM-USER-NAME": self.config.user, "Accept": "application/json"},
                auth=self._auth,
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ------------------------------------------------------------------ requests

    async def once(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """One request, not retried: (HTTP status, JSON body or None). Transport failures are TransientError."""
        try:
            resp = await self._http().request(method, path, json=body)
        except httpx.TimeoutException:
            raise TransientError(PROVIDER, f"timeout on {method} {path}") from None
        except httpx.TransportError as exc:
            raise TransientError(PROVIDER, f"cannot reach slurmrestd ({type(exc).__name__})") from None
        try:
            data = resp.json()
        except (json.JSONDecodeError, ValueError):
            data = None
        for warning in api.parse_warnings(data):  # slurmrestd's word that it did not do exactly what was asked
            log.warning("slurm: slurmrestd warns on %s %s: %s", method, path, warning[:500])
        return resp.status_code, data

    async def call(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, ok_errnos: frozenset[int] = frozenset()
    ) -> Any:
        """One request with bounded, jittered retries on transient failures; raises the mapped error."""
        async for attempt in self.retrying():
            with attempt:
                status, data = await self.once(method, path, body)
                if status < 300:
                    return data
                errs = api.parse_errors(data)
                if any(code in ok_errnos for code, _ in errs):
                    return data  # e.g. "invalid job id" where gone is an answer, not a failure
                raise_for(status, errs, f"{method} {path}")
        raise AssertionError("unreachable")  # pragma: no cover

    def retrying(self) -> AsyncRetrying:
        """The shared retry policy, bounded by ``slurm.max_attempts``."""
        return retrying(self.config.max_attempts)

    async def version(self) -> str:
        """The API version to speak: the pinned one, else the newest the server advertises."""
        if self._version:
            return self._version
        async with self._version_lock:
            if not self._version:
                async for attempt in self.retrying():
                    with attempt:
                        self._version = await self._negotiate()
            assert self._version
            return self._version

    async def _negotiate(self) -> str:
        for doc_path in api.OPENAPI_PATHS:
            status, data = await self.once("GET", doc_path)
            if status in (401, 403) or status >= 500:
                raise_for(status, api.parse_errors(data), f"GET {doc_path}")
            if status == 200 and isinstance(data, dict) and (v := api.pick_version(data)):
                return v
        # No OpenAPI document: probe the ping endpoints, newest first.
        for v in api.SUPPORTED_VERSIONS:
            status, data = await self.once("GET", api.path(v, "ping"))
            if status in (401, 403) or status >= 500:
                raise_for(status, api.parse_errors(data), "GET ping")
            if status == 200:
                return v
        raise BadRequestError(PROVIDER, "slurmrestd offers none of " + ", ".join(api.SUPPORTED_VERSIONS))

    async def path(self, what: str, **params: str | int) -> str:
        """The path of an endpoint in the negotiated version."""
        return api.path(await self.version(), what, **params)

    async def get(self, what: str, **params: str | int) -> Any:
        return await self.call("GET", await self.path(what, **params))

    # ------------------------------------------------------------------ reads

    async def nodes(self) -> list[api.NodeInfo]:
        return api.parse_nodes(await self.get("nodes") or {})

    async def jobs(self) -> list[api.JobInfo]:
        return api.parse_jobs(await self.get("jobs") or {})

    async def partitions(self) -> list[api.PartitionInfo]:
        return api.parse_partitions(await self.get("partitions") or {})

    async def ping(self) -> bool:
        data = await self.get("ping")
        pings = (data or {}).get("pings") or []
        return any(str(p.get("pinged", p.get("ping", ""))).upper() in ("UP", "RESPONDING") for p in pings)

    async def job(self, job_id: int | str) -> api.JobInfo | None:
        """One job, or None when slurmctld no longer knows it."""
        data = await self.call("GET", await self.path("job", job_id=job_id),
                               ok_errnos=frozenset({api.ESLURM_INVALID_JOB_ID}))
        jobs = api.parse_jobs(data or {})
        return next((j for j in jobs if str(j.job_id) == str(job_id)), None)

    # ------------------------------------------------------------------ writes

    async def submit_once(self, req: api.SubmitRequest) -> int:
        """POST job/submit once (the caller retries, after looking for an earlier try): the new job id."""
        v = await self.version()
        status, data = await self.once("POST", api.path(v, "submit"), api.submit_body(v, req))
        job_id = api.parse_submit(data) if isinstance(data, dict) else None
        if status >= 300 or job_id is None:
            raise_for(status if status >= 300 else 500, api.parse_errors(data), "job submit")
        assert job_id is not None
        await self._refuse_altered(job_id, data)
        return job_id

    async def submit(self, req: api.SubmitRequest) -> int:
        """POST job/submit, retried on transient errors: the new job id."""
        v = await self.version()
        data = await self.call("POST", api.path(v, "submit"), api.submit_body(v, req))
        job_id = api.parse_submit(data) if isinstance(data, dict) else None
        if job_id is None:
            raise BadRequestError(PROVIDER, "job submit answered without a job id")
        await self._refuse_altered(job_id, data)
        return job_id

    async def _refuse_altered(self, job_id: int, data: Any) -> None:
        """A submit slurmrestd accepted while warning about a field Lockstep relies on (it ignores an unknown or
        mistyped field and submits anyway): the job is cancelled and the launch fails with the warning's text,
        rather than run without its GPUs, on another node or with another time limit."""
        altered = api.relied_warnings(api.parse_warnings(data))
        if not altered:
            return
        try:
            await self.cancel(str(job_id))
        except Exception as exc:  # the launch's error is what matters; the job is found by owned() otherwise
            log.warning("slurm: cancelling job %s, submitted with an altered request: %s", job_id, exc)
        raise BadRequestError(PROVIDER, f"slurmrestd changed the request of job {job_id} (cancelled): "
                                        + "; ".join(altered)[:800], "slurm_warning")

    async def set_comment(self, job_id: str, comment: str) -> None:
        v = await self.version()
        await self.call("POST", api.path(v, "job", job_id=job_id), api.job_update_body(v, comment))

    async def cancel(self, job_id: str) -> None:
        """Cancel a job; one slurmctld no longer knows counts as cancelled."""
        await self.call("DELETE", await self.path("job", job_id=job_id),
                        ok_errnos=frozenset({api.ESLURM_INVALID_JOB_ID}))

    async def signal(self, job_id: str, name: str) -> None:
        """Send SIG``name`` to a job's processes; the job goes on (DELETE job/{id}?signal=…)."""
        if not re.fullmatch(r"[A-Z0-9]{1,8}", name):
            raise BadRequestError(PROVIDER, f"bad signal name {name!r}")
        await self.call("DELETE", await self.path("job", job_id=job_id) + f"?signal=SIG{name}",
                        ok_errnos=frozenset({api.ESLURM_INVALID_JOB_ID}))

    async def set_node_state(self, node: str, state: str, reason: str) -> None:
        """DRAIN or RESUME a node: POST node/{name} where the version has it, else scontrol on this host."""
        if not re.fullmatch(r"[A-Za-z0-9._\-\[\],]+", node):
            raise BadRequestError(PROVIDER, f"bad node name {node!r}")
        v = await self.version()
        if api.has_node_update(v):
            await self.call("POST", api.path(v, "node", name=node), api.node_update_body(v, state, reason))
            return
        await self._scontrol("update", f"NodeName={node}", f"State={state}", *([f"Reason={reason}"] if reason else []))

    async def _scontrol(self, *args: str) -> None:
        """v0.0.38 has no node update endpoint: run scontrol on this host (needs Slurm client and munge)."""
        conf = self.config.conf_path or os.environ.get("SLURM_CONF")
        if not conf:
            # Without SLURM_CONF scontrol falls back to a DNS SRV lookup: refuse rather than leave the host.
            raise BadRequestError(PROVIDER, "node updates need slurm.conf_path (or SLURM_CONF) with this slurmrestd")
        env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
        env["SLURM_CONF"] = conf
        try:
            proc = await asyncio.create_subprocess_exec(
                "scontrol", *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except FileNotFoundError:
            raise BadRequestError(PROVIDER, "scontrol is not installed on this host") from None
        _, err = await proc.communicate()
        if proc.returncode != 0:
            text = err.decode(errors="replace").strip().splitlines()
            raise BadRequestError(PROVIDER, f"scontrol {args[0]} failed: {text[-1] if text else proc.returncode}")
