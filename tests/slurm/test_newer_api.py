"""The provider against the newer slurmrestd shapes (v0.0.40 / v0.0.41, Slurm 23.11 / 24.05).

No such slurmrestd can be installed here (Debian 12 ships 22.05), so a small aiohttp server on 127.0.0.1
answers with the real v0.0.40 responses recorded from Slurm 23.11 (shared/data/slurm/slurm-23.11-v0.0.40)
and checks every request body against the real v0.0.41 OpenAPI schema before accepting it.
"""

from __future__ import annotations

import base64
import copy
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import SecretStr

from broker.errors import TransientError
from broker.models import AllocationState, JobSpec, Workload
from providers.base import LaunchRequest
from providers.slurm import SlurmProvider
from providers.slurm.config import SlurmConfig

V40 = "slurm/slurm-23.11-v0.0.40"
SPEC41 = "slurm/specs/slurm_openapi_spec_v0.0.41_testsuite.json"


def fake_jwt(exp: float) -> str:
    def seg(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{seg({'alg': 'HS256', 'typ': 'JWT'})}.{seg({'exp': int(exp), 'sun': 'root'})}.c2lnbmF0dXJl"


@dataclass
class NewSlurm:
    """State of the fake newer slurmrestd: recorded data plus what the tests submitted."""

    version: str
    openapi: dict[str, Any]
    nodes: dict[str, Any]
    partitions: dict[str, Any]
    jobs: list[dict[str, Any]]
    job_props: set[str]
    submit_props: set[str]
    node_props: set[str]
    template: dict[str, Any]
    submitted: list[dict[str, Any]] = field(default_factory=list)
    node_updates: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    next_id: int = 9_000_001
    fail_nodes: int = 0  # answer GET nodes with a bare 503 this many times first
    nodes_calls: int = 0
    meta: dict[str, Any] | None = None  # a recorded answer's meta (Slurm 23.11.1), else a short one
    warnings: list[dict[str, Any]] = field(default_factory=list)  # sent with every answer
    submit_warnings: list[dict[str, Any]] = field(default_factory=list)  # sent with submit answers only

    def reply(self, body: dict[str, Any], status: int = 200, warnings: list[dict[str, Any]] | None = None
              ) -> web.Response:
        meta = self.meta or {"plugin": {"type": f"openapi/{self.version}"}, "slurm": {"release": "23.11.1"}}
        return web.json_response({"meta": meta, "errors": [], "warnings": [*self.warnings, *(warnings or [])],
                                  **body}, status=status)

    def error(self, status: int, errno: int, text: str) -> web.Response:
        return web.json_response({"errors": [{"error_number": errno, "error": text}], "warnings": []}, status=status)

    def app(self) -> web.Application:
        v = self.version

        @web.middleware
        async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
            if not request.headers.get("X-SLURM-USER-TOKEN") or not request.headers.get("X-SLURM-USER-NAME"):
                return web.Response(status=401, text="Authentication failure")
            return await handler(request)

        async def openapi(_: web.Request) -> web.Response:
            return web.json_response(self.openapi)

        async def nodes(_: web.Request) -> web.Response:
            self.nodes_calls += 1
            if self.fail_nodes > 0:
                self.fail_nodes -= 1
                return web.Response(status=503, text="busy")
            return self.reply(self.nodes)

        async def partitions(_: web.Request) -> web.Response:
            return self.reply(self.partitions)

        async def jobs(_: web.Request) -> web.Response:
            return self.reply({"jobs": self.jobs})

        def find(job_id: str) -> dict[str, Any] | None:
            return next((j for j in self.jobs if str(j["job_id"]) == job_id), None)

        async def job(request: web.Request) -> web.Response:
            j = find(request.match_info["id"])
            if j is None:
                return self.error(500, 2017, "Invalid job id specified")
            if request.method == "DELETE":
                j["job_state"] = ["CANCELLED"]
                return self.reply({})
            if request.method == "POST":
                body = await request.json()
                if not set(body) <= self.job_props:
                    return self.error(400, 9001, f"unknown keys {sorted(set(body) - self.job_props)}")
                j["comment"] = body.get("comment", j["comment"])
                return self.reply({"job_id": j["job_id"]})
            return self.reply({"jobs": [j]})

        async def submit(request: web.Request) -> web.Response:
            body = await request.json()
            desc = body.get("job") or {}
            if not set(body) <= self.submit_props or not set(desc) <= self.job_props:
                return self.error(400, 9001, "Failure during parsing")
            self.submitted.append(body)
            new = copy.deepcopy(self.template)
            new.update(
                job_id=self.next_id,
                name=desc["name"],
                comment=desc.get("comment", ""),
                job_state=["PENDING"],
                state_reason="Resources",
                partition=desc.get("partition", ""),
                tres_per_node=desc.get("tres_per_node", ""),
                node_count={"set": True, "infinite": False, "number": desc.get("minimum_nodes", 1)},
                time_limit=desc["time_limit"],
                nodes="",
            )
            self.jobs.append(new)
            self.next_id += 1
            return self.reply({"job_id": new["job_id"], "step_id": "batch", "job_submit_user_msg": ""},
                              warnings=self.submit_warnings)

        async def node_post(request: web.Request) -> web.Response:
            body = await request.json()
            if not set(body) <= self.node_props:
                return self.error(400, 9001, "Failure during parsing")
            self.node_updates.append((request.match_info["name"], body))
            return self.reply({})

        app = web.Application(middlewares=[auth])
        app.router.add_get("/openapi/v3", openapi)
        app.router.add_get(f"/slurm/{v}/nodes", nodes)
        app.router.add_get(f"/slurm/{v}/partitions", partitions)
        app.router.add_get(f"/slurm/{v}/jobs", jobs)
        app.router.add_route("*", f"/slurm/{v}/job/submit", submit)
        app.router.add_route("*", f"/slurm/{v}/job/{{id}}", job)
        app.router.add_post(f"/slurm/{v}/node/{{name}}", node_post)
        return app


@pytest.fixture(params=["v0.0.40", "v0.0.41"])
async def new_slurm(request: pytest.FixtureRequest, shared_data: Path) -> AsyncIterator[tuple[NewSlurm, str]]:
    version: str = request.param

    def load(rel: str) -> Any:
        return json.loads((shared_data / rel).read_text(encoding="utf-8"))

    spec41 = load(SPEC41)
    schemas = spec41["components"]["schemas"]
    if version == "v0.0.41":
        openapi = spec41  # the real document: the provider must find v0.0.41 in it
    else:
        openapi = {"openapi": "3.0.3", "paths": {p.replace("v0.0.41", "v0.0.40"): {} for p in spec41["paths"]}}
    jobs = load(f"{V40}/V0040OpenapiJobInfoResp.json")["jobs"]
    state = NewSlurm(
        version=version,
        openapi=openapi,
        nodes=load(f"{V40}/V0040OpenapiNodesResp.json"),
        partitions=load(f"{V40}/V0040OpenapiPartitionResp.json"),
        jobs=copy.deepcopy(jobs),
        job_props=set(schemas["v0.0.41_job_desc_msg"]["properties"]),
        submit_props=set(schemas["v0.0.41_job_submit_req"]["properties"]),
        node_props=set(schemas["v0.0.41_update_node_msg"]["properties"]),
        template=copy.deepcopy(jobs[1]),
    )
    runner = web.AppRunner(state.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield state, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_newer_api_end_to_end(new_slurm: tuple[NewSlurm, str]) -> None:
    server, url = new_slurm
    cfg = SlurmConfig(enabled=True, url=url, token=SecretStr(fake_jwt(time.time() + 3600)), cluster_name="talapas")
    async with SlurmProvider(cfg, installation="inst-a") as p:
        assert await p.client.version() == server.version
        offers = await p.offers()
        hosts = {o.locality.host: o for o in offers if o.max_nodes == 1}
        assert "n0164" not in hosts and "n0999" not in hosts  # drained in the recorded answer
        h100 = hosts["n1000"]
        assert (h100.gpu, h100.gpu_count, h100.locality.zone) == ("H100-SXM", 8, "kerngpu")

        spec = JobSpec(name="t", gpu=["H100"], gpus=8, gpus_per_node=8, workload=Workload(hours=0.5),
                       command="true")
        req = LaunchRequest(job_id="job-new-1", spec=spec, offer=h100, nodes=1, installation="inst-a")
        alloc = await p.launch(req)
        assert alloc.state is AllocationState.pending and alloc.resource_ids == ["9000001"]
        sent = server.submitted[-1]["job"]
        assert sent["tres_per_node"] == "gres/gpu:nvidia_h100_80gb_hbm3:8"
        assert sent["time_limit"] == {"set": True, "infinite": False, "number": 30}
        assert "LOCKSTEP_JOB_ID=job-new-1" in sent["environment"]
        assert (await p.launch(req)).resource_ids == alloc.resource_ids  # idempotent
        assert len(server.submitted) == 1

    async with SlurmProvider(cfg, installation="inst-a") as again:
        owned = await again.owned()
        assert [a.job_id for a in owned] == ["job-new-1"]
        assert (await again.poll(owned[0])).state is AllocationState.pending
        await again.release(owned[0])
        assert (await again.poll(owned[0])).state is AllocationState.released
        await again.drain("n1000", "ecc")
        await again.resume("n1000")
    assert server.node_updates == [
        ("n1000", {"state": ["DRAIN"], "reason": "ecc"}),
        ("n1000", {"state": ["RESUME"]}),
    ]


async def test_transient_failures_are_retried_then_reported(new_slurm: tuple[NewSlurm, str]) -> None:
    server, url = new_slurm
    token = SecretStr(fake_jwt(time.time() + 3600))
    cfg = SlurmConfig(enabled=True, url=url, token=token, max_attempts=3)
    async with SlurmProvider(cfg) as p:
        server.fail_nodes = 2  # two 503s, then the answer: within the bound
        assert len(await p.client.nodes()) == 12
        assert server.nodes_calls == 3
        server.fail_nodes = 5  # more than the bound: reported as transient, after exactly 3 tries
        with pytest.raises(TransientError):
            await p.client.nodes()
        assert server.nodes_calls == 6
    # Nothing listens on port 1 of loopback: a connection error is transient too.
    async with SlurmProvider(SlurmConfig(url="http://127.0.0.1:1", token=token, max_attempts=2)) as p:
        with pytest.raises(TransientError):
            await p.offers()
