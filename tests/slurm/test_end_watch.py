"""Release at the end, not at the next poll (issue 24 item 4), on Slurm: the end watch (broker/loops.py) reads the
wrapper's exit status file in the attempt's folder of the shared job directory (``SlurmProvider.end_reported``:
no slurmrestd call) and follows it with a poll at once.

On the local Slurm cluster through the real broker loops, with a poll interval of a minute: a command that exits
with code 3 fails its job with that code and has its allocation released and booked — Slurm's own elapsed time
× the rate, as tests/slurm/test_billing.py checks — with no poll pass between its end and its release. The command
waits for a file the test writes once the loops' first poll pass has seen it running, so nothing here is timed
tightly: the end only has to come before the loops' second poll pass would have.

Without a cluster (the provider over a temporary job directory): only this attempt's statuses count, by the
poll's rule; a new submission of an attempt clears what an earlier one left; and a poll that finds Slurm still
running a job whose nodes have all ended spaces the next reports.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import SecretStr

import providers.slurm.api as api
from broker.models import Allocation, AllocationState, JobState
from providers.base import JOB_TAG, OWNER_TAG
from providers.runtime.manifest import RunRequest
from providers.slurm import SlurmProvider
from providers.slurm.config import SlurmConfig
from providers.slurm.provider import END_REPORT_AGAIN_MAX_S, END_REPORT_AGAIN_S
from providers.slurm.requests import ATTEMPT_TAG, TOKEN_TAG
from tests.plugins.slurm import SlurmCluster
from tests.slurm.test_runtime import SlurmBroker, ended_event, slurm_job
from tests.waiting import eventually

POLL_S = 60.0  # the loops' poll interval here: an end seen sooner is the end watch's


async def _async(value: object) -> object:
    return value


@pytest.fixture
async def watched(broker: SlurmBroker) -> AsyncIterator[SlurmBroker]:
    """The folder's broker (same database, job directory and installation) polling once a minute."""
    await broker.svc.aclose()
    broker.settings = broker.settings.model_copy(
        update={"broker": broker.settings.broker.model_copy(update={"poll_interval_s": POLL_S})})
    broker.svc = broker._service()
    await broker.svc.refresh()
    yield broker
    await broker.svc.broker.stop()


