"""The kit against the bundled catalog (a snapshot: offers only)."""

from __future__ import annotations

import pytest

from broker.models import Market
from providers.base import OfferQuery
from providers.catalog import CatalogProvider
from tests.providers.kit import OffersContract, SnapshotContract, Subject


class TestCatalog(OffersContract, SnapshotContract):
    provider_type = CatalogProvider

    @pytest.fixture
    def subject(self) -> Subject:
        return Subject(CatalogProvider(), OfferQuery(gpus=["H100-SXM"], markets=[Market.spot], regions=["us-east-1"]))
