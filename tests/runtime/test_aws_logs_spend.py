"""Logs and spend on AWS, end to end: moto's EC2 and S3, the boot script Lockstep generated run as the instance
would (standins/ec2.py), the broker's own poll, and a real Lockstep API server on loopback; both store
backends.

The log streams through ``GET /v1/jobs/{id}/logs?follow=true`` while the command runs (it waits for a file
the test writes only once the stream has delivered its first line), ends by itself after the job has
ended, is masked, is kept in the store (the bucket's copy deleted afterwards, the lines still come), and is
a 404 for another tenant; ``lockstep logs`` shows it. A job that exits 0 has its spend booked per EC2's
billing (per second, 60 s at least); the tenant's month-to-date spend is the sum of its jobs'.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from aiobotocore.session import AioSession

from broker.api import create_app, start_server
from broker.models import AllocationState, JobState, LogLine, Role, month_start
from broker.store import Store
from providers.aws.runtime import RunLocation
from standins.ec2 import BUCKET, FakeImds, s3_client
from tests.plugins.moto import moto_config
from tests.runtime.test_aws_e2e import INSTALLATION, SECRET, AwsBroker, runtime_overrides

pytestmark = pytest.mark.aws
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def broker(store: Store, tmp_path: Path, aws_moto: str, aws_session: AioSession) -> AsyncIterator[AwsBroker]:
    b = AwsBroker(tmp_path, moto_config(aws_moto, **runtime_overrides(aws_moto)), aws_session)
    await b.svc.aclose()  # the same broker on the parametrized store
    b.settings = b.settings.model_copy(update={"db_url": store.url})
    b.svc = b._service()
    await b.svc.refresh()
    yield b
    await b.svc.aclose()


@pytest.fixture
async def api(broker: AwsBroker, store: Store) -> AsyncIterator[tuple[str, str, str]]:
    """(url, a token of tenant "default" — whose jobs the broker submits —, one of tenant "beta")."""
    _, mine = store.create_token("default", Role.user)
    _, theirs = store.create_token("beta", Role.user)
    runner, url = await start_server(create_app(broker.svc, start_loops=False, close_service=False), "127.0.0.1", 0)
    try:
        yield url, mine, theirs
    finally:
        await runner.cleanup()


def client(url: str, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


async def test_a_job_that_exits_3_streams_its_log_while_it_runs_masked_and_kept_after_the_end(
        broker: AwsBroker, api: tuple[str, str, str]) -> None:
    url, mine, theirs = api
    go = broker.tmp_path / "go"
    command = (f'echo line-1; echo "token=$HF_TOKEN"; while [ ! -f {go} ]; do sleep 0.1; done; '
               'echo line-2; exit 3')
    job, alloc = await broker.place(await broker.submit(command=command, secrets={"HF_TOKEN": "hf-prod"}))
    async with client(url, theirs) as c:
        assert (await c.get(f"/v1/jobs/{job.id}/logs", params={"follow": "true"})).status_code == 404
        assert (await c.get(f"/v1/jobs/{job.id}/logs")).status_code == 404

    got: list[LogLine] = []
    first = asyncio.Event()

    async def follow() -> int:
        async with client(url, mine) as c, c.stream("GET", f"/v1/jobs/{job.id}/logs", params={"follow": "true"},
                                                    timeout=httpx.Timeout(60, read=None)) as r:
            async for raw in r.aiter_lines():
                if raw:
                    got.append(LogLine.model_validate_json(raw))
                    if got[-1].text == "line-1":
                        first.set()
            return r.status_code

    async with FakeImds() as imds:
        [node] = broker.nodes(alloc, imds)
        await node.start()
        stream = asyncio.create_task(follow())
        await asyncio.wait_for(first.wait(), 90)
        assert (await broker.svc.get_job(job.id)).state is JobState.running  # streamed while it runs
        go.write_text("go")
        assert await node.wait() == 3, node.console()
    await broker.svc.poll_now()  # the broker's poll sees the end: failed, released, log kept, cost booked
    assert await asyncio.wait_for(stream, 90) == 200

    job = await broker.svc.get_job(job.id)
    assert job.state is JobState.failed and "exit code 3" in job.reason, job.reason
    assert broker.instance_states(alloc) == ["terminated"]
    assert [ln.text for ln in got if ln.stream == "out"] == ["line-1", "token=*****", "line-2"]

    # The bucket's copy goes (objects expire); the store's stays.
    where = RunLocation.of(broker.config, INSTALLATION, job.id, job.attempts)
    s3_client(broker.endpoint).delete_object(Bucket=BUCKET, Key=where.log(0))
    assert await broker.aws.job_log(alloc) == ""
    async with client(url, mine) as c:
        r = await c.get(f"/v1/jobs/{job.id}/logs")
    assert r.status_code == 200 and SECRET not in r.text
    assert [LogLine.model_validate_json(x).text for x in r.text.splitlines()
            if '"out"' in x] == ["line-1", "token=*****", "line-2"]

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker", "--server", url, "--token", mine, "logs", job.id, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err
    assert [x for x in out.decode().splitlines() if not x.startswith("lockstep: ")] == [
        "line-1", "token=*****", "line-2"]


async def test_a_job_that_exits_0_books_its_spend_per_ec2_billing_and_month_to_date_is_the_sum(
        broker: AwsBroker, api: tuple[str, str, str]) -> None:
    url, mine, _ = api
    ended = []
    for i in range(2):
        job, alloc = await broker.place(await broker.submit(command=f"echo run {i}"))
        assert (await broker.svc.get_job(job.id)).accruing_usd > 0  # running: accrues, not booked yet
        job, node = await broker.run_job(alloc)
        assert node.exit_code == 0 and job.state is JobState.succeeded, job.reason
        [rec] = await broker.svc.job_allocations(job.id)
        assert rec.state is AllocationState.succeeded and broker.instance_states(alloc) == ["terminated"]
        assert rec.billed_s is not None and rec.billed_s >= 60  # EC2: per second, at least a minute
        assert rec.cost_usd == pytest.approx(rec.usd_per_hour * rec.billed_s / 3600) and rec.cost_usd > 0
        assert job.spent_usd == pytest.approx(rec.cost_usd) and job.accruing_usd == 0
        ended.append(job)
    total = sum(j.spent_usd for j in ended)
    async with client(url, mine) as c:
        page = (await c.get("/v1/jobs")).json()
        tenant = (await c.get("/v1/tenants/default")).json()
    assert {j["id"]: j["spent_usd"] for j in page["jobs"]} == {j.id: j.spent_usd for j in ended}
    assert tenant["month_to_date_usd"] == pytest.approx(total)
    now = broker.svc.clock()
    assert broker.svc.store.tenant_spend("default", month_start(now), now) == pytest.approx(total)
