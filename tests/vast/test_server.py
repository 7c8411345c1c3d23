"""The local Vast-API server itself: it reads queries as Vast's CLI writes them, and runs standalone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import httpx
from pydantic import SecretStr

from broker.models import Market
from providers.base import OfferQuery
from providers.vast import VastProvider
from providers.vast.config import VastConfig
from standins.vastapi.server import VastApiServer, free_port
from tests.conftest import ROOT
from tests.plugins.vast import VAST_TEST_KEY
from tests.waiting import eventually

AUTH = {"Authorization": f"Bearer {VAST_TEST_KEY}"}


async def test_cli_style_query_with_numbers_as_strings(vast_api):
    # What vastai's parse_query makes of 'reliability>0.95 num_gpus=8 gpu_name=H100_SXM geolocation in [US,CA]'.
    query = {"verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True},
             "reliability": {"gt": "0.95"}, "num_gpus": {"eq": "8"}, "gpu_name": {"eq": "H100 SXM"},
             "geolocation": {"in": ["US", "CA"]}, "gpu_ram": {"gte": 80000.0},
             "order": [["dph_total", "asc"], ["num_gpus", "desc"]], "type": "on-demand", "limit": 5}
    async with httpx.AsyncClient(base_url=vast_api.url, headers=AUTH) as client:
        offers = (await client.post("/api/v0/bundles/", json=query)).json()["offers"]
        assert 0 < len(offers) <= 5
        for o in offers:
            assert o["reliability"] > 0.95 and o["num_gpus"] == 8 and o["gpu_name"] == "H100 SXM"
            assert o["geolocation"].endswith((", US", ", CA")) and o["verified"]
        assert [o["dph_total"] for o in offers] == sorted(o["dph_total"] for o in offers)

        new_form = await client.put("/api/v0/search/asks/", json={"select_cols": ["*"], "q": query})
        assert [o["id"] for o in new_form.json()["offers"]] == [o["id"] for o in offers]

        excluded = {"gpu_name": {"notin": ["RTX 4090", "RTX 3090"]}, "num_gpus": {"neq": 8}, "limit": 1000}
        rest = (await client.post("/api/v0/bundles/", json=excluded)).json()["offers"]
        assert rest and all(o["gpu_name"] not in ("RTX 4090", "RTX 3090") and o["num_gpus"] != 8 for o in rest)

        bad = await client.post("/api/v0/bundles/", json={"gpu_nmae": {"eq": "RTX 4090"}})
        assert bad.status_code == 400 and "gpu_nmae" in bad.json()["msg"]
        assert (await client.post("/api/v0/bundles/", json={})).status_code == 200
        unauth = await client.post("/api/v0/bundles/", json={}, headers={"Authorization": "Bearer nope"})
        assert unauth.status_code == 401


async def test_standalone_server_serves_the_adapter():
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "standins.vastapi.server", "--port", str(port), "--api-key", "standalone-key",
        "--count", "60", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = (await proc.stdout.readline()).decode()  # printed once it listens
        assert f"127.0.0.1:{port}" in line, line
        config = VastConfig(url=f"http://127.0.0.1:{port}", api_key=SecretStr("standalone-key"),
                            backoff_initial_s=0.001, backoff_max_s=0.01, retry_after_max_s=0.01)
        async with VastProvider(config) as vast:
            offers = await vast.offers(OfferQuery(markets=[Market.on_demand]))
        assert offers and all(o.provider == "vast" and (o.reliability or 0) >= 0.9 for o in offers)
        async with httpx.AsyncClient(base_url=config.url, headers={"Authorization": "Bearer standalone-key"}) as client:
            ask = (await client.post("/api/v0/bundles/", json={"limit": 1})).json()["offers"][0]["id"]
            iid = (await client.put(f"/api/v0/asks/{ask}/", json={"image": "x", "runtype": "args", "onstart": "sh",
                                                                   "args": ["-c", "echo $$; sleep 600"]})
                   ).json()["new_contract"]
            await _status(client, iid)
            await _status(client, iid)
            pgid = int((await eventually(lambda: _log(client, iid), lambda got: got[0].strip() != "",
                                         "the container printed its pid"))[0])
            assert (await client.post("/_admin/faults", json={"unauthorized": True})).status_code == 200
    finally:
        proc.terminate()
        await proc.wait()
    await _all_gone(pgid)  # a server stopped by SIGTERM leaves no container running


# --------------------------------------------------------------------------- containers and the logs API


def _alive(pid: int) -> bool:
    """Is the process there and not a zombie?"""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry))
    return out


async def _all_gone(pgid: int) -> None:
    await eventually(lambda: asyncio.to_thread(_group, pgid), lambda left: left == [],
                     f"the container's processes (group {pgid}) are gone")


async def _rent(client: httpx.AsyncClient, vast_api, **body) -> int:
    ask = next(a for a in vast_api.state.offers if a not in vast_api.state.rented)
    answer = await client.put(f"/api/v0/asks/{ask}/", json={"client_id": "me", "image": "busybox", "disk": 10,
                                                            "label": "t", **body})
    assert answer.status_code == 200, answer.text
    return int(answer.json()["new_contract"])


async def _status(client: httpx.AsyncClient, iid: int) -> dict:
    return (await client.get(f"/api/v0/instances/{iid}/", params={"owner": "me"})).json()["instances"]


async def _log(client: httpx.AsyncClient, iid: int, **body) -> tuple[str, list[int]]:
    """The logs API as Vast's CLI uses it: PUT request_logs, then poll the result URL (no key) until it is there."""
    answer = (await client.put(f"/api/v0/instances/request_logs/{iid}/", json=body)).json()
    assert answer["success"]
    codes = []
    async with httpx.AsyncClient() as s3:  # the result URL is object storage: no Authorization header
        for _ in range(10):
            got = await s3.get(answer["result_url"])
            codes.append(got.status_code)
            if got.status_code == 200:
                return got.text, codes
    raise AssertionError(codes)


