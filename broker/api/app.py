"""The aiohttp application: routes from ROUTES, middlewares, and cleanup contexts for what it owns.

    app = create_app(Lockstep(settings))      # tests: AppRunner + TCPSite on 127.0.0.1:0
    await serve(settings, host, port)          # `lockstep serve`
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from broker.api.auth import RateLimiter, TokenCache
from broker.api.docs import STATIC_PREFIX, static_file
from broker.api.handlers import ROUTES
from broker.api.keys import BAD_TOKENS, LIMITER, METRICS, OPENAPI, SERVICE, TOKENS
from broker.api.metrics import ApiMetrics
from broker.api.middlewares import auth_middleware, body_middleware, error_middleware
from broker.api.openapi import build_openapi
from broker.config import Settings
from broker.dashboard import add_dashboard
from broker.service import Lockstep

log = logging.getLogger(__name__)
MAX_LINE = 65536


def create_app(svc: Lockstep, *, start_loops: bool = True, close_service: bool = True,
               token_cache_s: float = 2.0) -> web.Application:
    """An application serving ``svc``.

    ``start_loops``: run the broker's background loops (placement, polling,
    tracking) with the app. ``close_service``: close the service (providers,
    store) when the app stops. Token checks are cached ``token_cache_s``.
    """
    api = svc.settings.api
    app = web.Application(client_max_size=api.max_body_bytes,
                          middlewares=[error_middleware, auth_middleware, body_middleware])
    app[SERVICE] = svc
    app[METRICS] = ApiMetrics()
    app[LIMITER] = RateLimiter(api.rate_per_s, api.burst)
    app[BAD_TOKENS] = RateLimiter(api.bad_token_rate_per_s, api.bad_token_burst)

    app[TOKENS] = TokenCache(svc.verify_token, token_cache_s, known=svc.token_hashes)
    app[OPENAPI] = build_openapi(public_docs=api.public_docs)
    for r in ROUTES:
        app.router.add_route(r.method, r.path, r.handler, name=r.operation_id)
    # The docs page's script and stylesheet, from the installed Swagger UI bundle (not in the document).
    app.router.add_get(STATIC_PREFIX + "/{name}", static_file, name="docs_static")
    add_dashboard(app)  # /ui: pages for people, with their own session (broker/dashboard)
    app.cleanup_ctx.append(_hooks)
    app.cleanup_ctx.append(_service(start_loops, close_service))
    return app


async def _hooks(app: web.Application) -> AsyncIterator[None]:
    """Feed the metrics from the service's hooks; put back whatever hooks were there before."""
    metrics = app[METRICS]
    undo = app[SERVICE].observe(quotes=metrics.quote_hook(None), refreshes=metrics.refresh_hook(None),
                                placements=metrics.placement_hook(None))
    yield
    undo()


def _service(start_loops: bool, close_service: bool) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        svc = app[SERVICE]
        await svc.open_store()  # open and migrate the store before the first request
        started = False
        if start_loops:
            await svc.start()
            started = True
        yield
        if started:
            await svc.stop()
        if close_service:
            await svc.aclose()

    return ctx


async def start_server(app: web.Application, host: str, port: int, *,
                       reuse_port: bool = False) -> tuple[web.AppRunner, str]:
    """Start ``app`` on host:port (0: any free port); returns the runner and the base URL. ``reuse_port``:
    share the port with other processes (SO_REUSEPORT; the kernel spreads connections over them)."""
    # Long query strings get a JSON 400 from the handlers rather than aiohttp's plain-text one at 8 KiB.
    runner = web.AppRunner(app, access_log=logging.getLogger("lockstep.access"), max_line_size=MAX_LINE,
                           max_field_size=MAX_LINE)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []  # the real port when 0 was asked for
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, f"http://{host}:{bound}"


async def serve(settings: Settings, host: str, port: int, *,
                ready: Callable[[str], None] | None = None, worker: int | None = None) -> None:
    """Run the API and the broker loops until SIGTERM or Ctrl-C, then stop them cleanly.

    ``worker``: this process is worker ``worker`` of ``lockstep serve --workers N`` (broker/api/workers.py):
    it shares the port with the others and names itself in a ``Lockstep-Worker`` response header."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not on every platform
            loop.add_signal_handler(sig, stop.set)
    app = create_app(Lockstep(settings))
    if worker is not None:
        name = str(worker)

        async def tag(_request: web.Request, response: web.StreamResponse) -> None:
            response.headers["Lockstep-Worker"] = name

        app.on_response_prepare.append(tag)
    runner, url = await start_server(app, host, port, reuse_port=worker is not None)
    # What start-up built (modules, models, the store's engine, the first offer book) lives as long as the
    # process: moved out of the collector's sight, a full collection no longer walks it, which was a pause
    # of ~100 ms for every request in flight about once a second under load (bench/api.py, POST /v1/jobs).
    gc.collect()
    gc.freeze()
    log.info("serving on %s", url)
    if ready is not None:
        ready(url)
    try:
        await stop.wait()
        log.info("stopping: finishing requests, stopping the broker loops")
    finally:
        await runner.cleanup()  # runs the cleanup contexts: loops stopped, providers and store closed
