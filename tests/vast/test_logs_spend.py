"""Logs and spend end to end on the local Vast API server, through a real Lockstep API server on loopback with
its broker loops running (placement, polls), on both store backends.

A job's command prints lines, prints a secret and exits 3: it ends failed with code 3, with no cancel; its
lines come through ``GET /v1/jobs/{id}/logs`` (streamed with ``follow`` while it runs: the command waits for
a file the test writes only after the stream has delivered its first line, so the stream is shown to deliver
before the end, with no timing), through ``lockstep logs`` (a subprocess, through the server and locally),
and still once the instance is destroyed (kept in the store). The secret is masked; another tenant gets a
404. A job that exits 0 ends succeeded with its spend booked; the tenant's month-to-date spend is the sum
of its jobs'.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from broker.api import create_app, start_server
from broker.config import BrokerConfig, RuntimeConfig, SecretsConfig, Settings
from broker.models import TERMINAL_STATES, AllocationState, Job, JobState, LogLine, Role
from broker.service import Lockstep
from broker.store import Store
from providers.vast import VastProvider
from providers.vast.config import VastConfig
from standins.vastapi.server import VastApiServer
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hf_l0gs-s3cr3t-5e2d71c0"
INSTALLATION = "vlogs"


@dataclass
class Served:
    svc: Lockstep
    url: str
    alice: str  # tenant alpha
    bob: str  # tenant beta
    admin: str
    store: Store
    vast: VastApiServer
    settings: Settings
    vast_config: VastConfig
    tmp: Path

    def client(self, token: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)

    async def submit(self, token: str, command: str) -> Job:
        spec = {"name": "logs", "gpu": ["RTX-4090", "RTX-3090"], "gpus": 1, "providers": ["vast"],
                "markets": ["on_demand"], "workload": {"hours": 1}, "disk_gb": 20, "command": command,
                "secrets": {"HF_TOKEN": "hf-prod"}}
        async with self.client(token) as c:
            r = await c.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        return Job.model_validate(r.json())

    async def job(self, job_id: str, token: str | None = None) -> Job:
        async with self.client(token or self.admin) as c:
            r = await c.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return Job.model_validate(r.json())

    async def until_ended(self, job_id: str) -> Job:
        """The job once it has ended and its machine is given back and booked (in the same poll, just after)."""
        await eventually(lambda: self.job(job_id), lambda j: j.state in TERMINAL_STATES, "the job ends")
        await eventually(lambda: self.svc.job_allocations(job_id), lambda allocs: all(
            a.cost_usd is not None for a in allocs), "its allocation is released and booked")
        return await self.job(job_id)

    async def cli(self, *args: str, server: bool = True, token: str | None = None) -> tuple[int, str, str]:
        """``lockstep ARGS`` in a subprocess, through this server (or locally, on the same store and market)."""
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("LOCKSTEP_SERVER", None)
        if server:
            pre = ["--server", self.url, "--token", token or self.alice]
        else:
            config = self.tmp / "lockstep.yaml"
            config.write_text(yaml.safe_dump({
                "db_url": self.settings.db_url,
                "broker": {"installation": INSTALLATION},
                "secrets": {"files": {"hf-prod": str(self.tmp / "hf-prod")}},
                "vast": {"enabled": True, "url": self.vast_config.url,
                         "api_key": self.vast_config.api_key.get_secret_value() if self.vast_config.api_key else "",
                         "min_reliability": 0.0, "verified_only": False},
                "catalog": {"enabled": False},
            }))
            pre = ["--config", str(config)]
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "broker", *pre, *args, env=env,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
        return proc.returncode or 0, out.decode(), err.decode()


@pytest.fixture
async def served(store: Store, tmp_path: Path, vast_api: VastApiServer,
                 vast_config: VastConfig) -> AsyncIterator[Served]:
    (tmp_path / "hf-prod").write_text(SECRET)
    _, admin = store.create_token("ops", Role.admin)
    _, alice = store.create_token("alpha", Role.user)
    _, bob = store.create_token("beta", Role.user)
    settings = Settings(
        db_url=store.url,
        broker=BrokerConfig(installation=INSTALLATION, poll_interval_s=0.3, place_interval_s=0.3),
        secrets=SecretsConfig(files={"hf-prod": str(tmp_path / "hf-prod")}),
        runtime=RuntimeConfig(log_interval_s=0.3, grace_s=2.0))
    config = vast_config.model_copy(update={"log_poll_s": 0.05})
    svc = Lockstep(settings, providers={"vast": VastProvider(config, installation=INSTALLATION)}, store=store)
    runner, url = await start_server(create_app(svc, start_loops=True, close_service=False), "127.0.0.1", 0)
    try:
        yield Served(svc, url, alice, bob, admin, store, vast_api, settings, config, tmp_path)
    finally:
        await runner.cleanup()
        await svc.aclose()


async def _stream(served: Served, token: str, job_id: str, got: list[LogLine], first: asyncio.Event,
                  first_text: str) -> int:
    """Follow the job's log through the API into ``got``; ``first`` is set once ``first_text`` has come."""
    async with served.client(token) as c, c.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "true"},
                                                   timeout=httpx.Timeout(60, read=None)) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        async for raw in r.aiter_lines():
            if raw:
                got.append(LogLine.model_validate_json(raw))
                if got[-1].text == first_text:
                    first.set()
        return r.status_code


