"""A broker process for the crash and replica tests: ``python -m tests.broker.run_broker MODE``.

It builds its Settings the way a deployed broker does (``load_settings``: the environment, here
``LOCKSTEP_DB``, ``LOCKSTEP_VAST_URL``, ``LOCKSTEP_VAST_API_KEY``, ``LOCKSTEP_AWS_ENDPOINT_URL``, plus
the overrides below), a Lockstep over the store and the AWS and Vast providers, and then:

- ``serve``: ``svc.broker.start()`` (reconcile, then the refresh / place / poll loops) until killed;
- ``until-placed``: the same, and exits once no job is pending or placing (or ``--limit-s`` passed);
- ``reconcile``: one refresh and one reconciliation, then exits;
- ``recover``: the same, prints the report, waits for a line on stdin, then places as ``until-placed``
  (the test audits the reconciled state in between, without paying for a second process start).

It prints one JSON line on exit (``reconcile``: the report; ``until-placed``: job counts). The price
tracker, which ``svc.start()`` also runs, is left out: it is not under test here and on CI's two cores
it would only slow the placement being crashed.

AWS credentials: only moto's dummy ones, set by the test in this process's environment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

from broker.config import Settings, load_settings
from broker.models import JobState
from broker.reconcile import reconcile
from broker.service import Lockstep
from broker.store import Store
from providers.registry import build_providers


def settings_for(installation: str, worker_interval_s: float) -> Settings:
    return load_settings(
        aws={"enabled": True, "regions": ["us-east-1"], "image_id": "ami-12c6146b",  # moto's AMI (one region)
             "region_timeout_s": 60.0, "max_attempts": 2,
             "placement_groups": False, "capacity_reservations": False},  # moto emulates neither
        vast={"enabled": True, "min_reliability": 0.0, "verified_only": False, "timeout_s": 10.0,
              "max_attempts": 8, "backoff_initial_s": 0.01, "backoff_max_s": 0.1, "retry_after_max_s": 0.1},
        catalog={"enabled": False},
        broker={"installation": installation, "place_interval_s": worker_interval_s,
                "poll_interval_s": 3600.0, "refresh_interval_s": 3600.0},
    )


async def open_service(installation: str, interval_s: float) -> Lockstep:
    settings = settings_for(installation, interval_s)
    store = Store(settings.db_url)
    store.migrate()  # idempotent; replicas serialise it on PostgreSQL
    providers = build_providers(settings, only=["aws", "vast"])
    return Lockstep(settings, providers=providers, store=store)


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["serve", "until-placed", "reconcile", "recover"])
    ap.add_argument("--installation", required=True)
    ap.add_argument("--interval-s", type=float, default=0.2, help="placement loop interval")
    ap.add_argument("--limit-s", type=float, default=120.0, help="until-placed: give up after this long")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")

    started = time.monotonic()
    svc = await open_service(args.installation, args.interval_s)
    out: dict[str, Any] = {}
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        timings[name] = round(time.monotonic() - started, 3)

    try:
        if args.mode in ("reconcile", "recover"):
            health = await svc.refresh()
            lap("refreshed")
            # LOCKSTEP_TEST_EXCLUSIVE=1: the test says no other broker is running (a restart after a kill on
            # PostgreSQL: otherwise a placing job younger than stale_after is left alone as another replica's).
            exclusive = True if os.environ.get("LOCKSTEP_TEST_EXCLUSIVE") == "1" else None
            report = await reconcile(svc.store, svc.market.providers, exclusive=exclusive)
            lap("reconciled")
            out = {"health": {k: h.ok for k, h in health.items()}, "report": report.model_dump()}
            if args.mode == "recover":
                # Let the test audit the reconciled state, then carry on placing when it says so.
                print(json.dumps({**out, "timings": timings}), flush=True)
                await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        if args.mode != "reconcile":
            await svc.broker.start(reconcile_first=args.mode != "recover")
            lap("started")
            loop = asyncio.get_running_loop()
            end = loop.time() + args.limit_s
            while args.mode == "serve" or loop.time() < end:
                left = await svc.db(svc.store.jobs_in_states, [JobState.pending, JobState.placing])
                if not left and args.mode != "serve":
                    break
                await asyncio.sleep(0.2)
            await svc.broker.stop()
            jobs = await svc.db(svc.store.jobs_in_states, list(JobState))
            counts: dict[str, int] = {}
            for j in jobs:
                counts[j.state.value] = counts.get(j.state.value, 0) + 1
            lap("done")
            out = {"worker": svc.broker.worker, "counts": counts}
    finally:
        await svc.aclose()
    out["timings"] = timings
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
