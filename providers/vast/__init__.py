"""The Vast.ai marketplace (REST over httpx): provider, client, errors, offers, requests."""

from providers.vast.provider import VastProvider

__all__ = ["VastProvider"]
