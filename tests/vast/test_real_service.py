"""The adapter against the local Vast server made to behave like the real service (issue 28): the instance list
refuses pages over 25, the create body carries ``entrypoint``, one list read serves a poll round, rate limits
answer 429 with no Retry-After, instance rows carry no ``is_bid`` (outbid → preemption, tests/vast/
test_lifecycle.py), and the retry budget ends a call that keeps being refused."""

from __future__ import annotations

import pytest

from broker.models import AllocationState, Market
from providers.base import OfferQuery
from providers.retry import Throttled
from providers.vast import VastProvider
from providers.vast.client import LIST_PAGE
from standins.vastapi.server import LIST_LIMIT_MAX, Faults
from tests.vast.helpers import launch_request


async def _offers(vast: VastProvider, n: int):
    offers = await vast.offers(OfferQuery(gpus=["RTX-4090"], markets=[Market.on_demand], disk_gb=50))
    assert len(offers) >= n
    return sorted(offers, key=lambda o: o.usd_per_hour)[:n]


def _lists(vast_api) -> list[dict]:
    return [r for r in vast_api.state.requests if r["method"] == "GET" and r["path"] == "/api/v1/instances/"]


async def test_the_instance_list_is_read_in_pages_vast_accepts(vast_api, vast_config):
    async with VastProvider(vast_config, installation="pages") as vast:
        offers = await _offers(vast, 30)
        for i, offer in enumerate(offers):  # each launch first looks for its label in the list
            await vast.launch(launch_request(offer, job_id=f"job-{i}"))
        owned = await vast.owned()
    assert sorted(a.job_id for a in owned) == sorted(f"job-{i}" for i in range(30))
    limits = {int(r["query"]["limit"]) for r in _lists(vast_api)}
    assert limits and max(limits) <= LIST_LIMIT_MAX and LIST_PAGE <= LIST_LIMIT_MAX
    assert any("after_token" in r["query"] for r in _lists(vast_api)), "30 instances take two pages"


async def test_the_create_body_names_the_entrypoint_beside_onstart(vast_api, vast_config):
    async with VastProvider(vast_config) as vast:
        [offer] = await _offers(vast, 1)
        alloc = await vast.launch(launch_request(offer, job_id="job-entry", command="echo from-the-entrypoint"))
        [create] = [r for r in vast_api.state.requests if r["method"] == "PUT" and "/asks/" in r["path"]]
        assert create["body"]["entrypoint"] == "sh" and create["body"]["onstart"] == "sh"
        assert create["body"]["runtype"] == "args"

        async def ended():
            return (await vast.poll(alloc)).state

        for _ in range(600):  # the container runs from the entrypoint and ends with the command
            state = await ended()
            if state in (AllocationState.succeeded, AllocationState.failed):
                break
        assert state is AllocationState.succeeded
        assert "from-the-entrypoint" in await vast.job_log(alloc)
        await vast.release(alloc)


async def test_a_poll_round_reads_the_list_once_and_copes_with_bare_429s(vast_api, vast_config):
    # Three allocations polled in one round (within list_reuse_s): one list read, never one call per instance.
    cfg = vast_config.model_copy(update={"list_reuse_s": 3600.0})
    async with VastProvider(cfg) as vast:
        allocs = [await vast.launch(launch_request(o, job_id=f"job-round-{i}"))
                  for i, o in enumerate(await _offers(vast, 3))]
        vast_api.state.requests.clear()
        # Vast's limit: per endpoint and key, 429 with no Retry-After. Two calls per window here.
        vast_api.state.set_faults(Faults(rate_limit=2, rate_window_s=3600.0))
        states = [(await vast.poll(a)).state for a in allocs]
        assert all(s in (AllocationState.pending, AllocationState.running) for s in states)
        calls = [(r["method"], r["path"]) for r in vast_api.state.requests]
        assert calls == [("GET", "/api/v1/instances/")], calls  # no GET /api/v0/instances/{id}/ per machine
        vast_api.state.set_faults(Faults())
        for a in allocs:
            await vast.release(a)

    # A bare 429 (no Retry-After) is retried with jittered backoff until the window lets the call through.
    vast_api.state.set_faults(Faults(rate_limit=1, rate_window_s=0.3))
    paced = vast_config.model_copy(update={"backoff_initial_s": 0.2, "backoff_max_s": 0.5, "max_attempts": 10,
                                           "retry_budget_s": 20.0})
    async with VastProvider(paced) as vast:
        assert await vast.owned() == []
        assert await vast.owned() == []  # the second read within the window met a 429 first
    refused = [r for r in vast_api.state.requests if r["path"] == "/api/v1/instances/"]
    assert len(refused) >= 3  # two reads, at least one of them refused once and retried


async def test_the_retry_budget_ends_a_call_that_keeps_being_refused(vast_api, vast_config):
    vast_api.state.set_faults(Faults(rate_limit=1, rate_window_s=3600.0))
    cfg = vast_config.model_copy(update={"max_attempts": 1000, "backoff_initial_s": 0.05, "backoff_max_s": 0.05,
                                         "retry_budget_s": 0.5})
    async with VastProvider(cfg) as vast:
        await vast.owned()  # the one call the window allows
        with pytest.raises(Throttled):
            await vast.owned()
    attempts = [r for r in vast_api.state.requests if r["path"] == "/api/v1/instances/"]
    assert 2 <= len(attempts) < 1000  # stopped by the budget, not by max_attempts


def test_timeouts_follow_the_cli_and_retries_fit_the_brokers_timeout(vast_config):
    from pydantic import ValidationError

    from broker.config import BrokerConfig, Settings
    from providers.vast.config import VastConfig
    assert VastConfig().create_timeout_s == 120.0  # vastai's per-request timeout, for slow creates
    assert VastConfig().retry_budget_s < BrokerConfig().provider_timeout_s
    with pytest.raises(ValidationError, match="retry_budget_s"):
        Settings(vast={"enabled": True, "retry_budget_s": 60}, broker={"provider_timeout_s": 30})
