"""A market that stays down: the broker backs off the provider as a whole and every job ends.

The local Vast API (standins/vastapi) answers every call with 429/500 (or 401: a revoked key) for ten minutes of
*simulated* time: the service, the market, the router and the loops all read one injected clock, which the
test moves on in 5 s steps (the loops' own cadence: refresh every 60 s, place and poll every step). Nothing
sleeps. What is counted is what the provider received (its request log), so the bound is on real calls.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import pytest

from broker.config import BrokerConfig, Settings
from broker.loops import PLACING_AT_ONCE
from broker.market import CircuitState
from broker.models import JobState, utcnow
from broker.service import Lockstep
from broker.specs import parse_spec
from broker.store import Store
from providers.vast import VastProvider
from standins.vastapi.server import Faults, VastApiServer

STEP_S = 5
REFRESH_S = 60
SPEC = {"name": "outage", "gpu": ["RTX-4090", "RTX-3090", "L40S"], "gpus": 1, "markets": ["on_demand"],
        "workload": {"hours": 0.01}, "command": "sleep 600"}


class SimClock:
    """The one clock of the service under test; only the test moves it."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


class Outage:
    def __init__(self, svc: Lockstep, vast: VastApiServer, clock: SimClock) -> None:
        self.svc, self.vast, self.clock = svc, vast, clock
        self.t = 0  # simulated seconds since the outage began
        self.base = 0
        self.calls: dict[int, int] = {}  # t → requests the provider had received since the outage began

    def begin(self, faults: Faults) -> None:
        self.vast.state.set_faults(faults)
        self.base = len(self.vast.state.requests)

    async def run_until(self, end_s: int) -> None:
        """Move the clock on in steps, running each loop when it is due, recording the provider's calls."""
        while self.t < end_s:
            self.t += STEP_S
            self.clock.now += timedelta(seconds=STEP_S)
            if self.t % REFRESH_S == 0:
                await self.svc.market.refresh()
            await self.svc.broker.place_pending()
            await self.svc.broker.poll_once()
            self.calls[self.t] = len(self.vast.state.requests) - self.base

    def calls_between(self, a: int, b: int) -> int:
        return self.calls[b] - self.calls.get(a, 0)

    async def states(self) -> dict[str, JobState]:
        jobs, _ = await self.svc.list_jobs(limit=100)
        return {j.id: j.state for j in jobs}


@pytest.fixture
async def outage(store: Store, vast_api: VastApiServer, vast_config) -> AsyncIterator[Outage]:
    clock = SimClock(utcnow())
    settings = Settings(db_url=store.url, broker=BrokerConfig(
        installation="outage", circuit_failures=3, circuit_backoff_s=30, circuit_backoff_max_s=1800,
        placement_timeout_s=3600, placement_rounds=30))
    svc = Lockstep(settings, providers={"vast": VastProvider(vast_config, installation="outage")}, store=store,
                   clock=clock)
    health = await svc.refresh()  # a healthy start: the book holds Vast's offers (stale once it fails)
    assert health["vast"].ok and health["vast"].offers
    yield Outage(svc, vast_api, clock)
    jobs, _ = await svc.list_jobs(limit=100)
    vast_api.state.set_faults(Faults())
    for j in jobs:
        await svc.cancel(j.id)
    await svc.aclose()


