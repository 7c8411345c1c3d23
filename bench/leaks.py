"""Every dollar accounted (issue 24): a soak of short jobs on the local Vast API server while the broker process
is SIGKILLed and restarted, then three figures from the market's own record beside the broker's:

    python bench/leaks.py [--jobs 16] [--kills 4] [--poll 2] [--seed 7]

(a) machine-seconds the market billed while no live job owned the machine: a machine with no allocation record,
    or one that outlived the moment its record says it ended (goal 0);
(b) per finished job, seconds from the command's exit (its wrapper's own end time, from the container's log) to
    the machine's destruction at the market (goal: p99 within one poll interval);
(c) the broker's booked cost against the market's record of the same machines (its start to its destruction ×
    its price; goal within 1%).

The Vast server runs in this process (tests/vastapi: each instance's container is a local process running the
in-job wrapper); the broker is a child process (``--child``: the ``lockstep serve`` loops over a SQLite store),
killed with SIGKILL ``--kills`` times at seeded moments and started again each time (reconciliation first). Only
the Vast stand-in is soaked here: moto's instances do not run their boot scripts, and the local Slurm cluster is
shared with the tests (its billing is checked in tests/slurm/test_billing.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

VAST_KEY = "vast-bench-key-5b1e2d9c"
ROOT = str(Path(__file__).resolve().parent.parent)
SPEC = {"name": "leak", "gpu": ["RTX-4090", "RTX-3090", "L40S", "A100-SXM-80GB", "A100-PCIe-80GB"], "gpus": 1,
        "providers": ["vast"], "markets": ["on_demand"], "workload": {"hours": 0.05}}


# --------------------------------------------------------------------------- the broker child


async def child(installation: str, poll_s: float) -> None:
    from broker.config import load_settings
    from broker.service import Lockstep
    from broker.store import Store
    from providers.registry import build_providers

    settings = load_settings(
        vast={"enabled": True, "min_reliability": 0.0, "verified_only": False, "timeout_s": 10.0},
        aws={"enabled": False}, catalog={"enabled": False},
        broker={"installation": installation, "place_interval_s": 0.5, "poll_interval_s": poll_s,
                "refresh_interval_s": 3600.0})
    store = Store(settings.db_url)
    store.migrate()
    svc = Lockstep(settings, providers=build_providers(settings, only=["vast"]), store=store)
    await svc.broker.start()
    await asyncio.Event().wait()  # until killed


# --------------------------------------------------------------------------- the soak


def exit_time(log: str) -> float | None:
    """The wrapper's own end of the command (its LOCKSTEP-EXIT line), epoch seconds."""
    for line in reversed(log.splitlines()):
        _, marker, rest = line.partition("LOCKSTEP-EXIT ")
        if marker:
            doc = rest[rest.find("{"):]  # the line carries the attempt's nonce before its JSON
            try:
                return datetime.fromisoformat(json.loads(doc)["ended_at"].replace("Z", "+00:00")).timestamp()
            except (ValueError, KeyError):
                return None
    return None


