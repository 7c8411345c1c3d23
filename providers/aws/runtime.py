"""The run-time contract on EC2: what each attempt puts in S3, and what the broker reads back (docs/aws.md).

An EC2 instance usually cannot reach the broker, and must not hold a broker credential; S3 is reachable
from any VPC. So each attempt of a job gets a folder of the run-time bucket, and everything crosses it
through presigned URLs (one operation on one object, for a limited time)::

    s3://<aws.runtime_bucket>/<aws.runtime_prefix>/<installation>/<job>/
        a<attempt>/wrapper.py          the in-job wrapper, as shipped           broker PUT, instance GET (boot)
        a<attempt>/manifest.json       its manifest, with the job's secrets     broker PUT, instance GET (boot);
                                                                                 deleted at release
        a<attempt>/peers.json          instance ids and private IPs by launch   broker PUT after RunInstances,
                                       index (jobs of more than one node)        instance GET (rendezvous)
        a<attempt>/log-<rank>.txt      each node's log, shipped while it runs   instance PUT, broker GET
                                       in parts of LOG_PART_BYTES: this is the
                                       first, then log-<rank>.p<n>.txt
        a<attempt>/heartbeat-<rank>.json  each node's wrapper, alive            instance PUT, broker GET
        a<attempt>/status-<rank>.json  each node's exit status                  instance PUT, broker GET
        a<attempt>/control.json        a signal from the broker to the job       broker PUT (SignalsJobs),
                                       (``{"seq": n, "signal": "SIGTERM"}``)      instance GET every few seconds
        checkpoints/                   LOCKSTEP_CHECKPOINT_URI of every attempt (unless the spec names one);
                                       the workload writes it with its own instance profile

:class:`RunFiles` does the I/O (through :class:`~providers.aws.client.S3Client`); the rest is pure.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import providers.aws.uploads as uploads
from broker.errors import BadRequestError, ProviderError
from broker.models import Allocation, JobExit, Notice, utcnow
from providers.aws.client import S3Client
from providers.aws.config import AwsConfig
from providers.aws.requests import boot_script
from providers.base import LaunchRequest
from providers.runtime.logs import parse_heartbeat, parse_notice, parse_status
from providers.runtime.manifest import RunRequest, build_manifest, docker_container, wrapper_source

log = logging.getLogger(__name__)

RUNTIME_ATTR = "runtime"  # Allocation.attrs: the attempt's folder, s3://bucket/prefix/
MAX_PRESIGN_S = 604_800  # SigV4's limit: 7 days
UPLOAD_MARGIN_S = 3600.0  # beyond boot + rendezvous + max_duration + grace, for the last uploads
SHUTDOWN = ("shutdown", "-h", "now")  # with InstanceInitiatedShutdownBehavior=terminate: billing ends
# What a container needs to use EFA (the uverbs devices, pinned memory), and libfabric/NCCL over it.
EFA_DOCKER_ARGS = ("--device", "/dev/infiniband", "--ulimit", "memlock=-1:-1", "--cap-add", "IPC_LOCK")
# A node's log goes up in parts: the open part again each round (at most this much), a full part never again.
LOG_PART_BYTES = 1 << 20
LOG_PARTS = 64  # 64 MiB per node reaches the bucket; the rest stays in the file on the machine
EFA_ENV = {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_FORK_SAFE": "1"}


@dataclass(frozen=True)
class RunLocation:
    """One attempt's folder in the run-time bucket."""

    bucket: str
    prefix: str  # the attempt's key prefix, ending in "/"
    job_prefix: str  # the job's (every attempt's) key prefix, ending in "/"

    @classmethod
    def of(cls, config: AwsConfig, installation: str, job_id: str, attempt: int) -> RunLocation:
        assert config.runtime_bucket
        base = "/".join(p.strip("/") for p in (config.runtime_prefix, installation, job_id) if p.strip("/"))
        return cls(config.runtime_bucket, f"{base}/a{attempt}/", f"{base}/")

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    @property
    def checkpoint_uri(self) -> str:
        return f"s3://{self.bucket}/{self.job_prefix}checkpoints/"

    @property
    def wrapper(self) -> str:
        return self.prefix + "wrapper.py"

    @property
    def manifest(self) -> str:
        return self.prefix + "manifest.json"

    @property
    def peers(self) -> str:
        return self.prefix + "peers.json"

    def log(self, rank: int, part: int = 0) -> str:
        return f"{self.prefix}log-{rank}.txt" if part == 0 else f"{self.prefix}log-{rank}.p{part}.txt"

    def heartbeat(self, rank: int) -> str:
        return f"{self.prefix}heartbeat-{rank}.json"

    def status(self, rank: int) -> str:
        return f"{self.prefix}status-{rank}.json"

    @property
    def control(self) -> str:
        return self.prefix + "control.json"


