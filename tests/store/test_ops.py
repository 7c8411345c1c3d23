"""Alerts, benchmarks, node health, spend and usage, leader lock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.errors import NotFoundError
from broker.models import Allocation, AllocationState, Benchmark, JobState
from broker.store import Store

from .helpers import T0, job


def test_alerts_open_and_close(store: Store) -> None:
    series = {"provider": "aws", "sku": "p5.48xlarge", "zone": "us-east-1a"}
    a = store.add_alert(series, T0, peak=80.0, baseline=40.0)
    b = store.add_alert({**series, "zone": "us-east-1b"}, T0 + timedelta(hours=1), peak=90.0, baseline=41.0)
    assert [x["id"] for x in store.alerts(open_only=True)] == [b, a]
    store.update_alert(a, peak=85.0)  # the spike climbed
    store.update_alert(a, peak=82.0, end=T0 + timedelta(hours=2))  # ... and eased off before it cleared
    assert [x["id"] for x in store.alerts(open_only=True)] == [b]
    closed = next(x for x in store.alerts() if x["id"] == a)
    assert closed["series"] == series and closed["end"] == T0 + timedelta(hours=2) and closed["peak"] == 85.0
    assert [x["id"] for x in store.alerts(since=T0 + timedelta(hours=3))] == [b]  # a ended before
    with pytest.raises(NotFoundError):
        store.update_alert(9999, end=T0)
    with pytest.raises(NotFoundError):
        store.update_alert(9999)


def test_benchmarks_latest_per_target(store: Store) -> None:
    old = Benchmark(provider="slurm", target="gpu-node-1", gpu="H100-SXM", gpu_count=8, tflops_bf16=700.0,
                    measured_at=T0, raw={"nccl": {"busbw": 180.0}})
    new = Benchmark(provider="slurm", target="gpu-node-1", gpu="H100-SXM", gpu_count=8, tflops_bf16=350.0,
                    healthy=False, reason="slow", measured_at=T0 + timedelta(hours=1))
    other = Benchmark(provider="aws", target="p5.48xlarge", gpu="H100-SXM", measured_at=T0)
    for b in (old, new, other):
        assert store.add_benchmark(b) > 0
    assert store.benchmarks(provider="slurm") == [new]
    assert store.benchmarks(provider="slurm", latest_only=False) == [new, old]
    assert store.benchmarks(target="p5.48xlarge") == [other]
    assert len(store.benchmarks()) == 2


def test_node_health_upsert(store: Store) -> None:
    store.set_node_health("slurm", "gpu-node-1", False, "ECC double-bit errors: 3")
    store.set_node_health("slurm", "gpu-node-2", True)
    store.set_node_health("vast", "m-77", False, "slow all-reduce")
    assert store.unhealthy_nodes() == {
        ("slurm", "gpu-node-1"): "ECC double-bit errors: 3",
        ("vast", "m-77"): "slow all-reduce",
    }
    store.set_node_health("slurm", "gpu-node-1", True, "replaced GPU")
    assert store.unhealthy_nodes("slurm") == {}
    assert list(store.unhealthy_nodes("vast")) == [("vast", "m-77")]


def test_spend_gpus_and_usage(store: Store) -> None:
    now = datetime.now(UTC)
    store.create_job(job(tenant="acme", job_id="done", gpus=8))
    store.transition("done", JobState.cancelled)
    store.create_job(job(tenant="acme", job_id="run", gpus=16))
    for s in (JobState.placing, JobState.provisioning, JobState.running):
        store.transition("run", s)
    store.create_job(job(tenant="acme", job_id="wait", gpus=4))
    store.create_job(job(tenant="globex", job_id="theirs", gpus=8))
    store.transition("theirs", JobState.placing)
    store.transition("theirs", JobState.provisioning)
    store.add_allocation(Allocation(id="a-run", job_id="run", provider="aws", nodes=2, usd_per_hour=60.0,
                                    state=AllocationState.running, created_at=now - timedelta(hours=2)))
    store.add_allocation(Allocation(id="a-done", job_id="done", provider="aws", usd_per_hour=10.0,
                                    state=AllocationState.running, created_at=now - timedelta(hours=5)))
    ended_at = now - timedelta(hours=3)
    _, booked = store.end_allocation("a-done", state=AllocationState.released, reason="done", ended_at=ended_at,
                                     cost_usd=100.0, billed_s=36000.0)
    assert booked and store.get_job("done").spent_usd == 100.0
    # Ended again (a retried release, a reconcile after a crash): the state may change, the spend never twice.
    again, booked = store.end_allocation("a-done", state=AllocationState.released, reason="again", ended_at=now,
                                         cost_usd=999.0, billed_s=1.0)
    assert not booked and store.get_job("done").spent_usd == 100.0
    assert (again.cost_usd, again.billed_s, again.ended_at, again.reason) == (100.0, 36000.0, ended_at, "again")
    assert store.gpus_held("acme") == 16
    assert store.gpus_held("globex") == 8
    assert store.gpus_held("nobody") == 0
    # 100 booked + 60 $/h for 2 h running (the released allocation is booked already).
    spend = store.tenant_spend("acme", since=now - timedelta(days=1), now=now)
    assert spend == pytest.approx(220.0)
    # Accrual starts at `since` when the allocation is older; what ended before `since` is not counted, and
    # what began before it counts its share ("done" ran from 5 h to 3 h ago: half of it after 4 h ago, $50).
    assert store.tenant_spend("acme", since=now - timedelta(hours=1), now=now) == pytest.approx(60.0)
    assert store.tenant_spend("acme", since=now - timedelta(hours=4), now=now) == pytest.approx(50.0 + 120.0)
    assert store.accruing(["run", "done", "wait"], now=now) == {"run": pytest.approx(120.0)}
    assert store.tenant_spend("globex", since=now - timedelta(days=1), now=now) == 0.0
    usage = {u["job_id"]: u for u in store.job_usage(now=now)}
    assert set(usage) == {"done", "run", "wait", "theirs"}
    assert usage["run"]["gpus"] == 16 and usage["run"]["gpu_hours"] == pytest.approx(32.0)
    assert usage["done"]["spent_usd"] == 100.0 and usage["wait"]["gpu_hours"] == 0.0
    assert usage["done"]["gpu_hours"] > 0  # from created to its last update
    assert store.job_usage(since=now + timedelta(hours=1)) == []
    # What /metrics reports, from the same rows.
    counts = store.counts()
    assert counts["jobs"] == {"cancelled": 1, "running": 1, "pending": 1, "provisioning": 1}
    assert counts["placements"] == 2  # "run" and "theirs" each reached provisioning once
    assert sorted(counts["allocations"]) == [("aws", "released", 1), ("aws", "running", 1)]
    assert store.ping() is True


def test_leader_lock(store: Store) -> None:
    with store.leader_lock("tracker") as got:
        assert got is True
        if not store.is_sqlite:
            other = Store(store.url)
            try:
                with other.leader_lock("tracker") as got2:
                    assert got2 is False  # exclusive across processes / connections
                with other.leader_lock("another") as got3:
                    assert got3 is True
            finally:
                other.close()
    if not store.is_sqlite:
        other = Store(store.url)
        try:
            with other.leader_lock("tracker") as got4:
                assert got4 is True  # released when the first context ended
        finally:
            other.close()
