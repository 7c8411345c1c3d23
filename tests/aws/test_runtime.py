"""The run-time contract on EC2, at the adapter: what a launch puts in S3 and in the user data, and what poll
and job_log read back once the boot script Lockstep generated has run as the instance would (moto's EC2 and
S3 on loopback; standins/ec2.py runs the script)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from broker.config import RuntimeConfig
from broker.errors import BadRequestError
from broker.models import AllocationState, ExitReason, JobSpec, Market, Offer
from providers.aws import AwsProvider
from providers.aws.config import AwsConfig
from providers.aws.requests import RUNTIME_TAG
from providers.aws.runtime import EFA_ENV, MAX_PRESIGN_S, RunLocation, aws_manifest, upload_ttl_s
from providers.base import LaunchRequest, OfferQuery
from providers.runtime.logs import parse_log
from providers.runtime.manifest import RunRequest, wrapper_source
from standins.ec2 import BUCKET, FakeImds, Node, ec2_client, s3_client
from tests.aws.conftest import INSTALLATION, job, pick

pytestmark = pytest.mark.aws

SECRET = "hf_live_7c1d9e0b5a4f"  # a value that must reach the command and nothing else


def run_request(spec: JobSpec, *, job_id: str = "job-rt", attempt: int = 1,
                secrets: dict[str, str] | None = None) -> RunRequest:
    return RunRequest.for_launch(spec, job_id=job_id, attempt=attempt,
                                 secrets={k: SecretStr(v) for k, v in (secrets or {}).items()},
                                 runtime=RuntimeConfig(log_interval_s=0.3, grace_s=2))


def request(offer: Offer, command: str, *, nodes: int = 1, job_id: str = "job-rt", attempt: int = 1,
            secrets: dict[str, str] | None = None, **spec: Any) -> LaunchRequest:
    the_spec = job(gpu=offer.gpu, gpus=offer.gpu_count * nodes, gpus_per_node=offer.gpu_count, command=command,
                   **({"secrets": sorted(secrets)} if secrets else {}), **spec)
    return LaunchRequest(job_id=job_id, tenant="team-a", attempt=attempt, spec=the_spec, offer=offer, nodes=nodes,
                         installation=INSTALLATION,
                         run=run_request(the_spec, job_id=job_id, attempt=attempt, secrets=secrets))


async def a10g(aws: AwsProvider) -> Offer:
    return pick(await aws.offers(OfferQuery(gpus=["A10G"], markets=[Market.on_demand])), "g5.xlarge",
                Market.on_demand)


def s3_text(endpoint: str, key: str) -> str | None:
    s3 = s3_client(endpoint)
    try:
        return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()
    except s3.exceptions.NoSuchKey:
        return None


async def boot_one(alloc: Any, endpoint: str, tmp_path: Path, *, shutdown_terminates: bool = True) -> Node:
    """Run the allocation's (one) boot script as its instance would; the node, its boot ended."""
    async with FakeImds() as imds:
        node = Node(endpoint, alloc.resource_ids[0], tmp_path, imds, shutdown_terminates=shutdown_terminates)
        await node.run()
    return node


async def started(node: Node) -> Node:
    """``node`` booting, once its command has touched the file ``started`` (the boot goes on)."""
    await node.start()
    for _ in range(240):
        if node.files("started"):
            break
        await asyncio.sleep(0.25)
    assert node.files("started"), node.console()
    return node


def state_of(endpoint: str, instance_id: str) -> str:
    desc = ec2_client(endpoint).describe_instances(InstanceIds=[instance_id])
    return desc["Reservations"][0]["Instances"][0]["State"]["Name"]


