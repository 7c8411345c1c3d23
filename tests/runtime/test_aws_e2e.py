"""Issue 14's "done means" on AWS, through the real broker: the service places a job at moto's EC2 (its
wrapper and manifest in moto's S3), the boot script Lockstep generated runs as the instance would
(standins/ec2.py), and the broker's own poll sees the command's end, its exit code and its log, and gives the
machine back; a 2-node job's nodes meet at a TCP barrier; the end is seen across a broker restart; an instance
stopped under a running job requeues it (issue 15); a spot interruption notice checkpoints the command and its
replacement runs before the old machine is gone (issue 30)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import socket
import sys
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiobotocore.session import AioSession

from broker.config import BrokerConfig, RuntimeConfig, SecretsConfig, Settings
from broker.models import Allocation, AllocationState, Job, JobState, utcnow
from broker.reconcile import reconcile
from broker.service import Lockstep
from broker.specs import parse_spec
from broker.store import Store
from providers.aws import AwsProvider
from providers.aws.config import AwsConfig
from providers.aws.runtime import RunLocation
from providers.runtime.logs import parse_log
from standins.ec2 import BUCKET, FakeImds, Node, ec2_client, runtime_overrides, s3_client
from tests.aws.loopback import on_loopback
from tests.plugins.moto import moto_config
from tests.runtime.barrier import SCRIPT as BARRIER_SCRIPT
from tests.runtime.barrier import check_barrier
from tests.waiting import eventually

pytestmark = pytest.mark.aws

INSTALLATION = "lockstep-rt"
SECRET = "hf_live_Zq8r2Kp0x7Wm"
SECRET_SHA = hashlib.sha256(SECRET.encode()).hexdigest()


class AwsBroker:
    """A Lockstep over moto alone, with the run-time contract on; ``restart()`` gives a new one on the same DB."""

    def __init__(self, tmp_path: Path, config: AwsConfig, session: AioSession) -> None:
        secret_file = tmp_path / "hf-prod"
        secret_file.write_text(SECRET + "\n")
        self.db_path = tmp_path / "broker.db"
        self.config = config
        self.session = session
        self.settings = Settings(
            db_url=f"sqlite:///{self.db_path}", broker=BrokerConfig(installation=INSTALLATION),
            secrets=SecretsConfig(files={"hf-prod": str(secret_file)}),
            runtime=RuntimeConfig(log_interval_s=0.3, grace_s=2))
        self.tmp_path = tmp_path
        self.svc = self._service()

    def _service(self) -> Lockstep:
        aws = AwsProvider(self.config, installation=INSTALLATION, session=self.session)
        store = Store(self.settings.db_url)
        store.migrate()
        return Lockstep(self.settings, providers={"aws": aws}, store=store)

    @property
    def aws(self) -> AwsProvider:
        provider = self.svc.market.providers["aws"]
        assert isinstance(provider, AwsProvider)
        return provider

    async def restart(self) -> None:
        """The broker process dies and a new one starts: new providers, the same database; the start-up
        reconciliation as BrokerLoops.start runs it."""
        await self.svc.aclose()
        self.svc = self._service()
        await self.svc.refresh()
        report = await reconcile(self.svc.store, self.svc.market.providers, lifecycle=self.svc.broker.lifecycle)
        assert not report.unreachable and not report.requeued, report

    async def submit(self, **spec: Any) -> Job:
        data = {"name": "rt", "gpu": "A10G", "gpus": 1, "providers": ["aws"], "markets": ["on_demand"],
                "workload": {"hours": 1}}
        data.update(spec)
        return await self.svc.submit(parse_spec(data))

    async def place(self, job: Job) -> tuple[Job, Allocation]:
        await self.svc.place_now([job.id])
        job = await self.svc.get_job(job.id)
        assert job.state is JobState.provisioning, job.reason
        [alloc] = [a for a in await self.svc.job_allocations(job.id) if a.state is not AllocationState.released]
        await self.svc.poll_now()
        job = await self.svc.get_job(job.id)
        assert job.state is JobState.running, job.reason
        return job, alloc

    def nodes(self, alloc: Allocation, imds: FakeImds, **kw: Any) -> list[Node]:
        desc = ec2_client(self.endpoint).describe_instances(InstanceIds=alloc.resource_ids)
        for inst in (i for r in desc["Reservations"] for i in r["Instances"]):
            imds.nodes[inst["InstanceId"]] = inst["PrivateIpAddress"]
        return [Node(self.endpoint, iid, self.tmp_path / "nodes", imds, **kw) for iid in alloc.resource_ids]

    async def run_job(self, alloc: Allocation, **kw: Any) -> tuple[Job, Node]:
        """Boot the attempt's single instance as EC2 would, then one broker poll; the job after it."""
        async with FakeImds() as imds:
            [node] = self.nodes(alloc, imds, **kw)
            await node.run()
        await self.svc.poll_now()
        return await self.svc.get_job(alloc.job_id), node

    @property
    def endpoint(self) -> str:
        assert self.config.endpoint_url
        return self.config.endpoint_url

    def instance_states(self, alloc: Allocation) -> list[str]:
        desc = ec2_client(self.endpoint).describe_instances(InstanceIds=alloc.resource_ids)
        by_id = {i["InstanceId"]: i["State"]["Name"] for r in desc["Reservations"] for i in r["Instances"]}
        return [by_id[i] for i in alloc.resource_ids]


