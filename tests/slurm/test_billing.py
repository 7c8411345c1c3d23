"""Billed time is the market's own billing (issue 24), on the local Slurm cluster through the real broker: a job
queued behind a full pool accrues nothing and, cancelled before it ran, is booked nothing; a job that ran is
booked Slurm's own elapsed time (its record's start to end, read back from slurmrestd) × its rate.

The pool filled is the cluster's L40S node (gpu-node5), by a blocker job of this test's own that it cancels.
"""

from __future__ import annotations

import re

import pytest

from broker.models import AllocationState, JobState, month_start
from tests.plugins.slurm import SlurmCluster
from tests.slurm.test_runtime import SlurmBroker
from tests.waiting import eventually

pytestmark = pytest.mark.slurm


async def _async(value: object) -> object:
    return value


async def test_a_job_queued_behind_a_full_pool_and_cancelled_before_it_ran_costs_nothing(
    broker: SlurmBroker, slurm_cluster: SlurmCluster, slurm_installation: str
) -> None:
    # Fill the L40S node (4 GPUs) with a job of our own, with a time limit (so the pool's wait can be estimated).
    out = slurm_cluster.cli("sbatch", "--parsable", "-w", "gpu-node5", "--gres=gpu:l40s:4", "-t", "10",
                            f"--comment=lockstep-test-blocker-{slurm_installation}", "--wrap", "sleep 600",
                            "-o", "/dev/null")
    blocker = re.sub(r"\D.*", "", out.strip())
    try:
        await eventually(lambda: _async(slurm_cluster.cli("squeue", "-h", "-j", blocker, "-o", "%T").strip()),
                         lambda s: s == "RUNNING", "the blocker runs")
        await broker.svc.refresh()
        job = await broker.submit(gpu="L40S", gpus=1, command="echo never")
        alloc = await broker.place(job)
        await broker.svc.poll_now()
        queued = await broker.svc.get_job(job.id)
        assert queued.state is JobState.provisioning and queued.reason.startswith("queued in slurm"), queued.reason
        assert slurm_cluster.cli("squeue", "-h", "-j", alloc.resource_ids[0], "-o", "%T").strip() == "PENDING"
        store = broker.svc.store
        now = broker.svc.clock()
        assert store.accruing([job.id], now) == {}  # waiting in Slurm's queue accrues nothing
        assert store.tenant_spend(job.tenant, month_start(now), now) == 0.0
        await broker.svc.cancel(job.id)
        [rec] = await broker.svc.job_allocations(job.id)
        assert rec.state is AllocationState.released and rec.cost_usd == 0.0 and rec.billed_s == 0.0
        assert (await broker.svc.get_job(job.id)).spent_usd == 0.0
    finally:
        slurm_cluster.cli("scancel", blocker, check=False)


async def test_a_job_that_ran_is_booked_slurms_own_elapsed_time_times_its_rate(broker: SlurmBroker) -> None:
    job = await broker.submit(command="sleep 3; echo done")
    alloc = await broker.place(job)
    job = await broker.poll_until(job.id, (JobState.succeeded, JobState.failed), "the job ended")
    assert job.state is JobState.succeeded, job.reason
    record = await broker.slurm.client.job(alloc.resource_ids[0])  # Slurm's own record of the job
    assert record is not None and record.start_time and record.end_time
    elapsed = record.end_time - record.start_time
    assert elapsed >= 3
    [rec] = await broker.svc.job_allocations(job.id)
    assert rec.billed_s == pytest.approx(elapsed)
    assert rec.cost_usd == pytest.approx(rec.usd_per_hour * elapsed / 3600)
    assert (await broker.svc.get_job(job.id)).spent_usd == pytest.approx(rec.cost_usd)
    assert rec.ended_at is not None and rec.ended_at.timestamp() == pytest.approx(record.end_time)
