"""The router's failover logic, over in-memory markets (standins/memory.py) and a real store (SQLite
and PostgreSQL: the ``store`` fixture).

Which offer comes next after an error, when a provider is skipped, the try cap, the intent written before
the call, and a launch that went through despite its error. The same paths against the real markets are in
test_e2e.py (capacity failover at moto), test_launch_races.py and test_crash.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.config import SecretsConfig
from broker.errors import BadRequestError, CapacityError, ProviderAuthError, QuotaError, TransientError
from broker.models import AllocationState, Job, JobState, Market, QuoteOption
from broker.router import PlacementResult, Router
from broker.store import Store
from providers.base import LaunchRequest
from standins.memory import MemoryProvider, offer, router_over, submit_and_place

TRY_KEYS = ["offer_id", "provider", "sku", "zone", "market", "error", "kind"]


async def place(router: Router, **spec_fields: object) -> PlacementResult:
    return await submit_and_place(router.store, router, **spec_fields)


def event_tries(job: Job, to: JobState) -> list[dict[str, Any]]:
    [event] = [e for e in job.events if e.to_state is to][-1:]
    return list(event.data.get("tries", []))


def placed_on(res: PlacementResult) -> QuoteOption:
    assert res.placed and res.job.placement is not None, res.reason
    return res.job.placement


async def test_a_capacity_error_moves_to_the_next_offer(store: Store) -> None:
    mem = MemoryProvider("mem", [offer("mem", "a", 1.0, zone="z1"), offer("mem", "b", 2.0, zone="z2"),
                                 offer("mem", "c", 3.0, zone="z3")])
    mem.refuse["mem:a"] = CapacityError("mem", "no capacity in z1", "InsufficientInstanceCapacity")
    res = await place(await router_over(store, mem))

    assert res.placed and res.job.state is JobState.provisioning, res.reason
    assert placed_on(res).offer_id == "mem:b"  # the next offer, in rank order
    assert [r.offer.id for r in mem.launches] == ["mem:a", "mem:b"]
    [t] = res.tries
    assert (t.offer_id, t.kind, t.zone) == ("mem:a", "capacity", "z1") and not t.rules_out_provider
    # The job's event keeps the try with the keys it always had.
    [kept] = event_tries(res.job, JobState.provisioning)
    assert list(kept) == TRY_KEYS and kept["kind"] == "capacity" and "InsufficientInstanceCapacity" in kept["error"]
    # Each try had its own intent and attempt; the refused one is recorded as failed.
    allocs = sorted(store.allocations(res.job.id), key=lambda a: a.attempt)
    assert [(a.attempt, a.state) for a in allocs] == [(1, AllocationState.failed), (2, AllocationState.pending)]
    assert allocs[0].client_token != allocs[1].client_token
    assert res.job.attempts == 2


@pytest.mark.parametrize("refusal", [QuotaError("q", "vCPU limit reached"), ProviderAuthError("q", "key refused")],
                         ids=["quota", "auth"])
async def test_a_quota_or_auth_error_skips_the_rest_of_that_provider(store: Store, refusal: Exception) -> None:
    q = MemoryProvider("q", [offer("q", "a", 1.0), offer("q", "b", 1.5), offer("q", "c", 1.8)])
    other = MemoryProvider("other", [offer("other", "x", 2.5)])
    for o in ("q:a", "q:b", "q:c"):
        q.refuse[o] = refusal
    res = await place(await router_over(store, q, other))

    assert res.placed and placed_on(res).provider == "other", res.reason
    assert [r.offer.id for r in q.launches] == ["q:a"]  # its other offers were not tried
    [t] = res.tries
    assert t.rules_out_provider and t.kind == ("quota" if isinstance(refusal, QuotaError) else "auth")


async def test_the_try_cap_ends_the_pass_and_the_job_waits_with_every_try_kept(store: Store) -> None:
    offers = [offer("mem", str(i), 1.0 + i / 10, zone=f"z{i}") for i in range(5)]
    mem = MemoryProvider("mem", offers)
    for o in offers:
        mem.refuse[o.id] = CapacityError("mem", f"none left in {o.zone}")
    res = await place(await router_over(store, mem, tries=3))

    assert not res.placed and res.job.state is JobState.pending
    assert len(mem.launches) == 3 and len(res.tries) == 3
    assert res.reason == "all 3 launch tries failed; last: mem: none left in z2"
    assert res.job.reason == res.reason and res.job.decision["route"] == "cloud"  # the decision is kept
    kept = event_tries(res.job, JobState.pending)
    assert [t["offer_id"] for t in kept] == ["mem:0", "mem:1", "mem:2"]
    assert all(list(t) == TRY_KEYS for t in kept)
    assert not store.live_allocations()  # every intent resolved (failed), none left live


async def test_the_intent_and_the_attempt_are_stored_before_the_provider_is_called(store: Store) -> None:
    mem = MemoryProvider("mem", [offer("mem", "a", 1.0), offer("mem", "b", 2.0)])
    mem.refuse["mem:a"] = CapacityError("mem", "none")
    seen: list[tuple[int, int, list[tuple[str, str]]]] = []

    def look(req: LaunchRequest) -> None:  # what a crash at this moment would leave in the store
        job = store.get_job(req.job_id)
        intents = store.allocations(req.job_id, [AllocationState.intent])
        live = [(a.state.value, a.client_token) for a in intents]
        seen.append((req.attempt, job.attempts, live))

    mem.on_launch = look
    res = await place(await router_over(store, mem))

    assert res.placed
    tokens = [r.client_token for r in mem.launches]
    assert seen == [(1, 1, [("intent", tokens[0])]), (2, 2, [("intent", tokens[1])])]


async def test_an_adapter_exception_is_recorded_and_the_next_offer_tried(store: Store) -> None:
    mem = MemoryProvider("mem", [offer("mem", "a", 1.0), offer("mem", "b", 2.0)])
    mem.refuse["mem:a"] = KeyError("instanceId")  # an adapter bug, no provider error
    res = await place(await router_over(store, mem))

    assert res.placed and placed_on(res).offer_id == "mem:b", res.reason
    assert mem.owned_calls == 1  # it asked whether the failed call launched anything: it had not
    [t] = res.tries
    assert t.kind == "error" and "KeyError" in t.error and not t.rules_out_provider
    [kept] = event_tries(res.job, JobState.provisioning)
    assert list(kept) == ["offer_id", "provider", "error", "kind"]  # no sku/zone/market for an adapter error


async def test_a_launch_that_went_through_despite_its_error_is_found_and_kept(store: Store) -> None:
    mem = MemoryProvider("mem", [offer("mem", "a", 1.0), offer("mem", "b", 2.0)])
    mem.fail_after["mem:a"] = TransientError("mem", "read timed out")  # rented, but the answer was lost
    res = await place(await router_over(store, mem))

    assert res.placed and placed_on(res).offer_id == "mem:a" and not res.tries, res.reason
    assert len(mem.launches) == 1 and mem.owned_calls == 1  # found via owned(), not rented twice
    [alloc] = store.allocations(res.job.id)
    assert alloc.state is AllocationState.pending and alloc.resource_ids == list(mem.held)


async def test_when_owned_cannot_be_read_the_launch_error_stands(store: Store) -> None:
    mem = MemoryProvider("mem", [offer("mem", "a", 1.0), offer("mem", "b", 2.0)])
    mem.fail_after["mem:a"] = TransientError("mem", "read timed out")
    mem.owned_error = TransientError("mem", "listing failed")
    res = await place(await router_over(store, mem))

    # The first launch may have gone through: its intent is failed, and reconciliation (not the router)
    # settles what it holds. The router moves on.
    assert res.placed and placed_on(res).offer_id == "mem:b"
    [t] = res.tries
    assert t.kind == "TransientError" and "read timed out" in t.error


async def test_a_refusal_is_not_checked_with_the_provider(store: Store) -> None:
    mem = MemoryProvider("mem", [offer("mem", "a", 1.0), offer("mem", "b", 2.0)])
    mem.refuse["mem:a"] = BadRequestError("mem", "image not allowed")
    res = await place(await router_over(store, mem))

    assert res.placed and mem.owned_calls == 0  # a refusal launched nothing: no need to ask
    [t] = res.tries
    assert t.kind == "BadRequestError" and not t.rules_out_provider


async def test_no_candidate_leaves_the_job_pending_with_the_reason(store: Store) -> None:
    mem = MemoryProvider("mem", [offer("mem", "a", 1.0)])
    res = await place(await router_over(store, mem), gpu="H100")  # nothing of that GPU here

    assert not res.placed and res.job.state is JobState.pending and not mem.launches
    assert res.reason.startswith("no feasible offer") and res.job.reason == res.reason


async def test_a_secret_no_source_has_fails_the_job_before_any_launch(store: Store) -> None:
    mem = MemoryProvider("mem", [offer("mem", "a", 1.0)])
    res = await place(await router_over(store, mem), secrets=["HF_TOKEN"])
    assert not res.placed and res.job.state is JobState.failed
    assert "no secret named 'HF_TOKEN'" in res.job.reason and "LOCKSTEP_SECRET_HF_TOKEN" in res.job.reason
    assert mem.launches == []


async def test_secrets_reach_the_launch_request_and_nothing_the_store_keeps(store: Store, tmp_path: Path) -> None:
    value = "hf_live_9c1f0e4b7a"
    (tmp_path / "hf-prod").write_text(value + "\n")
    mem = MemoryProvider("mem", [offer("mem", "a", 1.0)])
    router = await router_over(store, mem, secrets=SecretsConfig(dir=str(tmp_path)))
    res = await place(router, secrets={"HF_TOKEN": "hf-prod"}, env={"MODE": "x"})
    assert res.placed, res.reason
    [req] = mem.launches
    assert req.run is not None and req.run.secret_values() == {"HF_TOKEN": value}
    assert req.run.env == {"MODE": "x"} and req.run.job_id == res.job.id and req.run.attempt == 1
    assert value not in repr(req) and value not in req.model_dump_json()
    stored = [store.get_job(res.job.id).model_dump_json(),
              *(a.model_dump_json() for a in store.allocations(res.job.id))]
    assert not any(value in blob for blob in stored)


async def test_a_deadline_burst_event_carries_the_wait_the_deadline_and_both_costs(store: Store) -> None:
    """Issue 29: with the on-prem pool busy the quote rejects its node as `deadline`; the burst still says why."""
    onprem = MemoryProvider("onprem", [offer("onprem", "node1", 0.5, market=Market.owned, queue_wait_hours=30)])
    cloud = MemoryProvider("mem", [offer("mem", "a", 2.0)])
    res = await place(await router_over(store, onprem, cloud), markets=["owned", "on_demand"],
                      workload={"hours": 10}, deadline_in="20h")
    assert placed_on(res).provider == "mem", res.reason
    [event] = [e for e in res.job.events if e.to_state is JobState.provisioning]
    decision = event.data["decision"]
    assert decision["reason"] == "burst: on-prem queue would miss the deadline"
    n = decision["numbers"]
    assert n["onprem_queue_wait_hours"] == 30 and n["hours_to_deadline"] == 20 and n["deadline"]
    assert n["cloud_cost_usd"] == 20 and n["onprem_cost_usd"] == 5 and n["extra_cost_usd"] == 15


async def test_a_job_without_a_workload_is_placed_on_the_cheapest_per_hour(store: Store) -> None:
    """Issue 29.1: no workload, no hours to cost: the cheapest $/h of the shape, expected hours unknown."""
    mem = MemoryProvider("mem", [offer("mem", "dear", 3.0), offer("mem", "cheap", 1.0, zone="z2")])
    onprem = MemoryProvider("onprem", [offer("onprem", "node1", 0.5, market=Market.owned, queue_wait_hours=30)])
    res = await place(await router_over(store, mem, onprem), workload=None, markets=["owned", "on_demand"])
    chosen = placed_on(res)
    assert chosen.offer_id == "mem:cheap" and chosen.expected_hours is None
    assert res.job.decision["reason"].startswith("burst: on-prem wait 30.00 h exceeds the limit")
