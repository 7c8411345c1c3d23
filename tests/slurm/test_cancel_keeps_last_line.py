"""A cancelled job's kept log is complete (issue 29): the line its command prints as it is stopped — after the
cancel has reached it — is in `lockstep logs` once the job is cancelled and its machine given back. On the local
Slurm cluster, through the real service (cancel → lifecycle.release → scancel), read back from the store."""

from __future__ import annotations

import pytest

from broker.models import AllocationState, JobState
from tests.slurm.test_runtime import SlurmBroker, out_lines
from tests.waiting import eventually

pytestmark = pytest.mark.slurm


async def test_the_line_a_job_prints_as_it_is_cancelled_is_in_its_kept_log(broker: SlurmBroker) -> None:
    command = "trap 'echo stopping-now; exit 0' TERM; echo started; while true; do sleep 0.1; done"
    job = await broker.submit(command=command)
    alloc = await broker.place(job)
    await broker.poll_until(job.id, (JobState.running,), "the job runs")
    await eventually(lambda: broker.slurm.job_log(alloc), lambda text: "started" in out_lines(text),
                     "the command has started", 60)

    cancelled = await broker.svc.cancel(job.id)
    assert cancelled.state is JobState.cancelled
    [after] = await broker.svc.job_allocations(job.id)
    assert after.state is AllocationState.released and broker.svc.store.archived_logs(after.id)

    texts = [ln.text for ln in await broker.svc.job_logs(job.id)]
    assert "started" in texts
    assert "stopping-now" in texts, texts[-5:]
