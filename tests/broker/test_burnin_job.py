"""Burn-in switched on by a job spec: the broker runs the probe first on the Slurm node it placed the job on."""

from __future__ import annotations

from pathlib import Path

from broker.models import JobState
from broker.service import Lockstep
from broker.specs import parse_spec
from tests.broker.test_burnin import svc  # noqa: F401  (the fixture: a service over the local cluster)
from tests.waiting import eventually


async def test_job_with_burn_in_runs_the_probe_first_and_its_result_is_stored(
    svc: Lockstep, tmp_path: Path  # noqa: F811
) -> None:
    spec = parse_spec({"name": "burnt-in", "gpu": "L40S", "gpus": 1, "markets": ["owned"], "burn_in": True,
                       "workload": {"hours": 0.2}, "command": "sleep 120"})
    await svc.refresh()
    job = await svc.submit(spec)
    await svc.place_now([job.id])
    job = await svc.get_job(job.id)
    assert job.state is JobState.provisioning and job.placement.provider == "slurm", job.reason

    async def benches() -> list:
        await svc.poll_now()
        return await svc.db(svc.store.benchmarks, "slurm")

    got = await eventually(benches, lambda bs: bool(bs), "the burn-in result recorded")
    [b] = got
    assert b.healthy and b.raw["source"] == "probe" and b.raw["burnin"]["stem"] == f"job-{job.id}-1"
    job = await svc.get_job(job.id)
    assert job.state in (JobState.provisioning, JobState.running)  # a healthy node keeps the job
    await svc.cancel(job.id)
