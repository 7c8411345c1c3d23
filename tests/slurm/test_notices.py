"""Interruption notices → checkpoints, make before break, on Slurm (issue 30 item 2).

The broker submits an interruptible job with Slurm's ``--signal=USR1@120`` and the manifest's ``notice.trap``
SIGUSR1: the wrapper takes Slurm's USR1 as the notice, writes ``notice-<rank>.json`` in the attempt's folder and
sends the command SIGTERM (the command's shell ignores the USR1 Slurm sends every process of the step). The
broker reads that file at its next poll (``SlurmProvider.notice``: no slurmrestd call), the allocation becomes
``draining``, the job is placed again while the old Slurm job still runs, and the replacement resumes from the
checkpoint; the old Slurm job is booked and released once its command ends.

On the local Slurm cluster the notice is sent as Slurm sends it, to every process of the job
(``scancel --signal=USR1 --full``, SLURM_CONF exported); slurmrestd 22.05's signal call ends the job, so it is not
used. The test prints, without asserting on them, the time from the notice to the replacement running and the
work lost. A second test leaves the signal to Slurm: a 3-minute limit, and Slurm's own ``--signal`` (submitted
through slurmrestd) reaches the wrapper before it. Without a cluster: the submitted fields against the specs, the
manifest and shells, the notice files read, and an attempt that ended at its notice before a poll saw it.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

import providers.slurm.api as api
from broker.models import Allocation, AllocationState, ExitReason, JobExit, JobState
from providers.runtime.manifest import RunRequest
from providers.slurm import SlurmProvider
from providers.slurm.config import SlurmConfig
from providers.slurm.runtime import (
    IGNORE_NOTICE,
    NOTICE_LEAD_S,
    AttemptDir,
    batch_script,
    notice_signal,
    slurm_manifest,
    srun_argv,
    time_limit_min,
)
from tests.plugins.slurm import SlurmCluster
from tests.slurm.test_runtime import SlurmBroker, out_lines, slurm_job
from tests.waiting import eventually

# Counts steps (10 ms each), checkpoints every CKPT_S s and on SIGTERM (the wrapper's, at the notice) into
# LOCKSTEP_CHECKPOINT_DIR, one file per attempt renamed into place; after the notice's checkpoint it holds until the
# test lets it go, then exits. An attempt that finds a checkpoint resumes from the newest and ends when told.
WORKLOAD = r'''
import json, os, signal, sys, time
d, attempt = os.environ["LOCKSTEP_CHECKPOINT_DIR"], os.environ["LOCKSTEP_ATTEMPT"]
gate = sys.argv[1]
def newest():
    best = None
    for f in os.listdir(d):
        if f.startswith("ckpt-") and f.endswith(".json"):
            doc = json.load(open(os.path.join(d, f)))
            best = doc if best is None or doc["step"] > best["step"] else best
    return best
found = newest()
if found:
    print("attempt %s resumed from step %d" % (attempt, found["step"]), flush=True)
    open(os.path.join(gate, "running-%s" % attempt), "w").close()
    while not os.path.exists(os.path.join(gate, "finish")):
        time.sleep(0.05)
    sys.exit(0)
step, saved = 0, time.time()
def checkpoint(why):
    path = os.path.join(d, "ckpt-%s.json" % attempt)
    with open(path + ".tmp", "w") as fh:
        json.dump({"step": step, "at": time.time(), "why": why}, fh)
    os.replace(path + ".tmp", path)
def on_term(signum, frame):
    signal.signal(signum, signal.SIG_IGN)  # the tree gets it more than once
    checkpoint("notice")
    print("checkpointed step %d at the notice" % step, flush=True)
    while not os.path.exists(os.path.join(gate, "let-go")):
        time.sleep(0.05)
    print("attempt %s stops at step %d" % (attempt, step), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(gate, "running-%s" % attempt), "w").close()
while True:
    step += 1
    time.sleep(0.01)
    if time.time() - saved >= %(ckpt_s)s:
        checkpoint("interval")
        saved = time.time()
'''
CKPT_S = 60  # the workload's own checkpoint interval: work lost on a notice is what it did since the last one


async def exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


@pytest.mark.slurm
async def test_slurms_signal_checkpoints_the_command_and_the_replacement_resumes_while_the_old_job_drains(
    broker: SlurmBroker, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    b = broker
    gate = tmp_path / "gate"
    gate.mkdir()
    workload = tmp_path / "workload.py"
    workload.write_text(WORKLOAD.replace("%(ckpt_s)s", str(CKPT_S)))
    job = await b.submit(interruptible=True, checkpoint_minutes=1,
                         command=f"exec {sys.executable} {workload} {gate}")
    first = await b.place(job)
    slurm_id = first.resource_ids[0]
    manifest = json.loads(b.where(await b.svc.get_job(job.id)).manifest.read_text())
    assert manifest["notice"] == {"trap": "SIGUSR1", "deliver": "SIGTERM"}
    await eventually(lambda: exists(gate / "running-1"), bool, "attempt 1's command runs")
    job = await b.poll_until(job.id, (JobState.running,), "a poll sees attempt 1 running")
    assert await b.slurm.notice(first) is None  # no notice yet

    # The market's notice: Slurm's USR1 to every process of the job, as --signal sends it to the steps.
    noticed = time.time()
    slurm_cluster.cli("scancel", "--signal=USR1", "--full", slurm_id)
    notice = await eventually(lambda: b.slurm.notice(first), lambda n: n is not None,
                              "the wrapper writes the notice beside its status")
    assert notice is not None and notice.source == "slurm" and notice.action == "signal SIGUSR1"
    assert notice.rank == 0 and notice.seen_at is not None and notice.deadline is None
    ckpt_dir = Path(manifest["env"]["LOCKSTEP_CHECKPOINT_DIR"])
    await eventually(lambda: exists(ckpt_dir / "ckpt-1.json"), bool, "attempt 1 checkpoints on the SIGTERM")
    assert slurm_job(slurm_cluster, slurm_id)["JobState"] == "RUNNING"  # USR1 ended nothing: not the command

    # The broker's next poll: the allocation drains, the job is requeued, counted as a preemption.
    await b.svc.poll_now()
    job = await b.svc.get_job(job.id)
    assert job.state is JobState.pending and job.preemptions == 1, job.reason
    draining = next(a for a in await b.svc.job_allocations(job.id) if a.id == first.id)
    assert draining.state is AllocationState.draining and draining.cost_usd is None
    assert slurm_job(slurm_cluster, slurm_id)["JobState"] == "RUNNING"  # make before break

    # Placed again at once, while the old Slurm job still runs; the replacement resumes from the checkpoint.
    await b.svc.place_now([job.id])
    second = next(a for a in await b.svc.job_allocations(job.id) if a.id != first.id)
    assert second.attempt == first.attempt + 1 and second.resource_ids[0] != slurm_id
    await eventually(lambda: exists(gate / "running-2"), bool, "attempt 2's command runs")
    job = await b.poll_until(job.id, (JobState.running,), "a poll sees attempt 2 running")
    replaced = time.time()
    assert slurm_job(slurm_cluster, slurm_id)["JobState"] == "RUNNING"  # both run: the old one still draining

    (gate / "let-go").touch()  # the old command ends after its checkpoint: booked while the replacement runs

    async def old_booked() -> Allocation:
        await b.svc.poll_now()
        return next(a for a in await b.svc.job_allocations(job.id) if a.id == first.id)

    old = await eventually(old_booked, lambda a: a.state is not AllocationState.draining, "the old job is booked")
    assert old.state is AllocationState.preempted and old.cost_usd is not None and old.cost_usd > 0, old
    assert slurm_job(slurm_cluster, slurm_id)["JobState"] in ("COMPLETED", "FAILED", "CANCELLED")
    assert not [a for a in await b.slurm.owned() if a.resource_ids == first.resource_ids]  # given back
    assert (await b.svc.get_job(job.id)).state is JobState.running  # the replacement runs on
    assert b.slurm.files.where(job.id, 1).fence.read_text().strip() == "2"  # fenced once given back

    (gate / "finish").touch()
    job = await b.poll_until(job.id, (JobState.succeeded, JobState.failed), "the replacement ends")
    assert job.state is JobState.succeeded, job.reason

    recs = {a.id: a for a in await b.svc.job_allocations(job.id)}
    resumed = [ln for ln in out_lines(await b.slurm.job_log(recs[second.id])) if " resumed from step " in ln]
    assert resumed, out_lines(await b.slurm.job_log(recs[second.id]))
    step = int(resumed[0].split()[-1])
    old_lines = out_lines(await b.slurm.job_log(recs[first.id]))
    stopped = [int(ln.split()[-1]) for ln in old_lines if ln.startswith("attempt 1 stops at step ")]
    assert step > 0 and stopped, old_lines
    assert [e.to_state for e in job.events].count(JobState.preempted) == 1
    lost_steps = stopped[0] - step
    print(f"\nslurm notice: notice → replacement running {replaced - noticed:.1f} s; work lost {lost_steps} steps "
          f"({lost_steps * 0.01:.2f} s of 10 ms steps; the workload's checkpoint interval {CKPT_S} s)")


@pytest.mark.slurm
async def test_slurm_itself_sends_the_notice_the_broker_asked_for_before_the_time_limit(
    broker: SlurmBroker, slurm_cluster: SlurmCluster
) -> None:
    """No scancel here: a 3-minute limit, and Slurm's own --signal=USR1@120 (sent up to 60 s early, so within the
    job's first minute) reaches the wrapper through slurmrestd's submission."""
    b = broker
    job = await b.submit(interruptible=True, checkpoint_minutes=1, workload={"hours": 0.05},
                         command="trap 'echo checkpoint on TERM; sleep 60' TERM; echo up; "
                                 "while true; do sleep 0.2; done")
    first = await b.place(job)
    assert slurm_job(slurm_cluster, first.resource_ids[0])["TimeLimit"] == "00:03:00"
    await b.poll_until(job.id, (JobState.running,), "a poll sees the command running")
    notice = await eventually(lambda: b.slurm.notice(first), lambda n: n is not None,
                              "Slurm signals the job before its limit", limit_s=150)
    assert notice is not None and notice.action == "signal SIGUSR1"
    await eventually(lambda: b.slurm.job_log(first), lambda t: "checkpoint on TERM" in out_lines(t),
                     "the command gets the wrapper's SIGTERM")
    assert slurm_job(slurm_cluster, first.resource_ids[0])["JobState"] == "RUNNING"
    await b.svc.poll_now()
    rec = next(a for a in await b.svc.job_allocations(job.id) if a.id == first.id)
    assert rec.state is AllocationState.draining
    assert (await b.svc.get_job(job.id)).preemptions == 1


# ---------------------------------------------------------------------------------------------- without a cluster

def run_request(**kw: object) -> RunRequest:
    return RunRequest.model_validate({"job_id": "j1", "attempt": 1, "command": "python3 train.py", **kw})


def test_interruptible_jobs_get_slurms_signal_in_every_api_version(shared_data: Path) -> None:
    req = api.SubmitRequest(name="lockstep-j1", script="#!/bin/bash\ntrue\n", nodes=1, gpus_per_node=1,
                            gpu_type="h100", time_limit_min=30, comment="c", warn_signal="USR1", warn_s=120)
    spec38 = json.loads((shared_data / "slurm/specs/slurm_openapi_v0.0.38_plugin.json").read_text())
    props38 = spec38["components"]["schemas"]["v0.0.38_job_properties"]["properties"]
    body38 = api.submit_body("v0.0.38", req)
    assert set(body38["job"]) <= set(props38) and body38["job"]["signal"] == "USR1@120"
    spec41 = json.loads((shared_data / "slurm/specs/slurm_openapi_spec_v0.0.41_testsuite.json").read_text())
    props41 = spec41["components"]["schemas"]["v0.0.41_job_desc_msg"]["properties"]
    body41 = api.submit_body("v0.0.41", req)["job"]
    assert set(body41) <= set(props41)
    assert body41["kill_warning_signal"] == "USR1"
    assert body41["kill_warning_delay"] == {"set": True, "infinite": False, "number": 120}
    assert api.submit_body("v0.0.39", req)["job"]["kill_warning_delay"] == 120
    plain = api.SubmitRequest(name="x", script="", nodes=1, gpus_per_node=1, gpu_type="", time_limit_min=30,
                              comment="")
    for version in ("v0.0.38", "v0.0.39", "v0.0.41"):
        job = api.submit_body(version, plain)["job"]
        assert not {"signal", "kill_warning_signal", "kill_warning_delay"} & set(job)


def test_only_interruptible_jobs_with_room_for_the_lead_are_warned_and_after_their_max_duration() -> None:
    assert notice_signal(True, 30) == ("USR1", NOTICE_LEAD_S)
    assert notice_signal(False, 30) is None  # a job that does not resume is left to run to its end
    assert notice_signal(True, 2) is None  # 2 min: it would be warned at once
    run = run_request(max_duration_s=600.0, grace_s=30.0)
    # The notice comes after the wrapper's own stop at max_duration (+ grace), even 60 s early.
    limit = time_limit_min(run, 15, notice_lead_s=NOTICE_LEAD_S)
    assert limit * 60 - NOTICE_LEAD_S - 60 >= 600 + 30
    assert time_limit_min(run, 15) < limit


def test_the_manifest_traps_usr1_and_every_shell_and_the_command_ignore_it(tmp_path: Path) -> None:
    where = AttemptDir.of(str(tmp_path), "lab", "j1", 1)
    noticed = slurm_manifest(run_request(), where, "none", notice=True)
    assert noticed["notice"] == {"trap": "SIGUSR1", "deliver": "SIGTERM"}
    assert noticed["command"] == f"{IGNORE_NOTICE}\npython3 train.py"
    plain = slurm_manifest(run_request(), where, "none")
    assert "notice" not in plain and plain["command"] == "python3 train.py"
    assert f"\n{IGNORE_NOTICE}" in batch_script(where, installation="lab", image=None, container_runtime="none",
                                                python="python3")
    inner = srun_argv(where, image=None, container_runtime="none", python="python3")[-1]
    assert inner.index(IGNORE_NOTICE) < inner.index("wrapper.py")


def provider(tmp_path: Path) -> SlurmProvider:
    cfg = SlurmConfig(enabled=True, url="http://127.0.0.1:9", token=SecretStr("x"), job_dir=str(tmp_path / "jobs"))
    return SlurmProvider(cfg, installation="lab")


def allocation(attempt: int = 2, nodes: int = 2) -> Allocation:
    return Allocation(id="slurm:onprem:7", job_id="j1", attempt=attempt, provider="slurm", nodes=nodes,
                      state=AllocationState.running, resource_ids=["7"])


def write_notice(p: SlurmProvider, attempt: int, rank: int, kind: str = "interruption") -> None:
    where = p.files.where("j1", attempt)
    where.path.mkdir(parents=True, exist_ok=True)
    where.notice(rank).write_text(json.dumps({
        "kind": kind, "source": "slurm", "action": "signal SIGUSR1", "deadline": "",
        "seen_at": "2026-12-07T07:00:00.123Z", "rank": rank, "signal": "SIGTERM"}))


async def test_the_notice_is_this_attempts_first_notice_file_by_rank(tmp_path: Path) -> None:
    async with provider(tmp_path) as p:
        alloc = allocation()
        assert await p.notice(alloc) is None
        write_notice(p, 1, 0)  # an earlier attempt's: its own folder
        write_notice(p, 2, 0, kind="rebalance")  # reported, not acted on
        assert await p.notice(alloc) is None
        write_notice(p, 2, 1)
        notice = await p.notice(alloc)
        assert notice is not None and notice.rank == 1 and notice.source == "slurm" and notice.deadline is None
        assert notice.seen_at is not None and notice.seen_at.year == 2026
        p.files.where("j1", 2).notice(1).write_text("{not json")
        assert await p.notice(alloc) is None
        assert await p.notice(alloc.model_copy(update={"resource_ids": []})) is None


async def test_an_attempt_stopped_at_the_notice_that_ended_before_a_poll_saw_it_is_preempted_not_failed(
    tmp_path: Path
) -> None:
    async with provider(tmp_path) as p:
        alloc = allocation(nodes=1)
        end = JobExit(exit_code=0, reason=ExitReason.signal)
        assert (await p._ended_or_noticed(alloc, end, [])).state is AllocationState.failed  # no notice: a stop
        write_notice(p, 2, 0)
        status = await p._ended_or_noticed(alloc, end, ["n1"])
        assert status.state is AllocationState.preempted and "interruption notice" in status.reason
        done = JobExit(exit_code=0, reason=ExitReason.exited)  # it finished anyway: done
        assert (await p._ended_or_noticed(alloc, done, [])).state is AllocationState.succeeded
