"""What the in-job wrapper is given: its manifest, its files, and how to carry both. Pure: no I/O.

Adapters build one manifest per attempt with :func:`build_manifest` and choose how it reaches the
machine (docs/runtime.md). Secret values enter here and nowhere else on the broker's side: the
manifest travels to the machine and is never stored.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from functools import lru_cache
from importlib import resources
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from broker.configbase import RuntimeConfig
from broker.models import JobSpec, RegistryAuth

DEFAULT_GRACE_S = 30.0
REGISTRY_PASSWORD_VAR = "LOCKSTEP_REGISTRY_PASSWORD"  # in the manifest's secrets only; the wrapper logs in with it
FILES_MTIME = 0  # packed files carry no time, so the same files always pack to the same bytes
HEARTBEAT_S = 30.0  # how often the wrapper says it is alive (providers/runtime/logs.py wrapper_silent)
# What the wrapper runs when the manifest's `shutdown` keeps failing (docs/runtime.md): a forced power-off.
SHUTDOWN_FALLBACKS = (("poweroff", "-f"),)


class RunRequest(BaseModel):
    """One attempt of one job, as every market's wrapper needs it (the market adds where logs go).

    Built by the router for each launch; never stored (its secrets are values).
    """

    model_config = ConfigDict(defer_build=True, frozen=True)

    job_id: str
    attempt: int
    command: str
    nodes: int = 1
    gpus_per_node: int = 0
    env: dict[str, str] = Field(default_factory=dict)
    secrets: dict[str, SecretStr] = Field(default_factory=dict)  # variable → value
    files: dict[str, str] = Field(default_factory=dict)  # relative path → text
    image: str | None = None  # as the spec gives it (None: the market decides)
    container_image: str = ""  # the image a market that always runs one uses
    registry: RegistryAuth | None = None
    max_duration_s: float | None = None
    grace_s: float = DEFAULT_GRACE_S
    rdzv_port: int = 29500
    rendezvous_wait_s: float = 900.0
    log_interval_s: float = 5.0
    data_uri: str = ""
    checkpoint_uri: str = ""

    @classmethod
    def for_launch(cls, spec: JobSpec, *, job_id: str, attempt: int, secrets: Mapping[str, SecretStr],
                   runtime: RuntimeConfig) -> RunRequest:
        assert spec.gpus_per_node is not None
        return cls(
            job_id=job_id, attempt=attempt, command=spec.command, nodes=spec.nodes, gpus_per_node=spec.gpus_per_node,
            env=dict(spec.env), secrets=dict(secrets), files=dict(spec.files), image=spec.image,
            container_image=spec.container_image(), registry=spec.registry, max_duration_s=spec.max_duration_s,
            grace_s=runtime.grace_s, rdzv_port=spec.rdzv_port, rendezvous_wait_s=runtime.rendezvous_wait_s,
            log_interval_s=runtime.log_interval_s, data_uri=spec.data.uri, checkpoint_uri=spec.checkpoint_uri or "",
        )

    def base_env(self, checkpoint_uri: str = "", checkpoint_dir: str = "") -> dict[str, str]:
        """The job's own variables plus those every attempt has (docs/runtime.md)."""
        out = dict(self.env)
        out["LOCKSTEP_JOB_ID"] = self.job_id
        out["LOCKSTEP_ATTEMPT"] = str(self.attempt)
        uri = self.checkpoint_uri or checkpoint_uri
        if uri:
            out["LOCKSTEP_CHECKPOINT_URI"] = uri
        if checkpoint_dir:
            out["LOCKSTEP_CHECKPOINT_DIR"] = checkpoint_dir
        if self.data_uri:
            out["LOCKSTEP_DATA_URI"] = self.data_uri
        return out

    def secret_values(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.secrets.items()}


def exit_nonce(job_id: str, attempt: int) -> str:
    """The attempt's nonce in the wrapper's ``LOCKSTEP-EXIT`` line: only a line with it ends the attempt.

    Derived, not stored, so any replica (and a restarted broker) checks it without a lookup. It stops output
    that merely contains the marker (another job's log replayed, a ``\\r``-joined line); not a command set on
    forging its own end (docs/runtime.md "Limits"), which could end itself anyway.
    """
    return hashlib.sha256(f"lockstep-exit\0{job_id}\0{attempt}".encode()).hexdigest()[:16]