@pytest.fixture
async def broker(tmp_path: Path, aws_moto: str, aws_session: AioSession) -> AsyncIterator[AwsBroker]:
    b = AwsBroker(tmp_path, moto_config(aws_moto, **runtime_overrides(aws_moto)), aws_session)
    await b.svc.refresh()
    yield b
    await b.svc.aclose()


def out_lines(text: str, rank: int = 0) -> list[str]:
    return [ln.text for ln in parse_log(text, rank) if ln.stream == "out"]


def ended_event(job: Job) -> Any:
    return [e for e in job.events if e.to_state in (JobState.succeeded, JobState.failed)][-1]


async def test_a_command_that_exits_3_fails_with_its_code_and_log_and_its_instance_goes_without_a_cancel(
    broker: AwsBroker
) -> None:
    job, alloc = await broker.place(await broker.submit(command="echo line-1; echo line-2; exit 3"))
    job, node = await broker.run_job(alloc)
    assert node.exit_code == 3, node.console()
    assert job.state is JobState.failed, job.reason
    event = ended_event(job)
    assert event.data["exit_code"] == 3 and event.data["exit_reason"] == "exited"
    assert "line-2" in event.data["last_lines"] and "exit code 3" in job.reason
    assert not [e for e in job.events if e.to_state is JobState.cancelled]
    assert broker.instance_states(alloc) == ["terminated"]
    [rec] = await broker.svc.job_allocations(job.id)
    assert rec.state is AllocationState.failed  # given back (recorded as how it ended), not live any more
    assert out_lines(await broker.aws.job_log(rec)) == ["line-1", "line-2"]


