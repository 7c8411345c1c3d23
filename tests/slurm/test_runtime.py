"""Issue 14's and 15's "done means" on the local Slurm cluster, through the real broker (the service, its
router, JobLifecycle.follow on each poll): the in-job wrapper runs under srun on every node, its log and exit
status come back through the shared job directory, a 2-node job's nodes meet at a TCP barrier, a secret
reaches the command and nowhere else, and a node whose slurmd dies under a running job requeues it.

The cluster is shared: every job is this session's installation's and is released by the test; a test that
kills a slurmd restarts it and resumes the node in a ``finally``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig, RuntimeConfig, SecretsConfig, Settings
from broker.models import Allocation, AllocationState, Job, JobState
from broker.reconcile import reconcile
from broker.service import Lockstep
from broker.specs import parse_spec
from broker.store import Store
from providers.runtime.logs import parse_log
from providers.slurm import SlurmProvider
from providers.slurm.config import SlurmConfig
from providers.slurm.runtime import AttemptDir
from tests.plugins.slurm import SlurmCluster
from tests.runtime.barrier import SCRIPT as BARRIER_SCRIPT
from tests.runtime.barrier import check_barrier
from tests.waiting import eventually

pytestmark = pytest.mark.slurm

SECRET = "hf_slurm_Q4t9Lw2Zx8Vb"
SECRET_SHA = hashlib.sha256(SECRET.encode()).hexdigest()


class SlurmBroker:
    """A Lockstep over the local Slurm cluster alone, with its job directory under the test's tmp_path."""

    def __init__(self, tmp_path: Path, config: SlurmConfig, installation: str) -> None:
        secret_file = tmp_path / "hf-prod"
        secret_file.write_text(SECRET + "\n")
        self.db_path = tmp_path / "broker.db"
        self.config = config.model_copy(update={"job_dir": str(tmp_path / "jobs")})
        self.installation = installation
        self.settings = Settings(
            db_url=f"sqlite:///{self.db_path}", broker=BrokerConfig(installation=installation),
            secrets=SecretsConfig(files={"hf-prod": str(secret_file)}),
            runtime=RuntimeConfig(log_interval_s=0.3, grace_s=2))
        self.svc = self._service()

    def _service(self) -> Lockstep:
        self.slurm = SlurmProvider(self.config, installation=self.installation)
        store = Store(self.settings.db_url)
        store.migrate()
        return Lockstep(self.settings, providers={"slurm": self.slurm}, store=store)

    async def restart(self) -> None:
        """The broker process dies and a new one starts on the same database; start-up reconciliation."""
        await self.svc.aclose()
        self.svc = self._service()
        await self.svc.refresh()
        report = await reconcile(self.svc.store, self.svc.market.providers, lifecycle=self.svc.broker.lifecycle)
        assert not report.unreachable and not report.requeued, report

    async def submit(self, **spec: Any) -> Job:
        data: dict[str, Any] = {"name": "rt", "gpu": "H100", "gpus": 1, "providers": ["slurm"],
                                "markets": ["owned"], "workload": {"hours": 0.25}}
        data.update(spec)
        return await self.svc.submit(parse_spec(data))

    async def place(self, job: Job) -> Allocation:
        await self.svc.place_now([job.id])
        job = await self.svc.get_job(job.id)
        assert job.state is JobState.provisioning, job.reason
        [alloc] = [a for a in await self.svc.job_allocations(job.id) if a.state is not AllocationState.released]
        return alloc

    async def poll_until(self, job_id: str, states: tuple[JobState, ...], what: str, limit_s: float = 120) -> Job:
        async def step() -> Job:
            await self.svc.poll_now()
            return await self.svc.get_job(job_id)

        return await eventually(step, lambda j: j.state in states, what, limit_s)

    def where(self, job: Job) -> AttemptDir:
        return self.slurm.files.where(job.id, job.attempts)


def out_lines(text: str, rank: int = 0) -> list[str]:
    return [ln.text for ln in parse_log(text, rank) if ln.stream == "out"]


def ended_event(job: Job) -> Any:
    return [e for e in job.events if e.to_state in (JobState.succeeded, JobState.failed)][-1]


