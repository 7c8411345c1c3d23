"""The local Vast-API server itself: it reads queries as Vast's CLI writes them, and runs standalone."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
from pydantic import SecretStr

from broker.config import VastConfig
from broker.models import Market
from providers.base import OfferQuery
from providers.vast import VastProvider
from tests.conftest import ROOT
from tests.plugins.vast import VAST_TEST_KEY
from tests.vastapi.server import free_port

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
        sys.executable, "-m", "tests.vastapi.server", "--port", str(port), "--api-key", "standalone-key",
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
        async with httpx.AsyncClient(base_url=config.url) as client:
            assert (await client.post("/_admin/faults", json={"unauthorized": True})).status_code == 200
    finally:
        proc.terminate()
        await proc.wait()
