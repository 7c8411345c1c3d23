"""The placement loop's quick passes (woken by submissions): they look at the jobs this process was told
of and the retries due, and a full pass finds the rest (another process's submissions)."""

from __future__ import annotations

from broker.config import BrokerConfig, Settings
from broker.models import Job, JobState, utcnow
from broker.service import Lockstep
from broker.service.runtime import new_job_id
from broker.store import Store
from standins.memory import MemoryProvider, offer, spec


async def test_a_quick_pass_places_what_was_submitted_here_and_a_full_pass_the_rest(store: Store) -> None:
    provider = MemoryProvider("mem", [offer("mem", f"x{i}", 1.0 + i) for i in range(3)])
    svc = Lockstep(Settings(db_url=store.url, broker=BrokerConfig(installation="quick")), providers={"mem": provider},
                   store=store)
    try:
        await svc.refresh()
        mine = await svc.submit(spec())
        now = utcnow()
        theirs, _ = store.create_job(Job(id=new_job_id(), spec=spec(), created_at=now, updated_at=now))  # elsewhere
        assert svc.submitted_ids == {mine.id}

        quick = await svc.broker.place_pending(quick=True)
        assert [(r.job.id, r.placed) for r in quick] == [(mine.id, True)]
        assert not svc.submitted_ids  # the hint was used
        assert store.get_job(theirs.id).state is JobState.pending  # not looked at by a quick pass

        full = await svc.broker.place_pending()
        assert [(r.job.id, r.placed) for r in full] == [(theirs.id, True)]
        assert {store.get_job(j).state for j in (mine.id, theirs.id)} == {JobState.provisioning}
    finally:
        await svc.aclose()
