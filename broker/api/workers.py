"""``lockstep serve --workers N``: N server processes on one port, sharing the store.

Each worker is a whole broker (the API and the loops) in its own process, so the API uses more than
one core. They listen on the same address with SO_REUSEPORT and the kernel spreads new connections over
them. They share the store, which must be PostgreSQL: there the workers are replicas, and the replica
machinery does the rest (a job is claimed by a row-locked state change, so two workers never place the
same job; reconciliation and migrations take turns under advisory locks).

SQLite is refused for N > 1, on purpose: SQLite has one writer at a time, and writers in different
processes meet in its busy handler, which sleeps instead of handing the lock over; one process per file
keeps a submission one short, in-process-ordered write (broker/store/engine.py). One worker on SQLite
already runs the loops beside the API; more cores need PostgreSQL.

The parent process only starts, watches and stops the workers: SIGTERM or Ctrl-C stops them all
(each finishes its requests and stops its loops), and if one dies the others are stopped and the
command fails.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import socket
import sys
import time
from multiprocessing.connection import Connection
from typing import Any

from broker.config import Settings
from broker.errors import SpecError

READY_TIMEOUT_S = 120.0


def check_workers(settings: Settings, workers: int) -> None:
    """SpecError (exit 2) for a worker count this store cannot have."""
    if workers < 1:
        raise SpecError("workers", "must be 1 or more")
    if workers > 1 and settings.db_url.startswith("sqlite"):
        raise SpecError(
            "workers",
            "more than one worker needs PostgreSQL (db_url): SQLite has one writer at a time and one broker "
            "process per file; with SQLite run one worker, which already runs the loops beside the API",
        )


def _free_port(host: str) -> socket.socket:
    """A socket bound (not listening) to a free port with SO_REUSEPORT: it holds the port for the workers."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, 0))
    return sock


def _worker(settings: Settings, host: str, port: int, index: int, ready: Connection) -> None:
    import asyncio
    import logging

    from broker.api.app import serve

    logging.basicConfig(level=settings.log_level.upper(), format=f"%(levelname)s worker{index} %(name)s: %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(settings, host, port, ready=lambda url: ready.send(url), worker=index))


def run_workers(settings: Settings, host: str, port: int, workers: int,
                ready: Any = None) -> int:
    """Start ``workers`` server processes on host:port (0: a free port, the same for all), call ``ready(url)``
    once all of them serve, and wait. Returns the exit status: 0 after SIGTERM / Ctrl-C, 1 if a worker died."""
    check_workers(settings, workers)
    holder = _free_port(host) if port == 0 else None
    if holder is not None:
        port = holder.getsockname()[1]
    ctx = mp.get_context("spawn")  # a fresh interpreter each: no threads or event loop inherited
    procs: list[Any] = []  # SpawnProcess
    pipes: list[Connection] = []
    stop = False

    def on_signal(_sig: int, _frame: Any) -> None:
        nonlocal stop
        stop = True

    old = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    try:
        for i in range(1, workers + 1):
            parent_end, child_end = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker, args=(settings, host, port, i, child_end), name=f"lockstep-worker{i}",
                               daemon=False)
            proc.start()
            child_end.close()
            procs.append(proc)
            pipes.append(parent_end)
        url = ""
        deadline = time.monotonic() + READY_TIMEOUT_S
        for proc, pipe in zip(procs, pipes, strict=True):
            while not stop and proc.is_alive() and time.monotonic() < deadline and not pipe.poll(0.1):
                pass
            if stop:
                break
            if not pipe.poll(0):
                print(f"lockstep: worker {proc.name} did not start", file=sys.stderr)
                return 1
            url = pipe.recv()
        if holder is not None:
            holder.close()  # every worker listens on the port now
            holder = None
        if not stop and ready is not None:
            ready(url)
        while not stop:
            if any(not p.is_alive() for p in procs):
                print("lockstep: a worker stopped; stopping the others", file=sys.stderr)
                status = 1
                break
            time.sleep(0.2)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        for p in procs:
            if p.is_alive() and p.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()  # SIGTERM: the worker finishes its requests and stops its loops
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join(5)
        if holder is not None:
            holder.close()
    return status
