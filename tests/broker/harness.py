"""Helpers for the crash and replica tests: job mixes, broker child processes, and the audit.

The audit is the point of those tests: after a crash (or two replicas racing) the store and the
providers must agree, job by job and resource by resource.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import boto3

from broker.config import BrokerConfig, Settings
from broker.models import Allocation, AllocationState, Job, JobState
from broker.service import Lockstep
from broker.specs import parse_spec
from broker.store import Store
from providers.base import OWNER_TAG
from standins.vastapi.server import VastApiServer, VastState
from tests.plugins.moto import FaultProxy
from tests.plugins.vast import VAST_TEST_KEY

ROOT = Path(__file__).resolve().parents[2]
LIVE = (AllocationState.intent, AllocationState.pending, AllocationState.running, AllocationState.unknown)
HOLDING = (JobState.provisioning, JobState.running)

# One GPU each: Vast jobs may take any of the market's common models (one machine, one job),
# AWS jobs an on-demand A10G instance (single node; moto has no capacity limit).
VAST_SPEC = {"name": "crash-vast", "gpu": ["RTX-4090", "RTX-3090", "L40S", "A100-SXM-80GB", "A100-PCIe-80GB",
                                           "H100-SXM", "H100-PCIe"],
             "gpus": 1, "providers": ["vast"], "markets": ["on_demand"], "workload": {"hours": 1},
             "command": "sleep 600"}
AWS_SPEC = {"name": "crash-aws", "gpu": "A10G", "gpus": 1, "providers": ["aws"], "markets": ["on_demand"],
            "workload": {"hours": 1}, "command": "sleep 600"}


async def submit_jobs(db_url: str, n: int) -> list[Job]:
    """Submit ``n`` jobs, alternating Vast and AWS, through the service (as the API would)."""
    store = Store(db_url)
    store.migrate()
    svc = Lockstep(Settings(db_url=db_url, broker=BrokerConfig()), providers={}, store=store)
    try:
        return [await svc.submit(parse_spec(VAST_SPEC if i % 2 == 0 else AWS_SPEC)) for i in range(n)]
    finally:
        await svc.aclose()


def child_env(db_url: str, vast_url: str, aws_url: str) -> dict[str, str]:
    """The broker child's environment: its store and providers, and moto's dummy credentials only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LOCKSTEP_"))}
    env.update({
        "LOCKSTEP_DB": db_url,
        "LOCKSTEP_VAST_URL": vast_url,
        "LOCKSTEP_VAST_API_KEY": VAST_TEST_KEY,
        "LOCKSTEP_AWS_ENDPOINT_URL": aws_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "PYTHONPATH": str(ROOT),
    })
    return env


def launches(vast: VastApiServer, proxy: FaultProxy) -> int:
    """Launch calls the providers have received so far (Vast rentals and EC2 RunInstances)."""
    rents = sum(1 for r in vast.state.requests if r["method"] == "PUT" and r["path"].startswith("/api/v0/asks/"))
    return rents + len(proxy.actions("RunInstances"))


class BrokerChild:
    """``python -m tests.broker.run_broker`` as an asyncio subprocess (the Vast server shares our loop)."""

    def __init__(self, mode: str, installation: str, env: dict[str, str], log: Path) -> None:
        self.args = ["-m", "tests.broker.run_broker", mode, "--installation", installation]
        self.env, self.log = env, log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> BrokerChild:
        self._err = self.log.open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, *self.args, cwd=ROOT, env=self.env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=self._err)
        return self

    async def line(self, limit_s: float = 120.0) -> dict:
        """The next JSON line the child prints (``recover`` prints its report, then waits)."""
        assert self.proc is not None and self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), limit_s)
        assert raw, f"broker child exited early ({await self.proc.wait()}); log:\n" + self.log.read_text()[-3000:]
        return json.loads(raw)

    def go(self) -> None:
        """Let a ``recover`` child go on from its reconciliation to placing."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")

    async def result(self, limit_s: float = 120.0) -> dict:
        """Wait for a clean exit and return the JSON line it printed."""
        assert self.proc is not None
        try:
            out, _ = await asyncio.wait_for(self.proc.communicate(), limit_s)
        except TimeoutError:
            self.kill()
            await self.proc.wait()
            raise AssertionError(f"broker child did not finish; log: {self.log}") from None
        finally:
            self._err.close()
        assert self.proc.returncode == 0, f"broker child exited {self.proc.returncode}; log: {self.log}\n" + \
            self.log.read_text()[-3000:]
        return json.loads(out.decode().strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    async def killed(self) -> int:
        self.kill()
        assert self.proc is not None
        code = await self.proc.wait()
        self._err.close()
        return code


class Brokers:
    """The broker children of one test; whatever the test's outcome, none outlives it."""

    def __init__(self, installation: str, db_url: str, env: dict[str, str], log: Path) -> None:
        self.installation, self.db_url, self.env, self.log = installation, db_url, env, log
        self.children: list[BrokerChild] = []

    async def start(self, mode: str) -> BrokerChild:
        child = await BrokerChild(mode, self.installation, self.env, self.log).start()
        self.children.append(child)
        return child

    async def kill_all(self) -> None:
        for child in self.children:
            if child.proc is not None and child.proc.returncode is None:
                await child.killed()


