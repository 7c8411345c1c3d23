"""Every dollar accounted (issue 24): a soak of short jobs on a market's local stand-in while the broker process
is SIGKILLed and restarted, then three figures from the market's own record beside the broker's:

    python bench/leaks.py [--market vast|slurm] [--jobs 16] [--kills 4] [--poll 2] [--seed 7]

(a) machine-seconds the market billed while no live job owned the machine: a machine with no allocation record,
    or one that outlived the moment its record says it ended (goal 0);
(b) per finished job, seconds from the command's exit (its wrapper's own end time) to the machine's release at
    the market (goal: p99 within one poll interval);
(c) the broker's booked cost against the market's record of the same machines (goal within 1%).

``--market vast`` (the default): the Vast server runs in this process (standins/vastapi: each instance's
container is a local process running the in-job wrapper); the market's record is its instance start, destruction
and ``dph_total``. ``--market slurm``: the local Slurm cluster (deploy/slurm/up.sh; its env file says where), its
record slurmctld's own job records (``scontrol show job``: start and end, whole seconds; the cluster keeps no
accounting database) at the node's amortised rate the broker booked, the command's exit from the wrapper's status
file in the shared job directory. Either way the broker is a child process (``--child``: the ``lockstep serve``
loops over a SQLite store), killed with SIGKILL ``--kills`` times at seeded moments and started again each time
(reconciliation first). Not soaked here: moto (its instances do not run their boot scripts by themselves), and
injected provider faults.
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


async def child(market: str, installation: str, poll_s: float) -> None:
    from broker.config import load_settings
    from broker.service import Lockstep
    from broker.store import Store
    from providers.registry import build_providers

    sections: dict[str, Any] = {
        "vast": {"vast": {"enabled": True, "min_reliability": 0.0, "verified_only": False, "timeout_s": 10.0}},
        "slurm": {"slurm": {"enabled": True, "timeout_s": 10.0}},  # url, token, job_dir: the environment
    }
    settings = load_settings(
        **sections[market], aws={"enabled": False}, catalog={"enabled": False},
        broker={"installation": installation, "place_interval_s": 0.5, "poll_interval_s": poll_s,
                "refresh_interval_s": 3600.0})
    store = Store(settings.db_url)
    store.migrate()
    svc = Lockstep(settings, providers=build_providers(settings, only=[market]), store=store)
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


class VastRecord:
    """The local Vast server, and its own record of each instance it destroyed (start, end, price, exit)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.machines: dict[str, dict[str, Any]] = {}

    async def start(self) -> dict[str, str]:
        from standins.vastapi.server import VastApiServer

        self.server = await VastApiServer(VAST_KEY, seed=self.args.seed, count=200).start()
        state = self.server.state
        destroy = state.destroy

        def recorded_destroy(instance_id: int) -> dict[str, Any] | None:
            box = state.containers.get(instance_id)
            log = box.log_text() if box is not None else ""
            inst = destroy(instance_id)
            if inst is not None:
                self.machines[str(instance_id)] = {"start": float(inst["start_date"]), "end": time.time(),
                                                   "usd_per_hour": float(inst["dph_total"]), "exit": exit_time(log)}
            return inst

        state.destroy = recorded_destroy  # type: ignore[method-assign]  # the bench's own lookout on its server
        return {"LOCKSTEP_VAST_URL": self.server.url, "LOCKSTEP_VAST_API_KEY": VAST_KEY}

    def spec(self) -> dict[str, Any]:
        return SPEC

    async def record(self, installation: str, allocs: list[Any]) -> dict[str, dict[str, Any]]:
        now = time.time()
        for iid, inst in self.server.state.instances.items():  # never destroyed: billed up to now
            if str(inst.get("label") or "").startswith(f"lockstep:{installation}:"):
                self.machines[str(iid)] = {"start": float(inst["start_date"]), "end": now,
                                           "usd_per_hour": float(inst["dph_total"]), "exit": None, "alive": True}
        return self.machines

    async def stop(self) -> None:
        await self.server.stop()