async def soak(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    from broker.config import BrokerConfig, Settings
    from broker.models import TERMINAL_STATES, AllocationState
    from broker.service import Lockstep
    from broker.specs import parse_spec
    from broker.store import Store
    from tests.vastapi.server import VastApiServer

    server = await VastApiServer(VAST_KEY, seed=args.seed, count=200).start()
    state = server.state
    machines: dict[int, dict[str, Any]] = {}  # the market's record of each destroyed instance
    destroy = state.destroy

    def recorded_destroy(instance_id: int) -> dict[str, Any] | None:
        box = state.containers.get(instance_id)
        log = box.log_text() if box is not None else ""
        inst = destroy(instance_id)
        if inst is not None:
            machines[instance_id] = {"start": float(inst["start_date"]), "end": time.time(),
                                     "usd_per_hour": float(inst["dph_total"]), "exit": exit_time(log)}
        return inst

    state.destroy = recorded_destroy  # type: ignore[method-assign]  # the bench's own lookout on its server
    db_url = f"sqlite:///{tmp}/leaks.db"
    installation = f"leaks-{os.getpid()}"
    env = {**os.environ, "LOCKSTEP_DB": db_url, "LOCKSTEP_VAST_URL": server.url, "LOCKSTEP_VAST_API_KEY": VAST_KEY,
           "PYTHONPATH": ROOT}
    store = Store(db_url)
    store.migrate()
    svc = Lockstep(Settings(db_url=db_url, broker=BrokerConfig(installation=installation)), providers={},
                   store=store)
    rng = random.Random(args.seed)
    for i in range(args.jobs):
        code = 3 if i % 4 == 3 else 0
        await svc.submit(parse_spec({**SPEC, "command": f"sleep {rng.uniform(2, 10):.1f}; exit {code}"}))

    broker_log = os.open(f"{tmp}/broker.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    async def start() -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--child", "--installation", installation, "--poll", str(args.poll),
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=broker_log)

    proc = await start()
    t0 = time.monotonic()
    kills = 0
    try:
        while True:
            jobs = store.jobs_in_states(list(TERMINAL_STATES))
            live = store.live_allocations()
            if len(jobs) == args.jobs and not live:
                break
            if time.monotonic() - t0 > args.limit_s:
                print(f"gave up after {args.limit_s:g} s: {len(jobs)} of {args.jobs} jobs ended, "
                      f"{len(live)} allocations live")
                break
            if kills < args.kills and rng.random() < 0.5:
                await asyncio.sleep(rng.uniform(1.0, 6.0))
                proc.send_signal(signal.SIGKILL)
                await proc.wait()
                kills += 1
                await asyncio.sleep(rng.uniform(0.5, 3.0))  # down for a while: commands end meanwhile
                proc = await start()
            else:
                await asyncio.sleep(1.0)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        os.close(broker_log)
    soak_s = time.monotonic() - t0
    now = time.time()
    allocs = store.allocations()
    still = {iid: inst for iid, inst in state.instances.items()
             if str(inst.get("label") or "").startswith(f"lockstep:{installation}:")}
    for iid, inst in still.items():  # never destroyed: billed up to now
        machines[iid] = {"start": float(inst["start_date"]), "end": now, "usd_per_hour": float(inst["dph_total"]),
                         "exit": None, "alive": True}
    orphan_s = 0.0
    latency: list[float] = []
    booked = market = 0.0
    worst = 0.0
    for iid, m in machines.items():
        owner = next((a for a in allocs if str(iid) in a.resource_ids), None)
        if owner is None:
            orphan_s += m["end"] - m["start"]
            continue
        if owner.ended_at is not None and m["end"] > owner.ended_at.timestamp() + 1.0:
            orphan_s += m["end"] - owner.ended_at.timestamp()
        elif owner.state in (AllocationState.pending, AllocationState.running) and m.get("alive"):
            pass  # a live job's machine, still owned
        if m["exit"] is not None and not m.get("alive"):
            latency.append(m["end"] - m["exit"])
        cost = (m["end"] - m["start"]) * m["usd_per_hour"] / 3600
        if args.verbose:
            since = owner.attrs.get("running_since", "")
            print(f"  {iid}: market {m['start']:.1f} → {m['end']:.1f} ${cost:.5f}; booked from {since} to "
                  f"{owner.ended_at.timestamp() if owner.ended_at else 0:.1f}: ${owner.cost_usd or 0:.5f} "
                  f"({owner.billed_s} s, {owner.state.value}, {owner.reason[:60]!r})")
        market += cost
        booked += owner.cost_usd or 0.0
        if cost:
            worst = max(worst, abs((owner.cost_usd or 0.0) - cost) / cost)
    await svc.aclose()
    await server.stop()
    return {"machines": len(machines), "orphan_s": orphan_s, "latency": sorted(latency), "booked": booked,
            "market": market, "worst": worst, "kills": kills, "soak_s": soak_s,
            "ended": len(store.jobs_in_states(list(TERMINAL_STATES)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--poll", type=float, default=2.0, help="the broker's poll interval, seconds")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--limit-s", type=float, default=300.0)
    ap.add_argument("--verbose", action="store_true", help="one line per machine: the market's and the books'")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--installation", default="leaks", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        asyncio.run(child(args.installation, args.poll))
        return
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="lockstep-leaks-") as tmp:
        r = asyncio.run(soak(args, tmp))
    load1 = os.getloadavg()
    lat = r["latency"]
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")
    print(f"{args.jobs} short jobs on the local Vast API, broker SIGKILLed {r['kills']} times, poll every "
          f"{args.poll:g} s; {r['ended']} jobs ended, {r['machines']} machines, {r['soak_s']:.0f} s; "
          f"{os.cpu_count()} CPUs, load average {load0[0]:.1f} before, {load1[0]:.1f} after")
    print(f"(a) machine-seconds billed while no live job owned the machine: {r['orphan_s']:.1f} (goal 0)")
    if lat:
        print(f"(b) command exit → machine destroyed: median {statistics.median(lat):.1f} s, p99 {p99:.1f} s, "
              f"max {lat[-1]:.1f} s over {len(lat)} jobs (goal p99 ≤ {args.poll:g} s, one poll interval)")
    err = (r["booked"] - r["market"]) / r["market"] * 100 if r["market"] else 0.0
    print(f"(c) booked ${r['booked']:.4f} against the market's record ${r['market']:.4f}: {err:+.2f}% in total, "
          f"worst machine {r['worst'] * 100:.1f}% (goal within 1%)")


if __name__ == "__main__":
    main()