async def test_launch_stages_the_wrapper_and_manifest_and_the_user_data_only_fetches_them(
    run_aws: AwsProvider, aws_moto: str
) -> None:
    offer = await a10g(run_aws)
    req = request(offer, "echo hi", secrets={"HF_TOKEN": SECRET}, env={"MODE": "train"}, max_duration="2h")
    alloc = await run_aws.launch(req)
    where = RunLocation.of(run_aws.config, INSTALLATION, "job-rt", 1)
    assert alloc.attrs["runtime"] == where.uri == f"s3://{BUCKET}/lockstep/{INSTALLATION}/job-rt/a1/"
    [iid] = alloc.resource_ids
    ec2 = ec2_client(aws_moto)
    inst = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    assert {t["Key"]: t["Value"] for t in inst["Tags"]}[RUNTIME_TAG] == where.uri
    behaviour = ec2.describe_instance_attribute(InstanceId=iid, Attribute="instanceInitiatedShutdownBehavior")
    assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"

    assert s3_text(aws_moto, where.wrapper) == wrapper_source()
    manifest = json.loads(s3_text(aws_moto, where.manifest) or "{}")
    assert manifest["secrets"] == {"HF_TOKEN": SECRET}  # the values travel here, and only here
    assert manifest["env"]["MODE"] == "train" and manifest["env"]["LOCKSTEP_JOB_ID"] == "job-rt"
    assert manifest["env"]["LOCKSTEP_CHECKPOINT_URI"] == f"s3://{BUCKET}/lockstep/{INSTALLATION}/job-rt/checkpoints/"
    assert manifest["shutdown"] == ["shutdown", "-h", "now"]
    assert manifest["rendezvous"]["mode"] == "single"
    assert manifest["container"]["runtime"] == "docker" and manifest["container"]["image"] == req.spec.container_image()
    assert set(manifest["logs"]["put_urls"]) == set(manifest["logs"]["status_put_urls"]) == {"0"}
    logs = manifest["logs"]
    assert "log-0.txt" in logs["put_urls"]["0"] and "status-0.json" in logs["status_put_urls"]["0"]
    assert "X-Amz-Expires=" + str(3600 + 900 + 7200 + 2 + 3600) in manifest["logs"]["put_urls"]["0"]

    from standins.ec2 import user_data_of

    script = user_data_of(aws_moto, iid)
    assert script.startswith("#!/bin/bash\n") and SECRET not in script and "train" not in script
    assert "wrapper.py?" in script and "manifest.json?" in script and "X-Amz-Expires=3600" in script


async def test_a_command_that_exits_3_ends_failed_with_its_log_and_its_instance_terminated(
    run_aws: AwsProvider, aws_moto: str, tmp_path: Path
) -> None:
    offer = await a10g(run_aws)
    req = request(offer, "echo line-1; echo line-2 >&2; echo $LOCKSTEP_JOB_ID/$LOCKSTEP_ATTEMPT; exit 3")
    alloc = await run_aws.launch(req)
    assert (await run_aws.poll(alloc)).state is AllocationState.running
    assert await run_aws.job_log(alloc) == ""  # nothing shipped yet
    node = await boot_one(alloc, aws_moto, tmp_path)
    assert node.exit_code == 3, node.console()
    # The wrapper shut the machine down: terminated at moto, with no release by Lockstep.
    assert state_of(aws_moto, alloc.resource_ids[0]) == "terminated"
    assert node.calls("shutdown") == [["-h", "now"]]
    [docker] = node.calls("docker")
    assert docker[0] == "run" and req.spec.container_image() in docker and "--gpus" in docker
    status = await run_aws.poll(alloc)
    assert status.state is AllocationState.failed, status
    assert status.exit is not None and status.exit.exit_code == 3 and status.exit.reason is ExitReason.exited
    assert "line-1" in status.exit.last_lines
    lines = parse_log(await run_aws.job_log(alloc))
    assert [ln.text for ln in lines if ln.stream == "out"] == ["line-1", "job-rt/1"]  # stdout in order
    assert [ln.text for ln in lines if ln.stream == "err"] == ["line-2"]
    assert all(ln.at is not None for ln in lines)


async def test_an_ended_command_is_seen_while_its_instance_still_runs_and_release_ends_it(
    run_aws: AwsProvider, aws_moto: str, tmp_path: Path
) -> None:
    offer = await a10g(run_aws)
    alloc = await run_aws.launch(request(offer, "echo done"))
    node = await boot_one(alloc, aws_moto, tmp_path, shutdown_terminates=False)
    assert node.exit_code == 0, node.console()
    assert state_of(aws_moto, alloc.resource_ids[0]) == "running"  # its shutdown has not happened (yet)
    status = await run_aws.poll(alloc)
    assert status.state is AllocationState.succeeded and status.exit is not None and status.exit.exit_code == 0
    await run_aws.release(alloc)
    assert state_of(aws_moto, alloc.resource_ids[0]) == "terminated"
    # Released: the manifest (which would hold the secrets) is deleted; the log and status stay for `logs`.
    where = RunLocation.of(run_aws.config, INSTALLATION, "job-rt", 1)
    assert s3_text(aws_moto, where.manifest) is None
    assert s3_text(aws_moto, where.status(0)) is not None and "done" in (s3_text(aws_moto, where.log(0)) or "")