SLURM_ENV = Path(ROOT) / "deploy" / "slurm" / ".state" / "env"
SLURM_SPEC = {"name": "leak", "gpu": ["H100", "A100-SXM-80GB", "L40S"], "gpus": 1, "providers": ["slurm"],
              "markets": ["owned"], "workload": {"hours": 0.05}}


class SlurmRecord:
    """The local Slurm cluster, and slurmctld's own record of each job (start and end, whole seconds)."""

    def __init__(self, args: argparse.Namespace, tmp: str) -> None:
        self.args = args
        self.job_dir = f"{tmp}/slurm-jobs"

    async def start(self) -> dict[str, str]:
        if not SLURM_ENV.is_file():
            raise SystemExit(f"the local Slurm cluster is not up ({SLURM_ENV} is absent): run deploy/slurm/up.sh")
        env: dict[str, str] = {}
        for line in SLURM_ENV.read_text().splitlines():
            name, sep, value = line.removeprefix("export ").partition("=")
            if sep:
                env[name.strip()] = value.strip().strip("'\"")
        self.conf = env["SLURM_CONF"]
        return {"LOCKSTEP_SLURM_URL": env["LOCKSTEP_SLURM_URL"], "LOCKSTEP_SLURM_TOKEN": env["LOCKSTEP_SLURM_TOKEN"],
                "LOCKSTEP_SLURM__USER": env.get("LOCKSTEP_SLURM_USER", "root"), "LOCKSTEP_SLURM__CONF_PATH": self.conf,
                "LOCKSTEP_SLURM__JOB_DIR": self.job_dir, "SLURM_CONF": self.conf}

    def spec(self) -> dict[str, Any]:
        return SLURM_SPEC

    def _jobs(self) -> list[dict[str, str]]:
        import subprocess

        out = subprocess.run(["scontrol", "show", "job", "-o"], capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in {**os.environ, "SLURM_CONF": self.conf}.items() if k != "SLURM_JWT"})
        jobs = []
        for line in out.stdout.splitlines():
            fields = dict(part.split("=", 1) for part in line.split(" ") if "=" in part)
            jobs.append(fields)
        return jobs

    async def record(self, installation: str, allocs: list[Any]) -> dict[str, dict[str, Any]]:
        from providers.base import OWNER_TAG
        from providers.slurm.requests import parse_comment

        by_job = {rid: a for a in allocs for rid in a.resource_ids}
        now = time.time()
        machines: dict[str, dict[str, Any]] = {}
        for job in await asyncio.to_thread(self._jobs):
            if parse_comment(job.get("Comment", "")).get(OWNER_TAG) != installation:
                continue
            start, end = job.get("StartTime", ""), job.get("EndTime", "")
            if job.get("JobState") == "PENDING" or not start or start == "Unknown":
                continue  # never ran: billed nothing
            alive = job.get("JobState") in ("RUNNING", "COMPLETING", "SUSPENDED")
            owner = by_job.get(job["JobId"])
            machines[job["JobId"]] = {
                "start": datetime.fromisoformat(start).timestamp(),
                "end": now if alive or end in ("", "Unknown") else datetime.fromisoformat(end).timestamp(),
                "usd_per_hour": owner.usd_per_hour if owner is not None else 0.0,
                "exit": self._exit(installation, owner) if owner is not None else None, "alive": alive}
        return machines

    def _exit(self, installation: str, alloc: Any) -> float | None:
        """The wrapper's own end of the command (rank 0's status file in the attempt's folder)."""
        status = Path(self.job_dir) / installation / alloc.job_id / f"a{alloc.attempt}" / "status-0.json"
        try:
            ended = json.loads(status.read_text())["ended_at"]
            return datetime.fromisoformat(ended.replace("Z", "+00:00")).timestamp()
        except (OSError, ValueError, KeyError):
            return None

    async def stop(self) -> None:
        return None


