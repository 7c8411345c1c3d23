"""Rent → poll → destroy, found again by label after a restart, and listed by owned()."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json

from pydantic import SecretStr

from broker.config import RuntimeConfig
from broker.models import AllocationState, Market, RegistryAuth
from providers.base import LaunchRequest, OfferQuery
from providers.runtime.manifest import REGISTRY_PASSWORD_VAR, RunRequest
from providers.vast import VastProvider
from providers.vast.runtime import BOOT_ARGS
from tests.vast.helpers import job_spec, launch_request
from tests.waiting import eventually


async def _cheapest(vast: VastProvider, gpu: str = "RTX-4090", market: Market = Market.on_demand):
    offers = await vast.offers(OfferQuery(gpus=[gpu], markets=[market], disk_gb=50))
    assert offers
    return min(offers, key=lambda o: o.usd_per_hour)


async def test_rent_poll_destroy_and_find_again_by_label(vast_api, vast_config):
    async with VastProvider(vast_config, installation="ci") as vast:
        offer = await _cheapest(vast)
        req = launch_request(offer, job_id="job-41")
        alloc = await vast.launch(req)
    ask_id = int(offer.attrs["ask_id"])
    iid = int(alloc.resource_ids[0])
    assert alloc.provider == "vast" and alloc.state is AllocationState.pending
    assert alloc.offer_id == offer.id and alloc.client_token == req.client_token
    assert alloc.usd_per_hour == offer.usd_per_hour

    [create] = [r for r in vast_api.state.requests if r["method"] == "PUT"]
    assert create["path"] == f"/api/v0/asks/{ask_id}/"
    body = create["body"]
    assert body["label"] == "lockstep:ci:job-41:0" and body["price"] is None
    assert body["image"] == req.spec.container_image() and body["disk"] == 50.0
    # The container is the job: an args launch whose entrypoint runs the wrapper shipped in env.
    assert body["runtype"] == "args" and body["onstart"] == "sh" and body["args"] == BOOT_ARGS
    assert {"LOCKSTEP_WRAPPER", "LOCKSTEP_MANIFEST"} <= set(body["env"])
    assert vast_api.state.instances[iid]["label"] == "lockstep:ci:job-41:0"

    # The rented ask leaves the market.
    async with VastProvider(vast_config, installation="ci") as vast:
        again = await vast.offers(OfferQuery(gpus=["RTX-4090"], disk_gb=50))
        assert all(o.attrs["ask_id"] != str(ask_id) for o in again)

    # A new adapter (a restarted broker) finds the instance by its label instead of renting twice.
    async with VastProvider(vast_config, installation="ci") as vast:
        same = await vast.launch(req)
        assert same.resource_ids == alloc.resource_ids
        assert len(vast_api.state.instances) == 1
        owned = await vast.owned()
        assert [(a.job_id, a.attempt, a.resource_ids) for a in owned] == [("job-41", 0, [str(iid)])]

        # The list calls above were looks too (the local server moves an instance one step per look).
        states = [(await vast.poll(alloc)).state for _ in range(3)]
        assert states[-1] is AllocationState.running
        assert states == sorted(states, key=[AllocationState.pending, AllocationState.running].index)
        status = await vast.poll(alloc)
        assert status.hosts == [vast_api.state.instances[iid]["public_ipaddr"]]

        await vast.release(alloc)
        assert iid not in vast_api.state.instances
        assert (await vast.poll(alloc)).state is AllocationState.released
        await vast.release(alloc)  # releasing twice is fine
        assert await vast.owned() == []
        back = await vast.offers(OfferQuery(gpus=["RTX-4090"], disk_gb=50))
        assert any(o.attrs["ask_id"] == str(ask_id) for o in back)


async def test_owned_pages_through_instances_and_keeps_only_this_installation(vast_api, vast_config):
    async with VastProvider(vast_config, installation="ci") as mine, \
            VastProvider(vast_config, installation="other") as theirs:
        offers = await mine.offers(OfferQuery(gpus=["RTX-4090", "RTX-3090"], markets=[Market.on_demand]))
        for i, offer in enumerate(offers[:60]):
            await mine.launch(launch_request(offer, job_id=f"job-{i}"))
        await theirs.launch(launch_request(offers[60], job_id="theirs"))
        owned = await mine.owned()
    assert sorted(a.job_id for a in owned) == sorted(f"job-{i}" for i in range(60))
    pages = [r for r in vast_api.state.requests if r["path"] == "/api/v1/instances/" and "after_token" in r["query"]]
    assert pages, "61 instances take more than one page"


async def test_spot_launch_bids_min_bid_and_reports_preemption(vast_api, vast_config):
    async with VastProvider(vast_config) as vast:
        offer = await _cheapest(vast, "RTX-3090", Market.spot)
        alloc = await vast.launch(launch_request(offer, job_id="job-spot"))
        [create] = [r for r in vast_api.state.requests if r["method"] == "PUT"]
        assert create["body"]["price"] == float(offer.attrs["min_bid"])
        iid = int(alloc.resource_ids[0])
        assert [(await vast.poll(alloc)).state for _ in range(2)] == [AllocationState.pending,
                                                                      AllocationState.running]
        await eventually(lambda: vast.job_log(alloc), lambda log: "lockstep node 0 of 1" in log,
                         "the wrapper runs the command")
        vast_api.state.outbid(iid)  # a higher bid: Vast stops the container (TERM), the wrapper says "signal"
        box = vast_api.state.containers[iid]
        await eventually(lambda: asyncio.to_thread(box.running), lambda alive: not alive, "the container stops")
        log = await vast.job_log(alloc)
        assert '"reason": "signal"' in log.splitlines()[-1]  # the wrapper's own account of the TERM
        status = await vast.poll(alloc)
        assert status.state is AllocationState.preempted and "outbid" in status.reason and status.exit is None


async def test_a_container_stopped_outside_lockstep_without_an_exit_status_fails_clearly(vast_api, vast_config):
    async with VastProvider(vast_config) as vast:
        offer = await _cheapest(vast)
        alloc = await vast.launch(launch_request(offer, job_id="job-stopped"))
        iid = int(alloc.resource_ids[0])
        # Stopped in Vast's console before it ever ran: exited, with no log and no LOCKSTEP-EXIT line.
        vast_api.state.set_instance(iid, actual_status="exited", cur_state="stopped", intended_status="stopped",
                                    status_msg="stopped by user")
        status = await vast.poll(alloc)
    assert status.state is AllocationState.failed and status.exit is not None
    assert status.exit.exit_code == 127 and status.exit.reason.value == "error"
    assert "no LOCKSTEP-EXIT line" in status.reason and "stopped by user" in status.reason


async def test_a_private_image_logs_in_through_vast_and_the_command_never_sees_the_password(vast_api, vast_config):
    async with VastProvider(vast_config) as vast:
        offer = await _cheapest(vast)
        spec = job_spec(offer.gpu, offer.gpu_count).model_copy(update={
            "image": "registry.example.com/team/train:3",
            "registry": RegistryAuth(server="registry.example.com", username="bot", password_secret="reg")})
        run = RunRequest.for_launch(spec, job_id="job-private", attempt=1, runtime=RuntimeConfig(), secrets={
            REGISTRY_PASSWORD_VAR: SecretStr("reg-pass-0451"), "HF_TOKEN": SecretStr("hf-token-7781")})
        await vast.launch(LaunchRequest(job_id="job-private", attempt=1, spec=spec, offer=offer, nodes=1, run=run))
    [create] = [r["body"] for r in vast_api.state.requests if r["method"] == "PUT"]
    assert create["image"] == "registry.example.com/team/train:3"
    assert create["image_login"] == "-u bot -p reg-pass-0451 registry.example.com"  # Vast pulls the image
    manifest = json.loads(gzip.decompress(base64.b64decode(create["env"]["LOCKSTEP_MANIFEST"])))
    assert manifest["secrets"] == {"HF_TOKEN": "hf-token-7781"}  # the password is Vast's, not the command's
    assert manifest["rendezvous"]["mode"] == "single" and "container" not in manifest and "shutdown" not in manifest