async def test_a_job_that_exits_3_streams_its_log_masks_its_secret_and_keeps_it_after_the_machine_is_gone(
        served: Served) -> None:
    go = served.tmp / "go"
    command = (f'echo "line one"; echo "token=$HF_TOKEN"; while [ ! -f {go} ]; do sleep 0.1; done; '
               'echo "line two" >&2; echo "line three"; exit 3')
    job = await served.submit(served.alice, command)

    # Another tenant's job is not found, for the log as for the job (before anything is streamed).
    async with served.client(served.bob) as c:
        assert (await c.get(f"/v1/jobs/{job.id}/logs")).status_code == 404
        assert (await c.get(f"/v1/jobs/{job.id}/logs", params={"follow": "true"})).status_code == 404
        assert (await c.get(f"/v1/jobs/{job.id}/logs", params={"tail": "-1"})).status_code == 400  # names tail

    got: list[LogLine] = []
    first = asyncio.Event()
    stream = asyncio.create_task(_stream(served, served.alice, job.id, got, first, "line one"))
    await asyncio.wait_for(first.wait(), 90)
    # The first line came through the stream while the command still runs (it waits for the file).
    assert (await served.job(job.id)).state is JobState.running
    assert "token=*****" in [ln.text for ln in got]
    go.write_text("go")
    assert await asyncio.wait_for(stream, 90) == 200  # the stream ends by itself once the job has ended

    job = await served.until_ended(job.id)
    assert job.state is JobState.failed and "exit code 3" in job.reason, job.reason
    assert not [e for e in job.events if e.to_state is JobState.cancelled]
    assert not served.vast.state.instances  # destroyed because the command ended
    out = [ln.text for ln in got if ln.stream == "out"]
    assert out == ["line one", "token=*****", "line three"]
    assert [ln.text for ln in got if ln.stream == "err"] == ["line two"]

    # After the end, from the store: the instance and Vast's copy of its log are gone.
    async with served.client(served.alice) as c:
        r = await c.get(f"/v1/jobs/{job.id}/logs")
        tail = await c.get(f"/v1/jobs/{job.id}/logs", params={"tail": "2"})
    assert r.status_code == 200 and SECRET not in r.text
    lines = [LogLine.model_validate_json(x) for x in r.text.splitlines()]
    assert [ln.text for ln in lines if ln.stream == "out"] == out
    assert [LogLine.model_validate_json(x) for x in tail.text.splitlines()] == lines[-2:]
    [alloc] = await served.svc.job_allocations(job.id)
    assert served.store.archived_logs(alloc.id) and alloc.state is AllocationState.failed

    # The CLI, through the server and without one; another tenant's token: exit 2, one line.
    code, text, err = await served.cli("logs", job.id)
    assert code == 0, err
    assert [x for x in text.splitlines() if x in ("line one", "token=*****", "line three")] == out
    assert "line two" in err and SECRET not in text + err
    code, text, err = await served.cli("logs", job.id, "--tail", "1", "--json")
    assert code == 0 and [LogLine.model_validate_json(x) for x in text.splitlines()] == lines[-1:], err
    code, text, err = await served.cli("logs", job.id, token=served.bob)
    assert code == 2 and "not found" in err and text == "", err
    code, text, err = await served.cli("logs", job.id, "--follow", server=False)
    assert code == 0, err
    assert "line one" in text.splitlines() and "token=*****" in text.splitlines() and SECRET not in text + err
    # Locally the command went through the store's background broker, which it started: a second broker on
    # this store would place the next tests' jobs too.
    assert (await served.cli("server", "stop", server=False))[0] == 0


