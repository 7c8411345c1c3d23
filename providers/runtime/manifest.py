"""What the in-job wrapper is given: its manifest, its files, and how to carry both. Pure: no I/O.

Adapters build one manifest per attempt with :func:`build_manifest` and choose how it reaches the
machine (docs/runtime.md). Secret values enter here and nowhere else on the broker's side: the
manifest travels to the machine and is never stored.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

DEFAULT_GRACE_S = 30.0
FILES_MTIME = 0  # packed files carry no time, so the same files always pack to the same bytes


@dataclass(frozen=True)
class RunRequest:
    """One attempt of one job, as every market's wrapper needs it."""

    job_id: str
    attempt: int
    command: str
    nodes: int = 1
    gpus_per_node: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)  # env name → value
    files: Mapping[str, str] = field(default_factory=dict)  # relative path → text
    max_duration_s: float | None = None
    grace_s: float = DEFAULT_GRACE_S
    rdzv_port: int = 29500
    data: Mapping[str, str] = field(default_factory=dict)  # url (fetched), uri, path
    checkpoint_uri: str = ""
    checkpoint_dir: str = ""

    def base_env(self) -> dict[str, str]:
        """The job's own variables plus those every attempt has (docs/runtime.md)."""
        out = dict(self.env)
        out["LOCKSTEP_JOB_ID"] = self.job_id
        out["LOCKSTEP_ATTEMPT"] = str(self.attempt)
        if self.checkpoint_uri:
            out["LOCKSTEP_CHECKPOINT_URI"] = self.checkpoint_uri
        if self.checkpoint_dir:
            out["LOCKSTEP_CHECKPOINT_DIR"] = self.checkpoint_dir
        return out


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
    extra_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The wrapper's manifest for one attempt (its format is the wrapper's ``main``)."""
    env = run.base_env()
    env.update(extra_env or {})
    manifest: dict[str, Any] = {
        "version": 1,
        "command": run.command,
        "env": env,
        "secrets": dict(run.secrets),
        "rendezvous": {"port": run.rdzv_port, "gpus_per_node": run.gpus_per_node, **rendezvous},
        "logs": dict(logs),
        "grace_s": run.grace_s,
    }
    if workdir:
        manifest["workdir"] = workdir
    if run.files:
        manifest["files"] = pack_files(run.files)
    if run.max_duration_s:
        manifest["max_duration_s"] = run.max_duration_s
    if run.data:
        manifest["data"] = dict(run.data)
    if run.checkpoint_dir:
        manifest["checkpoint_dir"] = run.checkpoint_dir
    if container:
        manifest["container"] = dict(container)
    if shutdown:
        manifest["shutdown"] = list(shutdown)
    return manifest