async def test_env_files_data_and_a_secret_reach_the_command_and_the_secret_appears_nowhere_else(
    broker: AwsBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    s3_client(broker.endpoint).put_object(Bucket=BUCKET, Key="datasets/tiny.txt", Body=b"tiny-dataset-row\n")
    command = ('python3 -c "import hashlib,os; print(\'secret-sha256\', '
               'hashlib.sha256(os.environ[\'HF_TOKEN\'].encode()).hexdigest())"; '
               'echo "greeting=$GREETING"; echo "params=$(cat conf/params.txt)"; cat "$LOCKSTEP_DATA_PATH"; '
               'echo "ckpt=$LOCKSTEP_CHECKPOINT_URI"; echo "token-echo $HF_TOKEN"')
    job, alloc = await broker.place(await broker.submit(
        command=command, env={"GREETING": "hello"}, secrets={"HF_TOKEN": "hf-prod"},
        files={"conf/params.txt": "lr=0.1\n"}, data={"uri": f"s3://{BUCKET}/datasets/tiny.txt"}))
    job, node = await broker.run_job(alloc)
    assert node.exit_code == 0, node.console()
    assert job.state is JobState.succeeded, job.reason
    assert broker.instance_states(alloc) == ["terminated"]
    [rec] = await broker.svc.job_allocations(job.id)
    log_text = await broker.aws.job_log(rec)
    where = RunLocation.of(broker.config, INSTALLATION, job.id, job.attempts)
    assert out_lines(log_text) == [
        f"secret-sha256 {SECRET_SHA}", "greeting=hello", "params=lr=0.1", "tiny-dataset-row",
        f"ckpt={where.checkpoint_uri}", "token-echo *****"]

    # The value went only into the manifest in S3, which is gone now that the attempt is released.
    assert SECRET not in node.user_data and SECRET not in log_text and SECRET not in node.console()
    assert not [c for c in node.calls("docker") if any(SECRET in a for a in c)]  # -e NAME, never the value
    s3 = s3_client(broker.endpoint)
    left = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=where.prefix).get("Contents", [])]
    assert where.manifest not in left and where.log(0) in left
    for key in left:
        assert SECRET.encode() not in s3.get_object(Bucket=BUCKET, Key=key)["Body"].read(), key
    assert SECRET not in caplog.text
    assert SECRET not in json.dumps([e.model_dump(mode="json") for e in job.events])
    assert SECRET not in job.model_dump_json() and SECRET not in rec.model_dump_json()
    await broker.svc.aclose()  # flush the database to its file
    for path in broker.db_path.parent.glob(broker.db_path.name + "*"):
        assert SECRET.encode() not in path.read_bytes(), path


async def test_max_duration_stops_the_command_fails_the_job_with_that_reason_and_releases(
    broker: AwsBroker
) -> None:
    job, alloc = await broker.place(await broker.submit(command="echo started; sleep 120", max_duration="2s"))
    job, node = await broker.run_job(alloc)
    assert node.exit_code == 143, node.console()  # TERM at max_duration
    assert job.state is JobState.failed and "max_duration" in job.reason, job.reason
    assert ended_event(job).data["exit_reason"] == "max_duration"
    assert broker.instance_states(alloc) == ["terminated"]
    [rec] = await broker.svc.job_allocations(job.id)
    assert rec.state is AllocationState.failed
    assert "max_duration of 2 s reached" in await broker.aws.job_log(rec)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_two_nodes_see_one_rendezvous_and_meet_at_a_tcp_barrier(broker: AwsBroker) -> None:
    port = free_port()
    job, alloc = await broker.place(await broker.submit(
        gpus=2, gpus_per_node=1, command="python3 barrier.py", files={"barrier.py": BARRIER_SCRIPT}, rdzv_port=port))
    assert len(alloc.resource_ids) == 2
    async with FakeImds() as imds:
        nodes = broker.nodes(alloc, imds)
        addrs = [imds.nodes[n.instance_id] for n in nodes]  # rank order = launch index = resource_ids
        # moto's private addresses lead nowhere: give them to lo, so each node listens and connects as itself.
        with on_loopback(addrs):
            codes = await asyncio.gather(*(n.run() for n in nodes))
        assert codes == [0, 0], [n.console() for n in nodes]
        assert imds.refused == 0  # every metadata read came with an IMDSv2 token
    await broker.svc.poll_now()
    job = await broker.svc.get_job(job.id)
    assert job.state is JobState.succeeded, job.reason
    assert broker.instance_states(alloc) == ["terminated", "terminated"]
    [rec] = await broker.svc.job_allocations(job.id)
    logs = [out_lines(await broker.aws.job_log(rec, rank=r), r) for r in (0, 1)]
    check_barrier(logs, addrs, port, gpus_per_node=1)


