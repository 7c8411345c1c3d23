"""Allocations: intent before the provider call, one live allocation per job, lookup by resource id."""

from __future__ import annotations

import pytest

from broker.errors import ConflictError, NotFoundError
from broker.models import Allocation, AllocationState
from broker.store import Store

from .helpers import job


def _alloc(alloc_id: str, job_id: str, **kw: object) -> Allocation:
    return Allocation(id=alloc_id, job_id=job_id, provider="aws", client_token=f"tok-{alloc_id}", **kw)  # type: ignore[arg-type]


def test_intent_then_update(store: Store) -> None:
    store.create_job(job(job_id="j"))
    a = store.add_allocation(_alloc("a1", "j", usd_per_hour=98.3, region="us-east-1"))
    assert a.state is AllocationState.intent and a.client_token == "tok-a1"
    b = store.update_allocation("a1", state=AllocationState.running, resource_ids=["i-0abc", "i-0def"],
                                attrs={"placement_group": "pg-1"})
    assert b.state is AllocationState.running and b.resource_ids == ["i-0abc", "i-0def"]
    assert b.attrs == {"placement_group": "pg-1"} and b.updated_at >= a.updated_at
    assert store.get_allocation("a1") == b
    with pytest.raises(NotFoundError):
        store.get_allocation("zz")
    with pytest.raises(NotFoundError):
        store.update_allocation("zz", state=AllocationState.released)


def test_compare_and_set_changes_only_the_expected_state(store: Store) -> None:
    store.create_job(job(job_id="j"))
    store.add_allocation(_alloc("a1", "j"))
    # The launch lands first: the reconcile's "fail it if still an intent" must not undo it.
    store.update_allocation("a1", expected={AllocationState.intent}, state=AllocationState.pending,
                            resource_ids=["i-1"])
    with pytest.raises(ConflictError, match="is pending, not intent"):
        store.update_allocation("a1", expected={AllocationState.intent}, state=AllocationState.failed, reason="x")
    kept = store.get_allocation("a1")
    assert (kept.state, kept.resource_ids, kept.reason) == (AllocationState.pending, ["i-1"], "")
    ended = store.update_allocation("a1", expected={AllocationState.pending, AllocationState.running},
                                    state=AllocationState.released)
    assert ended.state is AllocationState.released
    with pytest.raises(NotFoundError):
        store.update_allocation("zz", expected={AllocationState.intent}, state=AllocationState.failed)


def test_allocation_needs_a_job(store: Store) -> None:
    with pytest.raises(NotFoundError):
        store.add_allocation(_alloc("a1", "no-such-job"))


def test_one_live_allocation_per_job(store: Store) -> None:
    store.create_job(job(job_id="j"))
    store.add_allocation(_alloc("a1", "j"))
    with pytest.raises(ConflictError):
        store.add_allocation(_alloc("a2", "j", attempt=1))
    store.update_allocation("a1", state=AllocationState.failed, reason="capacity")
    store.add_allocation(_alloc("a2", "j", attempt=1))  # the first one no longer holds anything
    store.add_allocation(_alloc("a3", "j", attempt=2, state=AllocationState.released))  # not live: fine
    with pytest.raises(ConflictError):
        store.update_allocation("a3", state=AllocationState.running)  # would make two live
    assert store.get_allocation("a3").state is AllocationState.released


def test_listing_and_live(store: Store) -> None:
    store.create_job(job(job_id="j1"))
    store.create_job(job(job_id="j2"))
    store.add_allocation(_alloc("a1", "j1", state=AllocationState.released))
    store.add_allocation(_alloc("a2", "j1", state=AllocationState.running))
    store.add_allocation(_alloc("a3", "j2", state=AllocationState.unknown))
    assert [a.id for a in store.allocations(job_id="j1")] == ["a1", "a2"]
    assert [a.id for a in store.allocations(states=[AllocationState.released])] == ["a1"]
    assert sorted(a.id for a in store.live_allocations()) == ["a2", "a3"]


def test_find_allocation_by_resource_id(store: Store) -> None:
    store.create_job(job(job_id="j1"))
    store.create_job(job(job_id="j2"))
    store.add_allocation(_alloc("a1", "j1", resource_ids=["i-1", "i-12"]))
    store.add_allocation(
        Allocation(id="s1", job_id="j2", provider="slurm", resource_ids=["i-1"], state=AllocationState.pending)
    )
    found = store.find_allocation("aws", "i-12")
    assert found is not None and found.id == "a1"
    assert store.find_allocation("aws", "i-1").id == "a1"  # type: ignore[union-attr]
    assert store.find_allocation("slurm", "i-1").id == "s1"  # type: ignore[union-attr]
    assert store.find_allocation("aws", "i-") is None  # substring of an id is not a match
    assert store.find_allocation("aws", "i-%") is None
    assert store.find_allocation("vast", "i-1") is None


def test_preempted_allocation_does_not_block_the_next_attempt(store: Store) -> None:
    store.create_job(job(job_id="spot"))
    store.add_allocation(_alloc("a1", "spot", state=AllocationState.running))
    store.update_allocation("a1", state=AllocationState.preempted, reason="spot reclaimed")
    store.add_allocation(_alloc("a2", "spot", attempt=1))
    assert [a.id for a in store.live_allocations()] == ["a2"]
    assert [a.id for a in store.allocations(job_id="spot", states=[AllocationState.preempted])] == ["a1"]
