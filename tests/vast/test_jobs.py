"""Jobs end to end on the local Vast API server, through the broker's own placement and poll passes.

The container is the job (docs/vast.md): the server runs each launched container's command as a local
process (the wrapper the create body carries, started by its bootstrap), and the broker learns how it ended
from Vast's logs API. Nothing here cancels a job: the machine must be given back because the command ended.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import string
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.config import BrokerConfig, RuntimeConfig, SecretsConfig, Settings
from broker.models import TERMINAL_STATES, Allocation, Job, JobState
from broker.reconcile import reconcile
from broker.service import Lockstep
from broker.specs import parse_spec
from broker.store import Store
from providers.runtime.logs import parse_log
from providers.vast import VastProvider
from providers.vast.config import VastConfig
from standins.vastapi.server import VastApiServer
from tests.broker.conftest import wait_for
from tests.waiting import eventually

SECRET = "hf_s3cr3t-v4lue-9e1f0c2b7a"  # what must appear nowhere the broker keeps or says
INSTALLATION = "vjobs"


class Broker:
    def __init__(self, svc: Lockstep, vast: VastApiServer, db: Path) -> None:
        self.svc = svc
        self.vast = vast
        self.db = db

    @property
    def provider(self) -> VastProvider:
        p = self.svc.market.providers["vast"]
        assert isinstance(p, VastProvider)
        return p

    async def run(self, **spec) -> Job:
        """Submit and place one job on Vast; it is provisioning on one instance."""
        data = {"name": "vast-run", "gpu": ["RTX-4090", "RTX-3090"], "gpus": 1, "providers": ["vast"],
                "markets": ["on_demand"], "workload": {"hours": 1}, "disk_gb": 20}
        data.update(spec)
        job = await self.svc.submit(parse_spec(data))
        await self.svc.place_now([job.id])
        job = await self.svc.get_job(job.id)
        assert job.state is JobState.provisioning, job.reason
        return job

    async def alloc(self, job: Job) -> Allocation:
        return (await self.svc.job_allocations(job.id))[-1]

    def instance_id(self, alloc: Allocation) -> int:
        return int(alloc.resource_ids[0])

    async def until(self, job: Job, states: set[JobState]) -> Job:
        """Poll (the broker's own pass) until the job is in one of ``states``. The poll that ends a job must
        also have destroyed its instance: checked right after it, before anything else can."""
        async def reached() -> bool:
            alloc = await self.alloc(job)
            await self.svc.poll_now()
            now = await self.svc.get_job(job.id)
            if now.state in TERMINAL_STATES:
                assert self.instance_id(alloc) not in self.vast.state.instances, "destroyed in the same poll"
            return now.state in states

        await wait_for(reached, limit_s=90, every=0.2)
        return await self.svc.get_job(job.id)


async def open_broker(tmp_path: Path, vast_api: VastApiServer, vast_config: VastConfig) -> Broker:
    """A broker over the store in ``tmp_path`` (the same one again after a "crash") and the local Vast API."""
    (tmp_path / "hf-prod").write_text(SECRET)
    db = tmp_path / "jobs.db"
    settings = Settings(db_url=f"sqlite:///{db}", broker=BrokerConfig(installation=INSTALLATION),
                        secrets=SecretsConfig(files={"hf-prod": str(tmp_path / "hf-prod")}),
                        runtime=RuntimeConfig(log_interval_s=0.5, grace_s=2.0))
    store = Store(settings.db_url)
    store.migrate()
    config = vast_config.model_copy(update={"log_poll_s": 0.05})
    svc = Lockstep(settings, providers={"vast": VastProvider(config, installation=INSTALLATION)}, store=store)
    health = await svc.refresh()
    assert all(h.ok for h in health.values()), health
    return Broker(svc, vast_api, db)


@pytest.fixture
async def broker(tmp_path: Path, vast_api: VastApiServer, vast_config: VastConfig) -> AsyncIterator[Broker]:
    b = await open_broker(tmp_path, vast_api, vast_config)
    try:
        yield b
    finally:
        await b.svc.aclose()


def _ended(job: Job) -> dict:
    return [e for e in job.events if e.to_state is job.state][-1].data


def _cancels(vast: VastApiServer) -> list[dict]:
    return [r for r in vast.state.requests if r["method"] == "DELETE"]


async def test_a_command_that_exits_3_fails_with_code_3_its_log_kept_and_its_machine_destroyed(broker: Broker):
    job = await broker.run(command='echo "line one"; echo "line two" >&2; echo "line three"; exit 3')
    alloc = await broker.alloc(job)
    iid = broker.instance_id(alloc)
    create = next(r["body"] for r in broker.vast.state.requests if r["path"].startswith("/api/v0/asks/"))
    assert create["runtype"] == "args" and create["label"] == f"lockstep:{INSTALLATION}:{job.id}:{job.attempts}"

    job = await broker.until(job, {JobState.failed, JobState.succeeded})
    assert job.state is JobState.failed, job.reason
    assert "exit code 3" in job.reason
    end = _ended(job)
    # (stdout and stderr are read apart: their lines keep each stream's order, not one between the two)
    assert end["exit_code"] == 3 and end["exit_reason"] == "exited"
    assert sorted(end["last_lines"][-3:]) == ["line one", "line three", "line two"]
    # Destroyed by the broker (one DELETE, of this instance), because the command ended: nobody cancelled.
    assert [r["path"] for r in _cancels(broker.vast)] == [f"/api/v0/instances/{iid}/"]
    assert iid not in broker.vast.state.instances and iid not in broker.vast.state.containers
    assert not any(e.to_state is JobState.cancelled for e in job.events)

    # The log, through the capability (Vast's copy went with the instance: the adapter kept the last one read).
    lines = parse_log(await broker.provider.job_log(await broker.alloc(job)))
    assert [ln.text for ln in lines if ln.stream == "out"] == ["line one", "line three"]
    assert [ln.text for ln in lines if ln.stream == "err"] == ["line two"]
    assert all(ln.at is not None for ln in lines)


async def test_a_command_that_exits_0_succeeds(broker: Broker):
    job = await broker.run(command="echo all good")
    job = await broker.until(job, {JobState.failed, JobState.succeeded})
    assert job.state is JobState.succeeded, job.reason
    assert _ended(job)["exit_code"] == 0
    assert not broker.vast.state.instances


async def test_max_duration_stops_the_command_fails_the_job_and_destroys_the_machine(broker: Broker):
    job = await broker.run(command="echo started; sleep 600", max_duration="2s")
    job = await broker.until(job, {JobState.failed, JobState.succeeded})
    assert job.state is JobState.failed and "max_duration" in job.reason, job.reason
    end = _ended(job)
    assert end["exit_reason"] == "max_duration" and end["exit_code"] == 128 + 15  # TERM
    assert not broker.vast.state.instances and not broker.vast.state.containers


async def test_env_files_and_a_secret_reach_the_command_and_the_secret_is_nowhere_else(
        broker: Broker, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    # A file large enough that the manifest is split over several variables (one may hold 128 KiB at most).
    rng = random.Random(5)
    big = "".join(rng.choice(string.ascii_letters) for _ in range(300_000))
    command = ('echo "mode=$MODE"; echo "conf=$(cat conf/run.txt)"; wc -c < big.txt; '
               'python3 -c "import hashlib,os; print(\'sha=\' + hashlib.sha256(os.environ[\'HF_TOKEN\'].encode())'
               '.hexdigest()); print(\'echoed=\' + os.environ[\'HF_TOKEN\'])"')
    job = await broker.run(command=command, env={"MODE": "train"}, secrets={"HF_TOKEN": "hf-prod"},
                           files={"conf/run.txt": "lr=0.1\n", "big.txt": big})
    create = next(r["body"] for r in broker.vast.state.requests if r["path"].startswith("/api/v0/asks/"))
    assert int(create["env"]["LOCKSTEP_MANIFEST_PARTS"]) > 1
    job = await broker.until(job, {JobState.failed, JobState.succeeded})
    assert job.state is JobState.succeeded, job.reason

    log = await broker.provider.job_log(await broker.alloc(job))
    out = [ln.text for ln in parse_log(log) if ln.stream == "out"]
    assert "mode=train" in out and "conf=lr=0.1" in out and "300000" in out
    assert f"sha={hashlib.sha256(SECRET.encode()).hexdigest()}" in out
    assert "echoed=*****" in out  # a workload that prints it: masked at the source

    # Nowhere the broker keeps or says anything: the database (and its journal), its log, events, records.
    stored = b"".join(p.read_bytes() for p in broker.db.parent.glob(broker.db.name + "*"))
    assert stored and SECRET.encode() not in stored
    assert caplog.records and SECRET not in caplog.text
    job = await broker.svc.get_job(job.id)
    assert SECRET not in job.model_dump_json()
    assert all(SECRET not in a.model_dump_json() for a in await broker.svc.job_allocations(job.id))
    assert SECRET not in log


async def test_a_vanished_instance_requeues_its_job_counted_with_the_reason(broker: Broker):
    job = await broker.run(command="echo started; sleep 600")
    job = await broker.until(job, {JobState.running})
    alloc = await broker.alloc(job)

    async def started() -> bool:
        return "started" in [ln.text for ln in parse_log(await broker.provider.job_log(alloc))]

    await wait_for(started, limit_s=60, every=0.2)  # its log, while it runs, through the logs API

    broker.vast.state.vanish(broker.instance_id(alloc))  # the host is gone, and the instance with it
    await broker.svc.poll_now()
    job = await broker.svc.get_job(job.id)
    assert job.state is JobState.pending and job.preemptions == 1
    preempted = [e for e in job.events if e.to_state is JobState.preempted]
    assert len(preempted) == 1 and "vanished" in preempted[0].reason
    assert (await broker.svc.job_allocations(job.id))[-1].state.value == "preempted"
    assert not any(e.to_state is JobState.cancelled for e in job.events)


async def test_an_image_without_python3_fails_with_a_clear_reason(broker: Broker):
    broker.vast.state.images_without_python.add("ghcr.io/example/tiny:1")
    job = await broker.run(command="echo never", image="ghcr.io/example/tiny:1")
    job = await broker.until(job, {JobState.failed, JobState.succeeded})
    assert job.state is JobState.failed
    assert "no python3" in job.reason and "could not be started" in job.reason, job.reason
    assert _ended(job)["exit_code"] == 127
    assert not broker.vast.state.instances


async def test_after_a_broker_crash_a_job_that_ended_meanwhile_is_finished_and_its_machine_destroyed(
        tmp_path: Path, vast_api: VastApiServer, vast_config: VastConfig):
    first = await open_broker(tmp_path, vast_api, vast_config)
    ended = await first.run(command="echo working; sleep 2; exit 4")
    gone = await first.run(command="sleep 600")
    ended = await first.until(ended, {JobState.running})
    gone = await first.until(gone, {JobState.running})
    ended_iid = first.instance_id(await first.alloc(ended))
    await first.svc.aclose()  # the broker dies: nothing polls while the command ends and a host is lost

    box = vast_api.state.containers[ended_iid]
    await eventually(lambda: asyncio.to_thread(box.running), lambda alive: not alive, "the first job's command ends")
    vast_api.state.vanish(first.instance_id(await first.alloc(gone)))

    second = await open_broker(tmp_path, vast_api, vast_config)
    try:
        # What a starting broker does: reconcile with what Vast holds, then poll what the store says is live.
        report = await reconcile(second.svc.store, second.svc.market.providers)
        assert not report.unreachable and not report.released, report
        ended = await second.until(ended, {JobState.failed, JobState.succeeded})
        assert ended.state is JobState.failed and _ended(ended)["exit_code"] == 4, ended.reason
        requeued = await second.svc.get_job(gone.id)
        assert requeued.state is JobState.pending and requeued.preemptions == 1, requeued.reason
        assert not vast_api.state.instances
    finally:
        await second.svc.aclose()
