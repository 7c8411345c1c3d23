"""Submissions through the service: concurrent ones are written together (a group commit), and each
caller still gets what a submission alone would have given it."""

from __future__ import annotations

import asyncio

from broker.config import Settings
from broker.errors import ConflictError
from broker.models import Job, JobState, utcnow
from broker.service import Lockstep
from broker.service.runtime import GroupCommit, new_job_id
from broker.specs import parse_spec
from broker.store import Store

SPEC = {"name": "s", "gpu": "H100", "gpus": 8, "workload": {"hours": 1}}


async def test_concurrent_submissions_each_get_their_own_answer(store: Store) -> None:
    svc = Lockstep(Settings(db_url=store.url), providers={}, store=store)
    spec, other = parse_spec(SPEC), parse_spec({**SPEC, "gpus": 16})
    calls = [svc.submit_job(spec, tenant="acme") for _ in range(20)]
    calls += [svc.submit_job(spec, tenant="acme", idempotency_key="once") for _ in range(10)]
    calls += [svc.submit_job(other, tenant="acme", idempotency_key="once")]
    calls += [svc.submit_job(spec, tenant="globex", idempotency_key="once")]
    out = await asyncio.gather(*calls, return_exceptions=True)

    plain, keyed, clash, elsewhere = out[:20], out[20:30], out[30], out[31]
    assert all(isinstance(r, tuple) and r[1] for r in plain)
    assert len({r[0].id for r in plain if isinstance(r, tuple)}) == 20
    assert all(isinstance(r, tuple) for r in keyed)
    assert [r[1] for r in keyed if isinstance(r, tuple)].count(True) == 1  # one job for the key, the rest repeats
    assert len({r[0].id for r in keyed if isinstance(r, tuple)}) == 1
    assert isinstance(clash, ConflictError)
    assert isinstance(elsewhere, tuple) and elsewhere[1]
    stored = await svc.db(store.jobs_in_states, [JobState.pending])
    assert len(stored) == 22  # 20 plain, one for acme's key, one for globex's
    for r in plain[:3]:
        assert isinstance(r, tuple)
        assert r[0] == await svc.get_job(r[0].id)  # what the caller got is what was stored
    assert svc.job_submitted.is_set()




async def test_a_submission_in_the_turn_a_writer_finishes_is_still_written(store: Store) -> None:
    """A writer task that has finished leaves the set of writers only when its done-callback runs, one
    loop turn later; a submission arriving in that turn must start a writer of its own, or nobody writes
    it and its caller waits forever (seen once in a full run, the last of a burst)."""
    svc = Lockstep(Settings(db_url=store.url), providers={}, store=store)
    group = GroupCommit(svc)
    finished = asyncio.create_task(asyncio.sleep(0))
    await finished
    group._writers.add(finished)  # the state of that turn: finished, its discard not yet run
    now = utcnow()
    job, created = await asyncio.wait_for(
        group.write(Job(id=new_job_id(), tenant="acme", spec=parse_spec(SPEC), created_at=now, updated_at=now), None),
        timeout=30)
    assert created and job.tenant == "acme"
