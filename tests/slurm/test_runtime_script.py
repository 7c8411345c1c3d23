"""The Slurm run-time contract as text: the batch script, the srun line for each container runtime, the
manifest, Slurm's time limit and exit codes (providers/slurm/runtime.py). Pure: no cluster needed; the same
script runs for real in tests/slurm/test_runtime.py."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from pydantic import SecretStr

from broker.errors import BadRequestError
from broker.models import ExitReason, JobSpec, Locality, Offer, Workload
from providers.base import LaunchRequest
from providers.runtime.manifest import RunRequest
from providers.runtime.wrapper import CONTAINER_SHELL, command_argv
from providers.slurm import SlurmProvider
from providers.slurm.config import SlurmConfig
from providers.slurm.runtime import (
    AttemptDir,
    JobFiles,
    batch_script,
    exit_without_status,
    pyxis_image,
    slurm_exit_code,
    slurm_manifest,
    time_limit_min,
)

WHERE = AttemptDir.of("/shared/jobs", "lab", "job-1", 2)
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"


def run(**kw: object) -> RunRequest:
    base: dict[str, object] = {"job_id": "job-1", "attempt": 2, "command": "python3 train.py", "nodes": 2,
                               "gpus_per_node": 8}
    base.update(kw)
    return RunRequest.model_validate(base)


def script(image: str | None, runtime: str) -> str:
    return batch_script(WHERE, installation="lab", image=image, container_runtime=runtime, python="python3")


def srun_line(text: str) -> list[str]:
    [line] = [ln for ln in text.splitlines() if ln.startswith("srun ")]
    return shlex.split(line)


def test_the_batch_script_runs_one_wrapper_per_node_and_removes_the_manifest_after() -> None:
    text = script(None, "none")
    argv = srun_line(text)
    assert argv[:6] == ["srun", "--export=ALL", "--nodes=${SLURM_JOB_NUM_NODES}", "--ntasks=${SLURM_JOB_NUM_NODES}",
                        "--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    assert argv[6:8] == ["sh", "-c"] and not any(a.startswith("--container") for a in argv)
    assert "python3 /shared/jobs/lab/job-1/a2/wrapper.py /shared/jobs/lab/job-1/a2/manifest.json; rc=$?" in argv[8]
    # The node-local work folder is named by Lockstep's job and attempt, never by Slurm's job id (issue 29).
    assert 'TMPDIR="$b/lockstep-job-1-a2-n${SLURM_NODEID}"' in argv[8] and "SLURM_JOB_ID" not in argv[8]
    # Addresses before the step, the manifest removed after it, the step's code as the job's.
    lines = text.splitlines()
    srun_at = next(i for i, ln in enumerate(lines) if ln.startswith("srun "))
    assert lines.index('export LOCKSTEP_NODE_ADDRS="$addrs"') < srun_at
    assert lines[-3:] == ["rc=$?", "rm -f /shared/jobs/lab/job-1/a2/manifest.json", "exit $rc"]
    assert "LOCKSTEP_NODE_RANK" not in text  # each node's rank is its SLURM_NODEID, never one for all
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_pyxis_runs_the_wrapper_inside_the_image_with_the_job_dir_mounted() -> None:
    argv = srun_line(script(IMAGE, "pyxis"))
    assert "--container-image=nvcr.io#nvidia/pytorch:24.05-py3" in argv
    assert "--container-mounts=/shared/jobs/lab/job-1:/shared/jobs/lab/job-1" in argv
    assert argv.index("--container-image=nvcr.io#nvidia/pytorch:24.05-py3") < argv.index("sh")
    # The manifest does not wrap the command again: it already runs in the image.
    assert "container" not in slurm_manifest(run(image=IMAGE), WHERE, "pyxis")


def test_apptainer_runs_the_wrapper_on_the_host_and_the_command_in_apptainer_exec() -> None:
    argv = srun_line(script(IMAGE, "apptainer"))
    assert not any(a.startswith("--container") for a in argv)
    manifest = slurm_manifest(run(image=IMAGE), WHERE, "apptainer")
    assert manifest["container"] == {"runtime": "apptainer", "image": IMAGE}
    assert command_argv({**manifest, "workdir": "/tmp/w"}, []) == [
        "apptainer", "exec", "--nv", "--pwd", "/tmp/w", "--bind", "/tmp/w", f"docker://{IMAGE}", *CONTAINER_SHELL,
        "python3 train.py"]


def test_pyxis_image_names() -> None:
    assert pyxis_image("nvcr.io/nvidia/pytorch:24.05-py3") == "nvcr.io#nvidia/pytorch:24.05-py3"
    assert pyxis_image("localhost:5000/me/img") == "localhost:5000#me/img"
    assert pyxis_image("pytorch/pytorch:2.3.0") == "pytorch/pytorch:2.3.0"  # Docker Hub: as it is
    assert pyxis_image("ubuntu") == "ubuntu"


def test_the_manifest_logs_to_the_shared_dir_with_rank_from_slurm_and_a_shared_checkpoint_dir() -> None:
    m = slurm_manifest(run(secrets={"HF_TOKEN": SecretStr("s3cr3t-value")}), WHERE, "none")
    assert m["rendezvous"]["mode"] == "env" and m["rendezvous"]["gpus_per_node"] == 8
    assert m["logs"]["file"] == "/shared/jobs/lab/job-1/a2/log-{rank}.txt"
    assert m["logs"]["status_dir"] == "/shared/jobs/lab/job-1/a2" and m["logs"]["stdout"] is False
    assert m["env"]["LOCKSTEP_CHECKPOINT_DIR"] == "/shared/jobs/lab/job-1/checkpoints/"
    assert m["secrets"] == {"HF_TOKEN": "s3cr3t-value"} and "container" not in m
    own = slurm_manifest(run(checkpoint_uri="s3://b/ck/"), WHERE, "none")
    assert own["env"]["LOCKSTEP_CHECKPOINT_URI"] == "s3://b/ck/" and "LOCKSTEP_CHECKPOINT_DIR" not in own["env"]


def test_slurms_time_limit_caps_max_duration_and_exit_codes_read_both_ways() -> None:
    assert time_limit_min(run(), 90) == 90
    assert time_limit_min(run(max_duration_s=2.0, grace_s=2.0), 90) == 3  # 2 s + 2 s grace + 120 s margin
    assert time_limit_min(run(max_duration_s=7200.0), 30) == 123
    assert slurm_exit_code(3 << 8) == 3 and slurm_exit_code(3) == 3 and slurm_exit_code(None) is None
    end = exit_without_status(None, "TIMEOUT", "", "srun: error: oops\n")
    assert end.exit_code == 127 and end.reason is ExitReason.max_duration and "srun: error: oops" in end.last_lines


async def test_a_host_only_pool_refuses_an_image_job_before_any_request(tmp_path: Path) -> None:
    cfg = SlurmConfig(enabled=True, url="http://127.0.0.1:9", token=SecretStr("x"), job_dir=str(tmp_path))
    spec = JobSpec(name="img", gpu=["H100"], gpus=1, gpus_per_node=1, workload=Workload(hours=1), image=IMAGE)
    offer = Offer(id="o", provider="slurm", market="owned", sku="n", gpu="H100-SXM", gpu_count=8, usd_per_hour=1,
                  locality=Locality(provider="slurm", region="onprem"))
    async with SlurmProvider(cfg, installation="lab") as p:
        with pytest.raises(BadRequestError, match="no container runtime"):
            await p.launch(LaunchRequest(job_id="job-1", spec=spec, offer=offer, nodes=1, installation="lab"))
    assert not any(tmp_path.iterdir())  # nothing staged  # noqa: ASYNC240 (a tmp dir, once)


async def test_a_job_dir_the_broker_cannot_write_is_a_clear_configuration_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    cfg = SlurmConfig(enabled=True, url="http://127.0.0.1:9", token=SecretStr("x"), job_dir=str(blocker / "jobs"))
    files = JobFiles(cfg, "lab")
    with pytest.raises(BadRequestError, match=r"slurm\.job_dir: cannot write"):
        await files.stage(run(secrets={"HF_TOKEN": SecretStr("s3cr3t-value")}))
