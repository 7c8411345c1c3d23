"""The bundled price catalog: config, provider (a read-only snapshot), client (the file and lookups), offers."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from providers.catalog.provider import CatalogProvider

__all__ = ["CatalogProvider"]
# Imported when first asked for: loading the settings imports this package's config module, which must not
# import the adapter's client library with it (the CLI starts fast; one adapter's missing dependency breaks no other).
_LAZY = {"CatalogProvider": "providers.catalog.provider"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
