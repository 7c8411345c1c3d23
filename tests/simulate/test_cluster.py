"""The cluster simulation: an on-prem pool that bursts to the cloud, over pods the test writes (and the real trace)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from broker.errors import SpecError
from broker.models import Market
from broker.simulate.cluster import ClusterConfig, cloud_rates, deadline_for, run_cluster
from broker.simulate.traces import SpotTrace, load_pods, load_spot_trace
from tests.simulate.helpers import write_pods

H = 3600.0
ALWAYS = SpotTrace("always", 600, np.ones(1000, dtype=bool))


def burst_of_pods(tmp_path: Path, qos: str = "LS") -> list:
    """Twelve 4-hour 8-GPU jobs at once, then a quiet stream of 1-GPU jobs."""
    pods = [(f"big-{i}", 8, 0.0, 4 * H, qos) for i in range(12)]
    pods += [(f"small-{i}", 1, 10 * H + i * H, 0.5 * H, qos) for i in range(10)]
    return load_pods(write_pods(tmp_path / "pods.csv", pods))


def test_deadline_rule() -> None:
    cfg = ClusterConfig(onprem_gpus=8)
    assert deadline_for(10, 0.2, cfg) == pytest.approx(10 + 0.2 + 1.0)  # at least an hour of slack
    assert deadline_for(10, 5, cfg) == pytest.approx(20)  # as long as it runs
    assert deadline_for(0, 100, cfg) == pytest.approx(124)  # at most a day


def test_onprem_only_and_cloud_only_are_the_bounds(tmp_path: Path) -> None:
    pods = burst_of_pods(tmp_path)
    work = sum(p.gpus * p.duration_s / H for p in pods)
    onprem = run_cluster(pods, ClusterConfig(onprem_gpus=16), ALWAYS, "onprem-only")
    assert onprem.burst_share == 0 and onprem.cost_by_market["on_demand"] == 0
    assert onprem.gpu_hours_by_market["owned"] == pytest.approx(work)
    # two nodes for twelve 8-GPU jobs: six rounds of four hours, the last pair waits 20 h
    assert 16.0 <= onprem.p95_wait_hours <= 20.0
    assert onprem.deadline_misses > 0
    cloud = run_cluster(pods, ClusterConfig(onprem_gpus=16), ALWAYS, "cloud-only")
    assert cloud.burst_share == 1 and cloud.cost_by_market["owned"] == 0 and cloud.mean_wait_hours == 0
    boot = sum(p.gpus for p in pods) * 10 / 60  # every cloud start pays its restart, in GPU-hours
    assert cloud.gpu_hours_by_market["on_demand"] == pytest.approx(work + boot)
    assert cloud.deadline_misses == 0


def test_lockstep_bursts_what_would_wait_too_long(tmp_path: Path) -> None:
    pods = burst_of_pods(tmp_path)
    onprem = run_cluster(pods, ClusterConfig(onprem_gpus=16), ALWAYS, "onprem-only")
    ls = run_cluster(pods, ClusterConfig(onprem_gpus=16), ALWAYS, "lockstep")
    assert 0 < ls.burst_share < 1
    assert ls.mean_wait_hours < onprem.mean_wait_hours and ls.deadline_misses < onprem.deadline_misses
    # the queue estimate (QueueModel) kept jobs on-prem while their wait stayed under the 4 h limit
    assert ls.gpu_hours_by_market["owned"] >= 4 * 8 * 4
    assert ls.p95_wait_hours <= 4.0 + 1e-9
    # a pool big enough for everything: nothing bursts
    big = run_cluster(pods, ClusterConfig(onprem_gpus=96), ALWAYS, "lockstep")
    assert big.burst_share == 0 and big.mean_wait_hours == 0


def test_spot_jobs_are_preempted_and_finish(tmp_path: Path) -> None:
    # T4 in the catalog: spot is the cheapest option for jobs that tolerate preemption
    assert cloud_rates("T4", 1, True)[Market.spot].usd_per_hour < cloud_rates("T4", 1, False)[
        Market.on_demand].usd_per_hour
    pods = load_pods(write_pods(tmp_path / "be.csv", [(f"be-{i}", 1, i * 600.0, 6 * H, "BE") for i in range(6)]))
    flaky = SpotTrace("flaky", 600, np.array([(i // 12) % 2 == 0 for i in range(2000)]))
    cfg = ClusterConfig(onprem_gpus=0, gpu="T4")
    r = run_cluster(pods, cfg, flaky, "cheapest-first")
    assert r.preemptions > 0 and r.gpu_hours_by_market["spot"] > 0
    assert r.gpu_hours_by_market["spot"] + r.gpu_hours_by_market["on_demand"] >= 6 * 6
    ls = run_cluster(pods, cfg, flaky, "lockstep")
    assert ls.deadline_misses == 0 and ls.gpu_hours_by_market["spot"] > 0


def test_bad_input(tmp_path: Path) -> None:
    pods = burst_of_pods(tmp_path)
    with pytest.raises(SpecError, match="--policy"):
        run_cluster(pods, ClusterConfig(onprem_gpus=8), ALWAYS, "fastest")
    with pytest.raises(SpecError, match="--onprem-gpus"):
        run_cluster(pods, ClusterConfig(onprem_gpus=-8), ALWAYS, "lockstep")
    with pytest.raises(SpecError, match="--gpus-per-node"):
        run_cluster(pods, ClusterConfig(onprem_gpus=8, gpus_per_node=4), ALWAYS, "lockstep")
    bad = tmp_path / "bad.csv"
    bad.write_text("name,foo\nx,1\n")
    with pytest.raises(SpecError, match="--pods"):
        load_pods(bad)


def test_alibaba_trace_bursting_pays_against_waiting(shared_data: Path) -> None:
    pods = load_pods(shared_data / "traces/alibaba-gpu-v2023/openb_pod_list_default.csv")
    assert len(pods) > 7000
    spot = load_spot_trace(shared_data / "spot/availability/1-node/aws-10-26-2022/us-west-2a_v100_8.json")
    cfg = ClusterConfig(onprem_gpus=32)
    onprem = run_cluster(pods, cfg, spot, "onprem-only")
    ls = run_cluster(pods, cfg, spot, "lockstep")
    cheapest = run_cluster(pods, cfg, spot, "cheapest-first")
    assert ls.mean_wait_hours < 1 < onprem.mean_wait_hours
    assert ls.deadline_misses < onprem.deadline_misses
    assert ls.cost < cheapest.cost
