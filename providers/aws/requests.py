"""EC2 request bodies Lockstep sends, built from a LaunchRequest: pure functions, no I/O.

Kept apart from the provider so the exact parameters (tags, placement, market
options, EFA interfaces, capacity-reservation target) can be read in one place
and checked against the EC2 service model by botocore's Stubber in tests.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from broker.errors import BadRequestError
from broker.models import Fabric, Market
from providers.aws.config import AwsConfig
from providers.aws.instance_types import GpuType
from providers.base import JOB_TAG, OWNER_TAG, TENANT_TAG, LaunchRequest

CLIENT_TOKEN_TAG = "lockstep:client-token"
ATTEMPT_TAG = "lockstep:attempt"
PROVIDER_TAG = "lockstep:provider"  # "aws" or "reserved": which adapter reconciles the instance
MARKET_TAG = "lockstep:market"
PLACEMENT_TAG = "lockstep:placement-group"
RESERVATION_TAG = "lockstep:capacity-reservation"
RELEASED_TAG = "lockstep:released"  # set just before Lockstep terminates: tells release from preemption
RUNTIME_TAG = "lockstep:runtime"  # the attempt's run-time folder (s3://bucket/prefix/), when it has one

# States in which an instance still exists (and may cost money).
LIVE_STATES: tuple[str, ...] = ("pending", "running", "stopping", "stopped")


def placement_group_name(installation: str, job_id: str, attempt: int) -> str:
    """One cluster placement group per job attempt, named from the job (EC2: ≤255 ASCII chars)."""
    raw = f"{installation}-{job_id}-a{attempt}"
    return re.sub(r"[^A-Za-z0-9-]", "-", raw)[:200]


def tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def launch_tags(
    req: LaunchRequest,
    *,
    installation: str,
    provider: str,
    market: Market,
    placement_group: str | None,
    capacity_reservation_id: str | None,
    runtime_uri: str = "",
) -> dict[str, str]:
    tags = {
        "Name": f"lockstep-{req.job_id}"[:255],
        OWNER_TAG: installation,
        JOB_TAG: req.job_id,
        TENANT_TAG: req.tenant,
        CLIENT_TOKEN_TAG: req.client_token,
        ATTEMPT_TAG: str(req.attempt),
        PROVIDER_TAG: provider,
        MARKET_TAG: market.value,
    }
    if placement_group:
        tags[PLACEMENT_TAG] = placement_group
    if capacity_reservation_id:
        tags[RESERVATION_TAG] = capacity_reservation_id
    if runtime_uri and len(runtime_uri) <= 256:  # EC2's limit on a tag value; without it, the configured place
        tags[RUNTIME_TAG] = runtime_uri
    return tags


def wants_efa(req: LaunchRequest, gpu_type: GpuType | None) -> bool:
    """EFA interfaces only where the type has them and the job cannot do with plain ethernet."""
    return bool(gpu_type and gpu_type.efa and not req.spec.fabric.accepts(Fabric.ethernet))


def efa_interfaces(gpu_type: GpuType, subnet_id: str, security_groups: list[str]) -> list[dict[str, Any]]:
    """One EFA interface per network card (p5: 32, p4d: 4): device 0 on card 0, device 1 on the others."""
    count = max(1, min(gpu_type.efa_interfaces or 1, gpu_type.network_cards or 1))
    out: list[dict[str, Any]] = []
    for card in range(count):
        nic: dict[str, Any] = {
            "NetworkCardIndex": card,
            "DeviceIndex": 0 if card == 0 else 1,
            "InterfaceType": "efa",
            "SubnetId": subnet_id,
            "DeleteOnTermination": True,
        }
        if security_groups:
            nic["Groups"] = list(security_groups)
        out.append(nic)
    return out


def run_instances_request(
    req: LaunchRequest,
    *,
    config: AwsConfig,
    installation: str,
    provider: str,
    gpu_type: GpuType | None,
    placement_group: str | None = None,
    capacity_reservation_id: str | None = None,
    shared_group: str | None = None,
    script: str | None = None,
    runtime_uri: str = "",
    image_id: str | None = None,
) -> dict[str, Any]:
    """RunInstances parameters for one job attempt: all nodes or none (MinCount = MaxCount).

    ``placement_group`` is the job's own group (tagged, deleted on release); ``shared_group`` one
    that belongs to somebody else (a capacity reservation's), only launched into. ``script``: the
    user data (:func:`boot_script`, or :func:`user_data` without a run-time bucket); ``runtime_uri``
    the attempt's run-time folder, tagged on the instances. ``image_id``: the region's AMI, resolved
    (:mod:`.images`); default: the configured one, as written. With ``aws.instance_profile`` the instances
    run with that profile (their role reads and writes the run-time files).
    """
    offer = req.offer
    zone = offer.zone
    market = offer.market
    if market not in (Market.spot, Market.on_demand, Market.reserved):
        raise BadRequestError(provider, f"cannot launch a {market.value} offer on EC2", "Market")
    if not zone:
        raise BadRequestError(provider, "offer has no availability zone", "NoZone")
    tags = launch_tags(
        req,
        installation=installation,
        provider=provider,
        market=market,
        placement_group=placement_group,
        capacity_reservation_id=capacity_reservation_id,
        runtime_uri=runtime_uri,
    )
    placement: dict[str, Any] = {"AvailabilityZone": zone}
    if placement_group or shared_group:
        placement["GroupName"] = placement_group or shared_group
    params: dict[str, Any] = {
        "ImageId": image_id or config.image_for(offer.region),
        "InstanceType": offer.sku,
        "MinCount": req.nodes,
        "MaxCount": req.nodes,
        "ClientToken": req.client_token,
        "Placement": placement,
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tag_list(tags)},
            {"ResourceType": "volume", "Tags": tag_list(tags)},
        ],
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        # The wrapper shuts the instance down when the command ends: that must end its billing too.
        "InstanceInitiatedShutdownBehavior": "terminate",
    }
    subnet = config.subnet_ids.get(zone)
    if wants_efa(req, gpu_type):
        assert gpu_type is not None
        if not subnet:
            raise BadRequestError(provider, f"EFA needs a subnet in {zone}: set aws.subnet_ids", "NoSubnet")
        # With explicit interfaces, subnet and groups go on the interfaces, not on the request.
        params["NetworkInterfaces"] = efa_interfaces(gpu_type, subnet, config.security_group_ids)
    else:
        if subnet:
            params["SubnetId"] = subnet
        if config.security_group_ids:
            params["SecurityGroupIds"] = list(config.security_group_ids)
    if config.key_name:
        params["KeyName"] = config.key_name
    if config.instance_profile:
        profile = config.instance_profile
        params["IamInstanceProfile"] = {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
    if script:
        params["UserData"] = script  # botocore base64-encodes it for RunInstances
    if market is Market.spot:
        spot: dict[str, Any] = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
        if req.spec.max_usd_per_hour:
            # The job's cap is for all its nodes; EC2's MaxPrice is per instance. Above it AWS
            # interrupts instead of billing more (without it, the cap is the on-demand price).
            spot["MaxPrice"] = f"{req.spec.max_usd_per_hour / req.nodes:.5f}"
        params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
    if capacity_reservation_id:
        params["CapacityReservationSpecification"] = {
            "CapacityReservationTarget": {"CapacityReservationId": capacity_reservation_id}
        }
    return params


def boot_script(job_id: str, attempt: int, *, wrapper_url: str, manifest_url: str) -> str:
    """The user data of a job with the run-time contract (docs/aws.md, docs/runtime.md): fetch the wrapper and
    the manifest through their presigned URLs, run the wrapper (which shuts the instance down when the command
    ends), and shut the instance down itself when the wrapper did not (it died, or its shutdown failed).

    It holds no secret: the manifest, which has the job's secret values, is read from an open descriptor
    and never stays on disk. A boot that cannot fetch them, or finds no python3 of 3.6 or later, shuts the
    instance down (its console output says why): an idle instance must not keep billing. The wrapper is not
    exec'd: this script waits for it, passing on the signals it gets, and reads the wrapper's end mark
    (``LOCKSTEP_END_MARK``). The power-off is ``shutdown``, else ``poweroff -f``, else sysrq.
    ``LOCKSTEP_DIR`` moves the working folder and ``LOCKSTEP_SYSRQ=0`` turns sysrq off (tests).
    """
    folder = "/var/lib/lockstep/" + re.sub(r"[^A-Za-z0-9._-]", "-", f"{job_id}-a{attempt}")  # safe in quotes
    return "\n".join([
        "#!/bin/bash",
        f"# Lockstep job {job_id}, attempt {attempt}: the in-job wrapper and its manifest, from S3",
        "set -u",
        "umask 077",
        f'D="${{LOCKSTEP_DIR:-{folder}}}"',
        "power_off() {",
        '  shutdown -h now && return 0',
        '  echo "lockstep-boot: shutdown failed; poweroff -f" >&2',
        '  poweroff -f && return 0',
        '  if [ "${LOCKSTEP_SYSRQ:-1}" = 1 ]; then',
        '    echo "lockstep-boot: poweroff failed; sysrq" >&2',
        '    echo 1 > /proc/sys/kernel/sysrq; echo o > /proc/sysrq-trigger',
        '  fi',
        '}',
        'boot_failed() { echo "lockstep-boot: $*" >&2; power_off; exit 1; }',
        'fetch() { curl -fsS --retry 10 --retry-delay 3 --retry-connrefused --connect-timeout 10 '
        '--max-time 300 -o "$1" "$2"; }',
        'mkdir -p "$D" && cd "$D" || boot_failed "cannot create $D"',
        'command -v python3 >/dev/null || boot_failed "python3 is not on the image"',
        "python3 -c 'import sys; sys.exit(sys.version_info < (3, 6))' || "
        'boot_failed "python3 is older than 3.6 ($(python3 -V 2>&1)); the wrapper needs 3.6 or later"',
        f"fetch wrapper.py {shlex.quote(wrapper_url)} || boot_failed \"cannot fetch the wrapper\"",
        f"fetch manifest.json {shlex.quote(manifest_url)} || boot_failed \"cannot fetch the manifest\"",
        "# The manifest holds the job's secrets: read from an open descriptor, no copy left on disk.",
        'exec 3<manifest.json',
        'rm -f manifest.json',
        'M="$D/end-mark"; rm -f "$M"',
        'TMPDIR="$D" LOCKSTEP_END_MARK="$M" python3 wrapper.py - <&3 3<&- &',
        'pid=$!',
        'exec 3<&-',
        '# wait returns early when a trapped signal comes: pass it on, wait again until the wrapper is gone.',
        'for s in TERM INT HUP USR1 USR2; do trap "kill -$s $pid 2>/dev/null" $s; done',
        'while :; do wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null || break; done',
        'if ! grep -qx shutdown "$M" 2>/dev/null; then',
        '  echo "lockstep-boot: the wrapper ended (exit $rc) without shutting the machine down" >&2',
        '  power_off',
        'fi',
        'exit "$rc"',
    ]) + "\n"


def user_data(req: LaunchRequest) -> str | None:
    """The boot script without a run-time bucket: run the job's image with its command on all the node's GPUs.

    cloud-init runs it as root on the GPU AMIs (NVIDIA driver + container toolkit).
    The job's id and attempt go in as environment so the workload can resume from
    its checkpoint after a preemption. None when the job has no command.
    """
    if not req.spec.command.strip():
        return None
    env = f"-e LOCKSTEP_JOB_ID={shlex.quote(req.job_id)} -e LOCKSTEP_ATTEMPT={req.attempt}"
    run = (f"docker run --rm --gpus all --network host --ipc host {env} "
           f"{shlex.quote(req.spec.container_image())} bash -lc {shlex.quote(req.spec.command)}")
    return "\n".join(["#!/bin/bash", f"# Lockstep job {req.job_id}, attempt {req.attempt}",
                      "set -euo pipefail", run]) + "\n"


def create_placement_group_request(name: str, tags: dict[str, str]) -> dict[str, Any]:
    return {
        "GroupName": name,
        "Strategy": "cluster",
        "TagSpecifications": [{"ResourceType": "placement-group", "Tags": tag_list(tags)}],
    }
