"""What the API shows of a market's faults, on a real server over the local Vast API.

A drained node leaves ``GET /v1/offers`` at once (not at the next refresh), as it leaves quotes; a provider
whose key is revoked shows its circuit (``auth_failed``) in ``GET /v1/providers`` and in ``/metrics``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.api import create_app, start_server
from broker.config import BrokerConfig, Settings
from broker.models import Role
from broker.service import Lockstep
from broker.store import Store
from providers.vast import VastProvider
from standins.vastapi.server import Faults, VastApiServer


@dataclass
class Served:
    url: str
    admin: str
    svc: Lockstep

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {self.admin}"}, timeout=60)


@pytest.fixture
async def served(tmp_path: Path, vast_api: VastApiServer, vast_config) -> AsyncIterator[Served]:
    """``lockstep serve``'s application (no background loops: the test drives refreshes) over a Vast market."""
    db_url = f"sqlite:///{tmp_path / 'faults.db'}"
    store = Store(db_url)
    store.migrate()
    _, admin = store.create_token("ops", Role.admin)
    svc = Lockstep(Settings(db_url=db_url, broker=BrokerConfig(installation="api-faults")),
                   providers={"vast": VastProvider(vast_config, installation="api-faults")}, store=store)
    runner, url = await start_server(create_app(svc, start_loops=False), "127.0.0.1", 0)
    try:
        yield Served(url, admin, svc)
    finally:
        await runner.cleanup()


async def test_a_drained_node_leaves_the_offers_at_once(served: Served) -> None:
    async with served.client() as client:
        offers = (await client.get("/v1/offers", params={"provider": "vast"})).json()
        refreshed = served.svc.market.refreshed_at
        offer = next(o for o in offers if o["locality"]["host"])
        host = offer["locality"]["host"]
        on_host = {o["id"] for o in offers if o["locality"]["host"] == host}

        r = await client.post(f"/v1/nodes/vast/{host}/drain", json={"reason": "ECC errors"})
        assert r.status_code == 200, r.text

        after = (await client.get("/v1/offers", params={"provider": "vast"})).json()
        assert served.svc.market.refreshed_at == refreshed  # no refresh in between: the drain alone did it
        assert on_host.isdisjoint(o["id"] for o in after)
        assert len(after) == len(offers) - len(on_host)
        # The quote agrees: none of its options is on the drained node.
        quote = (await client.post("/v1/quotes", json={"name": "q", "gpu": [offer["gpu"]], "gpus": offer["gpu_count"],
                                                       "workload": {"hours": 1}, "providers": ["vast"]})).json()
        assert quote["options"] and all(o["offer_id"] not in on_host for o in quote["options"])


async def test_a_revoked_key_shows_in_providers_and_metrics(served: Served, vast_api: VastApiServer) -> None:
    async with served.client() as client:
        assert (await client.get("/v1/providers")).json()["providers"]["vast"]["circuit"]["state"] == "closed"
        vast_api.state.set_faults(Faults(unauthorized=True))
        await served.svc.refresh()
        refused = len(vast_api.state.requests)
        await served.svc.refresh()  # not called again: the refused key stands until the configuration changes
        assert len(vast_api.state.requests) == refused

        vast = (await client.get("/v1/providers")).json()["providers"]["vast"]
        assert not vast["ok"] and vast["stale"]
        assert vast["circuit"]["state"] == "auth_failed" and "invalid_user_key" in vast["circuit"]["reason"]
        assert "unusable until its configuration changes" in vast["last_error"]

        scrape = (await client.get("/metrics")).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(scrape) for s in fam.samples}
    assert samples[("lockstep_provider_circuit_state", (("provider", "vast"),))] == 3
    assert samples[("lockstep_provider_up", (("provider", "vast"),))] == 0
