"""Lockstep's HTTP API (aiohttp): thin handlers over broker.service.Lockstep."""

from broker.api.app import create_app, serve, start_server

__all__ = ["create_app", "serve", "start_server"]
