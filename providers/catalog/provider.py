"""The bundled price catalog as a provider: real offers from a dated snapshot, read-only.

`lockstep quote` and dry runs must work on a fresh machine with no credentials and
no network: this provider answers ``offers()`` from the catalog file, normalised once
and cached (a quote builds on ``offers()``, so it must be cheap). It pushes nothing
down: the market filters its answer like every other.

Capabilities: a snapshot (nothing to launch, nothing to track).
"""

from __future__ import annotations

from datetime import datetime

from broker.models import Offer
from providers.base import OfferQuery
from providers.capabilities import Snapshot
from providers.catalog.client import load_catalog
from providers.catalog.offers import DEFAULT_MAX_CLUSTER_NODES, as_of, catalog_offers


class CatalogProvider(Snapshot):
    """Read-only provider over the bundled catalog."""

    name = "catalog"

    def __init__(self, path: str | None = None, max_cluster_nodes: int = DEFAULT_MAX_CLUSTER_NODES) -> None:
        if max_cluster_nodes < 1:
            raise ValueError("max_cluster_nodes must be at least 1")
        self.path = path
        self.max_cluster_nodes = max_cluster_nodes

    @property
    def as_of(self) -> datetime:
        return as_of(load_catalog(self.path))

    async def offers(self, query: OfferQuery | None = None) -> list[Offer]:
        return list(catalog_offers(self.path, self.max_cluster_nodes))
