"""What Lockstep asks Vast for: the instance it creates from an ask, and the label that finds it again.

Pure functions. The label (``lockstep:<installation>:<job>:<attempt>``) is the
launch's idempotency key: before renting, the provider looks it up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.errors import BadRequestError
from broker.models import Market
from providers.base import LaunchRequest
from providers.vast.runtime import BOOT_ARGS, ENTRYPOINT

PROVIDER = "vast"


def label_prefix(installation: str) -> str:
    return f"lockstep:{installation}:"


def label_for(installation: str, req: LaunchRequest) -> str:
    """The label marking an instance as this installation's, for this job and attempt."""
    return f"{label_prefix(installation)}{req.job_id}:{req.attempt}"


def member_label(label: str, rank: int, count: int) -> str:
    """The label of one machine of a multi-machine attempt: the attempt's label and ``#<rank>/<count>``, so
    what a crash left half-rented reads back as such."""
    return f"{label}#{rank}/{count}"


def parse_label(prefix: str, label: str) -> tuple[str, int, int, int] | None:
    """(job id, attempt, rank, machine count) of one of this installation's labels (``prefix``), else None."""
    if not label.startswith(prefix):
        return None
    rest, _, member = label[len(prefix):].partition("#")
    job_id, _, attempt = rest.rpartition(":")
    rank, _, count = member.partition("/")
    if not job_id or not attempt.isdigit() or (member and not (rank.isdigit() and count.isdigit())):
        return None
    return job_id, int(attempt), int(rank or 0), int(count or 1)


def create_body(req: LaunchRequest, label: str, *, env: Mapping[str, str], image_login: str | None = None
                ) -> dict[str, Any]:
    """The body of ``PUT /api/v0/asks/{id}/`` for one machine of a launch: a bid at the ask's ``min_bid`` for a
    spot offer, else on-demand; the container runs the in-job wrapper (:mod:`.runtime`) and exits with the
    job's command (``runtype: "args"``). The container's entrypoint goes in ``entrypoint``, the API reference's
    field for it, and in ``onstart`` too, which Vast's CLI (1.9.1) still sends as an args launch's entrypoint."""
    spec = req.spec
    bid = None
    if req.offer.market == Market.spot:
        if "min_bid" not in req.offer.attrs:
            raise BadRequestError(PROVIDER, f"offer {req.offer.id} is spot but has no min_bid", "no_bid")
        bid = float(req.offer.attrs["min_bid"])
    return {
        "client_id": "me",
        "image": spec.container_image(),
        "env": dict(env),  # the wrapper and its manifest (secrets included: Vast shows env to the account owner)
        "price": bid,  # set = an interruptible bid at this $/h; null = on-demand
        "disk": spec.disk_gb,
        "label": label,
        "entrypoint": ENTRYPOINT,
        "onstart": ENTRYPOINT,
        "runtype": "args",
        "args": list(BOOT_ARGS),
        "image_login": image_login,
        "python_utf8": False,
        "lang_utf8": False,
        "use_jupyter_lab": False,
        "jupyter_dir": None,
        "force": False,
        "cancel_unavail": True,  # fail now rather than queue when the machine cannot host it
    }
