"""Burn-in, health gates that drain, measured speed in the ranking — against the real local Slurm cluster.

gpu-node1..3: 8×H100, ib_ndr · gpu-node4: 8×A100, roce · gpu-node5: 4×L40S, eth (deploy/slurm/up.sh).
The probe runs in quick mode (seconds); the nodes have no real GPUs, so it measures host and disk only.
Every node a test drains is resumed before the test ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeVar

import pytest

from broker import burnin
from broker.config import BrokerConfig, HealthConfig, Settings
from broker.errors import SpecError, TransientError
from broker.models import AllocationState, Benchmark, Fabric, JobSpec, Workload
from broker.service import Lockstep
from broker.store import Store
from policies.offers import OfferFilter
from providers.base import LaunchRequest
from providers.slurm import SlurmProvider
from providers.slurm.config import SlurmConfig
from tests.conftest import ROOT
from tests.plugins.slurm import SlurmCluster
from tests.waiting import eventually

pytestmark = pytest.mark.slurm

T = TypeVar("T")




def make_settings(tmp_path: Path, slurm_config: SlurmConfig, installation: str) -> Settings:
    return Settings(
        db_url=f"sqlite:///{tmp_path / 'lockstep.db'}",
        slurm=slurm_config,
        broker=BrokerConfig(installation=installation),
        health=HealthConfig(burnin_results_dir=str(tmp_path / "burnin")),
    )


@pytest.fixture
async def svc(tmp_path: Path, slurm_config: SlurmConfig, slurm_installation: str) -> AsyncIterator[Lockstep]:
    settings = make_settings(tmp_path, slurm_config, slurm_installation)
    store = Store(settings.db_url)
    store.migrate()
    service = Lockstep(
        settings, providers={"slurm": SlurmProvider(slurm_config, installation=slurm_installation)}, store=store
    )
    yield service
    await service.aclose()


def lockstep(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process."""
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, timeout=300,
                          env=env, cwd=ROOT)


