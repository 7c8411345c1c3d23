"""The job commands' papercuts (issue 29), each through a real server (``--server``) and locally (this store's
background broker), as real `lockstep` processes over one store:

- `lockstep status JOB --json` carries the job's allocations, the same document both ways as ``GET /v1/jobs/{id}``;
- `lockstep logs JOB` on a job with no output says so in one line on stderr (which depends on its state), exit 0,
  stdout empty (also with ``--json`` and ``--follow``);
- `lockstep submit` prints a snapshot-only warning once.

A catalog-only server with no broker loops: nothing is launched, job states change only as the test writes them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker.api import create_app
from broker.config import Settings
from broker.models import Allocation, AllocationState, Job, JobState, Role
from broker.service import Lockstep
from broker.specs import parse_spec
from broker.store import Store, open_store
from tests.api.conftest import ServerThread

ROOT = Path(__file__).resolve().parents[2]
AT = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
WARNING = "warning: every option that fits is a snapshot price"


@dataclass
class Here:
    db: Path
    url: str
    token: str
    store: Store

    def cli(self, *args: str, server: bool) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
        env["PYTHONPATH"] = str(ROOT)
        if server:
            env["LOCKSTEP_TOKEN"] = self.token
        where = ["--server", self.url] if server else ["--db", str(self.db)]
        return subprocess.run([sys.executable, "-m", "broker", *where, *args], capture_output=True, text=True,
                              timeout=120, env=env, cwd=self.db.parent)

    def job(self, state: JobState, *, ran: bool) -> Job:
        """A job written straight to the store in ``state``; ``ran``: with a released allocation (no log kept)."""
        spec = parse_spec({"name": "papercut", "gpu": "H100", "gpus": 8, "workload": {"hours": 1},
                           "command": "true"})
        job, _ = self.store.create_job(Job(id=f"j-{state.value}-{int(ran)}", spec=spec, created_at=AT,
                                           updated_at=AT, state=state))
        if ran:
            self.store.add_allocation(Allocation(
                id=f"a-{job.id}", job_id=job.id, provider="vast", offer_id="vast:1", resource_ids=["123"],
                state=AllocationState.released, usd_per_hour=20.0, created_at=AT, updated_at=AT,
                region="US", cost_usd=1.5, billed_s=270.0, ended_at=AT))
        return job


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Here]:
    db = tmp_path / "lockstep.db"
    store = open_store(f"sqlite:///{db}")
    _, token = store.create_token("ops", Role.admin, "tests: admin")
    svc = Lockstep(Settings(db_url=store.url), only_providers=["catalog"])
    server = ServerThread(create_app(svc, start_loops=False))
    url = server.start()
    try:
        yield Here(db, url, token, store)
    finally:
        server.stop()
        store.close()


def test_status_json_carries_the_allocations_through_a_server_and_locally(here: Here) -> None:
    job = here.job(JobState.cancelled, ran=True)
    docs = []
    for server in (True, False):
        r = here.cli("status", "--json", job.id, server=server)
        assert r.returncode == 0, r.stderr
        docs.append(json.loads(r.stdout))
    remote, local = docs
    assert remote == local  # the same document either way
    [alloc] = remote["allocations"]
    assert alloc["id"] == f"a-{job.id}" and alloc["state"] == "released" and alloc["cost_usd"] == 1.5
    assert remote["id"] == job.id and remote["state"] == "cancelled" and remote["events"]


@pytest.mark.parametrize("server", [True, False], ids=["server", "local"])
def test_logs_of_a_job_with_no_output_say_so_on_stderr(here: Here, server: bool) -> None:
    ended = here.job(JobState.cancelled, ran=False)
    ran = here.job(JobState.failed, ran=True)  # released, and no log was kept
    cases = [(ended, "(cancelled) produced no output"), (ran, "(failed) produced no output")]
    if server:  # (a local broker would place a pending job at once: this server runs no broker loops)
        cases.append((here.job(JobState.pending, ran=False), "is pending: no output yet"))
    for job, says in cases:
        for extra in ((), ("--json",), ("--follow",)):
            if job.state is JobState.pending and extra == ("--follow",):
                continue  # it would wait for the job
            r = here.cli("logs", job.id, *extra, server=server)
            assert r.returncode == 0, r.stderr
            assert r.stdout == "", (job.id, extra, r.stdout)
            [line] = r.stderr.strip().splitlines()
            assert line == f"lockstep: job {job.id} {says}", (extra, line)
    # Asked for no lines: none, and nothing to explain.
    r = here.cli("logs", ended.id, "--tail", "0", server=server)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stderr


@pytest.mark.parametrize("server", [True, False], ids=["server", "local"])
def test_submit_prints_its_warning_once(here: Here, tmp_path: Path, server: bool) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: warned\ngpu: H100\ngpus: 8\nworkload: {hours: 1}\ncommand: 'true'\n")
    r = here.cli("submit", "--no-place", str(spec), server=server)
    assert r.returncode == 0, r.stderr
    assert (r.stdout + r.stderr).count(WARNING) == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith(WARNING)  # on stderr, where scripts do not read the id
    job_id = r.stdout.strip().splitlines()[-1]
    assert r.stdout.strip().splitlines()[0] == f"job {job_id} pending"
