"""The on-prem Slurm pool (slurmrestd): config, provider, client, auth, errors, offers, queue, requests, api."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from providers.slurm.provider import SlurmProvider

__all__ = ["SlurmProvider"]
# Imported when first asked for: loading the settings imports this package's config module, which must not
# import the adapter's client library with it (the CLI starts fast; one adapter's missing dependency breaks no other).
_LAZY = {"SlurmProvider": "providers.slurm.provider"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
