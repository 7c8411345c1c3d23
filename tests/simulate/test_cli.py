"""`lockstep simulate deadline|cluster` and `lockstep advise` as users run them: JSON contract, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from broker.models import Allocation, AllocationState, Job, JobSpec
from broker.store import Store
from tests.simulate.helpers import write_pods, write_trace

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_KEYS = {"policy", "cost", "spot_hours", "ondemand_hours", "finish_hour", "met_deadline"}


def lockstep(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env["LOCKSTEP_DB"] = f"sqlite:///{tmp_path / 'cli.db'}"
    return subprocess.run([sys.executable, "-m", "broker", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=120)


def deadline_args(trace: Path, policy: str, **over: str) -> list[str]:
    opts = {"--trace": str(trace), "--job-hours": "10", "--deadline-hours": "14", "--changeover-hours": "0.2",
            "--spot-price": "0.9", "--ondemand-price": "3.06", "--policy": policy, **over}
    return ["simulate", "deadline", *[x for kv in opts.items() for x in kv]]


def test_deadline_every_policy_as_json(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.json", [1] * 30 + [0] * 12 + [1] * 200)
    costs = {}
    for policy in ("ondemand", "greedy", "uniform-progress", "lockstep", "optimal"):
        r = lockstep(*deadline_args(trace, policy), "--json", tmp_path=tmp_path)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert DEADLINE_KEYS <= set(out) and out["policy"] == policy
        assert out["met_deadline"] is True and out["finish_hour"] <= 14
        costs[policy] = out["cost"]
    assert costs["optimal"] <= min(costs.values())
    assert costs["ondemand"] == pytest.approx(10.2 * 3.06, rel=1e-6)
    text = lockstep(*deadline_args(trace, "greedy"), tmp_path=tmp_path)
    assert text.returncode == 0 and "greedy" in text.stdout and "met" in text.stdout


@pytest.mark.parametrize(("over", "option"), [
    ({"--job-hours": "-3"}, "--job-hours"),
    ({"--deadline-hours": "10.1"}, "--deadline-hours"),
    ({"--policy": "fastest"}, "--policy"),
    ({"--start-hour": "30"}, "--deadline-hours"),
    ({"--spot-price": "abc"}, "--spot-price"),
    ({"--trace": "/nonexistent/trace.json"}, "--trace"),
])
def test_deadline_bad_input_is_exit_2_with_one_line(tmp_path: Path, over: dict[str, str], option: str) -> None:
    trace = write_trace(tmp_path / "t.json", [1] * 240)
    r = lockstep(*deadline_args(trace, "greedy", **over), tmp_path=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in r.stderr


def test_bad_trace_file_is_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"metadata": {"gap_seconds": 0}, "data": [1]}')
    r = lockstep(*deadline_args(bad, "greedy"), tmp_path=tmp_path)
    assert r.returncode == 2 and "--trace" in r.stderr and "gap_seconds" in r.stderr


def test_cluster_and_its_bad_input(tmp_path: Path) -> None:
    pods = write_pods(tmp_path / "pods.csv", [(f"p{i}", 8, i * 600.0, 4 * 3600.0, "LS") for i in range(6)])
    spot = write_trace(tmp_path / "spot.json", [1] * 500)
    r = lockstep("simulate", "cluster", "--pods", str(pods), "--onprem-gpus", "16", "--policy", "lockstep",
                 "--spot-trace", str(spot), "--json", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"cost", "cost_by_market", "gpu_hours_by_market", "mean_wait_hours", "p95_wait_hours",
            "deadline_misses", "burst_share"} <= set(out)
    assert out["jobs"] == 6 and out["burst_share"] > 0
    assert set(out["cost_by_market"]) == {"owned", "spot", "on_demand"}
    text = lockstep("simulate", "cluster", "--pods", str(pods), "--onprem-gpus", "16", "--policy", "onprem-only",
                    "--spot-trace", str(spot), tmp_path=tmp_path)
    assert text.returncode == 0 and "deadline misses" in text.stdout
    for args, option in ((["--onprem-gpus", "-1", "--policy", "lockstep"], "--onprem-gpus"),
                         (["--onprem-gpus", "8", "--policy", "nope"], "--policy"),
                         (["--onprem-gpus", "8", "--policy", "lockstep", "--gpu", "Z80"], "--gpu")):
        bad = lockstep("simulate", "cluster", "--pods", str(pods), "--spot-trace", str(spot), *args,
                       tmp_path=tmp_path)
        assert bad.returncode == 2 and option in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_advise_from_pods_and_from_history(tmp_path: Path) -> None:
    pods = write_pods(tmp_path / "pods.csv", [(f"p{i}", 8, i * 3600.0, 3600.0, "BE") for i in range(48)])
    r = lockstep("advise", "--pods", str(pods), "--json", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["recommendation"] in ("rent", "hybrid", "own")
    assert {p["name"] for p in out["plans"]} >= {"rent", "own for peak"}
    assert out["usage"]["gpu_hours"] == pytest.approx(48 * 8)
    # the job history of the store the CLI opens
    store = Store(f"sqlite:///{tmp_path / 'cli.db'}")
    store.migrate()
    now = datetime.now(UTC)
    spec = JobSpec(name="train", gpu=["H100"], gpus=8, workload={"hours": 5})
    store.create_job(Job(id="j1", spec=spec, created_at=now - timedelta(days=2), updated_at=now))
    store.add_allocation(Allocation(id="a1", job_id="j1", provider="aws", state=AllocationState.released,
                                    created_at=now - timedelta(days=2), updated_at=now - timedelta(days=1)))
    store.close()
    h = lockstep("advise", "--from-history", "--json", tmp_path=tmp_path)
    assert h.returncode == 0, h.stderr
    hist = json.loads(h.stdout)
    assert hist["usage"]["gpu_hours"] == pytest.approx(8 * 24, rel=1e-3)
    assert hist["recommendation"] == "rent"
    text = lockstep("advise", "--from-history", tmp_path=tmp_path)
    assert text.returncode == 0 and "recommendation: rent" in text.stdout
    for args in ([], ["--from-history", "--pods", str(pods)]):
        bad = lockstep("advise", *args, tmp_path=tmp_path)
        assert bad.returncode == 2 and "--from-history" in bad.stderr
