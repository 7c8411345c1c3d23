"""Each provider's circuit breaker (broker/market.py) and what the router and the loops do with it, and the
placement limits (broker/lifecycle.py, called from broker/loops.py).

The breaker's own rules over an injected clock; then over an in-memory market (standins/memory.py) and a
real store on both backends. The same against the local Vast API, over ten simulated minutes: test_outage.py.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from broker.config import BrokerConfig, Settings, credential_files
from broker.errors import BadRequestError, CapacityError, ProviderAuthError, QuotaError, TransientError
from broker.lifecycle import JobLifecycle
from broker.loops import RETRY_AFTER, BrokerLoops
from broker.market import CircuitBreaker, CircuitOpen, CircuitPolicy, CircuitState, Marketplace
from broker.models import Job, JobState
from broker.service import Lockstep
from broker.store import Store
from providers.slurm.config import SlurmConfig
from standins.memory import NOW, MemoryProvider, offer, placed_job, spec


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def fail(breaker: CircuitBreaker, exc: Exception | None = None) -> None:
    ticket = breaker.acquire()
    assert ticket is not None
    ticket.record(exc or TransientError(breaker.name, "HTTP 503"))


def test_it_opens_after_n_failures_probes_once_and_backs_off_twice_as_long_each_time() -> None:
    clock = Clock()
    breaker = CircuitBreaker("p", CircuitPolicy(failures=3, backoff_s=30, backoff_max_s=100), clock=clock)
    fail(breaker)
    fail(breaker)
    assert breaker.state is CircuitState.closed and breaker.admits()
    fail(breaker)
    assert breaker.state is CircuitState.open and not breaker.admits() and breaker.acquire() is None
    assert breaker.info().next_probe_at == NOW + timedelta(seconds=30)

    waits = []
    for _ in range(4):  # each failed probe: open again, twice as long (capped)
        opened_at = clock.now
        while not breaker.admits():
            clock.advance(1)
        waits.append((clock.now - opened_at).total_seconds())
        probe = breaker.acquire()
        assert probe is not None and breaker.state is CircuitState.half_open
        assert breaker.acquire() is None  # one probe at a time: the others wait for its outcome
        probe.record(TransientError("p", "HTTP 500"))
        assert breaker.state is CircuitState.open
    assert waits == [30, 60, 100, 100]

    clock.advance(100)
    probe = breaker.acquire()
    assert probe is not None
    probe.record(None)
    assert breaker.state is CircuitState.closed and breaker.failures == 0 and breaker.info().next_probe_at is None
    # Closed long enough (its last backoff), the next outage starts again with the first backoff.
    clock.advance(100)
    breaker.acquire().record(None)
    for _ in range(3):
        fail(breaker)
    assert breaker.info().next_probe_at == clock.now + timedelta(seconds=30)


@pytest.mark.parametrize("answer", [CapacityError("p", "none left"), QuotaError("p", "vCPU limit"),
                                    BadRequestError("p", "bad image")], ids=["capacity", "quota", "bad-request"])
def test_a_refusal_is_an_answer_not_a_failure(answer: Exception) -> None:
    breaker = CircuitBreaker("p", CircuitPolicy(failures=2), clock=Clock())
    for _ in range(5):
        fail(breaker, answer)
    assert breaker.state is CircuitState.closed and breaker.failures == 0
    fail(breaker)
    fail(breaker, answer)  # an answer between failures: they are no longer consecutive
    fail(breaker)
    assert breaker.state is CircuitState.closed


def test_a_probe_that_was_not_made_leaves_the_next_one_due() -> None:
    clock = Clock()
    breaker = CircuitBreaker("p", CircuitPolicy(failures=1, backoff_s=10), clock=clock)
    fail(breaker)
    clock.advance(10)
    probe = breaker.acquire()
    assert probe is not None
    probe.release()  # the caller gave up before calling (cancelled, or nothing left to launch)
    assert breaker.state is CircuitState.open and breaker.admits() and breaker.acquire() is not None


def test_refused_credentials_hold_until_the_credential_file_changes(tmp_path: Path) -> None:
    token = tmp_path / "slurm.jwt"
    token.write_text("expired\n")
    config = SlurmConfig(token_file=str(token))
    breaker = CircuitBreaker("slurm", CircuitPolicy(failures=3, backoff_s=1), clock=Clock(),
                             credentials=lambda: credential_files(config))
    fail(breaker, ProviderAuthError("slurm", "token expired 60 s ago"))
    assert breaker.state is CircuitState.auth_failed and not breaker.admits()
    breaker.clock.advance(10_000)  # time alone does not bring it back
    assert not breaker.admits() and breaker.acquire() is None
    assert "unusable until its configuration changes" in breaker.describe()

    token.write_text("rotated-by-the-sidecar\n")
    probe = breaker.acquire()
    assert probe is not None
    probe.record(None)
    assert breaker.state is CircuitState.closed


async def test_the_service_probes_a_refused_provider_when_its_credential_file_is_rotated(tmp_path: Path) -> None:
    token = tmp_path / "slurm.jwt"
    token.write_text("one\n")
    settings = Settings(db_url=f"sqlite:///{tmp_path / 'x.db'}", slurm=SlurmConfig(token_file=str(token)))
    svc = Lockstep(settings, providers={"slurm": MemoryProvider("slurm", [])})
    circuit = svc.market.circuits["slurm"]
    fail(circuit, ProviderAuthError("slurm", "401"))
    assert not circuit.admits()
    token.write_text("two, longer\n")
    assert circuit.admits()
    await svc.aclose()


async def test_call_refuses_while_open_and_records_timeouts() -> None:
    breaker = CircuitBreaker("p", CircuitPolicy(failures=1), clock=Clock())

    async def hangs() -> None:
        await asyncio.wait_for(asyncio.sleep(10), 0.01)

    with pytest.raises(TimeoutError):
        await breaker.call(hangs)
    with pytest.raises(CircuitOpen) as refused:
        await breaker.call(hangs)
    assert "circuit open after 1 failed calls" in str(refused.value)


# --------------------------------------------------------------------------- with the router and the loops


async def loops_over(store: Store, *providers: MemoryProvider, clock: Clock, **broker: object) -> BrokerLoops:
    settings = Settings(db_url=store.url, broker=BrokerConfig(installation="mem", max_launch_tries=4,
                                                              circuit_failures=2, circuit_backoff_s=60, **broker))
    market = Marketplace({p.name: p for p in providers}, clock=clock,
                         circuit=CircuitPolicy(2, 60, 600))
    await market.refresh()
    return BrokerLoops(settings, store, market, clock=clock)


def submit(store: Store, clock: Clock, **fields: object) -> Job:
    job, _ = store.create_job(Job(id=f"j{len(store.jobs_in_states(list(JobState)))}", spec=spec(**fields),
                                  created_at=clock(), updated_at=clock(), deadline=fields.get("deadline")))
    return job


async def test_an_open_circuit_is_skipped_until_its_probe_and_the_job_waits_saying_why(store: Store) -> None:
    clock = Clock()
    down = MemoryProvider("down", [offer("down", "a", 1.0), offer("down", "b", 1.1), offer("down", "c", 1.2)])
    for o in ("down:a", "down:b", "down:c"):
        down.refuse[o] = TransientError("down", "HTTP 503")
    loops = await loops_over(store, down, clock=clock)
    job = submit(store, clock)

    [res] = await loops.place_pending()
    # Two failed launches open the circuit: the third offer is not tried.
    assert len(down.launches) == 2 and len(res.tries) == 2
    assert res.job.state is JobState.pending and "circuit open after 2 failed calls" in res.reason

    clock.advance(RETRY_AFTER.total_seconds())
    [res] = await loops.place_pending()
    assert len(down.launches) == 2  # not called while open
    assert res.reason.startswith("no launchable offer right now: down: circuit open")
    assert store.get_job(job.id).reason == res.reason

    clock.advance(60)  # the backoff has passed: one launch probes it, and the provider is back
    down.refuse.clear()
    [res] = await loops.place_pending()
    assert res.placed and len(down.launches) == 3
    assert loops.market.circuits["down"].state is CircuitState.closed


async def test_polls_wait_while_the_circuit_is_open(store: Store) -> None:
    mem, _, _ = await placed_job(store)
    clock = Clock()
    market = Marketplace({"mem": mem}, clock=clock, circuit=CircuitPolicy(1, 60, 600))
    loops = BrokerLoops(Settings(db_url=store.url), store, market, clock=clock)
    assert await loops.poll_once() == 1
    fail(market.circuits["mem"])
    assert await loops.poll_once() == 0  # not called
    clock.advance(60)
    assert await loops.poll_once() == 1  # the probe
    assert market.circuits["mem"].state is CircuitState.closed


async def test_a_job_fails_after_its_placement_rounds_with_each_reason_once(store: Store) -> None:
    clock = Clock()
    full = MemoryProvider("full", [offer("full", "a", 1.0, zone="z1"), offer("full", "b", 1.5, zone="z2")])
    full.refuse["full:a"] = CapacityError("full", "no capacity in z1")
    full.refuse["full:b"] = CapacityError("full", "no capacity in z2")
    loops = await loops_over(store, full, clock=clock, placement_rounds=3)
    job = submit(store, clock)

    for round_ in range(3):
        [res] = await loops.place_pending()
        clock.advance(RETRY_AFTER.total_seconds())
        assert res.job.state is (JobState.failed if round_ == 2 else JobState.pending), res.reason
    failed = store.get_job(job.id)
    assert failed.reason == ("not placed after 3 failed launch rounds (broker.placement_rounds): "
                             "full: no capacity in z1; full: no capacity in z2")
    assert failed.events[-1].data["reasons"] == ["full: no capacity in z1", "full: no capacity in z2"]
    assert failed.events[-1].data["rounds"] == 3
    assert len(full.launches) == 6 and not store.live_allocations()
    assert await loops.place_pending() == []  # failed is final: nothing left to place


async def test_a_job_waits_until_its_timeout_or_its_own_deadline(store: Store) -> None:
    clock = Clock()
    mem = MemoryProvider("mem", [offer("mem", "a", 1.0)])
    loops = await loops_over(store, mem, clock=clock, placement_timeout_s=600)
    patient = submit(store, clock, gpu="H100")  # nothing here can run it
    hurried = submit(store, clock, gpu="H100", deadline=NOW + timedelta(seconds=120))
    lenient = submit(store, clock, gpu="H100", deadline=NOW + timedelta(hours=2))

    await loops.place_pending()
    clock.advance(120)
    await loops.place_pending()
    assert store.get_job(hurried.id).state is JobState.failed
    assert store.get_job(hurried.id).reason.startswith("not placed by its deadline")
    assert "no feasible offer" in store.get_job(hurried.id).reason
    assert store.get_job(patient.id).state is JobState.pending

    clock.advance(480)
    await loops.place_pending()
    gave_up = store.get_job(patient.id)
    assert gave_up.state is JobState.failed
    assert gave_up.reason.startswith("not placed within 600 s of waiting (broker.placement_timeout_s): no feasible")
    assert store.get_job(lenient.id).state is JobState.pending  # its own deadline, two hours, stands
    assert not mem.launches


async def test_a_requeued_job_waits_anew(store: Store) -> None:
    clock = Clock()
    mem, job, _ = await placed_job(store)
    life = JobLifecycle(store, {"mem": mem}, clock=clock)
    await life.requeue_lost(store.get_job(job.id))
    requeued = store.get_job(job.id)
    wait = await life.placement_wait(requeued)
    # From the requeue on (the store stamps its events), not from the job's submission; its earlier tries
    # and rounds no longer count.
    assert requeued.events[-1].to_state is JobState.pending and wait.since == requeued.events[-1].at
    assert wait.since != requeued.created_at and wait.rounds == 0 and wait.reasons == ()
