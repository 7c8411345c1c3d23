"""`lockstep server status|stop|logs|run`: the per-user background broker of local mode.

The local commands start it on their own (broker/cli/localbroker.py); these commands look at it, stop it,
or show its log. ``run`` is what they start: the application and loops of ``lockstep serve`` (broker/api)
on a free loopback port, with an admin token of its own for the ``default`` tenant, in the foreground.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

import broker.cli.localbroker as lb
from broker.cli import render
from broker.cli.app import get_ctx
from broker.cli.backend import local_only

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="The background broker that follows local jobs (started by the first command that needs it).")

log = logging.getLogger("lockstep.server")
IDLE_CHECK_S = 30.0
IDLE_GRACE_S = 10.0  # never idle-exit this soon after starting: the command that started it is about to ask


def _dir(ctx: typer.Context, command: str) -> Path:
    c = get_ctx(ctx)
    local_only(c, f"server {command}")
    return lb.broker_dir(c.settings.db_url)


@app.command("status")
def status(ctx: typer.Context, json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Is the background broker up for this store: pid, address, since when, its log."""
    d = _dir(ctx, "status")
    info = lb.running(d)
    up = info is not None or lb.is_running(d)
    data = {"running": up, "starting": up and info is None, "pid": info.pid if info else None,
            "url": info.url if info else None, "store": info.store if info else None,
            "started_at": info.started_at if info else None, "log": str(d / "broker.log"),
            "current_settings": bool(info and info.settings_print == lb.settings_print(get_ctx(ctx).settings))}
    if json_out:
        render.print_json(data)
        return
    if info is None:
        typer.echo("background broker: starting" if up else "background broker: not running (the next "
                   "`lockstep submit` starts it)")
    else:
        typer.echo(f"background broker: running, pid {info.pid}, {info.url}, since {info.started_at}"
                   + ("" if data["current_settings"] else " (older settings: the next job command restarts it)"))
        typer.echo(f"store: {info.store}")
    typer.echo(f"log: {d / 'broker.log'}")


@app.command("stop")
def stop(ctx: typer.Context, json_out: Annotated[bool, typer.Option("--json", help='{"stopped": true|false}')]
         = False) -> None:
    """Stop the background broker (jobs carry on in their markets; the next job command starts it again)."""
    stopped = lb.stop(_dir(ctx, "stop"))
    if json_out:
        render.print_json({"stopped": stopped})
    else:
        typer.echo("stopped the background broker" if stopped else "the background broker was not running")


@app.command("logs")
def logs(
    ctx: typer.Context,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new lines (Ctrl-C ends).")] = False,
    tail: Annotated[int, typer.Option("--tail", "-n", min=0, help="The last N lines.")] = 50,
) -> None:
    """What the background broker logged."""
    path = _dir(ctx, "logs") / "broker.log"
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except FileNotFoundError:
        typer.echo(f"no log yet ({path})", err=True)
        return
    with f:
        lines = f.readlines()
        sys.stdout.write("".join(lines[-tail:] if tail else []))
        sys.stdout.flush()
        while follow:
            line = f.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
            else:
                time.sleep(0.25)


@app.command("run", hidden=True)
def run(ctx: typer.Context) -> None:
    """Run the background broker in the foreground (what the local commands start, detached)."""
    c = get_ctx(ctx)
    local_only(c, "server run")
    settings = c.settings
    d = lb.broker_dir(settings.db_url)
    lock = lb.hold_run_lock(d)  # held until this process ends, however it ends
    lb.write_private(d / "state.json", {"pid": os.getpid()})  # `server stop` can stop it while it starts
    logging.getLogger().setLevel(settings.log_level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        asyncio.run(_serve(settings, d))
    except KeyboardInterrupt:
        pass
    finally:
        os.close(lock)


async def _serve(settings: object, d: Path) -> None:
    from broker.api import create_app, start_server
    from broker.config import Settings
    from broker.models import DEFAULT_TENANT, TERMINAL_STATES, JobState, Role, TokenCreate
    from broker.service import Lockstep

    assert isinstance(settings, Settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    svc = Lockstep(settings)
    await svc.open_store()
    # A token of its own, made afresh at each start; the last start's is revoked (it was only ever in
    # state.json, which this start replaces).
    old = lb._read_json(d / "state.json") or {}
    previous = lb._read_json(d / "token.json") or {}
    info, token = await svc.create_token(TokenCreate(tenant=DEFAULT_TENANT, role=Role.admin,
                                                     label="background broker"))
    if previous.get("id"):
        with contextlib.suppress(Exception):
            await svc.revoke_token(str(previous["id"]))
    lb.write_private(d / "token.json", {"id": info.id})
    app = create_app(svc)
    last_request = [time.monotonic()]

    async def seen(_request: object, _response: object) -> None:
        last_request[0] = time.monotonic()

    app.on_response_prepare.append(seen)
    started = time.monotonic()
    runner, url = await start_server(app, "127.0.0.1", 0)
    from broker.config import mask_db_url

    lb.write_private(d / "state.json", {
        **{k: v for k, v in old.items() if k == "pid"}, "pid": os.getpid(), "url": url, "token": token,
        "settings_print": lb.settings_print(settings), "store": mask_db_url(settings.db_url),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds")})
    log.info("background broker serving on %s (store %s)", url, mask_db_url(settings.db_url))
    idle_s = settings.local.idle_exit_s
    unfinished = [s for s in JobState if s not in TERMINAL_STATES]

    async def idle_watch() -> None:
        """Exit once no job is left to follow and nobody asked anything for ``idle_s``: nothing is lost (the
        next command starts it again)."""
        while True:
            await asyncio.sleep(min(IDLE_CHECK_S, idle_s / 2))
            now = time.monotonic()
            if now - last_request[0] < idle_s or now - started < IDLE_GRACE_S:
                continue
            jobs, _ = await svc.list_jobs(states=unfinished, limit=1)
            if not jobs:
                log.info("idle for %.0fs with no unfinished job: stopping", idle_s)
                stop.set()
                return

    watcher = asyncio.create_task(idle_watch()) if idle_s > 0 else None
    try:
        await stop.wait()
        log.info("stopping: finishing requests, stopping the broker loops")
    finally:
        if watcher is not None:
            watcher.cancel()
        await runner.cleanup()