async def test_a_provider_down_ten_minutes_is_called_logarithmically_and_jobs_end(outage: Outage,
                                                                                    vast_config) -> None:
    svc = outage.svc
    waiting = [await svc.submit(parse_spec(SPEC)) for _ in range(8)]
    # Two jobs must be placed within 4 minutes: their own deadline ends their wait during the outage.
    hurried = [await svc.submit(parse_spec({**SPEC, "deadline_in": "4m"})) for _ in range(2)]
    outage.begin(Faults(error_rate=1.0, retry_after_s=0))

    await outage.run_until(600)

    circuit = svc.market.health()["vast"].circuit
    assert circuit.state is CircuitState.open and circuit.opened >= 3, circuit
    # One call (a launch, a search or a poll) costs the provider at most this many requests: the adapter's
    # bounded retries, and for a launch the look at what it owns afterwards (did the launch go through?).
    per_call = 2 * vast_config.max_attempts
    # The calls made before the circuit opened: up to the failure threshold, plus launches already in flight.
    first = outage.calls[STEP_S]
    assert first <= (PLACING_AT_ONCE + 3) * per_call
    # Then one probe per backoff, and the backoff doubles: each doubling of the outage's length costs at most
    # one probe more. Linear growth would cost as much in 300-600 s as in 0-300 s.
    for a, b in ((75, 150), (150, 300), (300, 600)):
        assert outage.calls_between(a, b) <= per_call, (a, b, outage.calls)
    probes = len({t for t in outage.calls if t > STEP_S and outage.calls_between(t - STEP_S, t)})
    assert probes <= math.ceil(math.log2(600 / 30 + 1)), outage.calls
    assert outage.calls[600] <= first + probes * per_call

    # Each hurried job failed at its deadline, with every distinct reason it collected, each once.
    for job in hurried:
        failed = await svc.get_job(job.id)
        assert failed.state is JobState.failed, failed.reason
        assert failed.reason.startswith("not placed by its deadline")
        [event] = [e for e in failed.events if e.to_state is JobState.failed]
        reasons = event.data["reasons"]
        assert reasons and len(reasons) == len(set(reasons)) and all(r in failed.reason for r in reasons)
        assert any("vast" in r and ("500" in r or "429" in r or "circuit open" in r) for r in reasons), reasons
    # The others still wait, pending (never stuck in placing), and nothing was launched.
    states = await outage.states()
    assert {states[j.id] for j in waiting} == {JobState.pending}
    assert not svc.store.live_allocations()

    # The provider recovers: the next probe closes the circuit and every waiting job is placed, once.
    outage.vast.state.set_faults(Faults())
    placed = {JobState.provisioning, JobState.running}
    while outage.t < 600 + 1800 + 60 and not {(await outage.states())[j.id] for j in waiting} <= placed:
        await outage.run_until(outage.t + 60)  # the next probe comes at most one (capped) backoff later
    assert svc.market.health()["vast"].circuit.state is CircuitState.closed
    states = await outage.states()
    assert {states[j.id] for j in waiting} <= placed, states
    live = svc.store.live_allocations()
    assert sorted(a.job_id for a in live) == sorted(j.id for j in waiting)
    assert len(outage.vast.state.instances) == len(waiting)


async def test_a_revoked_key_stops_all_calls_and_jobs_fail_with_the_reason_once(outage: Outage) -> None:
    svc = outage.svc
    svc.broker.limits = type(svc.broker.limits)(rounds=30, timeout_s=300)
    jobs = [await svc.submit(parse_spec(SPEC)) for _ in range(6)]
    outage.begin(Faults(unauthorized=True))

    await outage.run_until(600)

    health = svc.market.health()["vast"]
    assert health.circuit.state is CircuitState.auth_failed and "invalid_user_key" in health.circuit.reason
    assert not health.ok and health.stale and "unusable until its configuration changes" in health.last_error
    # The refusal came back to the first calls made (launches in flight at once); then nothing, for ten
    # minutes: a refused key is not tried again until the configuration changes.
    assert outage.calls[STEP_S] <= PLACING_AT_ONCE
    assert outage.calls[600] == outage.calls[STEP_S]
    for job in jobs:
        failed = await svc.get_job(job.id)
        assert failed.state is JobState.failed
        assert failed.reason.startswith("not placed within 300 s of waiting (broker.placement_timeout_s)")
        # Said once, however many rounds and passes met it.
        assert failed.reason.count("vast: credentials refused; unusable until its configuration changes") == 1
        assert failed.reason.count("invalid_user_key") <= 1, failed.reason
