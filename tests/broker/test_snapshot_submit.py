"""Submitting where the only options are snapshot prices, with a market configured (tests/api/test_snapshot_jobs.py
covers the catalog-only installation through the API and the CLI).

The AWS market here is the in-memory one of standins/memory.py under the name "aws", beside the real bundled
catalog: what is tested is the service's rule, not an adapter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.config import BrokerConfig, Settings
from broker.errors import TransientError
from broker.models import OfferSource
from broker.service import Lockstep
from providers.base import OfferQuery
from providers.catalog import CatalogProvider
from standins.memory import MemoryProvider, clock, offer, spec

AWS_ONLY = {"providers": ["aws"], "gpu": "A10G", "markets": ["on_demand"]}


class FailingMemory(MemoryProvider):
    """Configured, but its API does not answer."""

    async def offers(self, query: OfferQuery | None = None) -> list:
        raise TransientError(self.name, "DescribeInstanceTypes in us-east-1: connection failed", "ConnectError")


@pytest.fixture
async def svc_for(tmp_path: Path) -> AsyncIterator:
    made: list[Lockstep] = []

    def make(aws: MemoryProvider, mode: str = "warn") -> Lockstep:
        settings = Settings(db_url=f"sqlite:///{tmp_path / f'{len(made)}.db'}",
                            broker=BrokerConfig(snapshot_only_jobs=mode))  # type: ignore[arg-type]
        # The memory market's offers are observed at its fixed NOW: the service reads the same clock, so a
        # price's age (and its "live" label) does not depend on the day the test runs.
        svc = Lockstep(settings, providers={"catalog": CatalogProvider(), "aws": aws}, clock=clock)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        await svc.aclose()


async def test_a_live_option_means_no_warning_and_the_catalogs_rows_give_way(svc_for) -> None:
    svc = svc_for(MemoryProvider("aws", [offer("aws", "xlarge", 1.006)]))
    job = await svc.submit(spec(**AWS_ONLY))
    assert job.reason == "" and job.decision == {}
    q = await svc.quote(spec(**AWS_ONLY))
    assert q.feasible_sources == {"aws": {"live": 1}}  # the catalog's g5 rows are gone: AWS answered
    assert [o.source for o in q.options] == [OfferSource.live] and q.options[0].source_label == "live"


async def test_a_configured_market_that_does_not_answer_gets_a_warning_that_says_so(svc_for) -> None:
    svc = svc_for(FailingMemory("aws", []), mode="refuse")  # refuse: only when no market could run it
    job = await svc.submit(spec(**AWS_ONLY))
    warning = job.decision["warning"]
    assert warning.startswith("warning: every option that fits is a snapshot price (aws)")
    assert "aws did not answer its last refresh" in warning and "connection failed" in warning
    assert "not configured" not in warning  # aws is configured: nothing to switch on
    assert job.reason == warning
    q = await svc.quote(spec(**AWS_ONLY))
    assert set(q.feasible_sources) == {"aws"} and set(q.feasible_sources["aws"]) == {"snapshot"}
    assert all(o.offer_id.startswith("catalog:aws:") and o.source is OfferSource.snapshot for o in q.options)