def pack_files(files: Mapping[str, str]) -> str:
    """The job's files as a base64 tar.gz (deterministic: sorted, no times, no owners)."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=FILES_MTIME) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name in sorted(files):
            data = files[name].encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = FILES_MTIME
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode("ascii")


def encode_blob(data: bytes | str | Mapping[str, Any]) -> str:
    """gzip + base64, the form the wrapper reads from an environment variable."""
    if isinstance(data, Mapping):
        data = json.dumps(data, separators=(",", ":"), sort_keys=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    return base64.b64encode(gzip.compress(data, mtime=FILES_MTIME)).decode("ascii")


def docker_container(run: RunRequest, *, gpus: bool = True, args: Sequence[str] = ()) -> dict[str, Any]:
    """The manifest's ``container`` for a host that runs the command in ``docker run`` (AWS)."""
    box: dict[str, Any] = {"runtime": "docker", "image": run.container_image, "gpus": gpus, "args": list(args)}
    if run.registry is not None:
        box["registry"] = {"server": run.registry.server, "username": run.registry.username,
                           "password_env": REGISTRY_PASSWORD_VAR}
    return box


@lru_cache(maxsize=1)
def wrapper_source() -> str:
    """The wrapper's own text, as shipped to machines."""
    return resources.files("providers.runtime").joinpath("wrapper.py").read_text(encoding="utf-8")


def build_manifest(
    run: RunRequest,
    *,
    rendezvous: Mapping[str, Any],
    logs: Mapping[str, Any],
    workdir: str | None = None,
    container: Mapping[str, Any] | None = None,
    shutdown: Sequence[str] | None = None,
    data_url: str = "",
    checkpoint_uri: str = "",
    checkpoint_dir: str = "",
    extra_env: Mapping[str, str] | None = None,
    notice: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The wrapper's manifest for one attempt (its format is the wrapper's ``main``).

    The market supplies how the node finds its peers (``rendezvous``), where its log and status go
    (``logs``), the container to run in, what ends the machine (``shutdown``), a fetchable URL for
    the data input and its checkpoint convention.
    """
    env = run.base_env(checkpoint_uri, checkpoint_dir)
    env.update(extra_env or {})
    manifest: dict[str, Any] = {
        "version": 1,
        "command": run.command,
        "env": env,
        "secrets": run.secret_values(),
        "rendezvous": {"port": run.rdzv_port, "gpus_per_node": run.gpus_per_node, "wait_s": run.rendezvous_wait_s,
                       **rendezvous},
        "logs": {"interval_s": run.log_interval_s, **logs},
        "grace_s": run.grace_s,
        "heartbeat_s": HEARTBEAT_S,
        "exit_nonce": exit_nonce(run.job_id, run.attempt),
    }
    if workdir:
        manifest["workdir"] = workdir
    if run.files:
        manifest["files"] = pack_files(run.files)
    if run.max_duration_s:
        manifest["max_duration_s"] = run.max_duration_s
    data = {k: v for k, v in {"url": data_url, "uri": run.data_uri if run.data_uri.startswith("s3://") else "",
                               "path": run.data_uri if run.data_uri.startswith("/") else ""}.items() if v}
    if run.data_uri.startswith(("http://", "https://")) and not data_url:
        data["url"] = run.data_uri
    if data:
        manifest["data"] = data
    if checkpoint_dir:
        manifest["checkpoint_dir"] = checkpoint_dir
    if container:
        manifest["container"] = dict(container)
    if notice:  # how the market's interruption notice reaches the wrapper (docs/runtime.md, issue 30)
        manifest["notice"] = dict(notice)
    if shutdown:
        manifest["shutdown"] = list(shutdown)
        manifest["shutdown_fallbacks"] = [list(f) for f in SHUTDOWN_FALLBACKS]
    return manifest
