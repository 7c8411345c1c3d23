"""Multi-node jobs from single Vast machines, on the local Vast API server (issue 17, item 5).

The ranking assembles a 2-node ``colocate: any`` job from two machines (policies/assembly.py); the adapter
rents both or neither; each machine's container runs the wrapper with the same rendezvous (its own rank); the
broker follows both and destroys both when the commands end. On the local server every container is a local
process, so every machine's address is this host's (the test sets the asks' ``public_ipaddr`` to 127.0.0.1).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.errors import CapacityError
from broker.models import AllocationState, JobState, Market
from broker.specs import parse_spec
from policies.assembly import combine, member_ids
from providers.base import LaunchRequest, OfferQuery
from providers.runtime.logs import parse_log
from providers.vast import VastProvider
from providers.vast.config import VastConfig
from providers.vast.requests import member_label, parse_label
from standins.vastapi.server import Faults, VastApiServer, free_port
from tests.broker.conftest import wait_for
from tests.runtime.barrier import SCRIPT as BARRIER_SCRIPT
from tests.runtime.barrier import check_barrier
from tests.vast.test_jobs import INSTALLATION, Broker, open_broker


def _local_machines(vast: VastApiServer) -> None:
    """Containers run on this host here: every machine's public address is the host's loopback."""
    for offer in vast.state.offers.values():
        offer["public_ipaddr"] = "127.0.0.1"


@pytest.fixture
async def broker(tmp_path: Path, vast_api: VastApiServer, vast_config: VastConfig) -> AsyncIterator[Broker]:
    _local_machines(vast_api)
    b = await open_broker(tmp_path, vast_api, vast_config)
    try:
        yield b
    finally:
        await b.svc.aclose()


def two_node(**fields):
    data = {"name": "vast-2n", "gpu": ["RTX-4090"], "gpus": 2, "gpus_per_node": 1, "colocate": "any",
            "fabric": "ethernet", "providers": ["vast"], "markets": ["on_demand"], "workload": {"hours": 1},
            "disk_gb": 20}
    data.update(fields)
    return parse_spec(data)


def _creates(vast: VastApiServer) -> list[dict]:
    return [r for r in vast.state.requests if r["method"] == "PUT" and r["path"].startswith("/api/v0/asks/")]


async def test_a_two_node_job_runs_on_two_machines_with_one_rendezvous_and_both_are_destroyed(broker: Broker):
    port = free_port()
    job = await broker.svc.submit(two_node(files={"barrier.py": BARRIER_SCRIPT}, command="python3 barrier.py",
                                           rdzv_port=port))
    await broker.svc.place_now([job.id])
    job = await broker.svc.get_job(job.id)
    assert job.state is JobState.provisioning, job.reason
    alloc = await broker.alloc(job)
    assert "+" in alloc.offer_id and len(alloc.resource_ids) == 2 and alloc.nodes == 2
    iids = [int(i) for i in alloc.resource_ids]
    labels = [broker.vast.state.instances[i]["label"] for i in iids]
    base = f"lockstep:{INSTALLATION}:{job.id}:{job.attempts}"
    assert labels == [f"{base}#0/2", f"{base}#1/2"]
    asks = {broker.vast.state.instances[i]["ask_id"] for i in iids}
    assert {f"vast:{a}" for a in asks} == set(member_ids(alloc.offer_id))  # the two machines the quote chose
    # The head asked for Vast's identity form; the rendezvous port is the one Vast mapped for it, which every
    # rank was given (not the spec's port: on Vast a container's port is reached only through its mapping).
    creates = _creates(broker.vast)
    assert "-p 70000:70000" in creates[0]["body"]["env"] and "-p 70000:70000" not in creates[1]["body"]["env"]
    [mapped] = [k for k in broker.vast.state.instances[iids[0]]["ports"] if k != "22/tcp"]
    port = int(mapped.split("/")[0])
    assert broker.vast.state.instances[iids[0]]["ports"][mapped][0]["HostPort"] == str(port)

    async def ended() -> bool:
        await broker.svc.poll_now()
        return (await broker.svc.get_job(job.id)).state in (JobState.succeeded, JobState.failed)

    await wait_for(ended, limit_s=120, every=0.3)
    job = await broker.svc.get_job(job.id)
    assert job.state is JobState.succeeded, job.reason
    assert not broker.vast.state.instances  # both machines destroyed, with no cancel
    deleted = sorted(int(r["path"].rstrip("/").rsplit("/", 1)[1]) for r in broker.vast.state.requests
                     if r["method"] == "DELETE")
    assert deleted == sorted(iids)

    # Each machine's log: the rendezvous agrees on everything but the rank, and the barrier passed.
    logs = [[ln.text for ln in parse_log(await broker.provider.job_log(alloc, rank=rank)) if ln.stream == "out"]
            for rank in range(2)]
    check_barrier(logs, ["127.0.0.1", "127.0.0.1"], port, gpus_per_node=1)


async def test_when_the_second_rent_fails_the_first_machine_is_destroyed_and_the_launch_fails_cleanly(
        vast_api: VastApiServer, vast_config: VastConfig):
    _local_machines(vast_api)
    provider = VastProvider(vast_config, installation=INSTALLATION)
    try:
        offers = await provider.offers(OfferQuery(gpus=["RTX-4090"], markets=[Market.on_demand]))
        ones = [o for o in offers if o.gpu_count == 1][:2]
        assert len(ones) == 2
        spec = two_node(command="sleep 600")
        req = LaunchRequest(job_id="j-fault", attempt=1, spec=spec, offer=combine(ones), nodes=2, members=ones)
        vast_api.state.set_faults(Faults(steal_create_number=2))  # the second machine is rented by someone else
        with pytest.raises(CapacityError):
            await provider.launch(req)
        assert len(_creates(vast_api)) == 2
        assert vast_api.state.instances == {}  # no machine left running, or billing
        assert [r for r in vast_api.state.requests if r["method"] == "DELETE"], "the first machine was destroyed"
        assert await provider.owned() == []

        # The same attempt again, with the market back: rents both, once each (idempotent on the labels).
        vast_api.state.set_faults(Faults())
        vast_api.state.rented.clear()
        first = await provider.launch(req)
        again = await provider.launch(req)
        assert first.resource_ids == again.resource_ids and len(first.resource_ids) == 2
        assert len(vast_api.state.instances) == 2
        await provider.release(first)
        assert vast_api.state.instances == {}
    finally:
        await provider.aclose()


async def test_a_vanished_machine_requeues_the_job_and_the_other_is_destroyed(broker: Broker):
    job = await broker.svc.submit(two_node(command="echo started; sleep 600"))
    await broker.svc.place_now([job.id])
    alloc = await broker.alloc(await broker.svc.get_job(job.id))
    assert len(alloc.resource_ids) == 2

    async def running() -> bool:
        await broker.svc.poll_now()
        return (await broker.svc.get_job(job.id)).state is JobState.running

    await wait_for(running, limit_s=60, every=0.2)
    # After a crash, what Vast holds reads back as one allocation of two machines, in rank order.
    held = [a for a in await broker.provider.owned() if a.job_id == job.id]
    assert len(held) == 1 and held[0].resource_ids == alloc.resource_ids and held[0].nodes == 2
    assert [parse_label(f"lockstep:{INSTALLATION}:", broker.vast.state.instances[int(i)]["label"])[2]
            for i in held[0].resource_ids] == [0, 1]

    broker.vast.state.vanish(int(alloc.resource_ids[1]))
    await broker.svc.poll_now()
    job = await broker.svc.get_job(job.id)
    assert job.state is JobState.pending and job.preemptions == 1, job.reason
    preempted = [e for e in job.events if e.to_state is JobState.preempted]
    assert len(preempted) == 1 and re.search(r"rank 1.*vanished", preempted[0].reason)
    assert not broker.vast.state.instances  # the surviving machine was given back with the allocation


async def test_a_failed_rent_during_placement_frees_the_first_machine_and_the_next_assembly_is_placed(
        broker: Broker):
    broker.vast.state.set_faults(Faults(steal_create_number=2))  # someone else takes the second machine
    job = await broker.svc.submit(two_node(command="sleep 600"))
    result = await broker.svc.place_now([job.id])
    job = await broker.svc.get_job(job.id)
    assert job.state is JobState.provisioning, (job.reason, result)
    allocs = await broker.svc.job_allocations(job.id)
    failed, placed = allocs[0], allocs[-1]
    assert failed.state.value == "failed" and "no longer available" in failed.reason
    assert set(member_ids(failed.offer_id)).isdisjoint(member_ids(placed.offer_id))
    # Only the placed assembly's two machines are held: the first try's machine was destroyed at once.
    assert sorted(broker.vast.state.instances) == sorted(int(i) for i in placed.resource_ids)
    assert len(_creates(broker.vast)) == 4
    await broker.svc.cancel(job.id)
    await broker.svc.poll_now()
    assert not broker.vast.state.instances


async def test_a_launch_cut_short_by_a_crash_reads_back_as_lost_and_is_released(
        vast_api: VastApiServer, vast_config: VastConfig):
    """A crash between the two rents leaves one machine labelled as rank 0 of 2: after a restart it is listed as
    an allocation of 2 nodes holding 1 machine, which polls as gone (the job is requeued) and is released."""
    _local_machines(vast_api)
    provider = VastProvider(vast_config, installation=INSTALLATION)
    try:
        offers = await provider.offers(OfferQuery(gpus=["RTX-4090"], markets=[Market.on_demand]))
        ones = [o for o in offers if o.gpu_count == 1][:2]
        req = LaunchRequest(job_id="j-crash", attempt=2, spec=two_node(command="sleep 600"), offer=combine(ones),
                            nodes=2, members=ones)
        base = f"lockstep:{INSTALLATION}:j-crash:2"
        await provider._rent(req, ones[0], member_label(base, 0, 2), {})  # the crash came after this one
        (held,) = [a for a in await provider.owned() if a.job_id == "j-crash"]
        assert held.nodes == 2 and len(held.resource_ids) == 1
        status = await provider.poll(held)
        assert status.state is AllocationState.released and "1 of the 2 machines" in status.reason
        await provider.release(held)
        assert vast_api.state.instances == {}
    finally:
        await provider.aclose()


async def test_a_quote_through_the_service_weighs_assembled_machines_and_never_for_a_cluster_job(broker: Broker):
    q = await broker.svc.quote(two_node(), top=5)
    assert q.options and all("+" in o.offer_id and o.nodes == 2 for o in q.options)
    best = q.options[0]
    offer = broker.svc.market.find(best.offer_id)  # what the router launches: made again from its machines
    assert offer is not None and offer.attrs["members"] == ",".join(member_ids(best.offer_id))
    assert offer.usd_per_hour * 2 == pytest.approx(best.usd_per_hour, rel=1e-4)
    assert any("assembled" in n for n in q.notes)

    together = await broker.svc.quote(two_node(colocate="cluster"), top=5)
    assert not together.options and together.rejected_counts.get("nodes")