async def test_the_wrapper_stopped_as_its_machine_goes_down_is_a_preemption(
    run_aws: AwsProvider, aws_moto: str, tmp_path: Path
) -> None:
    offer = await a10g(run_aws)
    alloc = await run_aws.launch(request(offer, "touch started; echo working; sleep 300"))
    async with FakeImds() as imds:
        node = await started(Node(aws_moto, alloc.resource_ids[0], tmp_path, imds))
        node.terminate_wrapper()  # systemd's TERM when the instance stops or is reclaimed
        assert await node.wait() == 143, node.console()
    status = await run_aws.poll(alloc)
    assert status.state is AllocationState.preempted, status
    assert "stopped by a signal" in status.reason and status.exit is None


async def test_an_instance_stopped_under_a_job_with_no_status_is_a_preemption(
    run_aws: AwsProvider, aws_moto: str
) -> None:
    offer = await a10g(run_aws)
    alloc = await run_aws.launch(request(offer, "sleep 300"))
    ec2_client(aws_moto).stop_instances(InstanceIds=alloc.resource_ids)
    status = await run_aws.poll(alloc)
    assert status.state is AllocationState.preempted
    assert alloc.resource_ids[0] in status.reason and "stopped" in status.reason


async def test_peer_list_is_published_at_launch_again_on_an_adopted_launch_and_after_a_restart(
    run_aws: AwsProvider, runtime_config: AwsConfig, aws_moto: str, aws_session: Any
) -> None:
    offer = await a10g(run_aws)
    req = request(offer, "hostname", nodes=3)
    alloc = await run_aws.launch(req)
    where = RunLocation.of(run_aws.config, INSTALLATION, "job-rt", 1)
    doc = json.loads(s3_text(aws_moto, where.peers) or "{}")
    desc = ec2_client(aws_moto).describe_instances(InstanceIds=alloc.resource_ids)
    by_id = {i["InstanceId"]: i for r in desc["Reservations"] for i in r["Instances"]}
    ordered = sorted(by_id.values(), key=lambda i: i["AmiLaunchIndex"])
    assert doc == {"nodes": [{"id": i["InstanceId"], "addr": i["PrivateIpAddress"]} for i in ordered]}
    assert alloc.resource_ids == [i["InstanceId"] for i in ordered]  # rank order
    manifest = json.loads(s3_text(aws_moto, where.manifest) or "{}")
    assert manifest["rendezvous"]["mode"] == "peers" and manifest["rendezvous"]["identity"] == "imds"
    assert where.peers in manifest["rendezvous"]["peers_url"]

    s3 = s3_client(aws_moto)
    s3.delete_object(Bucket=BUCKET, Key=where.peers)
    again = await run_aws.launch(req)  # the same attempt retried: adopted by its client token
    assert again.resource_ids == alloc.resource_ids
    assert json.loads(s3_text(aws_moto, where.peers) or "{}") == doc

    s3.delete_object(Bucket=BUCKET, Key=where.peers)
    async with AwsProvider(runtime_config, installation=INSTALLATION, session=aws_session) as restarted:
        [owned] = await restarted.owned()  # what a reconcile adopts after a crash
        assert owned.attrs["runtime"] == where.uri
        assert (await restarted.poll(owned)).state is AllocationState.running
    assert json.loads(s3_text(aws_moto, where.peers) or "{}") == doc


async def test_without_a_bucket_a_plain_job_runs_as_before_and_one_with_env_is_refused(
    aws: AwsProvider, aws_moto: str
) -> None:
    offer = await a10g(aws)
    alloc = await aws.launch(request(offer, "nvidia-smi"))
    from standins.ec2 import user_data_of

    assert "docker run" in user_data_of(aws_moto, alloc.resource_ids[0])
    assert await aws.job_log(alloc) == ""
    with pytest.raises(BadRequestError) as err:
        await aws.launch(request(offer, "env", job_id="job-env", env={"A": "1"}, secrets={"HF_TOKEN": SECRET}))
    assert "aws.runtime_bucket" in str(err.value) and "env" in str(err.value) and "secrets" in str(err.value)
    assert SECRET not in str(err.value)