def split_s3_uri(uri: str) -> tuple[str, str]:
    """'s3://bucket/key' → ('bucket', 'key'); ('', '') for anything else."""
    if not uri.startswith("s3://"):
        return "", ""
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key


def upload_ttl_s(run: RunRequest, config: AwsConfig) -> int:
    """Lifetime of a node's log and status PUT URLs: boot, rendezvous and max_duration plus a margin,
    at most 7 days (a job that runs longer keeps running; its log stops updating, its end is still seen)."""
    if not run.max_duration_s:
        return MAX_PRESIGN_S
    total = config.runtime_url_ttl_s + run.rendezvous_wait_s + run.max_duration_s + run.grace_s + UPLOAD_MARGIN_S
    return int(min(MAX_PRESIGN_S, total))


def peers_document(instances: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """``peers.json``: every node's instance id and private address in launch-index order (the wrapper's rank
    is its place in this list); None while an address is still unknown."""
    nodes = []
    for inst in sorted(instances, key=launch_order):
        addr = inst.get("PrivateIpAddress")
        if not addr:
            return None
        nodes.append({"id": inst["InstanceId"], "addr": addr})
    return {"nodes": nodes}


def launch_order(inst: Mapping[str, Any]) -> tuple[int, str]:
    """The order of a launch's instances: EC2's launch index (ranks follow it), then the id."""
    return int(inst.get("AmiLaunchIndex") or 0), str(inst.get("InstanceId", ""))


# Spot's two-minute interruption notice and rebalance recommendations, from the instance metadata service,
# polled every 5 s as AWS advises (the endpoint: LOCKSTEP_IMDS_URL on the node, else 169.254.169.254).
AWS_NOTICE = {"imds": True, "every_s": 5.0, "rebalance": True, "deliver": "SIGTERM"}


def control_document(seq: int, signal_name: str) -> bytes:
    """The control object: a signal to the job (``SIGTERM``…), ``seq`` larger than any before it."""
    name = signal_name.upper()
    return json.dumps({"seq": seq, "signal": name if name.startswith("SIG") else "SIG" + name}).encode("utf-8")


def aws_manifest(run: RunRequest, *, log_urls: Mapping[str, str], status_urls: Mapping[str, str],
                 peers_url: str, data_url: str, checkpoint_uri: str, efa: bool,
                 part_urls: Mapping[str, Sequence[str]] | None = None,
                 heartbeat_urls: Mapping[str, str] | None = None, control_url: str = "") -> dict[str, Any]:
    """The wrapper's manifest for one attempt on EC2: the command in ``docker run`` of the job's image,
    rank from the peer list (multi-node, by instance id from IMDSv2), log and status to presigned URLs, and
    an instance-initiated shutdown at the end."""
    rendezvous: dict[str, Any] = (
        {"mode": "peers", "identity": "imds", "peers_url": peers_url} if run.nodes > 1 else {"mode": "single"}
    )
    container = docker_container(run, gpus=run.gpus_per_node > 0, args=EFA_DOCKER_ARGS if efa else ())
    extra = {k: v for k, v in EFA_ENV.items() if k not in run.env} if efa else {}  # the job's own values win
    return build_manifest(
        run,
        rendezvous=rendezvous,
        logs={"put_urls": dict(log_urls), "status_put_urls": dict(status_urls), "stdout": True,
              "part_urls": {r: list(u) for r, u in (part_urls or {}).items()}, "part_bytes": LOG_PART_BYTES,
              "heartbeat_put_urls": dict(heartbeat_urls or {}),
              **({"control_url": control_url, "control_every_s": uploads.CONTROL_EVERY_S} if control_url else {})},
        container=container,
        shutdown=SHUTDOWN,
        data_url=data_url,
        checkpoint_uri=checkpoint_uri,
        extra_env=extra,
        notice=AWS_NOTICE,
    )


def missing_runtime(run: RunRequest) -> list[str]:
    """What of a job only the run-time contract can carry (so it needs ``aws.runtime_bucket``)."""
    used = {"env": run.env, "secrets": run.secrets, "files": run.files, "registry": run.registry,
            "data": run.data_uri}
    return [name for name, value in used.items() if value]


class RunFiles:
    """One installation's run-time objects in the bucket (see the module's doc)."""

    def __init__(self, config: AwsConfig, installation: str, s3: S3Client) -> None:
        self.config = config
        self.installation = installation
        self.s3 = s3

    def location(self, job_id: str, attempt: int) -> RunLocation:
        return RunLocation.of(self.config, self.installation, job_id, attempt)

    def location_of(self, alloc: Allocation) -> RunLocation:
        """Where an allocation's attempt keeps its files: as launched (its tag), else as configured now."""
        bucket, key = split_s3_uri(alloc.attrs.get(RUNTIME_ATTR, ""))
        if bucket and key.endswith("/"):
            job_prefix = key.rstrip("/").rpartition("/")[0] + "/"
            return RunLocation(bucket, key, job_prefix)
        return self.location(alloc.job_id, alloc.attempt)

    async def _data_url(self, run: RunRequest, lifetime: float) -> str:
        """A presigned GET for a data input that is one S3 object (a prefix is left to the workload)."""
        bucket, key = split_s3_uri(run.data_uri)
        if not key or key.endswith("/"):
            return ""
        try:
            if not await self.s3.exists(bucket, key):
                return ""
        except ProviderError as exc:  # another region, no read access: the workload reads it itself
            log.info("aws: data input of %s not presigned (%s); the job gets its URI only", run.job_id, exc.code)
            return ""
        return await self.s3.presign("get_object", key, lifetime, bucket=bucket)

    async def stage(self, req: LaunchRequest, *, efa: bool, provider: str = "aws") -> str:
        """Upload the wrapper and this attempt's manifest; the user data that fetches and runs them. How the
        instance reports (its own role, or presigned URLs where they provably outlive the job) is
        :mod:`providers.aws.uploads`'s choice; a launch whose URLs could die first is refused."""
        run = req.run_request()
        where = self.location(req.job_id, req.attempt)
        boot = self.config.runtime_url_ttl_s
        after_boot = boot + run.rendezvous_wait_s  # the peer list and the data are read after the rendezvous
        upload = upload_ttl_s(run, self.config)
        mode = uploads.choose(self.config, None if self.config.instance_profile else await self.s3.credentials(),
                              needed_s=upload, now=utcnow())
        if not mode.ok:
            raise BadRequestError(provider, f"cannot report this job's end through presigned URLs: {mode.why}",
                                  "ShortLivedUrls")
        ranks = range(req.nodes)
        log_urls = {str(r): await self.s3.presign("put_object", where.log(r), upload) for r in ranks}
        status_urls = {str(r): await self.s3.presign("put_object", where.status(r), upload) for r in ranks}
        part_urls = {str(r): [await self.s3.presign("put_object", where.log(r, p), upload)
                              for p in range(1, LOG_PARTS)] for r in ranks}
        beat_urls = {str(r): await self.s3.presign("put_object", where.heartbeat(r), upload) for r in ranks}
        peers_url = await self.s3.presign("get_object", where.peers, after_boot) if req.nodes > 1 else ""
        manifest = aws_manifest(
            run, log_urls=log_urls, status_urls=status_urls, peers_url=peers_url,
            data_url=await self._data_url(run, after_boot), checkpoint_uri=where.checkpoint_uri, efa=efa,
            part_urls=part_urls, heartbeat_urls=beat_urls,
            control_url=await self.s3.presign("get_object", where.control, upload),
        )
        if mode.mode == uploads.INSTANCE_PROFILE:
            folder = uploads.attempt_folder(req.job_id, req.attempt)
            manifest = uploads.profile_manifest(manifest, folder, folder_uri=where.uri, region=self.s3.region,
                                                nodes=req.nodes)
            await self.s3.put(where.wrapper, wrapper_source().encode("utf-8"), "text/x-python; charset=utf-8")
            await self.s3.put(where.manifest, json.dumps(manifest, sort_keys=True).encode("utf-8"),
                              "application/json")
            return uploads.profile_boot_script(req.job_id, req.attempt, folder_uri=where.uri,
                                               region=self.s3.region, nodes=req.nodes)
        await self.s3.put(where.wrapper, wrapper_source().encode("utf-8"), "text/x-python; charset=utf-8")
        await self.s3.put(where.manifest, json.dumps(manifest, sort_keys=True).encode("utf-8"), "application/json")
        return boot_script(
            req.job_id, req.attempt,
            wrapper_url=await self.s3.presign("get_object", where.wrapper, boot),
            manifest_url=await self.s3.presign("get_object", where.manifest, boot),
        )

    async def publish_peers(self, where: RunLocation, instances: Sequence[Mapping[str, Any]]) -> bool:
        """Write ``peers.json`` (idempotent: the same instances give the same document); False while an
        instance has no address yet."""
        doc = peers_document(instances)
        if doc is None:
            return False
        await self.s3.put(where.peers, json.dumps(doc, sort_keys=True).encode("utf-8"), "application/json")
        return True

    async def statuses(self, where: RunLocation, nodes: int) -> dict[int, JobExit]:
        """The exit statuses the attempt's nodes have reported so far, by rank."""
        bodies = await asyncio.gather(*(self.s3.get(where.status(r)) for r in range(nodes)))
        out: dict[int, JobExit] = {}
        for rank, body in enumerate(bodies):
            ended = parse_status(body) if body is not None else None
            if ended is not None:
                out[rank] = ended.model_copy(update={"rank": rank})
        return out

    async def log(self, where: RunLocation, rank: int) -> str:
        """A node's log: its parts in order (a part is followed by another only when it is full)."""
        parts: list[bytes] = []
        for part in range(LOG_PARTS):
            body = await self.s3.get(where.log(rank, part))
            if body is None:
                break
            parts.append(body)
            if len(body) < LOG_PART_BYTES:
                break
        return b"".join(parts).decode("utf-8", "replace")

    async def heartbeat(self, where: RunLocation, rank: int) -> datetime | None:
        """When a node's wrapper last said it was alive (None: not yet; see ``wrapper_silent``)."""
        return parse_heartbeat(await self.s3.get(where.heartbeat(rank)))

    async def notice(self, where: RunLocation, nodes: int) -> Notice | None:
        """The first interruption notice a node's heartbeat carries (the wrapper beats at once on one)."""
        bodies = await asyncio.gather(*(self.s3.get(where.heartbeat(r)) for r in range(nodes)))
        found = [n.model_copy(update={"rank": r}) for r, b in enumerate(bodies) if (n := parse_notice(b))]
        return found[0] if found else None

    async def signal(self, where: RunLocation, seq: int, signal_name: str) -> None:
        """Write the attempt's control object: every node's wrapper sends ``signal_name`` to its command."""
        await self.s3.put(where.control, control_document(seq, signal_name), "application/json")

    async def forget(self, where: RunLocation) -> None:
        """Delete the attempt's manifest (it holds the job's secret values); logs and statuses stay."""
        try:
            await self.s3.delete(where.manifest)
        except ProviderError as exc:
            log.warning("aws: manifest %s not deleted: %s", where.uri, exc)
