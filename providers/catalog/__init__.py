"""The bundled price catalog: provider (a read-only snapshot), client (the file and lookups), offers."""

from providers.catalog.provider import CatalogProvider

__all__ = ["CatalogProvider"]
