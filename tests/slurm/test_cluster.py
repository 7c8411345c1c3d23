"""The Slurm provider against the real local cluster (deploy/slurm/up.sh): 5 fake-GPU nodes on 127.0.0.1.

gpu-node1..3: 8×H100, ib_ndr, rack1 · gpu-node4: 8×A100, roce, rack2 · gpu-node5: 4×L40S, eth, rack2.
Every job a test submits belongs to the session's own installation and is cancelled before the test ends.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeVar

import pytest
from pydantic import SecretStr

from broker.errors import BadRequestError, CapacityError, ProviderAuthError
from broker.models import Allocation, AllocationState, Colocate, Fabric, JobSpec, Offer, Workload
from providers.base import LaunchRequest
from providers.runtime.logs import parse_log
from providers.slurm import SlurmProvider
from providers.slurm.config import SlurmConfig
from tests.plugins.slurm import SlurmCluster
from tests.waiting import eventually

pytestmark = pytest.mark.slurm

T = TypeVar("T")




@pytest.fixture
async def provider(slurm_config: SlurmConfig, slurm_installation: str) -> AsyncIterator[SlurmProvider]:
    p = SlurmProvider(slurm_config, installation=slurm_installation)
    yield p
    # Clean up every job this installation still holds; owned() lists COMPLETING jobs too, so once it is
    # empty their GPUs are back.
    for alloc in await p.owned():
        await p.release(alloc)
    await eventually(p.owned, lambda a: a == [], "test jobs gone")
    await p.aclose()


def spec(gpus: int, per_node: int, *, gpu: str = "H100", minutes: float = 5, command: str = "sleep 120",
         **kw: object) -> JobSpec:
    return JobSpec(
        name="slurm-test", gpu=[gpu], gpus=gpus, gpus_per_node=per_node,
        workload=Workload(hours=minutes / 60), command=command, **kw,
    )


def request(job_spec: JobSpec, offer: Offer, nodes: int, installation: str) -> LaunchRequest:
    return LaunchRequest(
        job_id=f"job-{uuid.uuid4().hex[:10]}", spec=job_spec, offer=offer, nodes=nodes, installation=installation
    )


def pick(offers: list[Offer], **want: object) -> Offer:
    for o in offers:
        if all(
            (getattr(o, k) if hasattr(o, k) else o.locality.__getattribute__(k)) == v for k, v in want.items()
        ):
            return o
    raise AssertionError(f"no offer with {want} in {[o.id for o in offers]}")


def sinfo_free(cluster: SlurmCluster) -> dict[str, tuple[str, int, str]]:
    """node → (gres type, free GPUs, state) as `sinfo` reports it."""
    out = cluster.cli("sinfo", "-h", "-N", "-p", "gpu", "-O", "NodeList:40,Gres:60,GresUsed:80,StateLong:40")
    free = {}
    for line in out.splitlines():
        name, gres, used, state = line.split()
        m = re.match(r"gpu:(\w+):(\d+)", gres)
        u = re.match(r"gpu:\w+:(\d+)", used)
        assert m and u, line
        free[name] = (m.group(1), int(m.group(2)) - int(u.group(1)), state)
    return free


async def test_offers_match_sinfo(provider: SlurmProvider, slurm_cluster: SlurmCluster) -> None:
    async def snapshot() -> tuple[list[Offer], dict[str, tuple[str, int, str]], dict[str, tuple[str, int, str]]]:
        before = sinfo_free(slurm_cluster)
        offers = await provider.offers()
        return offers, before, sinfo_free(slurm_cluster)

    # Another job may start between the two reads: take a snapshot during which sinfo did not change.
    offers, expected, _ = await eventually(snapshot, lambda s: s[1] == s[2], "a stable snapshot")
    single = {o.locality.host: o for o in offers if o.max_nodes == 1}
    healthy = {n for n, (_, _, state) in expected.items() if state in ("idle", "mixed", "allocated")}
    assert set(single) == healthy and len(healthy) == 5
    for name in healthy:
        gres_type, free, _ = expected[name]
        o = single[name]
        assert o.attrs["gres_type"] == gres_type
        assert int(o.attrs["free_gpus"]) == free
        assert o.locality.region == "onprem" and o.locality.zone == "gpu"
    assert single["gpu-node1"].gpu == "H100-SXM" and single["gpu-node4"].gpu.startswith("A100")
    assert single["gpu-node5"].gpu == "L40S" and single["gpu-node5"].network.fabric is Fabric.ethernet
    ib = single["gpu-node2"]
    assert (ib.network.fabric, ib.network.fabric_gbps, ib.locality.rack) == (Fabric.infiniband, 400.0, "rack1")
    assert ib.locality.cluster == "onprem-ib_ndr"
    assert single["gpu-node4"].network.fabric is Fabric.roce
    rack = pick(offers, max_nodes=3, colocation=Colocate.rack)
    assert rack.gpu == "H100-SXM" and rack.gpu_count == 8 and rack.locality.rack == "rack1"
    assert sorted(rack.attrs["nodes"].split(",")) == ["gpu-node1", "gpu-node2", "gpu-node3"]


async def test_two_node_infiniband_job_runs_in_one_rack(
    provider: SlurmProvider, slurm_installation: str
) -> None:
    offers = await provider.offers()
    offer = pick(offers, max_nodes=3, colocation=Colocate.rack, gpu="H100-SXM")
    job = spec(16, 8, fabric="infiniband", colocate="rack", command='echo "gpus=$CUDA_VISIBLE_DEVICES"; sleep 2')
    req = request(job, offer, 2, slurm_installation)
    alloc = await provider.launch(req)
    assert alloc.state in (AllocationState.pending, AllocationState.running)
    assert alloc.resource_ids and alloc.client_token == req.client_token
    status = await eventually(
        lambda: provider.poll(alloc), lambda s: s.state is AllocationState.succeeded, "2-node job succeeded"
    )
    assert len(status.hosts) == 2
    nodes = {n.name: n for n in await provider.client.nodes()}
    for host in status.hosts:
        assert "ib_ndr" in nodes[host].features and "rack1" in nodes[host].features
    # The job really ran on both nodes, each of its steps with 8 GPUs (its log, from the shared job directory).
    for rank in (0, 1):
        lines = [ln.text for ln in parse_log(await provider.job_log(alloc, rank=rank)) if ln.stream == "out"]
        assert lines == ["gpus=0,1,2,3,4,5,6,7"]


async def test_full_pool_pends_queue_estimate_grows_and_cancel_frees(
    provider: SlurmProvider, slurm_installation: str
) -> None:
    offers = await provider.offers()
    rack = pick(offers, max_nodes=3, colocation=Colocate.rack, gpu="H100-SXM")
    await eventually(lambda: provider.queue_wait_hours(8, 1, "ib_ndr"), lambda w: w == 0.0, "an IB node free")

    # Fill the three IB nodes for (at most) 10 minutes.
    filler = await provider.launch(request(spec(24, 8, minutes=10, fabric="infiniband"), rack, 3, slurm_installation))
    await eventually(lambda: provider.poll(filler), lambda s: s.state is AllocationState.running, "filler running")
    w0 = await provider.queue_wait_hours(8, 1, "ib_ndr")
    assert w0 > 0.0

    # More GPUs than are free: the job pends, and the wait for the next one grows.
    waiting = await provider.launch(request(spec(24, 8, minutes=20, fabric="infiniband"), rack, 3, slurm_installation))
    status = await provider.poll(waiting)
    assert status.state is AllocationState.pending
    w1 = await provider.queue_wait_hours(8, 1, "ib_ndr")
    assert w1 > w0
    busy = {o.locality.host: o for o in await provider.offers() if o.max_nodes == 1}
    assert busy["gpu-node1"].attrs["free_gpus"] == "0" and busy["gpu-node1"].queue_wait_hours > 0
    assert busy["gpu-node4"].queue_wait_hours == 0.0  # the RoCE node is untouched

    # Cancelling releases the GPUs; Lockstep's own cancels read as released, not failed.
    await provider.release(waiting)
    await provider.release(filler)
    for alloc in (filler, waiting):
        await eventually(
            lambda a=alloc: provider.poll(a), lambda s: s.state is AllocationState.released, "cancel seen"
        )
    await provider.release(filler)  # twice is fine

    def all_free(offers: list[Offer]) -> bool:
        by = {o.locality.host: o for o in offers if o.max_nodes == 1}
        return all(by[n].attrs["free_gpus"] == "8" for n in ("gpu-node1", "gpu-node2", "gpu-node3"))

    await eventually(provider.offers, all_free, "IB GPUs free after cancel")


async def test_drained_node_leaves_offers(provider: SlurmProvider, slurm_cluster: SlurmCluster) -> None:
    node = "gpu-node5"
    try:
        await provider.drain(node, "lockstep test: ECC errors")
        offers = await provider.offers()
        assert node not in {o.locality.host for o in offers}
        assert node not in ",".join(o.attrs["nodes"] for o in offers)
        assert "drain" in slurm_cluster.cli("sinfo", "-h", "-n", node, "-o", "%T").strip()
    finally:
        await provider.resume(node)
    await eventually(provider.offers, lambda offers: node in {o.locality.host for o in offers}, "node back")


async def test_owned_survives_a_new_provider_and_launch_is_idempotent(
    slurm_config: SlurmConfig, provider: SlurmProvider, slurm_installation: str
) -> None:
    offer = pick(await provider.offers(), host="gpu-node4")
    req = request(spec(2, 2, gpu="A100", command="sleep 60"), offer, 1, slurm_installation)
    first = await provider.launch(req)

    async with SlurmProvider(slurm_config, installation=slurm_installation) as again:
        owned = await again.owned()
        mine = [a for a in owned if a.resource_ids == first.resource_ids]
        assert len(mine) == 1
        found = mine[0]
        assert (found.job_id, found.client_token, found.attempt) == (req.job_id, req.client_token, 0)
        assert found.state in (AllocationState.pending, AllocationState.running)
        # Same request again (a retry after a crash): no second job.
        second = await again.launch(req)
        assert second.resource_ids == first.resource_ids
        assert len(await again.owned()) == len(owned)

    # Another installation does not see (or claim) it.
    async with SlurmProvider(slurm_config, installation="someone-else") as other:
        assert all(a.resource_ids != first.resource_ids for a in await other.owned())


async def test_errors_are_mapped(slurm_config: SlurmConfig, provider: SlurmProvider, slurm_installation: str) -> None:
    offer = pick(await provider.offers(), host="gpu-node5")
    too_big = request(spec(16, 16, gpu="L40S"), offer, 1, slurm_installation)
    with pytest.raises(CapacityError):
        await provider.launch(too_big)
    bad_part = offer.model_copy(update={"attrs": {**offer.attrs, "partition": "no-such-partition"}})
    with pytest.raises(BadRequestError):
        await provider.launch(request(spec(1, 1, gpu="L40S"), bad_part, 1, slurm_installation))

    # A malformed token and an expired one are refused before they are sent; neither ever shows in
    # messages or reprs. (The server's own 401, for a request without a token, maps to ProviderAuthError
    # too: tests/slurm/test_api_shapes.py. A JWT slurmctld did not sign gets a bare HTTP 500 from
    # slurmrestd 22.05, indistinguishable from other failures.)
    for secret in ("not-a-valid-token-" + uuid.uuid4().hex, _jwt(exp=1_000_000_000)):
        cfg = slurm_config.model_copy(update={"token": SecretStr(secret)})
        async with SlurmProvider(cfg, installation=slurm_installation) as p:
            with pytest.raises(ProviderAuthError) as info:
                await p.offers()
            assert secret not in str(info.value) and secret not in repr(p) and secret not in repr(cfg)


def _jwt(exp: float) -> str:
    """A JWT-shaped token expiring at ``exp`` with a signature no key made."""
    return ".".join(
        base64.urlsafe_b64encode(json.dumps(part).encode()).decode().rstrip("=")
        for part in ({"alg": "HS256", "typ": "JWT"}, {"exp": int(exp), "iat": int(exp) - 600, "sun": "root"})
    ) + "." + uuid.uuid4().hex


async def test_a_rotated_token_file_is_used_without_a_restart(
    slurm_config: SlurmConfig, slurm_cluster: SlurmCluster, slurm_installation: str, tmp_path: Path
) -> None:
    token_file = tmp_path / "slurm.jwt"
    token_file.write_text(slurm_cluster.token + "\n")
    cfg = slurm_config.model_copy(update={"token": None, "token_file": str(token_file)})
    async with SlurmProvider(cfg, installation=slurm_installation) as p:
        assert await p.offers()
        token_file.write_text(_jwt(exp=time.time() - 60))  # rotated: the new token is read (and refused)
        with pytest.raises(ProviderAuthError, match="expired"):
            await p.offers()
        token_file.write_text(slurm_cluster.cli("scontrol", "token", "username=root", "lifespan=600").split("=", 1)[1])
        assert await p.offers()  # and to a good one again: no restart, no new provider
        # Rotated by renaming a new file into place with the old file's size and modification time
        # (cp -p, rsync -t): a different file all the same.
        good = token_file.read_text().strip()
        before = token_file.stat()
        expired = _jwt(exp=time.time() - 60)
        expired = expired[: expired.rindex(".") + 1] + ("a" * (before.st_size - expired.rindex(".") - 1))
        staged = tmp_path / "slurm.jwt.new"
        staged.write_text(expired)
        os.utime(staged, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert staged.stat().st_size == before.st_size
        os.replace(staged, token_file)
        with pytest.raises(ProviderAuthError, match="expired"):
            await p.offers()
        token_file.write_bytes(b"\xff\xfe" + good.encode()[2:])  # not text: refused, and its bytes never shown
        with pytest.raises(ProviderAuthError, match="not UTF-8") as info:
            await p.offers()
        assert good[2:12] not in str(info.value) and good[2:12] not in repr(info.value)
        token_file.write_text("")
        with pytest.raises(ProviderAuthError, match="token_file is empty"):
            await p.offers()
        token_file.unlink()
        with pytest.raises(ProviderAuthError, match="cannot read token_file"):
            await p.offers()


async def test_poll_reports_failure(provider: SlurmProvider, slurm_installation: str) -> None:
    offer = pick(await provider.offers(), host="gpu-node5")
    alloc: Allocation = await provider.launch(request(spec(1, 1, gpu="L40S", command="exit 3"), offer, 1,
                                                      slurm_installation))
    status = await eventually(
        lambda: provider.poll(alloc), lambda s: s.state not in (AllocationState.pending, AllocationState.running),
        "job ended",
    )
    assert status.state is AllocationState.failed
    assert status.exit is not None and status.exit.exit_code == 3 and status.exit.reason.value == "exited"
