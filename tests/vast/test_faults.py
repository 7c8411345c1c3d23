"""Throttling, server errors, a revoked key, the daily quota, and races for one ask."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pydantic import SecretStr

from broker.errors import CapacityError, ProviderAuthError, QuotaError, TransientError
from broker.models import AllocationState, Market
from providers.base import OfferQuery
from providers.vast import VastProvider
from standins.vastapi.server import Faults
from tests.plugins.vast import VAST_TEST_KEY
from tests.vast.helpers import launch_request

QUERY = OfferQuery(gpus=["RTX-4090"], markets=[Market.on_demand], disk_gb=50)


async def test_search_succeeds_under_30_percent_429_and_500_faults(vast_api, vast_config):
    async with VastProvider(vast_config) as vast:
        clean = await vast.offers(QUERY)
        vast_api.state.set_faults(Faults(error_rate=0.3, retry_after_s=0, seed=11))
        for _ in range(10):
            faulty = await vast.offers(QUERY)
            assert [o.id for o in faulty] == [o.id for o in clean]
    searches = vast_api.state.searches()
    assert 11 < len(searches) <= 1 + 10 * vast_config.max_attempts  # some were retried, within the bound


async def test_a_burst_of_429s_is_retried_and_bounded(vast_api, vast_config):
    vast_api.state.set_faults(Faults(burst_429=3, retry_after_s=0))
    async with VastProvider(vast_config) as vast:
        assert await vast.offers(QUERY)
        assert len(vast_api.state.searches()) == 4
        vast_api.state.set_faults(Faults(burst_429=100, retry_after_s=0))
        with pytest.raises(TransientError) as err:
            await vast.offers(QUERY)
    assert err.value.code == "too_many_requests"
    assert len(vast_api.state.searches()) == 4 + vast_config.max_attempts


async def test_a_revoked_key_fails_fast_without_showing_the_key(vast_api, vast_config, caplog):
    caplog.set_level(logging.DEBUG)
    vast_api.state.set_faults(Faults(unauthorized=True))
    async with VastProvider(vast_config) as vast:
        with pytest.raises(ProviderAuthError) as err:
            await vast.offers(QUERY)
    assert len(vast_api.state.requests) == 1  # not retried
    assert VAST_TEST_KEY not in str(err.value) and VAST_TEST_KEY not in repr(err.value)
    assert VAST_TEST_KEY not in repr(vast_config) and VAST_TEST_KEY not in repr(vast)
    assert caplog.records and VAST_TEST_KEY not in caplog.text


async def test_a_wrong_key_is_refused(vast_api, vast_config):
    wrong = vast_config.model_copy(update={"api_key": SecretStr("not-the-key")})
    async with VastProvider(wrong) as vast:
        with pytest.raises(ProviderAuthError):
            await vast.offers(QUERY)


async def test_the_daily_quota_is_not_retried(vast_api, vast_config):
    vast_api.state.set_faults(Faults(quota_exhausted=True))
    async with VastProvider(vast_config) as vast:
        with pytest.raises(QuotaError):
            await vast.offers(QUERY)
    assert len(vast_api.state.searches()) == 1


async def test_two_concurrent_rents_of_one_ask_give_one_instance(vast_api, vast_config):
    async with VastProvider(vast_config) as vast:
        offer = (await vast.offers(QUERY))[0]
        results = await asyncio.gather(
            vast.launch(launch_request(offer, job_id="job-a")),
            vast.launch(launch_request(offer, job_id="job-b")),
            return_exceptions=True,
        )
    wins = [r for r in results if not isinstance(r, BaseException)]
    losses = [r for r in results if isinstance(r, BaseException)]
    assert len(wins) == 1 and len(losses) == 1
    assert isinstance(losses[0], CapacityError) and losses[0].code == "no_such_ask"
    assert len(vast_api.state.instances) == 1


async def test_an_ask_rented_between_search_and_create_is_a_capacity_error(vast_api, vast_config):
    async with VastProvider(vast_config) as vast:
        offers = await vast.offers(QUERY)
        vast_api.state.rent_by_other(int(offers[0].attrs["ask_id"]))
        with pytest.raises(CapacityError):
            await vast.launch(launch_request(offers[0], job_id="job-c"))
        vast_api.state.set_faults(Faults(steal_next_create=1))
        with pytest.raises(CapacityError):
            await vast.launch(launch_request(offers[1], job_id="job-c"))
        alloc = await vast.launch(launch_request(offers[2], job_id="job-c"))  # the router's next offer
    assert alloc.state is AllocationState.pending
    assert len(vast_api.state.instances) == 1


async def test_a_lost_create_answer_does_not_rent_twice_or_leak(vast_api, vast_config):
    vast_api.state.set_faults(Faults(lose_next_create=1))
    async with VastProvider(vast_config) as vast:
        offer = (await vast.offers(QUERY))[0]
        alloc = await vast.launch(launch_request(offer, job_id="job-d"))
    [inst] = vast_api.state.instances.values()
    assert alloc.resource_ids == [str(inst["id"])]
    assert [r["method"] for r in vast_api.state.requests if r["path"].startswith("/api/v0/asks/")] == ["PUT", "PUT"]


def test_retry_after_is_honoured_up_to_the_cap(vast_config):
    from tenacity import Future, RetryCallState

    from providers.retry import Throttled, retry_after_seconds

    vast = VastProvider(vast_config.model_copy(update={"retry_after_max_s": 7.0}))

    def waited(retry_after: float | None) -> float:
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        outcome = Future(attempt_number=1)
        outcome.set_exception(Throttled("vast", "POST /api/v0/bundles/: HTTP 429", "too_many_requests", retry_after))
        state.outcome = outcome
        return vast.client.retrying().wait(state)

    assert waited(3.0) == 3.0
    assert waited(120.0) == 7.0
    assert waited(None) <= vast_config.backoff_max_s  # no hint: jittered exponential backoff
    assert retry_after_seconds("2") == 2.0 and retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert retry_after_seconds("soon") is None
