"""Spend: an allocation's cost is its price × its billed time per its market's granularity (a provider's
``billing``, never its name), booked into its job once, also across a crash between the machine's release
and the booking; a job whose market reports its end without an exit status is still given back; the log a
market serves is kept (masked) when the allocation ends. Over the in-memory market and a real store on
both backends; the same against the real markets in tests/vast/test_logs_spend.py and
tests/runtime/test_aws_logs_spend.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from broker.config import SecretsConfig
from broker.errors import TransientError
from broker.ledger import BILLING_DUE, RELEASING
from broker.lifecycle import JobLifecycle
from broker.models import (
    HOURLY,
    PER_SECOND,
    PER_SECOND_MIN_60,
    Allocation,
    AllocationState,
    Billing,
    Job,
    JobExit,
    JobState,
    Offer,
    month_start,
)
from broker.reconcile import reconcile
from broker.secrets import SecretSources
from broker.store import Store
from providers.capabilities import BilledSpan, HasJobLogs, KeepsBillingRecord
from standins.memory import NOW, Clock, MemoryProvider, offer, placed_job, poll, router_over, submit_and_place


def test_billing_granularities() -> None:
    assert PER_SECOND.billed_seconds(12.2) == 13 and PER_SECOND.billed_seconds(0) == 0
    assert PER_SECOND_MIN_60.billed_seconds(12.2) == 60 and PER_SECOND_MIN_60.billed_seconds(61.5) == 62
    assert HOURLY.billed_seconds(10) == 3600 and HOURLY.billed_seconds(3601) == 7200
    assert HOURLY.billed_seconds(7200) == 7200  # a whole number of increments is not rounded up
    assert Billing(increment_s=0).billed_seconds(1.25) == 1.25
    assert PER_SECOND_MIN_60.cost(3.6, 30) == pytest.approx(0.06)  # a minute at $3.60/h



async def _ended_on(store: Store, market: MemoryProvider, usd_per_hour: float, ran: timedelta) -> tuple[
        MemoryProvider, Job, Allocation, Clock, JobLifecycle]:
    """A job placed at NOW whose machines ``market`` then serves: seen running at NOW, its command ended at
    NOW + ``ran``, not polled since. The market it was placed on, the job, its allocation, the clock and the
    lifecycle over ``market``."""
    mem, job, alloc = await placed_job(store, usd_per_hour=usd_per_hour)
    market.held = mem.held
    clock = Clock()
    life = JobLifecycle(store, {"mem": market}, clock=clock)
    market.set_state(alloc, AllocationState.running)
    assert await poll(life, market, alloc.id) is JobState.running
    clock.now = NOW + ran
    market.end(alloc, JobExit(exit_code=0))
    return mem, job, alloc, clock, life


class MinuteMarket(MemoryProvider):
    billing = PER_SECOND_MIN_60


class HourlyMarket(MemoryProvider):
    billing = HOURLY


@pytest.mark.parametrize(("market", "ran", "billed"), [
    (MemoryProvider, timedelta(seconds=10.5), 11), (MinuteMarket, timedelta(seconds=10), 60),
    (HourlyMarket, timedelta(minutes=61), 7200)], ids=["per-second", "per-second-min-60", "hourly"])
async def test_the_cost_is_the_price_times_the_time_billed_per_the_markets_granularity(
        store: Store, market: type[MemoryProvider], ran: timedelta, billed: int) -> None:
    mine = market("mem", [])
    _, job, alloc, _, life = await _ended_on(store, mine, 3.6, ran)
    assert await poll(life, mine, alloc.id) is JobState.succeeded
    rec = store.get_allocation(alloc.id)
    assert rec.billed_s == billed and rec.cost_usd == pytest.approx(3.6 * billed / 3600)
    assert rec.ended_at == NOW + ran
    assert store.get_job(job.id).spent_usd == pytest.approx(rec.cost_usd)


async def test_a_job_whose_market_reports_its_end_without_an_exit_status_is_still_released(store: Store) -> None:
    """E.g. a container that stopped: it bills until it is destroyed, so it is given back at this poll."""
    mem, job, alloc = await placed_job(store)
    life = JobLifecycle(store, {"mem": mem}, clock=Clock())
    for state in (AllocationState.running, AllocationState.succeeded):
        mem.set_state(alloc, state)
        await poll(life, mem, alloc.id)
    assert store.get_job(job.id).state is JobState.succeeded
    assert mem.released == alloc.resource_ids and not mem.held
    rec = store.get_allocation(alloc.id)
    assert rec.state is AllocationState.succeeded and rec.cost_usd is not None


class CrashingRelease(MemoryProvider):
    """Gives the machine back, then the broker dies before it records anything."""

    async def release(self, alloc: Allocation) -> None:
        await super().release(alloc)
        raise SystemExit("the broker process dies here")


class DiesBeforeTheMarketActs(MemoryProvider):
    """The broker process dies while its release call is still on its way: the machine stays (found by
    bench/leaks.py --faults: a release retried under a 503 when the broker was SIGKILLed)."""

    async def release(self, alloc: Allocation) -> None:
        raise SystemExit("the broker process dies here")


async def _broker_dies_in_release(store: Store, dying_cls: type[MemoryProvider], usd_per_hour: float) -> tuple[
        MemoryProvider, MemoryProvider, Job, Allocation, Clock]:
    """A job that ran an hour and ended; the broker died in the release ``dying_cls`` makes. The record still says
    live, with the moment the release began (the mark)."""
    dying = dying_cls("mem", [])
    mem, job, alloc, clock, life = await _ended_on(store, dying, usd_per_hour, timedelta(hours=1))
    with pytest.raises(SystemExit):
        await poll(life, dying, alloc.id)
    rec = store.get_allocation(alloc.id)
    assert rec.state is AllocationState.running and rec.cost_usd is None
    assert rec.attrs[RELEASING] == (NOW + timedelta(hours=1)).isoformat()
    return mem, dying, job, alloc, clock


async def test_a_crash_between_the_release_and_the_booking_neither_loses_nor_doubles_the_cost(store: Store) -> None:
    mem, crashing, job, alloc, clock = await _broker_dies_in_release(store, CrashingRelease, 2.0)
    assert store.get_job(job.id).state is JobState.succeeded and not crashing.held  # the machine is gone

    # A new broker, an hour later: its poll finds the machine gone, records it and books the hour up to the mark.
    clock.now = NOW + timedelta(hours=2)
    after = JobLifecycle(store, {"mem": mem}, clock=clock)
    assert await poll(after, mem, alloc.id) is None
    rec = store.get_allocation(alloc.id)
    assert rec.state is AllocationState.released and rec.cost_usd == pytest.approx(2.0)
    assert rec.ended_at == NOW + timedelta(hours=1)
    assert store.get_job(job.id).spent_usd == pytest.approx(2.0)
    # Ended again (another replica's poll, a reconcile): recorded, never booked twice.
    await after.ended(rec, AllocationState.released, "again")
    assert store.get_job(job.id).spent_usd == pytest.approx(2.0)
    assert store.tenant_spend(job.tenant, month_start(NOW), clock.now) == pytest.approx(2.0)


async def test_reconciliation_books_a_machine_it_releases_up_to_its_own_release(store: Store) -> None:
    """The machine still bills after the mark: the reconciliation that finds it and gives it back books the time
    up to its own release, not up to the mark (the machine already gone at the mark is the test above)."""
    mem, _, job, alloc, clock = await _broker_dies_in_release(store, DiesBeforeTheMarketActs, 3.6)
    assert mem.held  # still billing

    # A new broker an hour later: reconciliation finds the machine, gives it back, books two hours.
    clock.now = NOW + timedelta(hours=2)
    report = await reconcile(store, {"mem": mem}, clock=clock, lifecycle=JobLifecycle(store, {"mem": mem},
                                                                                      clock=clock))
    assert len(report.released) == 1 and not mem.held
    rec = store.get_allocation(alloc.id)
    assert rec.state is AllocationState.released and rec.ended_at == NOW + timedelta(hours=2)
    assert rec.cost_usd == pytest.approx(7.2)
    assert store.get_job(job.id).spent_usd == pytest.approx(7.2)


class RecordKeepingMarket(KeepsBillingRecord, MemoryProvider):
    """Keeps its own record of each allocation's billed span (as Slurm's sacct and EC2's launch and state
    transition times do), whose API may fail just when the booking asks for it."""

    def __init__(self, name: str, offers: list[Offer]) -> None:
        super().__init__(name, offers)
        self.record: dict[str, BilledSpan] = {}
        self.record_error: Exception | None = None
        self.asked = 0

    async def billed_span(self, alloc: Allocation) -> BilledSpan | None:
        self.asked += 1
        if self.record_error is not None:
            raise self.record_error
        return self.record.get(alloc.resource_ids[0])


async def test_a_booking_made_while_the_markets_record_was_unreadable_is_booked_again_from_it(store: Store) -> None:
    """The market's billing API failed at the end: the broker's own span is booked for now, marked, and the next
    reconciliation books the market's span instead — the difference into the job's spend, once."""
    market = RecordKeepingMarket("mem", [])
    _, job, alloc, clock, life = await _ended_on(store, market, 3.6, timedelta(minutes=10))
    # The market billed 10 s less than the broker saw (it started the machine later than the first poll).
    market.record[alloc.resource_ids[0]] = BilledSpan(start=NOW + timedelta(seconds=10),
                                                      end=NOW + timedelta(minutes=10))
    market.record_error = TransientError("mem", "billing API timed out")
    assert await poll(life, market, alloc.id) is JobState.succeeded
    rec = store.get_allocation(alloc.id)
    assert rec.billed_s == 600 and rec.cost_usd == pytest.approx(0.6) and rec.attrs[BILLING_DUE] == "1"
    assert store.get_job(job.id).spent_usd == pytest.approx(0.6)

    # Still unreadable at the next pass: nothing changes, the mark stays.
    clock.now = NOW + timedelta(minutes=15)
    report = await reconcile(store, {"mem": market}, clock=clock, lifecycle=life)
    assert report.rebooked == [] and BILLING_DUE in store.get_allocation(alloc.id).attrs

    market.record_error = None
    blind = JobLifecycle(store, {}, clock=clock)  # a ledger that knows no market: nothing to ask, nothing moves
    assert await blind.ledger.confirm_billing(store.get_allocation(alloc.id)) is False
    report = await reconcile(store, {"mem": market}, clock=clock)  # its own lifecycle, over these providers
    assert report.rebooked == [alloc.id]
    rec = store.get_allocation(alloc.id)
    assert rec.billed_s == 590 and rec.cost_usd == pytest.approx(0.59) and BILLING_DUE not in rec.attrs
    assert rec.ended_at == NOW + timedelta(minutes=10)
    assert store.get_job(job.id).spent_usd == pytest.approx(0.59)
    assert store.tenant_spend(job.tenant, month_start(NOW), clock.now) == pytest.approx(0.59)
    asked = market.asked
    assert (await reconcile(store, {"mem": market}, clock=clock, lifecycle=life)).rebooked == []
    assert market.asked == asked and store.get_job(job.id).spent_usd == pytest.approx(0.59)  # asked once, moved once


class LoggingMarket(HasJobLogs, MemoryProvider):
    """Serves a log in which the workload printed a secret unmasked (an older wrapper, a market's own notes)."""

    text = ""

    async def job_log(self, alloc: Allocation, *, rank: int = 0) -> str:
        return self.text


async def test_the_log_is_kept_at_the_end_with_secret_values_masked_again(store: Store, tmp_path) -> None:
    secret = "s3cr3t-value-91af"
    (tmp_path / "tok").write_text(secret)
    config = SecretsConfig(files={"tok": str(tmp_path / "tok")})
    market = LoggingMarket("mem", [offer("mem", "a", 2.0)])
    res = await submit_and_place(store, await router_over(store, market, secrets=config),
                                 secrets={"HF_TOKEN": "tok"})
    assert res.placed, res.reason
    [alloc] = store.allocations(res.job.id)
    market.text = f"2026-12-01T04:07:13.123Z out token={secret}\n"
    sources = SecretSources(config)
    life = JobLifecycle(store, {"mem": market}, clock=Clock(), secrets=sources)
    market.end(alloc, JobExit(exit_code=1))
    assert await poll(life, market, alloc.id) is JobState.failed
    assert store.archived_logs(alloc.id) == {0: "2026-12-01T04:07:13.123Z out token=*****\n"}