@pytest.mark.parametrize("shutdown_terminates", [True, False], ids=["instance-terminated", "instance-running"])
async def test_an_attempt_that_ended_while_the_broker_was_down_is_seen_ended_after_the_restart(
    broker: AwsBroker, shutdown_terminates: bool
) -> None:
    job, alloc = await broker.place(await broker.submit(command="echo bye; exit 7"))
    await broker.svc.aclose()  # the broker goes down; the job runs on
    async with FakeImds() as imds:
        [node] = broker.nodes(alloc, imds, shutdown_terminates=shutdown_terminates)
        assert await node.run() == 7, node.console()
    await broker.restart()  # reconciliation requeues nothing (asserted inside)
    await broker.svc.poll_now()
    job = await broker.svc.get_job(job.id)
    assert job.state is JobState.failed and job.preemptions == 0 and job.attempts == 1, job.reason
    assert ended_event(job).data["exit_code"] == 7
    assert broker.instance_states(alloc) == ["terminated"]


async def test_an_instance_stopped_under_a_running_job_requeues_it_counted_with_the_reason(
    broker: AwsBroker
) -> None:
    job, alloc = await broker.place(await broker.submit(command="sleep 600"))
    ec2_client(broker.endpoint).stop_instances(InstanceIds=alloc.resource_ids)
    await broker.svc.poll_now()
    job = await broker.svc.get_job(job.id)
    assert job.state is JobState.pending and job.preemptions == 1, job.reason
    [preempted] = [e for e in job.events if e.to_state is JobState.preempted]
    assert alloc.resource_ids[0] in preempted.reason and "stopped" in preempted.reason
    [rec] = await broker.svc.job_allocations(job.id)
    assert rec.state is AllocationState.preempted
    assert broker.instance_states(alloc) == ["terminated"]  # the stopped instance is given back, not left


# --------------------------------------------------------------------------- interruption notice (issue 30)
# Notice → checkpoint → replacement, make before break: EC2 gives the two-minute notice; the wrapper hears it,
# SIGTERMs the command (which checkpoints and holds on), and beats the notice into the run-time bucket; the
# broker's next poll makes the old allocation ``draining`` and requeues the job, whose replacement is placed and
# runs while the old machine still checkpoints. The replacement resumes from the checkpoint; the old machine, its
# command done, shuts itself down and is booked as preempted. The checkpoint is an object in moto's S3 under the
# job's ``LOCKSTEP_CHECKPOINT_URI`` (the same for every attempt). Nothing is timed.

# Counts steps; saves its step to LOCKSTEP_CHECKPOINT_URI every CKPT_EVERY_S (60 s, the interval) and on
# SIGTERM (the notice), then holds until the test lets it go; an attempt that finds a checkpoint resumes from it
# and ends. On EC2 the instance profile gives it S3 access; here the job's environment names moto's.
WORKLOAD = r'''
import json, os, signal, sys, time
import boto3
bucket, _, prefix = os.environ["LOCKSTEP_CHECKPOINT_URI"].removeprefix("s3://").partition("/")
s3 = boto3.client("s3")
d, attempt, every = os.environ["CKPT_DIR"], os.environ["LOCKSTEP_ATTEMPT"], float(os.environ["CKPT_EVERY_S"])
saved = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", []))
step = json.loads(s3.get_object(Bucket=bucket, Key=saved[-1])["Body"].read())["step"] if saved else 0
print("attempt %s starts at step %d" % (attempt, step), flush=True)
if step:
    print("resumed from step %d" % step, flush=True)
    sys.exit(0)
def save():
    s3.put_object(Bucket=bucket, Key="%sckpt-%08d.json" % (prefix, step), Body=json.dumps({"step": step}))
    print("checkpointed step %d" % step, flush=True)
def on_term(signum, frame):
    signal.signal(signum, signal.SIG_IGN)  # the tree gets it more than once
    save()
    open(os.path.join(d, "saved-%s" % attempt), "w").close()
    while not os.path.exists(os.path.join(d, "let-go")):
        time.sleep(0.05)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(d, "running-%s" % attempt), "w").close()
last = time.monotonic()
while True:
    step += 1
    time.sleep(0.01)
    if time.monotonic() - last >= every:
        save()
        last = time.monotonic()
'''