@pytest.mark.slurm
async def test_a_command_that_exits_3_is_released_by_the_end_watch_before_the_next_poll_and_booked_slurms_time(
    watched: SlurmBroker, slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    b = watched
    gate = tmp_path / "gate"
    job = await b.submit(command=f"while [ ! -e {gate} ]; do sleep 0.1; done; echo done; exit 3")
    alloc = await b.place(job)
    await b.poll_until(job.id, (JobState.running,), "a poll sees the command running")

    # The real loops from here on, each poll pass counted: the first comes at once, the next a minute later.
    loops = b.svc.broker
    passes: list[float] = []
    poll_once = loops.poll_once

    async def counted() -> int:
        n = await poll_once()
        passes.append(time.time())
        return n

    monkeypatch.setattr(loops, "poll_once", counted)
    await loops.start(reconcile_first=False)
    await eventually(lambda: _async(len(passes)), lambda n: n == 1, "the loops' first poll pass")
    first_pass = passes[0]
    gate.touch()  # the command ends now, with code 3

    job = await eventually(lambda: b.svc.get_job(job.id), lambda j: j.state in (JobState.failed, JobState.succeeded),
                           "the end watch ends the job", limit_s=POLL_S / 2)
    [rec] = await b.svc.job_allocations(job.id)
    # Released before the loops' next poll pass came: no pass since the first, well inside the interval.
    assert len(passes) == 1, passes
    assert rec.ended_at is not None and rec.ended_at.timestamp() < first_pass + POLL_S
    assert job.state is JobState.failed and "exit code 3" in job.reason, job.reason
    event = ended_event(job)
    assert event.data["exit_code"] == 3 and event.data["exit_reason"] == "exited"
    assert event.at.timestamp() < first_pass + POLL_S
    assert rec.state is AllocationState.failed and rec.cost_usd is not None
    # Slurm ended the job by itself with the command's code (the release cancelled nothing)...
    info = slurm_job(slurm_cluster, alloc.resource_ids[0])
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "3:0", info
    # ...and the booking is Slurm's own elapsed time × the rate.
    record = await b.slurm.client.job(alloc.resource_ids[0])
    assert record is not None and record.start_time and record.end_time
    elapsed = record.end_time - record.start_time
    assert rec.usd_per_hour > 0
    assert rec.billed_s == pytest.approx(elapsed)
    assert rec.cost_usd == pytest.approx(rec.usd_per_hour * elapsed / 3600)
    assert (await b.svc.get_job(job.id)).spent_usd == pytest.approx(rec.cost_usd)
    assert rec.ended_at.timestamp() == pytest.approx(record.end_time)
    # Nothing left to watch, and the poll that comes later changes nothing.
    assert await loops.watch_ends() == 0
    await poll_once()
    assert (await b.svc.job_allocations(job.id))[0].cost_usd == rec.cost_usd


# ---------------------------------------------------------------------------------------------- without a cluster

JOB = "job-1"


def provider(tmp_path: Path) -> SlurmProvider:
    cfg = SlurmConfig(enabled=True, url="http://127.0.0.1:9", token=SecretStr("x"), job_dir=str(tmp_path / "jobs"))
    return SlurmProvider(cfg, installation="lab")


def allocation(attempt: int = 2, nodes: int = 2) -> Allocation:
    return Allocation(id="slurm:onprem:7", job_id=JOB, attempt=attempt, provider="slurm", nodes=nodes,
                      state=AllocationState.running, resource_ids=["7"])


def write_status(p: SlurmProvider, attempt: int, rank: int, code: int, reason: str = "exited") -> None:
    where = p.files.where(JOB, attempt)
    where.path.mkdir(parents=True, exist_ok=True)
    where.status(rank).write_text(json.dumps({"exit_code": code, "reason": reason, "rank": rank}))


def slurm_says(state: str, nodes: int = 2, exit_code: int | None = None) -> api.JobInfo:
    return api.JobInfo(job_id=7, name=f"lockstep-{JOB}", state=state, flags=frozenset(), reason="None",
                       comment=f"{OWNER_TAG}=lab;{JOB_TAG}={JOB};{ATTEMPT_TAG}=2;{TOKEN_TAG}=tok", partition="gpu",
                       nodes=tuple(f"n{i}" for i in range(nodes)), node_count=nodes, gpu_type="h100",
                       gpus_per_node=1, constraints="", time_limit_min=10, submit_time=1.0, start_time=2.0,
                       end_time=None if state == "RUNNING" else 9.0, exit_code=exit_code)


async def test_only_this_attempts_statuses_report_its_end_by_the_polls_rule(tmp_path: Path) -> None:
    async with provider(tmp_path) as p:
        alloc = allocation()
        assert await p.end_reported(alloc) is False  # nothing written yet
        write_status(p, 1, 0, 3)  # the previous attempt's end (a fenced one's, say): its own folder
        write_status(p, 3, 0, 3)
        assert await p.end_reported(alloc) is False
        write_status(p, 2, 1, 0)  # rank 1 ended well while the head runs on: not the attempt's end
        assert await p.end_reported(alloc) is False
        write_status(p, 2, 1, 3)  # rank 1 failed: the attempt is over
        assert await p.end_reported(alloc) is True
        write_status(p, 2, 1, 0)
        write_status(p, 2, 0, 0)  # the head ended
        assert await p.end_reported(alloc) is True
        assert await p.end_reported(allocation().model_copy(update={"resource_ids": []})) is False


async def test_a_new_submission_of_an_attempt_clears_what_an_earlier_one_left(tmp_path: Path) -> None:
    async with provider(tmp_path) as p:
        where = p.files.where(JOB, 2)
        write_status(p, 2, 0, 3)
        where.heartbeat(0).write_text('{"at": "2026-01-01T00:00:00Z"}')
        where.log(0).write_text("2026-01-01T00:00:00Z out earlier\n")
        await p.files.stage(RunRequest.model_validate({"job_id": JOB, "attempt": 2, "command": "true", "nodes": 2}))
        assert await p.end_reported(allocation()) is False
        assert not where.status(0).exists() and not where.heartbeat(0).exists()
        assert where.log(0).exists()  # logs stay
        assert where.manifest.exists()


async def test_an_end_slurm_has_not_ended_yet_is_reported_again_later_not_at_every_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with provider(tmp_path) as p:
        alloc = allocation()
        answer = slurm_says("RUNNING")

        async def job(job_id: int | str) -> api.JobInfo:
            return answer

        monkeypatch.setattr(p.client, "job", job)
        now = [1000.0]
        p.monotonic = lambda: now[0]
        write_status(p, 2, 0, 3)
        write_status(p, 2, 1, 3)  # every node ended; Slurm still runs the batch script
        assert await p.end_reported(alloc) is True
        assert (await p.poll(alloc)).state is AllocationState.running
        assert await p.end_reported(alloc) is False  # not at the watch's next look...
        now[0] += END_REPORT_AGAIN_S
        assert await p.end_reported(alloc) is True  # ...but after a while
        assert (await p.poll(alloc)).state is AllocationState.running
        now[0] += END_REPORT_AGAIN_S
        assert await p.end_reported(alloc) is False  # the wait has doubled
        now[0] += END_REPORT_AGAIN_S
        assert await p.end_reported(alloc) is True
        for _ in range(8):  # and grows no longer than its cap
            assert (await p.poll(alloc)).state is AllocationState.running
        now[0] += END_REPORT_AGAIN_MAX_S - 0.01
        assert await p.end_reported(alloc) is False
        now[0] += 0.01
        assert await p.end_reported(alloc) is True
        answer = slurm_says("FAILED", exit_code=3)
        status = await p.poll(alloc)  # a poll pass finds Slurm's end: the exit code is the command's
        assert status.state is AllocationState.failed and status.exit is not None and status.exit.exit_code == 3
        assert await p.end_reported(alloc) is True
