"""Local mode is always following: `lockstep submit` without a server starts (or reuses) the background broker,
which follows the job to its end with no other command, on the local Vast-API server (standins/vastapi).

- A job whose command exits 3: after `submit` and no other command, its instance is destroyed, the job ends
  `failed` with exit code 3 and its spend is booked.
- The broker killed with SIGKILL while the job runs: the next command starts it again, and its reconciliation
  and polls end the job and release the machine.
- Where the broker cannot start, `submit` refuses in one line and nothing is launched.

Each `lockstep` here is a real process; the broker a real detached one; the job's state is read back from the
store and from the Vast server's own record. Waits are bounded (tests/waiting.py); nothing is timed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from broker.cli import localbroker
from broker.models import TERMINAL_STATES, Allocation, Job, JobState
from broker.store import Store, open_store
from standins.vastapi.server import VastApiServer
from tests.plugins.vast import VAST_TEST_KEY
from tests.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Local:
    tmp: Path
    config: Path
    db_url: str
    vast: VastApiServer
    store: Store

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
        return {**env, "PYTHONPATH": str(ROOT), "LOCKSTEP_BROKER_HOME": str(self.tmp / "brokers"),
                "LOCKSTEP_VAST_API_KEY": VAST_TEST_KEY}

    async def cli(self, *args: str, config: Path | None = None) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "broker", "--config", str(config or self.config), *args, env=self.env(),
            cwd=self.tmp, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 180)
        return proc.returncode or 0, out.decode(), err.decode()

    def spec(self, command: str) -> Path:
        path = self.tmp / f"job-{abs(hash(command)) % 10**8}.yaml"
        path.write_text(yaml.safe_dump({
            "name": "local", "gpu": ["RTX-4090", "RTX-3090"], "gpus": 1, "providers": ["vast"],
            "markets": ["on_demand"], "workload": {"hours": 1}, "disk_gb": 20, "command": command}))
        return path

    @property
    def broker_dir(self) -> Path:
        os.environ[localbroker.HOME_ENV] = str(self.tmp / "brokers")  # the same tree the commands use
        try:
            return localbroker.broker_dir(self.db_url)
        finally:
            del os.environ[localbroker.HOME_ENV]

    def broker_pid(self) -> int:
        return int(json.loads((self.broker_dir / "state.json").read_text())["pid"])

    async def job(self, job_id: str) -> Job:
        return await asyncio.to_thread(self.store.get_job, job_id)

    async def allocations(self, job_id: str) -> list[Allocation]:
        return await asyncio.to_thread(self.store.allocations, job_id)

    async def ended_and_released(self, job_id: str) -> Job:
        """The job once it has ended, its instance is gone from the Vast server and its spend is booked."""
        await eventually(lambda: self.job(job_id), lambda j: j.state in TERMINAL_STATES, "the job ends", 120)
        await eventually(self.allocations_of(job_id), lambda allocs: bool(allocs) and all(
            a.cost_usd is not None for a in allocs), "its allocation is released and booked", 60)
        await eventually(self._instances, lambda n: n == 0, "the Vast instance is destroyed", 60)
        return await self.job(job_id)

    def allocations_of(self, job_id: str):
        return lambda: self.allocations(job_id)

    async def _instances(self) -> int:
        return len(self.vast.state.instances)


def _creates(vast: VastApiServer) -> list[dict]:
    """The rentals the Vast server was asked for (PUT /api/v0/asks/{id}/)."""
    return [r for r in vast.state.requests
            if r.get("method") == "PUT" and str(r.get("path", "")).startswith("/api/v0/asks/")]


@pytest.fixture
async def local(tmp_path: Path, vast_api: VastApiServer) -> AsyncIterator[Local]:
    db_url = f"sqlite:///{tmp_path / 'lockstep.db'}"
    config = tmp_path / "lockstep.yaml"
    config.write_text(yaml.safe_dump({
        "db_url": db_url,
        "broker": {"installation": "hlocal", "poll_interval_s": 1.0, "place_interval_s": 0.3},
        "runtime": {"log_interval_s": 0.3, "grace_s": 2.0},
        "vast": {"enabled": True, "url": vast_api.url, "min_reliability": 0.0, "verified_only": False,
                 "backoff_initial_s": 0.01, "backoff_max_s": 0.05},
        "catalog": {"enabled": False},
    }))
    store = open_store(db_url)
    here = Local(tmp_path, config, db_url, vast_api, store)
    try:
        yield here
    finally:
        await asyncio.to_thread(localbroker.stop, here.broker_dir, timeout_s=20)
        store.close()


async def test_submit_then_no_other_command_the_job_ends_failed_with_code_3_released_and_booked(
        local: Local) -> None:
    code, out, err = await local.cli("submit", "--no-place", "--json", str(local.spec('echo "hello"; exit 3')))
    assert code == 0, err
    job = Job.model_validate_json(out)
    assert job.tenant == "default"
    assert localbroker.is_running(local.broker_dir)  # started by the submit, detached from it

    # No other command: the background broker places, follows and releases it.
    job = await local.ended_and_released(job.id)
    assert job.state is JobState.failed and "exit code 3" in job.reason, job.reason
    assert not [e for e in job.events if e.to_state is JobState.cancelled]  # nobody cancelled it
    [alloc] = await local.allocations(job.id)
    assert alloc.cost_usd is not None and alloc.cost_usd > 0 and job.spent_usd == pytest.approx(alloc.cost_usd)
    assert _creates(local.vast), "the instance was created on the Vast server"

    # The same broker answers the next command (no second one started).
    pid = local.broker_pid()
    code, out, err = await local.cli("status", "--json", job.id)
    assert code == 0, err
    assert json.loads(out)["state"] == "failed" and local.broker_pid() == pid


async def test_a_killed_broker_is_started_by_the_next_command_and_the_job_still_ends_and_is_released(
        local: Local) -> None:
    go = local.tmp / "go"
    command = f'echo "started"; while [ ! -f {go} ]; do sleep 0.1; done; exit 3'
    code, out, err = await local.cli("submit", "--no-place", "--json", str(local.spec(command)))
    assert code == 0, err
    job_id = Job.model_validate_json(out).id
    await eventually(lambda: local.job(job_id), lambda j: j.state is JobState.running, "the job runs", 120)

    old = local.broker_pid()
    os.kill(old, signal.SIGKILL)  # mid-job: nothing follows it now
    await eventually(lambda: asyncio.to_thread(localbroker.is_running, local.broker_dir), lambda up: not up,
                     "the killed broker's lock is free", 30)
    go.write_text("go")  # the command ends while no broker runs
    await eventually(lambda: asyncio.to_thread(lambda: [c for c in local.vast.state.containers.values()
                                                        if c.running()]),
                     lambda live: not live, "the command has ended", 60)
    assert local.vast.state.instances, "nobody released it yet"

    code, out, err = await local.cli("status", "--json", job_id)  # the next command: the broker starts again
    assert code == 0, err
    assert localbroker.is_running(local.broker_dir) and local.broker_pid() != old

    job = await local.ended_and_released(job_id)
    assert job.state is JobState.failed and "exit code 3" in job.reason, job.reason


async def test_where_the_broker_cannot_start_submit_refuses_in_one_line_and_launches_nothing(
        local: Local) -> None:
    blocker = local.tmp / "not-a-dir"
    blocker.write_text("a file where the store's directory should be")
    config = local.tmp / "broken.yaml"
    data = yaml.safe_load(local.config.read_text())
    config.write_text(yaml.safe_dump({**data, "db_url": f"sqlite:///{blocker / 'lockstep.db'}"}))
    code, out, err = await local.cli("submit", str(local.spec("exit 0")), config=config)
    assert code == 1, (out, err)
    assert len(err.strip().splitlines()) == 1 and "background broker could not start" in err
    assert "nothing was submitted" in err and out == ""
    assert not _creates(local.vast)
    assert not local.vast.state.instances
