"""Crash safety: a broker process placing 100 jobs is SIGKILLed mid-way; a new one must leave no leak.

The kill is keyed to what the providers see, not to wall time: the test watches the launch calls
arriving at the Vast server (in this process) and at the EC2 fault proxy, and kills the broker the
moment the k-th one arrives (k seeded). The provider has then acted, or is acting, on a launch the
broker has not recorded, while up to seven other placements are at other steps: the windows that
"intent before the call, reconcile on start" exists for.

After the kill a fresh broker process reconciles, and the audit must be clean: no job in placing, no
intent left, at most one live allocation per job, every instance at moto and every Vast instance with
this installation's tag/label owned by exactly one live allocation of a live job. The same process
then places the rest; all 100 jobs end up placed with one resource each.
"""

from __future__ import annotations

import asyncio
import random
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.config import BrokerConfig, Settings
from broker.models import AllocationState, JobState
from broker.service import Lockstep
from broker.store import Store
from providers.vast import VastProvider
from providers.vast.config import VastConfig
from standins.vastapi.server import VastApiServer
from tests.broker.harness import Brokers, audit, child_env, launches, submit_jobs
from tests.plugins.moto import FaultProxy

JOBS = 100


@pytest.fixture
async def brokers(tmp_path: Path, vast_api: VastApiServer, aws_proxy_config) -> AsyncIterator[Brokers]:
    db_url = f"sqlite:///{tmp_path / 'crash.db'}"
    env = child_env(db_url, vast_api.url, aws_proxy_config.endpoint_url)
    b = Brokers(f"crash-{secrets.token_hex(3)}", db_url, env, tmp_path / "brokers.log")
    yield b
    await b.kill_all()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("seed", [3, 14, 15])
async def test_sigkill_mid_placement_leaves_nothing_behind(
        seed: int, brokers: Brokers, vast_api: VastApiServer, aws_faults: FaultProxy) -> None:
    db_url, installation, log = brokers.db_url, brokers.installation, brokers.log
    await submit_jobs(db_url, JOBS)
    kill_at = random.Random(seed).randint(5, JOBS * 2 // 3)

    first = await brokers.start("serve")
    loop = asyncio.get_running_loop()
    end = loop.time() + 90
    while launches(vast_api, aws_faults) < kill_at:
        assert first.proc is not None and first.proc.returncode is None, log.read_text()[-3000:]
        assert loop.time() < end, f"the broker made only {launches(vast_api, aws_faults)} launches"
        await asyncio.sleep(0.002)
    assert await first.killed() == -9

    before = await audit(db_url, installation, aws_faults.upstream, vast_api.state)
    # The crash really interrupted the placement: jobs were left unplaced, and some mid-way.
    assert before.states[JobState.provisioning.value] < JOBS, before.states
    assert before.states[JobState.placing.value] > 0 and (before.aws or before.vast), before.states

    # A new broker process on the same store: it reconciles, reports, and waits for us.
    second = await brokers.start("recover")
    report = (await second.line())["report"]
    assert not report["unreachable"], report
    after = await audit(db_url, installation, aws_faults.upstream, vast_api.state)
    assert not after.problems, f"{report}\n{after.explain()}"
    assert JobState.placing.value not in after.states
    assert report["to_provisioning"] or report["requeued"], report
    for job in before.jobs.values():  # whatever the crash left half-done went one way or the other
        if job.state is JobState.placing:
            assert after.jobs[job.id].state in (JobState.pending, JobState.provisioning), after.jobs[job.id]

    # It then places the rest: every job ends up with exactly one resource, nothing bought twice.
    second.go()
    out = await second.result()
    done = await audit(db_url, installation, aws_faults.upstream, vast_api.state)
    assert not done.problems, done.explain()
    assert sum(out["counts"].get(s.value, 0) for s in (JobState.provisioning, JobState.running)) == JOBS, out
    assert len(done.vast) == JOBS // 2 and len(done.aws) == JOBS // 2


async def test_a_launch_whose_answer_is_lost_is_adopted_not_repeated(
        tmp_path: Path, vast_api: VastApiServer, vast_config: VastConfig) -> None:
    """Vast rents the machine but the answer is lost (502) and the adapter does not retry: the router
    must find the rental (by its label) instead of renting a second machine and leaking the first."""
    db_url = f"sqlite:///{tmp_path / 'lost.db'}"
    installation = "lost-answer"
    [job] = await submit_jobs(db_url, 1)
    store = Store(db_url)
    cfg = vast_config.model_copy(update={"max_attempts": 1})
    svc = Lockstep(Settings(db_url=db_url, broker=BrokerConfig(installation=installation)),
                   providers={"vast": VastProvider(cfg, installation=installation)}, store=store)
    try:
        vast_api.state.faults.lose_next_create = 1
        await svc.place_now([job.id])
        job = await svc.get_job(job.id)
        assert job.state is JobState.provisioning, job.reason
        allocs = await svc.job_allocations(job.id)
        assert [(a.state, a.attempt) for a in allocs] == [(AllocationState.pending, 1)], allocs
        assert [str(i) for i in vast_api.state.instances] == allocs[0].resource_ids
    finally:
        await svc.aclose()
