"""A placement is a handful of writes (issue 25: the claim; the attempt counter and intent; the launch and the
job's move to provisioning), and a broker SIGKILLed between any two of them leaves nothing a restart cannot
make right, on SQLite and on PostgreSQL: a broker process places one job on the local Vast API and kills itself
at each point in turn (tests/broker/kill_between_writes.py); a new process reconciles (the audit must be clean:
no job placing, no intent, no instance without its one live allocation), then places the job — one machine,
never two.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.models import JobState
from standins.vastapi.server import VastApiServer
from tests.broker.harness import ROOT, Brokers, audit, child_env, submit_jobs

# (flag, K): killed after the K-th write committed, or just before the K-th write (after what came between).
KILL_POINTS = [("--after", 1), ("--after", 2), ("--before", 3), ("--after", 3)]
NAMES = ["claim|intent", "intent|launch", "launch|record", "record|end"]


@pytest.fixture(params=["sqlite", "postgres"])
async def brokers(request: pytest.FixtureRequest, tmp_path: Path, vast_api: VastApiServer,
                  aws_proxy_config) -> AsyncIterator[Brokers]:
    # Both stores: the writes of a placement are single statements with RETURNING and conditional UPDATEs,
    # whose locking differs (PostgreSQL's row locks, SQLite's one writer).
    db_url = f"sqlite:///{tmp_path / 'kills.db'}" if request.param == "sqlite" else \
        request.getfixturevalue("pg_database")()
    env = child_env(db_url, vast_api.url, aws_proxy_config.endpoint_url)
    if request.param == "postgres":
        # The restart is the only broker (the killed one is gone): its reconcile is exclusive, as an operator's
        # after a crash would be; otherwise the job left placing waits out stale_after as if another replica
        # were placing it.
        env["LOCKSTEP_TEST_EXCLUSIVE"] = "1"
    b = Brokers(f"kills-{secrets.token_hex(3)}", db_url, env, tmp_path / "brokers.log")
    yield b
    await b.kill_all()


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("flag", "k"), KILL_POINTS, ids=NAMES)
async def test_a_broker_killed_between_two_writes_of_a_placement_leaves_nothing_a_restart_cannot_fix(
        flag: str, k: int, brokers: Brokers, vast_api: VastApiServer, aws_proxy_config) -> None:
    db_url, installation = brokers.db_url, brokers.installation
    [job] = await submit_jobs(db_url, 1)  # a Vast job
    rents_before = sum(1 for r in vast_api.state.requests if r["method"] == "PUT")
    with brokers.log.open("ab") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.broker.kill_between_writes", "--installation", installation, "--job", job.id,
            flag, str(k), cwd=ROOT, env=brokers.env, stdout=asyncio.subprocess.PIPE, stderr=err)
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == -9, (proc.returncode, out, brokers.log.read_text()[-3000:])
    rented = sum(1 for r in vast_api.state.requests if r["method"] == "PUT") - rents_before
    assert rented == (1 if (flag, k) in (("--before", 3), ("--after", 3)) else 0)  # the kill came where meant

    second = await brokers.start("recover")
    report = (await second.line())["report"]
    assert not report["unreachable"], report
    after = await audit(db_url, installation, aws_proxy_config.endpoint_url, vast_api.state, events=True)
    assert not after.problems, f"{report}\n{after.explain()}"
    assert after.jobs[job.id].state in (JobState.pending, JobState.provisioning), after.explain()
    second.go()
    result = await second.result()
    done = await audit(db_url, installation, aws_proxy_config.endpoint_url, vast_api.state)
    assert not done.problems, done.explain()
    assert done.jobs[job.id].state is JobState.provisioning, json.dumps(result)
    assert len(done.vast) == 1  # one machine for the job, whichever process rented it
