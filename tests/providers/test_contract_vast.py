"""The kit against the local Vast API server (standins/vastapi)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr

from broker.models import Market
from providers.base import OfferQuery
from providers.vast import VastProvider
from providers.vast.config import VastConfig
from tests.plugins.vast import VAST_TEST_KEY
from tests.providers.kit import (
    AssemblesNodesContract,
    HasJobLogsContract,
    LaunchesContract,
    OffersContract,
    ReportsEndContract,
    Subject,
)


class TestVast(OffersContract, LaunchesContract, AssemblesNodesContract, HasJobLogsContract,
               ReportsEndContract):
    provider_type = VastProvider

    @pytest.fixture
    async def subject(self, vast_config: VastConfig) -> AsyncIterator[Subject]:
        wrong = "vast-wrong-key-5a7c"
        refused = vast_config.model_copy(update={"api_key": SecretStr(wrong), "max_attempts": 1})
        async with VastProvider(vast_config, installation="kit") as vast:
            yield Subject(
                vast,
                OfferQuery(gpus=["RTX-4090"], markets=[Market.on_demand]),
                broken=lambda: VastProvider(refused, installation="kit"),
                secrets=[wrong, VAST_TEST_KEY],
                command="python train.py",
            )
