"""The bundled catalog's settings (``catalog:`` in the configuration; docs/catalog.md)."""

from __future__ import annotations

from broker.configbase import MarketSection


class CatalogConfig(MarketSection):
    enabled: bool = True
    path: str | None = None  # another catalog file; default: the one shipped in the package
