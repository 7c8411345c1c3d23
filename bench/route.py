"""Jobs placed per second, end to end, against the local providers.

Starts the local Vast API server (standins/vastapi) in this process and moto's
ThreadedMotoServer (EC2) on loopback, opens an SQLite store in a temporary
directory, submits N one-GPU jobs (half for Vast, half for AWS on-demand), then
runs placement passes (``Lockstep.place_now``: rank, claim, intent, launch,
record) until every job is placed. Prints jobs placed per second and the p50 /
p99 placement latency (job created → provisioning, from the stored events).

    python bench/route.py [--jobs 200] [--vast-share 0.5]

Nothing leaves loopback; moto gets dummy credentials in this process only.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from broker.config import load_settings
from broker.models import JobState
from broker.service import Lockstep
from broker.specs import parse_spec
from broker.store import Store
from providers.registry import build_providers

VAST_KEY = "bench-vast-key"
DUMMY_AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
             "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
             "AWS_SHARED_CREDENTIALS_FILE": os.devnull}

VAST_SPEC = {"name": "bench-vast", "gpu": ["RTX-4090", "RTX-3090", "L40S", "A100-80GB", "A100-40GB", "H100-SXM",
                                           "H100-PCIe"],
             "gpus": 1, "providers": ["vast"], "markets": ["on_demand"], "workload": {"hours": 1},
             "command": "sleep 600"}
AWS_SPEC = {"name": "bench-aws", "gpu": "A10G", "gpus": 1, "providers": ["aws"], "markets": ["on_demand"],
            "workload": {"hours": 1}, "command": "sleep 600"}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


async def run(n: int, vast_share: float) -> None:
    from moto.server import ThreadedMotoServer

    from standins.vastapi.server import VastApiServer

    os.environ.update(DUMMY_AWS)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto logs one line per request otherwise
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    vast = await VastApiServer(VAST_KEY, seed=7, count=400).start()
    tmp = tempfile.TemporaryDirectory(prefix="lockstep-bench-")
    try:
        settings = load_settings(
            db_url=f"sqlite:///{tmp.name}/bench.db",
            aws={"enabled": True, "regions": ["us-east-1"], "endpoint_url": f"http://{host}:{port}",
                 "region_timeout_s": 60.0, "placement_groups": False, "capacity_reservations": False},
            vast={"enabled": True, "url": vast.url, "api_key": VAST_KEY, "min_reliability": 0.0,
                  "verified_only": False},
            catalog={"enabled": False},
            broker={"installation": "bench"},
        )
        store = Store(settings.db_url)
        store.migrate()
        svc = Lockstep(settings, providers=build_providers(settings, only=["aws", "vast"]), store=store)
        t0 = time.perf_counter()
        await svc.refresh()  # moto loads its EC2 data on the first call: not part of the figure
        refresh_s = time.perf_counter() - t0

        n_vast = round(n * vast_share)
        specs = [parse_spec(VAST_SPEC if i < n_vast else AWS_SPEC) for i in range(n)]
        start = time.perf_counter()
        jobs = [await svc.submit(s) for s in specs]
        submitted = time.perf_counter()
        passes = 0
        left_before = n
        while True:
            passes += 1
            await svc.place_now()
            left = await svc.db(store.jobs_in_states, [JobState.pending, JobState.placing])
            if not left or len(left) == left_before or passes >= 20:  # done, or the market ran out
                break
            left_before = len(left)
        elapsed = time.perf_counter() - start

        latencies: list[float] = []
        placed = 0
        for j in jobs:
            job = await svc.get_job(j.id)
            ev = next((e for e in job.events if e.to_state is JobState.provisioning), None)
            if ev is not None:
                placed += 1
                latencies.append((ev.at - job.created_at).total_seconds())
        unplaced = [j for j in (await svc.db(store.jobs_in_states, [JobState.pending, JobState.placing]))]
        for j in unplaced[:5]:
            print(f"not placed: {j.id} {j.spec.name}: {j.reason}")
        await svc.aclose()
        print(f"jobs: {n} ({n_vast} Vast, {n - n_vast} AWS on-demand); placed: {placed} in {passes} pass(es)")
        print(f"offer refresh (not counted): {refresh_s:.2f} s; submit: {submitted - start:.2f} s")
        print(f"placed per second, end to end: {placed / elapsed:.1f} jobs/s ({elapsed:.2f} s)")
        if latencies:
            print(f"placement latency (created → provisioning): p50 {statistics.median(latencies) * 1000:.0f} ms, "
                  f"p99 {pct(latencies, 0.99) * 1000:.0f} ms")
    finally:
        await vast.stop()
        moto.stop()
        tmp.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--vast-share", type=float, default=0.5)
    args = ap.parse_args()
    asyncio.run(run(args.jobs, args.vast_share))


if __name__ == "__main__":
    main()