async def soak(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    from broker.config import BrokerConfig, Settings
    from broker.models import TERMINAL_STATES, AllocationState
    from broker.service import Lockstep
    from broker.specs import parse_spec
    from broker.store import Store

    market: VastRecord | SlurmRecord = VastRecord(args) if args.market == "vast" else SlurmRecord(args, tmp)
    market_env = await market.start()
    db_url = f"sqlite:///{tmp}/leaks.db"
    installation = f"leaks-{os.getpid()}"
    env = {**os.environ, "LOCKSTEP_DB": db_url, "PYTHONPATH": ROOT, **market_env}
    store = Store(db_url)
    store.migrate()
    svc = Lockstep(Settings(db_url=db_url, broker=BrokerConfig(installation=installation)), providers={},
                   store=store)
    rng = random.Random(args.seed)
    for i in range(args.jobs):
        code = 3 if i % 4 == 3 else 0
        await svc.submit(parse_spec({**market.spec(), "command": f"sleep {rng.uniform(2, 10):.1f}; exit {code}"}))

    broker_log = os.open(f"{tmp}/broker.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    async def start() -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--child", "--market", args.market, "--installation", installation,
            "--poll", str(args.poll),
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
    allocs = store.allocations()
    machines = await market.record(installation, allocs)
    orphan_s = 0.0
    latency: list[float] = []
    booked = market_usd = 0.0
    worst = 0.0
    for mid, m in machines.items():
        owner = next((a for a in allocs if mid in a.resource_ids), None)
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
            print(f"  {mid}: market {m['start']:.1f} → {m['end']:.1f} ${cost:.5f}; booked from {since} to "
                  f"{owner.ended_at.timestamp() if owner.ended_at else 0:.1f}: ${owner.cost_usd or 0:.5f} "
                  f"({owner.billed_s} s, {owner.state.value}, {owner.reason[:60]!r})")
        market_usd += cost
        booked += owner.cost_usd or 0.0
        if cost:
            worst = max(worst, abs((owner.cost_usd or 0.0) - cost) / cost)
    await svc.aclose()
    await market.stop()
    return {"machines": len(machines), "orphan_s": orphan_s, "latency": sorted(latency), "booked": booked,
            "market": market_usd, "worst": worst, "kills": kills, "soak_s": soak_s,
            "ended": len(store.jobs_in_states(list(TERMINAL_STATES)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--market", choices=["vast", "slurm"], default="vast", help="whose stand-in to soak")
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
        asyncio.run(child(args.market, args.installation, args.poll))
        return
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="lockstep-leaks-") as tmp:
        r = asyncio.run(soak(args, tmp))
    load1 = os.getloadavg()
    lat = r["latency"]
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan")
    where = {"vast": "the local Vast API", "slurm": "the local Slurm cluster"}[args.market]
    print(f"{args.jobs} short jobs on {where}, broker SIGKILLed {r['kills']} times, poll every "
          f"{args.poll:g} s; {r['ended']} jobs ended, {r['machines']} machines, {r['soak_s']:.0f} s; "
          f"{os.cpu_count()} CPUs, load average {load0[0]:.1f} before, {load1[0]:.1f} after")
    print(f"(a) machine-seconds billed while no live job owned the machine: {r['orphan_s']:.1f} (goal 0)")
    if lat:
        grain = "; Slurm's end is in whole seconds, so ±1 s" if args.market == "slurm" else ""
        print(f"(b) command exit → machine released: median {statistics.median(lat):.1f} s, p99 {p99:.1f} s, "
              f"max {lat[-1]:.1f} s over {len(lat)} jobs (goal p99 ≤ {args.poll:g} s, one poll interval{grain})")
    err = (r["booked"] - r["market"]) / r["market"] * 100 if r["market"] else 0.0
    print(f"(c) booked ${r['booked']:.4f} against the market's record ${r['market']:.4f}: {err:+.2f}% in total, "
          f"worst machine {r['worst'] * 100:.1f}% (goal within 1%)")


if __name__ == "__main__":
    main()