def cli_env(cluster: SlurmCluster, tmp_path: Path, installation: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env.update(
        LOCKSTEP_SLURM_URL=cluster.url,
        LOCKSTEP_SLURM_USER=cluster.user,
        LOCKSTEP_SLURM_TOKEN=cluster.token,
        LOCKSTEP_SLURM__CONF_PATH=cluster.conf,
        LOCKSTEP_SLURM__CLUSTER_NAME="onprem",
        LOCKSTEP_BROKER__INSTALLATION=installation,
        LOCKSTEP_HEALTH__BURNIN_RESULTS_DIR=str(tmp_path / "burnin"),
    )
    return env


def host_offers(svc: Lockstep, host: str) -> list:
    return [o for o in svc.market.offers() if o.locality.host == host]


def job_spec(gpu: str = "H100", gpus: int = 1) -> JobSpec:
    return JobSpec(name="burnin-test", gpu=[gpu], gpus=gpus, gpus_per_node=gpus,
                   workload=Workload(reference_gpu_hours=100.0), markets=["owned"])


# --------------------------------------------------------------------------- burn-in


async def test_burnin_runs_on_the_named_node_and_is_stored_and_visible(
    svc: Lockstep, slurm_cluster: SlurmCluster, slurm_installation: str, tmp_path: Path
) -> None:
    node = "gpu-node4"
    env = cli_env(slurm_cluster, tmp_path, slurm_installation)
    db = str(tmp_path / "lockstep.db")
    run = lockstep("--db", db, "burnin", node, "--provider", "slurm", "--json", env=env)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert (doc["provider"], doc["target"], doc["source"], doc["healthy"]) == ("slurm", node, "probe", True)
    assert doc["disk_write_mbps"] > 0 and doc["disk_read_mbps"] > 0  # the probe really measured something

    # It ran where it was sent: Slurm says so, and so does the probe (Slurm's node name in its environment).
    job_id = doc["burnin"]["slurm_job_id"]
    shown = slurm_cluster.cli("scontrol", "show", "job", job_id, check=False)
    if shown.strip():  # slurmctld forgets finished jobs after MinJobAge
        assert f"NodeList={node}" in shown and "JobState=COMPLETED" in shown

    # Stored: the store has it, with the probe's raw document.
    stored = await svc.db(svc.store.benchmarks, "slurm", node)
    assert len(stored) == 1 and stored[0].healthy and stored[0].raw["source"] == "probe"
    assert stored[0].raw["host"]["hostname"] and stored[0].raw["burnin"]["slurm_job_id"] == job_id
    assert not list((tmp_path / "burnin").glob("*.json")), "the result file is removed once stored"

    # Visible: `bench list --json`, and the offers of that host carry the probe's perf after a refresh.
    listed = lockstep("--db", db, "bench", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["benchmarks"]
    assert [(r["target"], r["source"], r["healthy"]) for r in rows] == [(node, "probe", True)]
    await svc.refresh()
    mine = host_offers(svc, node)
    assert mine and all(o.perf is not None and o.perf.source == "probe" for o in mine)
    assert all(o.perf is None for o in host_offers(svc, "gpu-node5"))  # only the measured host


async def test_burn_in_refuses_unknown_and_drained_nodes(svc: Lockstep, slurm_cluster: SlurmCluster) -> None:
    with pytest.raises(SpecError, match="not a node of slurm"):
        await burnin.burn_in(svc.burnin, "slurm", "gpu-node99")
    provider = svc.market.providers["slurm"]
    assert isinstance(provider, SlurmProvider)
    await provider.drain("gpu-node5", "lockstep test: burn-in refusal")
    try:
        with pytest.raises(SpecError, match="DRAIN"):
            await burnin.burn_in(svc.burnin, "slurm", "gpu-node5")
    finally:
        await provider.resume("gpu-node5")
    await eventually(provider.offers, lambda offers: any(o.locality.host == "gpu-node5" for o in offers),
                     "gpu-node5 offered again after resume")


async def test_burn_in_that_cannot_start_is_cancelled(
    svc: Lockstep, slurm_cluster: SlurmCluster, slurm_installation: str
) -> None:
    """All of gpu-node5's GPUs are held: the probe job pends, times out, and is cancelled (no leak)."""
    provider = svc.market.providers["slurm"]
    offers = await eventually(provider.offers, lambda os: any(o.locality.host == "gpu-node5" for o in os),
                              "gpu-node5 offered")
    offer = next(o for o in offers if o.locality.host == "gpu-node5")
    spec = JobSpec(name="holder", gpu=["L40S"], gpus=4, gpus_per_node=4, workload=Workload(hours=0.1),
                   command="sleep 120")
    holder = await provider.launch(LaunchRequest(job_id=f"job-{uuid.uuid4().hex[:10]}", spec=spec, offer=offer,
                                                 nodes=1, installation=slurm_installation))
    try:
        await eventually(lambda: provider.poll(holder), lambda s: s.state is AllocationState.running, "holder runs")
        with pytest.raises(TransientError, match="did not finish"):
            await burnin.burn_in(svc.burnin, "slurm", "gpu-node5", timeout_s=3)

        def burnin_jobs() -> list[str]:
            out = slurm_cluster.cli("squeue", "-h", "-o", "%i %T %k")
            return [line for line in out.splitlines() if f"lockstep:burnin={slurm_installation}" in line
                    and "CANCELLED" not in line]

        async def left() -> list[str]:
            return burnin_jobs()

        await eventually(left, lambda jobs: jobs == [], "the pending probe job is cancelled")
    finally:
        await provider.release(holder)
    assert await svc.db(svc.store.benchmarks, "slurm") == []  # nothing measured, nothing stored


async def test_burn_in_as_the_first_step_of_an_allocation(
    svc: Lockstep, slurm_installation: str, tmp_path: Path
) -> None:
    """A user's job whose script runs the probe first: the result is collected and stored per node."""
    provider = svc.market.providers["slurm"]
    offers = await eventually(provider.offers, lambda os: any(o.locality.host == "gpu-node5" for o in os),
                              "gpu-node5 offered")
    offer = next(o for o in offers if o.locality.host == "gpu-node5")
    job_id = f"job-{uuid.uuid4().hex[:10]}"
    stem = burnin.job_stem(job_id, 0)
    marker = tmp_path / "user-step-ran"
    command = burnin.burnin_command(f"echo done > {marker}", result_dir=str(burnin.results_dir(svc.burnin)),
                                     stem=stem)
    spec = JobSpec(name="burnin-first", gpu=["L40S"], gpus=1, gpus_per_node=1, workload=Workload(hours=0.1),
                   command=command)
    alloc = await provider.launch(
        LaunchRequest(job_id=job_id, spec=spec, offer=offer, nodes=1, installation=slurm_installation)
    )
    try:
        await eventually(lambda: provider.poll(alloc), lambda s: s.state is AllocationState.succeeded, "job done")
    finally:
        await provider.release(alloc)
    assert marker.read_text().strip() == "done"  # the user's command ran after the probe
    got = await burnin.collect_burnin(svc.burnin, "slurm", stem)
    assert [(b.target, b.healthy, b.raw["source"]) for b in got] == [("gpu-node5", True, "probe")]
    assert await burnin.collect_burnin(svc.burnin, "slurm", stem) == []  # each result is stored once
    assert [b.target for b in await svc.db(svc.store.benchmarks, "slurm")] == ["gpu-node5"]


# --------------------------------------------------------------------------- health gates that drain

BAD = {
    "throughput": (
        "gpu-node5", None,
        Benchmark(provider="slurm", target="gpu-node5", gpu="L40S", gpu_count=4, tflops_bf16=60.0,
                  raw={"source": "probe"}),
        "of the L40S datasheet",
    ),
    "ecc": (
        "gpu-node5", None,
        Benchmark(provider="slurm", target="gpu-node5", gpu="L40S", gpu_count=4, tflops_bf16=330.0,
                  ecc_double_bit=2, raw={"source": "probe"}),
        "double-bit",
    ),
    "ib-latency": (
        "gpu-node3", Fabric.infiniband,
        Benchmark(provider="slurm", target="gpu-node3", gpu="H100-SXM", gpu_count=8, busbw_gbps=180.0,
                  allreduce_latency_us=10.0, raw={"source": "nccl-tests"}),
        "latency 10.0",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_bad_benchmark_drains_the_node(svc: Lockstep, slurm_cluster: SlurmCluster, case: str) -> None:
    node, fabric, bench, why = BAD[case]
    await svc.refresh()
    assert host_offers(svc, node), f"{node} is offered before the test"
    try:
        b = await burnin.record_benchmark(svc.burnin, bench, fabric=fabric)
        assert not b.healthy and why in b.reason
        assert b.raw["drain"]["drained"] is True

        # Stored with its verdict; the node is marked unhealthy.
        [stored] = await svc.db(svc.store.benchmarks, "slurm", node)
        assert not stored.healthy and stored.reason == b.reason
        assert ("slurm", node) in await svc.db(svc.store.unhealthy_nodes, "slurm")

        # Drained in Slurm, with the reason.
        reasons = slurm_cluster.cli("sinfo", "-h", "-R", "-n", node, "-o", "%N|%E")
        assert reasons.startswith(f"{node}|lockstep health: "), reasons
        assert why.replace("µ", "u") in reasons or why in reasons
        assert "drain" in slurm_cluster.cli("sinfo", "-h", "-n", node, "-o", "%T")

        # Out of the pool at once: the next quote rejects its offer, before any refresh…
        q = await svc.quote(job_spec())
        rejected = {r.offer_id: r.code for r in q.rejected}
        assert rejected.get(f"slurm/onprem/{node}") == "unhealthy"
        assert all(node not in o.offer_id for o in q.options)
        # …and after a refresh Slurm no longer offers it at all.
        await svc.refresh()
        assert not host_offers(svc, node)
        assert all(node not in o.attrs.get("nodes", "").split(",") for o in await svc.offers(OfferFilter()))
    finally:
        await burnin.resume_node(svc.burnin, "slurm", node)
    assert ("slurm", node) not in await svc.db(svc.store.unhealthy_nodes, "slurm")

    async def refreshed() -> list:
        await svc.refresh()
        return host_offers(svc, node)

    await eventually(refreshed, bool, f"{node} offered again after resume")


async def test_healthy_benchmark_leaves_the_node_alone(svc: Lockstep, slurm_cluster: SlurmCluster) -> None:
    good = Benchmark(provider="slurm", target="gpu-node5", gpu="L40S", gpu_count=4, tflops_bf16=300.0,
                     raw={"source": "probe"})
    b = await burnin.record_benchmark(svc.burnin, good)
    assert b.healthy and b.reason == "" and "drain" not in b.raw
    assert await svc.db(svc.store.unhealthy_nodes, "slurm") == {}
    assert "drain" not in slurm_cluster.cli("sinfo", "-h", "-n", "gpu-node5", "-o", "%T")


# --------------------------------------------------------------------------- measured speed in the ranking


async def test_ranking_prefers_the_measured_fast_node(svc: Lockstep) -> None:
    fast, slow = "gpu-node1", "gpu-node2"
    for node, tflops in ((fast, 850.0), (slow, 720.0)):  # both healthy: 86 % and 73 % of the 989 datasheet
        b = await burnin.record_benchmark(svc.burnin, Benchmark(
            provider="slurm", target=node, gpu="H100-SXM", gpu_count=8, tflops_bf16=tflops, raw={"source": "probe"}
        ))
        assert b.healthy, b.reason
    await svc.refresh()  # measured performance is merged into the offers on every refresh
    q = await svc.quote(job_spec(), top=50)
    by_host = {o.offer_id.rsplit("/", 1)[-1]: (i, o) for i, o in enumerate(q.options)}
    (i_fast, o_fast), (i_slow, o_slow) = by_host[fast], by_host[slow]
    assert o_fast.usd_per_hour == o_slow.usd_per_hour  # the same price…
    assert o_fast.expected_cost_usd < o_slow.expected_cost_usd and i_fast < i_slow  # …the faster one wins
    assert o_fast.perf_source == o_slow.perf_source == "probe"
    assert "measured 850 TFLOP/s per GPU (probe)" in o_fast.breakdown.notes
    assert "measured 720 TFLOP/s per GPU (probe)" in o_slow.breakdown.notes