async def test_an_args_launch_runs_its_command_until_it_exits_and_serves_its_log(vast_api):
    async with httpx.AsyncClient(base_url=vast_api.url, headers=AUTH) as client:
        iid = await _rent(client, vast_api, runtype="args", onstart="sh", env={"GREETING": "hello from env"},
                          args=["-c", 'echo "$GREETING"; echo to-stderr >&2; echo "home=$HOME"; exit 3'])
        assert (await _status(client, iid))["actual_status"] == "loading"
        assert (await _status(client, iid))["actual_status"] in ("running", "exited")
        done = await eventually(lambda: _status(client, iid), lambda i: i["actual_status"] == "exited",
                                "the container exits with its command")
        assert done["status_msg"] == "Exited (3)" and done["intended_status"] == "running"
        listed = (await client.get("/api/v1/instances/")).json()["instances"]
        assert [i["actual_status"] for i in listed if i["id"] == iid] == ["exited"]

        text, codes = await _log(client, iid)
        assert codes == [403, 200]  # not uploaded yet on the first look, as S3 right after the PUT
        lines = text.splitlines()
        assert lines[0] == "hello from env" and "to-stderr" in lines  # stdout and stderr, one log
        home = next(ln for ln in lines if ln.startswith("home="))[len("home="):]
        assert home.startswith(str(vast_api.state.containers[iid].dir))  # a temp dir of its own
        assert (await _log(client, iid, tail="1"))[0] == lines[-1] + "\n"
        assert (await _log(client, iid, filter="stderr"))[0] == "to-stderr\n"
        daemon = (await _log(client, iid, daemon_logs="true"))[0]
        assert "pulling busybox" in daemon and "Exited (3)" in daemon
        assert not any(u.get("keyed") for u in vast_api.state.log_uploads.values())

        gone = await client.put("/api/v0/instances/request_logs/1/", json={})
        assert gone.status_code == 404 and gone.json()["error"] == "invalid_id"
        unauth = await client.put(f"/api/v0/instances/request_logs/{iid}/", json={}, headers={"Authorization": "x"})
        assert unauth.status_code == 401


async def test_destroy_kills_every_process_of_the_container(vast_api):
    async with httpx.AsyncClient(base_url=vast_api.url, headers=AUTH) as client:
        # The command leaves children in the background, one of them in a session of its own (as the wrapper
        # starts the job's command): removing a container kills them all, as docker does.
        iid = await _rent(client, vast_api, runtype="args", onstart="sh",
                          args=["-c", "sleep 600 & setsid sleep 600 & echo $!; wait"])
        await _status(client, iid)
        assert (await _status(client, iid))["actual_status"] == "running"
        pgid = vast_api.state.containers[iid].proc.pid
        await eventually(lambda: asyncio.to_thread(_group, pgid), lambda live: len(live) == 2,
                         "sh and its sleep run")
        text = (await eventually(lambda: _log(client, iid), lambda got: got[0].strip() != "", "a pid printed"))[0]
        away = int(text.strip())  # the sleep in a session of its own
        assert away not in _group(pgid) and _alive(away)
        assert (await client.request("DELETE", f"/api/v0/instances/{iid}/", json={})).status_code == 200
        await _all_gone(pgid)
        await eventually(lambda: asyncio.to_thread(_alive, away), lambda alive: not alive, "its own session too")
        assert iid not in vast_api.state.instances and iid not in vast_api.state.containers


async def test_ssh_launches_run_nothing_and_an_image_without_python_has_none(vast_api):
    async with httpx.AsyncClient(base_url=vast_api.url, headers=AUTH) as client:
        ssh = await _rent(client, vast_api, runtype="ssh", onstart="sleep 600")
        await _status(client, ssh)
        assert (await _status(client, ssh))["actual_status"] == "running"
        assert ssh not in vast_api.state.containers

        vast_api.state.images_without_python.add("busybox")
        iid = await _rent(client, vast_api, runtype="args", onstart="sh",
                          args=["-c", "command -v python3 || echo no python3 here"])
        await _status(client, iid)
        await eventually(lambda: _status(client, iid), lambda i: i["actual_status"] == "exited", "exits")
        assert (await _log(client, iid))[0] == "no python3 here\n"

        missing = await _rent(client, vast_api, runtype="args", onstart="no-such-entrypoint")
        await _status(client, missing)
        shown = await _status(client, missing)
        assert shown["actual_status"] == "exited" and "executable file not found" in shown["status_msg"]


async def test_stopping_the_server_kills_every_container():
    server = await VastApiServer(VAST_TEST_KEY, count=20).start()
    try:
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as client:
            iid = await _rent(client, server, runtype="args", onstart="sh", args=["-c", "sleep 600"])
            await _status(client, iid)
            await _status(client, iid)
            pgid = server.state.containers[iid].proc.pid
            root = server.state.containers[iid].dir
    finally:
        await server.stop()
    await _all_gone(pgid)
    assert not root.exists()
