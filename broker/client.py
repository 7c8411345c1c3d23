"""The client of a Lockstep server is the SDK (broker/sdk.py); this name stays for code that imported it."""

from __future__ import annotations

from broker.sdk import ApiError, AsyncClient, Client, RemoteError, Unreachable

__all__ = ["ApiError", "AsyncClient", "Client", "RemoteError", "Unreachable"]