def test_efa_settings_in_the_manifest_and_the_jobs_own_values_win() -> None:
    spec = job(gpu="H100", gpus=16, gpus_per_node=8, command="torchrun x", env={"FI_EFA_FORK_SAFE": "0"})
    run = run_request(spec)
    manifest = aws_manifest(run, log_urls={}, status_urls={}, peers_url="u", data_url="", checkpoint_uri="", efa=True)
    args = manifest["container"]["args"]
    assert args[args.index("--device") + 1] == "/dev/infiniband" and "memlock=-1:-1" in args
    assert {k: manifest["env"][k] for k in EFA_ENV} == {**EFA_ENV, "FI_EFA_FORK_SAFE": "0"}
    plain = aws_manifest(run, log_urls={}, status_urls={}, peers_url="u", data_url="", checkpoint_uri="", efa=False)
    assert plain["container"]["args"] == [] and "FI_PROVIDER" not in plain["env"]
    # Issue 30: the wrapper polls the metadata service for spot's notice and delivers SIGTERM.
    assert plain["notice"] == {"imds": True, "every_s": 5.0, "rebalance": True, "deliver": "SIGTERM"}


def test_upload_urls_live_for_the_run_and_at_most_seven_days() -> None:
    config = AwsConfig(runtime_bucket="runs")
    assert upload_ttl_s(run_request(job(command="x", max_duration="2h")), config) == 3600 + 900 + 7200 + 2 + 3600
    assert upload_ttl_s(run_request(job(command="x")), config) == MAX_PRESIGN_S
    assert upload_ttl_s(run_request(job(command="x", max_duration="30d")), config) == MAX_PRESIGN_S


async def test_a_long_log_goes_up_in_parts_and_reads_back_whole_with_a_heartbeat(
    run_aws: AwsProvider, aws_moto: str, tmp_path: Path
) -> None:
    """Issue 27: the log of more than one part (1 MiB each) is read back in order from its parts; the wrapper's
    heartbeat reached the bucket."""
    offer = await a10g(run_aws)
    alloc = await run_aws.launch(request(offer, "seq 1 60000"))
    assert await run_aws.heartbeat(alloc) is None  # nothing yet
    node = await boot_one(alloc, aws_moto, tmp_path)
    assert node.exit_code == 0, node.console()
    where = RunLocation.of(run_aws.config, INSTALLATION, "job-rt", 1)
    assert s3_text(aws_moto, where.log(0, 1)) is not None  # a second part
    lines = [ln.text for ln in parse_log(await run_aws.job_log(alloc)) if ln.stream == "out"]
    assert lines == [str(n) for n in range(1, 60001)]
    assert await run_aws.heartbeat(alloc) is not None


def runs_instances(request: Any, body: bytes) -> bool:
    return b"Action=RunInstances" in body


async def launch_through_faults(runtime_config: AwsConfig, aws_session: Any, aws_moto: str, kind: str,
                                req_of: Any) -> tuple[Any, Exception | None, int]:
    """Launch with every RunInstances call faulted by ``kind`` (EC2's ClientToken replayed as EC2 does); the
    allocation or the error, and how many RunInstances calls the proxy saw."""
    from standins.faults import FaultProxy, aws_error, ec2_client_token

    proxy = await FaultProxy(aws_moto, 1.0, 1, kinds=(kind,), error_body=aws_error,
                             spare=lambda r, b: not runs_instances(r, b), replay=ec2_client_token).start()
    try:
        config = runtime_config.model_copy(update={"endpoint_url": proxy.url})  # S3 stays straight at moto
        async with AwsProvider(config, installation=INSTALLATION, session=aws_session) as aws:
            req = req_of(await a10g(aws))
            try:
                return await aws.launch(req), None, proxy.total
            except Exception as exc:
                return None, exc, proxy.total
    finally:
        await proxy.stop()