async def test_follow_in_the_cli_streams_while_the_job_runs(served: Served) -> None:
    go = served.tmp / "go-cli"
    job = await served.submit(served.alice, f'echo "started"; while [ ! -f {go} ]; do sleep 0.1; done; echo done')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker", "--server", served.url, "--token", served.alice, "logs", job.id, "-f",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        seen: list[str] = []
        while "started" not in seen:  # the wrapper's own notes ("lockstep: …") come first
            line = await asyncio.wait_for(proc.stdout.readline(), 90)
            assert line, f"the CLI ended early: {seen}"
            seen.append(line.decode().rstrip("\n"))
        assert (await served.job(job.id)).state is JobState.running  # printed while it runs
        go.write_text("go")
        rest, err = await asyncio.wait_for(proc.communicate(), 90)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err
    assert [x for x in rest.decode().splitlines() if not x.startswith("lockstep: ")] == ["done"]
    assert all(x.startswith("lockstep: ") for x in seen[:-1])
    assert (await served.job(job.id)).state is JobState.succeeded


async def test_a_job_that_exits_0_books_its_spend_and_the_tenant_month_to_date_is_the_sum(served: Served) -> None:
    jobs = [await served.submit(served.alice, f"echo run {i}; sleep 1") for i in range(2)]
    ended = [await served.until_ended(j.id) for j in jobs]
    assert all(j.state is JobState.succeeded for j in ended), [j.reason for j in ended]
    for j in ended:
        [alloc] = await served.svc.job_allocations(j.id)
        assert alloc.state is AllocationState.succeeded and alloc.cost_usd is not None and alloc.billed_s
        assert j.spent_usd > 0 and j.spent_usd == pytest.approx(alloc.cost_usd)
        assert alloc.cost_usd == pytest.approx(alloc.usd_per_hour * alloc.billed_s / 3600)
        assert j.accruing_usd == 0
    total = sum(j.spent_usd for j in ended)

    async with served.client(served.alice) as c:
        page = (await c.get("/v1/jobs")).json()
        mine = (await c.get("/v1/tenants/alpha")).json()
        theirs = await c.get("/v1/tenants/beta")
    assert {j["id"]: j["spent_usd"] for j in page["jobs"]} == {j.id: j.spent_usd for j in ended}
    assert mine["month_to_date_usd"] == pytest.approx(total) and theirs.status_code == 404
    async with served.client(served.admin) as c:
        tenants = {t["name"]: t["month_to_date_usd"] for t in (await c.get("/v1/tenants")).json()}
    assert tenants["alpha"] == pytest.approx(total) and tenants["beta"] == 0
    from broker.models import month_start

    now = served.svc.clock()
    assert served.store.tenant_spend("alpha", month_start(now), now) == pytest.approx(total)  # the router's figure

    code, text, err = await served.cli("jobs", "--json")
    assert code == 0, err
    assert {j["id"]: j["spent_usd"] for j in json.loads(text)} == {j.id: j.spent_usd for j in ended}
    code, text, err = await served.cli("tenants", "list", "--json", server=False)
    assert code == 0, err
    listed = {t["name"]: t["month_to_date_usd"] for t in json.loads(text)}
    assert listed["alpha"] == pytest.approx(total)
