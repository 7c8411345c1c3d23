"""How an EC2 instance reports at run time (docs/aws.md "Run-time reporting"): with its own role, or through
presigned URLs that provably outlive the job.

A presigned URL is signed with the broker's credentials and dies with them. Brokers usually run with temporary
ones (an instance or container role, IRSA, SSO: 1–12 h), so a log and status URL signed at launch can be dead
long before a long job ends, which would then end "failed, no exit code". Two modes:

- ``instance_profile`` (``aws.instance_profile`` set): the instances run with that profile; the boot script
  fetches the wrapper and manifest, ships the node's log and status, and reads the peer list with the instance's
  own role (the AWS CLI of the image), so nothing the instance needs expires with the broker's credentials.
- ``presigned`` (no profile): only where the URLs provably live long enough: the broker's credentials are
  long-term keys (a URL then lives its full ``ExpiresIn``, 7 days at most), or temporary ones whose expiry is
  known and comes after the upload URLs' lifetime. Otherwise the launch is refused, saying why.

:func:`choose` is pure; :func:`static_credentials` reads only the environment and the AWS config files (no
network: it is what ``lockstep config check`` says); the boot script and manifest of the profile mode are
:func:`profile_boot_script` and :func:`profile_manifest`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from providers.aws.config import AwsConfig

INSTANCE_PROFILE = "instance_profile"
PRESIGNED = "presigned"
MAX_PRESIGN_S = 604_800  # SigV4's limit: 7 days
SYNC_EVERY_S = 15  # how often the profile mode's boot script ships the node's log and status
# How often a node's wrapper reads the attempt's control object (a signal from the broker), and the profile
# mode's boot script fetches it: a budget's SIGTERM reaches the job within this, well inside its checkpoint
# window (broker.budget_grace_s, 120 s).
CONTROL_EVERY_S = 5
# botocore's credential providers that read only the environment and files (never the network).
STATIC_PROVIDERS = ("env", "shared-credentials-file", "config-file", "ec2-credentials-file", "boto-config")


@dataclass(frozen=True)
class Credentials:
    """What is known of the credentials the broker signs with."""

    temporary: bool
    expires_at: datetime | None = None
    source: str = ""


@dataclass(frozen=True)
class UploadMode:
    mode: str  # INSTANCE_PROFILE or PRESIGNED
    ok: bool  # False: presigned URLs would (or might) die before the job's end: the launch is refused
    why: str


def choose(config: AwsConfig, creds: Credentials | None, *, needed_s: float, now: datetime) -> UploadMode:
    """The reporting mode of a launch whose upload URLs must live ``needed_s`` seconds from ``now``."""
    if config.instance_profile:
        return UploadMode(INSTANCE_PROFILE, True, f"aws.instance_profile is set ({config.instance_profile}): "
                                                  f"instances fetch and report with their own role")
    hint = "set aws.instance_profile (docs/aws.md \"Run-time reporting\")"
    if needed_s > MAX_PRESIGN_S:
        return UploadMode(PRESIGNED, False, f"the job's upload URLs must live {needed_s / 86400:.1f} days, past "
                                            f"SigV4's 7-day limit: {hint}")
    if creds is None:
        return UploadMode(PRESIGNED, False, f"the broker has no AWS credentials to sign with: {hint}")
    if not creds.temporary:
        return UploadMode(PRESIGNED, True, f"the broker signs with long-term keys ({creds.source or 'access key'}):"
                                           f" presigned URLs live their full lifetime (7 days at most)")
    if creds.expires_at is None:
        return UploadMode(PRESIGNED, False, f"the broker's credentials are temporary ({creds.source or 'a session'}"
                                            f", expiry unknown): presigned URLs die with them, maybe before the "
                                            f"job ends: {hint}")
    left = (creds.expires_at - now).total_seconds()
    if left < needed_s:
        return UploadMode(PRESIGNED, False, f"the broker's credentials ({creds.source or 'temporary'}) expire in "
                                            f"{max(left, 0) / 3600:.1f} h, before the job's upload URLs are done "
                                            f"({needed_s / 3600:.1f} h): {hint}")
    return UploadMode(PRESIGNED, True, f"the broker's temporary credentials outlive the job's upload URLs "
                                       f"(expire in {left / 3600:.1f} h)")


async def session_credentials(session: Any) -> Credentials | None:
    """The credentials an aiobotocore session signs with now: temporary when they carry a session token;
    their expiry where botocore refreshes them (a role's)."""
    creds = await session.get_credentials()
    if creds is None:
        return None
    frozen = await creds.get_frozen_credentials()
    expiry = getattr(creds, "_expiry_time", None)
    return Credentials(temporary=bool(frozen.token), expires_at=expiry if isinstance(expiry, datetime) else None,
                       source=str(getattr(creds, "method", "") or ""))


def static_credentials(profile: str | None = None) -> Credentials:
    """What the broker would sign with, from the environment and the AWS config files only (no network). No
    such keys: a role, SSO or a process gives them, and those are temporary."""
    import botocore.session

    session = botocore.session.Session(profile=profile)
    resolver = session.get_component("credential_provider")
    for provider in list(resolver.providers):
        if provider.METHOD not in STATIC_PROVIDERS:
            resolver.remove(provider.METHOD)
    try:
        creds = session.get_credentials()
    except Exception:  # a broken profile: config check reports what it can
        creds = None
    if creds is None:
        return Credentials(temporary=True, source="a role, SSO or credential process (no keys in the "
                                                  "environment or the AWS files)")
    frozen = creds.get_frozen_credentials()
    return Credentials(temporary=bool(frozen.token), source=str(creds.method))


def config_note(config: AwsConfig, creds: Credentials) -> str:
    """What `lockstep config check` says about run-time reporting on EC2."""
    if config.runtime_bucket is None:
        return ("aws: run-time reporting off (no aws.runtime_bucket): jobs run as a bare `docker run`, without "
                "logs or exit status")
    mode = choose(config, creds, needed_s=0.0, now=datetime.now().astimezone())
    if mode.mode == INSTANCE_PROFILE:
        return f"aws: run-time reporting by instance profile: {mode.why}"
    if mode.ok:
        return f"aws: run-time reporting by presigned URLs: {mode.why}"
    return (f"aws: run-time reporting by presigned URLs, refused at launch where they could die before the "
            f"job ends: {mode.why}")


# --------------------------------------------------------------------------- the instance-profile mode


def attempt_folder(job_id: str, attempt: int) -> str:
    """The node's working folder (the same as the presigned mode's boot script), safe in quotes."""
    return "/var/lib/lockstep/" + re.sub(r"[^A-Za-z0-9._-]", "-", f"{job_id}-a{attempt}")


def profile_manifest(manifest: Mapping[str, Any], folder: str, *, folder_uri: str, region: str, nodes: int
                     ) -> dict[str, Any]:
    """The presigned mode's manifest turned to the profile mode: the node's log and status go to files in
    ``<folder>/out`` (the boot script ships them with the role), the peer list is read from a file the boot
    script fetches; no upload URL at all."""
    out = dict(manifest)
    logs = {k: v for k, v in (manifest.get("logs") or {}).items() if k not in ("put_urls", "status_put_urls")}
    logs.update(file=f"{folder}/out/log-{{rank}}.txt", status_dir=f"{folder}/out")
    if logs.pop("control_url", None):  # the boot script keeps the control object fetched, with the role
        logs["control_file"] = f"{folder}/control.json"
    out["logs"] = logs
    if nodes > 1:
        rdzv = {k: v for k, v in (manifest.get("rendezvous") or {}).items() if k != "peers_url"}
        rdzv["peers_file"] = f"{folder}/peers.json"
        out["rendezvous"] = rdzv
    # The last log and the status reach S3 before the instance stops (terminate behaviour ends its billing).
    out["shutdown"] = ["sh", "-c", 'aws s3 sync "$0" "$1" --exclude ".*" --only-show-errors --region "$2"; '
                                   "shutdown -h now", f"{folder}/out/", folder_uri, region]
    return out


def profile_boot_script(job_id: str, attempt: int, *, folder_uri: str, region: str, nodes: int) -> str:
    """The user data of the profile mode: the wrapper and manifest fetched from the attempt's folder
    (``s3://bucket/prefix/``) with the instance's role, its log and status shipped every few seconds, the peer
    list read once the broker writes it. Holds no secret and no URL that expires."""
    folder = attempt_folder(job_id, attempt)
    lines = [
        "#!/bin/bash",
        f"# Lockstep job {job_id}, attempt {attempt}: the wrapper and its manifest from S3, with this instance's "
        "role (aws.instance_profile)",
        "set -u",
        "umask 077",
        f"D={shlex.quote(folder)}",
        f"S3={shlex.quote(folder_uri)}",
        f"R={shlex.quote(region)}",
        'boot_failed() { echo "lockstep-boot: $*" >&2; shutdown -h now; exit 1; }',
        'fetch() { for _ in 1 2 3 4 5 6 7 8 9 10; do aws s3 cp --only-show-errors --region "$R" "$S3$1" "$2" '
        "&& return 0; sleep 3; done; return 1; }",
        'mkdir -p "$D/out" && cd "$D" || boot_failed "cannot create $D"',
        'command -v python3 >/dev/null || boot_failed "python3 is not on the image"',
        'command -v aws >/dev/null || boot_failed "the AWS CLI is not on the image (aws.instance_profile needs it)"',
        'fetch wrapper.py wrapper.py || boot_failed "cannot fetch the wrapper"',
        'fetch manifest.json manifest.json || boot_failed "cannot fetch the manifest"',
        "# The node's log and status, shipped with the instance's role while the job runs.",
        f'( while sleep {SYNC_EVERY_S}; do aws s3 sync "$D/out/" "$S3" --exclude ".*" --only-show-errors '
        '--region "$R"; done ) &',
    ]
    lines.append("# A signal from the broker (control.json, written by SignalsJobs), fetched as the wrapper reads it.")
    lines.append(f'( while sleep {CONTROL_EVERY_S:g}; do aws s3 cp --only-show-errors --region "$R" "$S3"control.json '
                 '"$D/.control.json" 2>/dev/null && mv "$D/.control.json" "$D/control.json"; done ) &')
    if nodes > 1:
        lines.append('( until [ -s "$D/peers.json" ]; do fetch peers.json "$D/.peers.json" 2>/dev/null && '
                     'mv "$D/.peers.json" "$D/peers.json"; sleep 5; done ) &')
    lines += [
        "# The manifest holds the job's secrets: read from an open descriptor, no copy left on disk.",
        "exec 3<manifest.json",
        "rm -f manifest.json",
        'TMPDIR="$D" exec python3 wrapper.py - <&3 3<&-',
    ]
    return "\n".join(lines) + "\n"