async def test_a_launch_whose_answer_was_lost_is_found_by_its_token_and_boots_from_its_manifest(
    runtime_config: AwsConfig, aws_session: Any, aws_moto: str, tmp_path: Path
) -> None:
    """EC2 bought the instance but its every answer was lost: the launch returns what the token bought, and the
    manifest the instance boots from is kept (deleting it would leave a paid machine with nothing to run)."""
    alloc, error, calls = await launch_through_faults(
        runtime_config, aws_session, aws_moto, "lost", lambda offer: request(offer, "echo ran-$LOCKSTEP_ATTEMPT"))
    assert error is None and calls >= 2  # the transport retried; every answer was lost
    assert len(alloc.resource_ids) == 1
    where = RunLocation.of(runtime_config, INSTALLATION, "job-rt", 1)
    assert alloc.attrs["runtime"] == where.uri and s3_text(aws_moto, where.manifest) is not None
    assert len(ec2_client(aws_moto).describe_instances()["Reservations"]) == 1  # one instance, not one per retry
    node = await boot_one(alloc, aws_moto, tmp_path)
    assert node.exit_code == 0, node.console()
    async with AwsProvider(runtime_config, installation=INSTALLATION, session=aws_session) as aws:
        status = await aws.poll(alloc)
        assert status.state is AllocationState.succeeded, status
        lines = parse_log(await aws.job_log(alloc))
        assert [ln.text for ln in lines if ln.stream == "out"] == ["ran-1"]


async def test_a_launch_refused_before_ec2_acted_leaves_no_manifest_behind(
    runtime_config: AwsConfig, aws_session: Any, aws_moto: str
) -> None:
    """Every RunInstances answered 503 before it reached EC2: nothing was bought, so the manifest (it holds the
    job's secret values) is deleted and the error stands."""
    alloc, error, calls = await launch_through_faults(
        runtime_config, aws_session, aws_moto, "503",
        lambda offer: request(offer, "echo hi", secrets={"HF_TOKEN": SECRET}))
    assert alloc is None and getattr(error, "retryable", False) and calls >= 1, error
    assert SECRET not in str(error)
    where = RunLocation.of(runtime_config, INSTALLATION, "job-rt", 1)
    assert s3_text(aws_moto, where.manifest) is None
    assert s3_text(aws_moto, where.wrapper) is not None  # staged, harmless: no secret in it
    assert ec2_client(aws_moto).describe_instances()["Reservations"] == []


async def test_a_signal_from_the_broker_reaches_the_command_through_the_control_object(
    run_aws: AwsProvider, aws_moto: str, tmp_path: Path
) -> None:
    """SignalsJobs on EC2 (a stop for cost's SIGTERM): the broker writes the attempt's control object; the node's
    wrapper reads it, the command gets SIGTERM, checkpoints in its trap and exits; the end is the wrapper's."""
    offer = await a10g(run_aws)
    alloc = await run_aws.launch(request(
        offer, "trap 'echo checkpointed; exit 0' TERM; touch started; while true; do sleep 0.1; done"))
    where = RunLocation.of(run_aws.config, INSTALLATION, "job-rt", 1)
    manifest = json.loads(s3_text(aws_moto, where.manifest) or "{}")
    assert "control.json" in manifest["logs"]["control_url"]
    async with FakeImds() as imds:
        node = await started(Node(aws_moto, alloc.resource_ids[0], tmp_path, imds))
        await run_aws.signal(alloc, "TERM")
        assert json.loads(s3_text(aws_moto, where.control) or "{}")["signal"] == "SIGTERM"
        await asyncio.wait_for(node.wait(), 60)
    status = await run_aws.poll(alloc)
    assert status.state in (AllocationState.preempted, AllocationState.failed), status  # the lifecycle's to judge
    out = [ln.text for ln in parse_log(await run_aws.job_log(alloc))]
    assert "SIGTERM from the broker" in out and "checkpointed" in out, out


async def test_signalling_without_a_runtime_bucket_is_refused_in_one_line(aws: AwsProvider) -> None:
    offer = await a10g(aws)
    alloc = await aws.launch(request(offer, "sleep 60"))
    with pytest.raises(BadRequestError, match=r"aws\.runtime_bucket"):
        await aws.signal(alloc, "TERM")
    await aws.release(alloc)