# --------------------------------------------------------------------------- the audit


@dataclass
class Audit:
    jobs: dict[str, Job]
    allocs: list[Allocation]
    aws: dict[str, str]  # live instance id → lockstep:job tag
    vast: dict[str, dict]  # instance id → the server's record (label, ask_id)
    problems: list[str] = field(default_factory=list)

    def explain(self) -> str:
        """The problems, with the allocations and events of every job they name (for failure messages)."""
        lines = list(self.problems)
        named = {j for j in self.jobs if any(j in q for q in self.problems)}
        for job_id in sorted(named):
            job = self.jobs[job_id]
            lines.append(f"-- {job_id}: {job.state.value} attempts={job.attempts} {job.reason!r}")
            lines += [f"   alloc {x.id} #{x.attempt} {x.state.value} {x.resource_ids} {x.reason!r}"
                      for x in self.allocs if x.job_id == job_id]
            lines += [f"   event {e.at:%H:%M:%S.%f} {e.from_state} -> {e.to_state.value} {e.reason!r}"
                      for e in job.events]
        return "\n".join(lines)

    @property
    def states(self) -> Counter[str]:
        return Counter(j.state.value for j in self.jobs.values())

    def live_by_job(self) -> dict[str, list[Allocation]]:
        out: dict[str, list[Allocation]] = {}
        for a in self.allocs:
            if a.state in LIVE:
                out.setdefault(a.job_id, []).append(a)
        return out


def aws_instances(endpoint: str, installation: str) -> dict[str, str]:
    """Live EC2 instances carrying this installation's owner tag: id → job tag."""
    ec2 = boto3.client("ec2", region_name="us-east-1", endpoint_url=endpoint)
    out: dict[str, str] = {}
    for page in ec2.get_paginator("describe_instances").paginate(Filters=[
            {"Name": f"tag:{OWNER_TAG}", "Values": [installation]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]}]):
        for r in page["Reservations"]:
            for i in r["Instances"]:
                tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                out[i["InstanceId"]] = tags.get("lockstep:job", "")
    return out


def vast_instances(state: VastState, installation: str) -> dict[str, dict]:
    prefix = f"lockstep:{installation}:"
    return {str(iid): inst for iid, inst in state.instances.items() if str(inst.get("label") or "").startswith(prefix)}


def _read(db_url: str, events: bool) -> tuple[dict[str, Job], list[Allocation]]:
    store = Store(db_url)
    try:
        jobs = {j.id: j for j in store.jobs_in_states(list(JobState))}
        if events:
            jobs = {i: store.get_job(i) for i in jobs}
        return jobs, store.allocations()
    finally:
        store.close()


async def audit(db_url: str, installation: str, aws_endpoint: str, vast_state: VastState,
                events: bool = False) -> Audit:
    """Compare the store with what the providers hold; ``Audit.problems`` lists every disagreement.

    ``events``: read each job with its events (slower).
    """
    jobs, allocs = await asyncio.to_thread(_read, db_url, events)
    a = Audit(jobs, allocs, await asyncio.to_thread(aws_instances, aws_endpoint, installation),
              vast_instances(vast_state, installation))
    p = a.problems
    live = a.live_by_job()
    for job in jobs.values():
        held = live.get(job.id, [])
        if job.state not in (JobState.pending, JobState.provisioning, JobState.running, JobState.failed):
            p.append(f"job {job.id} is {job.state.value}")
        if job.state is JobState.failed and not job.reason:
            p.append(f"job {job.id} failed without a reason")
        if len(held) > 1:
            p.append(f"job {job.id} holds {len(held)} live allocations: {[x.id for x in held]}")
        if job.state in HOLDING and (len(held) != 1 or not held[0].resource_ids):
            p.append(f"job {job.id} is {job.state.value} without exactly one live allocation with resources")
        if job.state not in HOLDING and held:
            p.append(f"job {job.id} is {job.state.value} but holds {[x.id for x in held]}")
        if any(x.state is AllocationState.intent for x in held):
            p.append(f"job {job.id} still has an unresolved intent")
    # Resource by resource: every provider resource is owned by exactly one live allocation of a live
    # job, and every resource a live allocation names still exists at its provider.
    owners: dict[tuple[str, str], list[str]] = {}
    for x in a.allocs:
        if x.state in LIVE:
            for rid in x.resource_ids:
                owners.setdefault((x.provider, rid), []).append(x.id)
    at_provider = {("aws", i): job for i, job in a.aws.items()}
    at_provider.update({("vast", i): str(inst["label"]).split(":")[2] for i, inst in a.vast.items()})
    for key, job_id in at_provider.items():
        mine = owners.get(key, [])
        if len(mine) != 1:
            p.append(f"{key[0]} resource {key[1]} (job {job_id}) is owned by {len(mine)} live allocations")
    for key, ids in owners.items():
        if key not in at_provider:
            p.append(f"live allocation(s) {ids} name {key[0]} resource {key[1]}, which the provider does not hold")
    # One Vast machine, one renter: no ask backs two instances.
    asks = Counter(inst["ask_id"] for inst in a.vast.values())
    p.extend(f"vast ask {ask} is rented {n} times" for ask, n in asks.items() if n > 1)
    return a
