"""AWS EC2 (aiobotocore): spot and on-demand (provider), capacity reservations and pools (reserved).

config · provider · client · errors · offers · instance_types · requests · prices · reserved
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from providers.aws.provider import AwsProvider
    from providers.aws.reserved import ReservedProvider

__all__ = ["AwsProvider", "ReservedProvider"]
# Imported when first asked for: loading the settings imports this package's config module, which must not
# import the adapter's client library with it (the CLI starts fast; one adapter's missing dependency breaks no other).
_LAZY = {"AwsProvider": "providers.aws.provider", "ReservedProvider": "providers.aws.reserved"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
