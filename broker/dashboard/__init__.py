"""The web dashboard at ``/ui``, served by ``lockstep serve``: jobs, a job's live log, spend against budget, the offer
book, price history, providers' health. Server-rendered pages over the service (broker/dashboard/pages.py), one
small script for the live log, no CDN and no build step (README: "The dashboard")."""

from __future__ import annotations

from aiohttp import web

from broker.dashboard.pages import PAGES, PREFIX


def add_dashboard(app: web.Application) -> None:
    """Serve the dashboard's pages under ``/ui`` (they check their own session cookie, not a bearer header)."""
    app.router.add_get(PREFIX, _redirect)
    for method, path, handler in PAGES:
        app.router.add_route(method, PREFIX + path, handler, name="ui_" + handler.__name__ + method.lower())


async def _redirect(_request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound(PREFIX + "/")


__all__ = ["PREFIX", "add_dashboard"]
