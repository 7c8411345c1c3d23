"""pytest fixtures: the local Vast-API server (standins/vastapi), started once per session on a free loopback port.

- ``vast_server``: the running server (session); ``vast_server.state`` holds its market, rentals, request log
  and faults.
- ``vast_api``: the same server, reset for this test (fresh market, no rentals, no faults, empty log).
- ``vast_config``: a VastConfig pointing at it, with a short backoff so retry tests stay quick, and no reuse
  of the instance list between polls (tests move instances between two polls).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr

from providers.vast.config import VastConfig
from standins.vastapi.server import VastApiServer

VAST_TEST_KEY = "vast-test-key-0f3c9a7e51d2"


@pytest.fixture(scope="session")
async def vast_server() -> AsyncIterator[VastApiServer]:
    server = VastApiServer(VAST_TEST_KEY, seed=7, count=400)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
def vast_api(vast_server: VastApiServer) -> VastApiServer:
    vast_server.state.reset()
    return vast_server


@pytest.fixture
def vast_config(vast_api: VastApiServer) -> VastConfig:
    return VastConfig(
        enabled=True,
        url=vast_api.url,
        api_key=SecretStr(VAST_TEST_KEY),
        timeout_s=5.0,
        max_attempts=8,
        min_reliability=0.0,
        verified_only=False,
        backoff_initial_s=0.001,
        backoff_max_s=0.01,
        retry_after_max_s=0.01,
        list_reuse_s=0.0,  # every poll reads the list afresh: tests move instances between polls
        ports_wait_s=60.0,
    )