def slurm_job(cluster: SlurmCluster, job_id: str) -> dict[str, str]:
    """``scontrol show job`` as key → value (JobState, ExitCode, NodeList…)."""
    out = cluster.cli("scontrol", "show", "job", "-o", job_id)
    return dict(part.split("=", 1) for part in out.split() if "=" in part)


async def test_a_command_that_exits_3_fails_with_its_code_and_log_and_the_allocation_completes_uncancelled(
    broker: SlurmBroker, slurm_cluster: SlurmCluster
) -> None:
    job = await broker.submit(command="echo line-1; echo line-2 >&2; echo line-3; exit 3")
    alloc = await broker.place(job)
    job = await broker.poll_until(job.id, (JobState.failed, JobState.succeeded), "the job ended")
    assert job.state is JobState.failed, job.reason
    event = ended_event(job)
    assert event.data["exit_code"] == 3 and event.data["exit_reason"] == "exited"
    assert "line-3" in event.data["last_lines"] and "exit code 3" in job.reason
    assert not [e for e in job.events if e.to_state is JobState.cancelled]
    # Slurm ended it by itself, with the command's code: no cancel.
    info = slurm_job(slurm_cluster, alloc.resource_ids[0])
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "3:0", info
    [rec] = await broker.svc.job_allocations(job.id)
    assert rec.state is AllocationState.failed
    log_text = await broker.slurm.job_log(rec)
    assert out_lines(log_text) == ["line-1", "line-3"]
    assert [ln.text for ln in parse_log(log_text) if ln.stream == "err"] == ["line-2"]
    assert not broker.where(job).manifest.exists()  # removed by the batch script once srun ended


async def test_max_duration_stops_the_command_fails_the_job_with_that_reason_and_caps_slurms_limit(
    broker: SlurmBroker, slurm_cluster: SlurmCluster
) -> None:
    job = await broker.submit(command="echo started; sleep 120", max_duration="2s")
    alloc = await broker.place(job)
    info = slurm_job(slurm_cluster, alloc.resource_ids[0])
    assert info["TimeLimit"] == "00:03:00", info  # 2 s + 2 s grace + 2 min margin: Slurm's backstop
    job = await broker.poll_until(job.id, (JobState.failed, JobState.succeeded), "the job ended")
    assert job.state is JobState.failed and "max_duration" in job.reason, job.reason
    assert ended_event(job).data["exit_reason"] == "max_duration" and ended_event(job).data["exit_code"] == 143
    [rec] = await broker.svc.job_allocations(job.id)
    assert rec.state is AllocationState.failed
    assert "max_duration of 2 s reached" in await broker.slurm.job_log(rec)
    assert slurm_job(slurm_cluster, alloc.resource_ids[0])["JobState"] == "FAILED"


async def test_an_attempt_that_ended_while_the_broker_was_down_is_seen_ended_after_the_restart(
    broker: SlurmBroker, slurm_cluster: SlurmCluster
) -> None:
    job = await broker.submit(command="echo bye; exit 7")
    alloc = await broker.place(job)
    await broker.svc.aclose()  # the broker goes down; the job runs on, and ends
    await eventually(lambda: _async(slurm_job(slurm_cluster, alloc.resource_ids[0])["JobState"]),
                     lambda s: s == "FAILED", "the Slurm job ended")
    await broker.restart()  # reconciliation requeues nothing (asserted inside)
    job = await broker.poll_until(job.id, (JobState.failed, JobState.succeeded), "the end seen")
    assert job.state is JobState.failed and job.preemptions == 0 and job.attempts == 1, job.reason
    assert ended_event(job).data["exit_code"] == 7


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_two_nodes_see_one_rendezvous_and_meet_at_a_tcp_barrier(
    broker: SlurmBroker, slurm_cluster: SlurmCluster
) -> None:
    port = free_port()
    job = await broker.submit(gpus=16, gpus_per_node=8, fabric="infiniband", command="python3 barrier.py",
                              files={"barrier.py": BARRIER_SCRIPT}, rdzv_port=port)
    alloc = await broker.place(job)
    job = await broker.poll_until(job.id, (JobState.failed, JobState.succeeded), "the 2-node job ended")
    [rec] = await broker.svc.job_allocations(job.id)
    logs = [out_lines(await broker.slurm.job_log(rec, rank=r), r) for r in (0, 1)]
    assert job.state is JobState.succeeded, (job.reason, logs)
    nodes = slurm_cluster.cli("scontrol", "show", "hostnames", slurm_job(slurm_cluster, alloc.resource_ids[0])
                              ["NodeList"]).split()
    assert len(nodes) == 2
    # Every node: the same size, head and address list (NodeAddr of each node: 127.0.0.1 here), its own rank,
    # in the allocation's order.
    check_barrier(logs, ["127.0.0.1", "127.0.0.1"], port, gpus_per_node=8, hosts=nodes)
    assert slurm_job(slurm_cluster, alloc.resource_ids[0])["JobState"] == "COMPLETED"


