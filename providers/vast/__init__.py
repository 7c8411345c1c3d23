"""The Vast.ai marketplace (REST over httpx): config, provider, client, errors, offers, requests."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from providers.vast.provider import VastProvider

__all__ = ["VastProvider"]
# Imported when first asked for: loading the settings imports this package's config module, which must not
# import the adapter's client library with it (the CLI starts fast; one adapter's missing dependency breaks no other).
_LAZY = {"VastProvider": "providers.vast.provider"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
