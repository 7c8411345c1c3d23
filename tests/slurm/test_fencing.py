"""Fencing (issue 24), on the local Slurm cluster: each attempt carries a fence — its attempt number, in the
job's status location the wrapper reads (the shared job directory's ``fence``). Attempt 1 runs; attempt 2 of
the same job is staged (what its launch does first, as after a requeue while attempt 1's node ran on): attempt
1's wrapper stops its command and exits, saying why, and Slurm's job of attempt 1 ends by itself.
"""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from broker.models import JobState
from providers.runtime.manifest import RunRequest
from tests.plugins.slurm import SlurmCluster
from tests.slurm.test_runtime import SlurmBroker, slurm_job
from tests.waiting import eventually

pytestmark = pytest.mark.slurm


async def _async(value: object) -> object:
    return value


async def test_attempt_1s_wrapper_stops_once_attempt_2_starts(broker: SlurmBroker,
                                                             slurm_cluster: SlurmCluster) -> None:
    job = await broker.submit(command='echo "attempt $LOCKSTEP_ATTEMPT up"; sleep 600')
    alloc = await broker.place(job)
    first = broker.slurm.files.where(job.id, alloc.attempt)
    await eventually(lambda: _async(first.log(0).exists() and "attempt 1 up" in first.log(0).read_text()),
                     bool, "attempt 1's command runs")
    assert first.fence.read_text().strip() == "1"
    # Attempt 2 is staged, as its launch does first: the fence moves on.
    run = RunRequest.for_launch(job.spec, job_id=job.id, attempt=2, secrets={"HF": SecretStr("x")},
                                runtime=broker.settings.runtime)
    await broker.slurm.files.stage(run)
    assert first.fence.read_text().strip() == "2"
    await eventually(lambda: _async(slurm_job(slurm_cluster, alloc.resource_ids[0])["JobState"]),
                     lambda s: s not in ("RUNNING", "PENDING", "COMPLETING"), "attempt 1's Slurm job ended", 60)
    assert "superseded by attempt 2: stopping attempt 1" in first.log(0).read_text()
    status = first.status(0).read_text()
    assert '"reason": "signal"' in status and '"exit_code": 143' in status, status
    assert (await broker.svc.get_job(job.id)).state in (JobState.provisioning, JobState.running)