async def test_the_notice_checkpoints_and_the_replacement_runs_before_the_old_machine_is_gone(
        broker: AwsBroker, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    workload = tmp_path / "workload.py"
    workload.write_text(WORKLOAD)
    moto_s3 = {"AWS_ENDPOINT_URL": broker.endpoint, "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    job = await broker.submit(markets=["spot"], interruptible=True, checkpoint_minutes=1,
                              command=f"exec {sys.executable} {workload}",
                              env={"CKPT_DIR": str(ckpt), "CKPT_EVERY_S": "60", **moto_s3})
    job, first = await broker.place(job)
    async with FakeImds() as imds:
        [old] = broker.nodes(first, imds)
        await old.start()

        async def exists(path: Path) -> bool:
            return await asyncio.to_thread(path.exists)

        await eventually(lambda: exists(ckpt / "running-1"), bool, "attempt 1's command runs")
        deadline = utcnow().replace(microsecond=0) + timedelta(minutes=2)
        noticed = time.monotonic()
        imds.interrupt(old.instance_id, at=deadline.isoformat().replace("+00:00", "Z"))
        notice = await eventually(lambda: broker.aws.notice(first), lambda n: n is not None,
                                  "the wrapper beats the notice into the bucket")
        assert notice is not None and notice.action == "terminate" and notice.deadline == deadline
        await eventually(lambda: exists(ckpt / "saved-1"), bool, "attempt 1 checkpoints on the SIGTERM")
        where = RunLocation.of(broker.config, INSTALLATION, job.id, first.attempt)
        bucket, _, prefix = where.checkpoint_uri.removeprefix("s3://").partition("/")
        listed = s3_client(broker.endpoint).list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
        [key] = [o["Key"] for o in listed]  # one checkpoint in moto's S3: the notice's (no 60 s save yet)
        assert key.removeprefix(prefix).startswith("ckpt-"), key

        await broker.svc.poll_now()
        job = await broker.svc.get_job(job.id)
        assert job.state is JobState.pending and job.preemptions == 1, job.reason
        draining = next(a for a in await broker.svc.job_allocations(job.id) if a.id == first.id)
        assert draining.state is AllocationState.draining and draining.cost_usd is None
        assert broker.instance_states(first) == ["running"]  # make before break

        await broker.svc.place_now([job.id])
        second = next(a for a in await broker.svc.job_allocations(job.id) if a.id != first.id)
        assert second.attempt == first.attempt + 1
        await broker.svc.poll_now()
        assert (await broker.svc.get_job(job.id)).state is JobState.running
        replaced_s = time.monotonic() - noticed  # a figure for the README (pytest -s), never asserted
        assert broker.instance_states(first) == ["running"]  # both run: the old one still checkpointing

        [new] = broker.nodes(second, imds)
        assert await new.run() == 0, new.console()
        (ckpt / "let-go").write_text("")
        await old.wait()
    await broker.svc.poll_now()

    job = await broker.svc.get_job(job.id)
    assert job.state is JobState.succeeded, job.reason
    recs = {a.id: a for a in await broker.svc.job_allocations(job.id)}
    assert recs[first.id].state is AllocationState.preempted and recs[first.id].cost_usd is not None
    assert broker.instance_states(first) == ["terminated"] and broker.instance_states(second) == ["terminated"]
    lines = out_lines(await broker.aws.job_log(recs[second.id]))
    resumed = [ln for ln in lines if ln.startswith("resumed from step ")]
    assert resumed and int(resumed[0].split()[-1]) > 0, lines
    saved = [ln for ln in out_lines(await broker.aws.job_log(recs[first.id])) if ln.startswith("checkpointed step ")]
    assert saved and int(saved[0].split()[-1]) == int(resumed[0].split()[-1])  # no step lost past the checkpoint
    body = s3_client(broker.endpoint).get_object(Bucket=bucket, Key=key)["Body"].read()
    assert json.loads(body) == {"step": int(resumed[0].split()[-1])}  # resumed from the object the notice saved
    print(f"\nnotice -> replacement running: {replaced_s:.1f} s (the wrapper polls the metadata service every "
          f"5 s; the test polls and places at once); steps lost: 0 of {saved[0].split()[-1]}")
    assert [e.to_state for e in job.events].count(JobState.preempted) == 1