async def test_a_node_whose_command_fails_ends_the_attempt_and_the_other_node_is_given_back(
    broker: SlurmBroker, slurm_cluster: SlurmCluster
) -> None:
    job = await broker.submit(gpus=16, gpus_per_node=8, fabric="infiniband",
                              command='if [ "$LOCKSTEP_NODE_RANK" = 1 ]; then echo boom; exit 5; fi; sleep 300')
    alloc = await broker.place(job)
    job = await broker.poll_until(job.id, (JobState.failed, JobState.succeeded), "the job ended")
    assert job.state is JobState.failed, job.reason
    event = ended_event(job)
    assert (event.data["exit_code"], event.data["node"], event.data["last_lines"][-1]) == (5, 1, "boom")
    # Rank 0 still ran: the lifecycle gave the allocation back at once.
    await eventually(lambda: _async(slurm_job(slurm_cluster, alloc.resource_ids[0])["JobState"]),
                     lambda s: s == "CANCELLED", "the rest of the Slurm job cancelled")


async def test_env_files_and_a_secret_reach_the_command_and_the_secret_appears_nowhere_else(
    broker: SlurmBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    command = ('python3 -c "import hashlib,os; print(\'secret-sha256\', '
               'hashlib.sha256(os.environ[\'HF_TOKEN\'].encode()).hexdigest())"; '
               'echo "greeting=$GREETING"; echo "params=$(cat conf/params.txt)"; echo "pwd=$PWD"; '
               'echo "ckpt=$LOCKSTEP_CHECKPOINT_DIR"; echo "token-echo $HF_TOKEN"')
    job = await broker.submit(command=command, env={"GREETING": "hello"}, secrets={"HF_TOKEN": "hf-prod"},
                              files={"conf/params.txt": "lr=0.1\n"})
    await broker.place(job)
    job = await broker.poll_until(job.id, (JobState.failed, JobState.succeeded), "the job ended")
    [rec] = await broker.svc.job_allocations(job.id)
    log_text = await broker.slurm.job_log(rec)
    assert job.state is JobState.succeeded, (job.reason, log_text)
    where = broker.where(job)
    lines = out_lines(log_text)
    assert lines[:3] == [f"secret-sha256 {SECRET_SHA}", "greeting=hello", "params=lr=0.1"], lines
    assert lines[3].startswith("pwd=/") and lines[3].endswith(f"lockstep-{job.id}")
    assert lines[4:] == [f"ckpt={where.checkpoints}/", "token-echo *****"]

    # The value went only into the manifest, which is gone now; nothing else in the job directory holds it.
    assert not where.manifest.exists()
    for path in where.job_path.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in caplog.text
    assert SECRET not in json.dumps([e.model_dump(mode="json") for e in job.events])
    assert SECRET not in job.model_dump_json() and SECRET not in rec.model_dump_json()
    await broker.svc.aclose()  # flush the database to its file
    for path in broker.db_path.parent.glob(broker.db_path.name + "*"):
        assert SECRET.encode() not in path.read_bytes(), path


async def test_an_image_job_is_refused_at_quote_time_on_a_pool_without_a_container_runtime(
    broker: SlurmBroker
) -> None:
    base = {"name": "img", "gpu": "H100", "gpus": 1, "providers": ["slurm"], "command": "true",
            "workload": {"hours": 0.25}}
    quote = await broker.svc.quote(parse_spec({**base, "image": "nvcr.io/nvidia/pytorch:24.05-py3"}))
    assert quote.options == []
    h100 = [r for r in quote.rejected if r.code not in ("gpu_model",)]
    assert h100 and all(r.code == "image" and "no container runtime" in r.reason for r in h100), quote.rejected
    job = await broker.submit(image="nvcr.io/nvidia/pytorch:24.05-py3", command="true")
    await broker.svc.place_now([job.id])
    job = await broker.svc.get_job(job.id)
    assert job.state is JobState.pending and "image" in job.reason, job.reason
    assert await broker.svc.job_allocations(job.id) == []
    # Without the image the same job has options.
    assert (await broker.svc.quote(parse_spec(base))).options


# --------------------------------------------------------------------------- a node dies under a job (issue 15)


def slurmd_pid(cluster: SlurmCluster, node: str) -> int:
    run_dir = Path(cluster.conf).parent.parent / "run"
    return int((run_dir / f"slurmd-{node}.pid").read_text().strip())


def node_state(cluster: SlurmCluster, node: str) -> str:
    return cluster.cli("sinfo", "-h", "-n", node, "-o", "%T").strip().split("\n")[0]


def restart_slurmd(cluster: SlurmCluster, node: str) -> None:
    """Start the node's slurmd again as deploy/slurm/up.sh does, and resume the node."""
    try:
        os.kill(slurmd_pid(cluster, node), 0)
    except (ProcessLookupError, FileNotFoundError, ValueError):
        subprocess.run(["slurmd", "-f", cluster.conf, "-N", node], env=cluster.env(), check=True, timeout=60)
    cluster.cli("scontrol", "update", f"nodename={node}", "state=resume", check=False)


async def test_a_node_whose_slurmd_dies_under_a_running_job_requeues_it_counted_with_the_reason(
    broker: SlurmBroker, slurm_cluster: SlurmCluster
) -> None:
    job = await broker.submit(gpus=16, gpus_per_node=8, fabric="infiniband", command="echo up; sleep 600")
    alloc = await broker.place(job)
    job = await broker.poll_until(job.id, (JobState.running,), "the 2-node job running")
    [rec] = await broker.svc.job_allocations(job.id)

    async def both_logs() -> list[list[str]]:
        return [out_lines(await broker.slurm.job_log(rec, rank=r), r) for r in (0, 1)]

    await eventually(both_logs, lambda logs: logs == [["up"], ["up"]], "the command running on both nodes")
    nodes = slurm_cluster.cli("scontrol", "show", "hostnames",
                              slurm_job(slurm_cluster, alloc.resource_ids[0])["NodeList"]).split()
    victim = nodes[1]
    try:
        os.kill(slurmd_pid(slurm_cluster, victim), signal.SIGKILL)
        # slurmctld notices after SlurmdTimeout (30 s here), marks the node down and requeues the job;
        # each broker poll follows what Slurm says.
        job = await broker.poll_until(job.id, (JobState.pending, JobState.failed, JobState.succeeded),
                                      "the job requeued after its node died", limit_s=240)
        assert job.state is JobState.pending and job.preemptions == 1, job.reason
        [preempted] = [e for e in job.events if e.to_state is JobState.preempted]
        assert alloc.resource_ids[0] in preempted.reason and "requeued" in preempted.reason, preempted.reason
        [rec] = await broker.svc.job_allocations(job.id)
        assert rec.state is AllocationState.preempted
        # Lockstep gave the Slurm job back (its own requeue is a new attempt, not Slurm's rerun).
        await eventually(lambda: _async(slurm_job(slurm_cluster, alloc.resource_ids[0])["JobState"]),
                         lambda s: s == "CANCELLED", "the requeued Slurm job cancelled")
    finally:
        restart_slurmd(slurm_cluster, victim)
        await eventually(lambda: _async(node_state(slurm_cluster, victim)),
                         lambda s: s in ("idle", "mixed", "allocated"), f"{victim} back in service", limit_s=120)


async def _async(value: Any) -> Any:
    return value


def test_job_dirs_are_per_installation_job_and_attempt_and_never_leave_the_job_dir() -> None:
    a = AttemptDir.of("/shared/jobs", "lab", "job-1", 2)
    assert str(a.path) == "/shared/jobs/lab/job-1/a2" and a.checkpoints == a.job_path / "checkpoints"
    b = AttemptDir.of("/shared/jobs", "../etc", "..", 1)
    assert str(b.path) == "/shared/jobs/_etc/_/a1"
