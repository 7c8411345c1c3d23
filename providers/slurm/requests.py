"""What Lockstep asks Slurm for: the batch job of a launch, its comment tags, its time limit.

Pure functions, no I/O. The comment carries the owner, the Lockstep job id and the
launch's client token, so a job can be found again after a crash (``owned``) and a
launch is never submitted twice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import providers.slurm.api as api
from broker.models import Colocate, FabricNeed
from providers.base import JOB_TAG, OWNER_TAG, TENANT_TAG, LaunchRequest

TOKEN_TAG = "lockstep:token"
ATTEMPT_TAG = "lockstep:attempt"
CANCEL_TAG = "lockstep:cancelled"


def make_comment(req: LaunchRequest, owner: str) -> str:
    """The job comment: who owns it and how to find it again. ``owner`` is the provider's installation."""
    return render_labels(
        {
            OWNER_TAG: owner,
            JOB_TAG: req.job_id,
            TENANT_TAG: req.tenant,
            ATTEMPT_TAG: str(req.attempt),
            TOKEN_TAG: req.client_token,
        }
    )


def render_labels(labels: Mapping[str, str]) -> str:
    """``k=v;k=v``: labels as a job comment (the shape :func:`parse_comment` reads)."""
    return ";".join(f"{k}={v}" for k, v in labels.items())


def parse_comment(comment: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in comment.split(";"):
        key, sep, value = part.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def time_limit_minutes(req: LaunchRequest, default_min: int) -> int:
    """From the workload: wall-clock hours, or reference GPU-hours spread over the job's GPUs (×2 margin)."""
    w = req.spec.workload
    if w is None:
        return default_min
    if w.hours is not None:
        return max(1, math.ceil(w.hours * 60))
    if w.reference_gpu_hours is not None:
        return max(1, math.ceil(w.reference_gpu_hours / req.spec.gpus * 60 * 2))
    return default_min


def launch_request(req: LaunchRequest, *, installation: str, gpus_per_node_default: int,
                   default_time_limit_min: int, partition: str | None, script: str | None = None,
                   time_limit_min: int | None = None, stdout: str | None = None,
                   warn: tuple[str, int] | None = None) -> api.SubmitRequest:
    """The batch job of one launch: the offer's partition, fabric and rack as constraints, tags in the comment.

    ``script``: the batch script (the run-time contract's, :mod:`.runtime`); default: the command itself.
    ``time_limit_min``: Slurm's limit; default: from the workload (:func:`time_limit_minutes`).
    ``warn``: ``--signal`` (signal name, seconds before the end): the interruption notice (:mod:`.runtime`).
    """
    spec, offer = req.spec, req.offer
    limit = time_limit_min if time_limit_min is not None else time_limit_minutes(req, default_time_limit_min)
    constraints: list[str] = []
    fabric_feature = offer.attrs.get("fabric_feature", "")
    rack_feature = offer.attrs.get("rack_feature", "")
    if fabric_feature and (req.nodes > 1 or spec.fabric is not FabricNeed.any):
        constraints.append(fabric_feature)
    wants_rack = offer.colocation is Colocate.rack or spec.colocate in (Colocate.node, Colocate.rack)
    if rack_feature and req.nodes > 1 and wants_rack:
        constraints.append(rack_feature)
    command = spec.command.strip() or f"exec sleep {limit * 60}"  # no command: hold the allocation
    return api.SubmitRequest(
        name=f"lockstep-{req.job_id}"[:100],
        script=script or f"#!/bin/bash\n# submitted by Lockstep ({installation})\n{command}\n",
        nodes=req.nodes,
        gpus_per_node=spec.gpus_per_node or gpus_per_node_default,
        gpu_type=offer.attrs.get("gres_type", ""),
        time_limit_min=limit,
        comment=make_comment(req, installation),
        partition=offer.attrs.get("partition") or partition,
        constraints="&".join(constraints) or None,
        stdout=stdout or f"/tmp/lockstep-{req.job_id}-%j.out",
        environment={
            "LOCKSTEP_JOB_ID": req.job_id,
            "LOCKSTEP_ATTEMPT": str(req.attempt),
            "LOCKSTEP_TENANT": req.tenant,
        },
        warn_signal=warn[0] if warn else "",
        warn_s=warn[1] if warn else 0,
    )
