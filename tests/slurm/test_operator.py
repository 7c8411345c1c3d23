"""Issue 29's "Slurm operator's day" on the local Slurm cluster, through the real broker: a node Slurm reports
not responding leaves the offers at the next refresh (before Slurm marks it DOWN); the API resumes a node
beside its drain, and a resume of a node Slurm already put back succeeds (route and `lockstep bench resume`);
node-local work folders are named by Lockstep's job and attempt, removed at success and at release, kept
(marked) on failure and swept once older than ``slurm.keep_failed_workdirs_h``.

The cluster is shared: every test here uses gpu-node5 (the L40S node few others use) for node operations, and
puts it back in service in a ``finally``; every job is released by the fixture.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from broker.api import create_app, start_server
from broker.models import JobState, Role
from providers.slurm.config import SlurmConfig
from providers.slurm.runtime import FAILED_MARK
from tests.plugins.slurm import SlurmCluster
from tests.slurm.test_runtime import SlurmBroker, node_state, out_lines, restart_slurmd, slurmd_pid
from tests.waiting import eventually

pytestmark = pytest.mark.slurm

NODE = "gpu-node5"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def ops(broker: SlurmBroker, slurm_cluster: SlurmCluster) -> AsyncIterator[SlurmBroker]:
    """The folder's broker (tests/slurm/conftest.py), and the node these tests drain resumed after."""
    yield broker
    slurm_cluster.cli("scontrol", "update", f"nodename={NODE}", "state=resume", check=False)


async def _value(value: object) -> object:
    return value


def slurm_flags(cluster: SlurmCluster, node: str) -> str:
    """sinfo's long state: ``idle``, ``drained``, ``idle*`` (not responding), ``down*``…"""
    return node_state(cluster, node)


async def offered_nodes(b: SlurmBroker) -> set[str]:
    await b.svc.refresh()
    return {o.locality.host for o in b.svc.market.offers() if o.provider == "slurm" and o.locality.host}


# --------------------------------------------------------------------------- not responding (item 1)


async def test_a_node_slurm_reports_not_responding_leaves_the_offers_before_slurm_marks_it_down(
    ops: SlurmBroker, slurm_cluster: SlurmCluster
) -> None:
    assert NODE in await offered_nodes(ops)
    try:
        os.kill(slurmd_pid(slurm_cluster, NODE), signal.SIGKILL)
        # slurmctld pings every SlurmdTimeout/3 (10 s here) and flags the node NOT_RESPONDING ("idle*") at the
        # first missed ping; DOWN only after SlurmdTimeout (30 s). Each round is one offer refresh.
        left = await eventually(lambda: offered_nodes(ops), lambda nodes: NODE not in nodes,
                                f"{NODE} out of the offers", limit_s=120)
        state = slurm_flags(slurm_cluster, NODE)
        assert "down" not in state and state.endswith("*"), state  # left while Slurm said "not responding"
        assert {"gpu-node1", "gpu-node4"} <= left  # only that node left
    finally:
        restart_slurmd(slurm_cluster, NODE)
        await eventually(lambda: _value(slurm_flags(slurm_cluster, NODE)),
                         lambda s: s in ("idle", "mixed", "allocated"), f"{NODE} back in service", limit_s=120)
    assert NODE in await offered_nodes(ops)


# --------------------------------------------------------------------------- resume (items 2 and 3)


async def test_the_api_resumes_a_node_beside_its_drain_and_a_node_slurm_already_resumed_answers_200(
    ops: SlurmBroker, slurm_cluster: SlurmCluster
) -> None:
    _, admin = ops.svc.store.create_token("ops", Role.admin, "tests: issue 29 admin")
    _, user = ops.svc.store.create_token("alpha", Role.user, "tests: issue 29 user")
    runner, url = await start_server(create_app(ops.svc, start_loops=False), "127.0.0.1", 0)
    resume = f"/v1/nodes/slurm/{NODE}/resume"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60,
                                     headers={"Authorization": f"Bearer {admin}"}) as c:
            r = await c.post(f"/v1/nodes/slurm/{NODE}/drain", json={"reason": "issue 29: resume test"})
            assert r.status_code == 200 and r.json()["drained"] is True, r.text
            assert slurm_flags(slurm_cluster, NODE) in ("drained", "draining")
            assert NODE not in await offered_nodes(ops)

            # Same role as drain: a user token may not.
            r = await c.post(resume, headers={"Authorization": f"Bearer {user}"})
            assert r.status_code == 403, r.text
            assert slurm_flags(slurm_cluster, NODE) in ("drained", "draining")

            r = await c.post(resume)
            assert r.status_code == 200, r.text
            assert r.json() == {"provider": "slurm", "node": NODE, "healthy": True, "resumed": True}
            assert slurm_flags(slurm_cluster, NODE).rstrip("*") == "idle"  # "*": until slurmd's next ping
            assert ("slurm", NODE) not in await ops.svc.unhealthy_nodes()
            await eventually(lambda: offered_nodes(ops), lambda nodes: NODE in nodes, f"{NODE} offered again")

            # The operator resumed it at Slurm first; Lockstep still has its flag: the resume clears it, 200.
            await ops.svc.drain_node("slurm", NODE, "issue 29: resumed at Slurm first")
            slurm_cluster.cli("scontrol", "update", f"nodename={NODE}", "state=resume")
            r = await c.post(resume)
            assert r.status_code == 200, r.text
            assert ("slurm", NODE) not in await ops.svc.unhealthy_nodes()
            # And once more: nothing to do is still a success.
            assert (await c.post(resume)).status_code == 200
            # The document names the route.
            doc = (await c.get("/openapi.json")).json()
            assert "post" in doc["paths"]["/v1/nodes/{provider}/{node}/resume"]
    finally:
        await runner.cleanup()


async def test_bench_resume_of_a_node_slurm_already_resumed_exits_0_and_clears_the_flag(
    ops: SlurmBroker, slurm_cluster: SlurmCluster, slurm_config: SlurmConfig
) -> None:
    await ops.svc.drain_node("slurm", NODE, "issue 29: resumed at Slurm first")
    slurm_cluster.cli("scontrol", "update", f"nodename={NODE}", "state=resume")
    assert slurm_flags(slurm_cluster, NODE).rstrip("*") == "idle"
    env = {k: v for k, v in slurm_cluster.env().items() if not k.startswith("LOCKSTEP_")}
    assert slurm_config.token is not None
    env.update(PYTHONPATH=str(ROOT), LOCKSTEP_LOG_LEVEL="WARNING", LOCKSTEP_SLURM__ENABLED="true",
               LOCKSTEP_SLURM_URL=slurm_config.url, LOCKSTEP_SLURM_USER=slurm_config.user,
               LOCKSTEP_SLURM_TOKEN=slurm_config.token.get_secret_value(),
               LOCKSTEP_SLURM__CONF_PATH=slurm_cluster.conf, LOCKSTEP_SLURM__JOB_DIR=ops.config.job_dir)
    await ops.svc.aclose()  # the CLI writes the same database
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "broker", "--db", ops.settings.db_url, "bench", "resume", NODE,
        env=env, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()  # main: exit 1, "scontrol update failed: Invalid node state"
    assert "back in the pool" in out.decode()
    ops.svc = ops._service()
    assert ("slurm", NODE) not in await ops.svc.unhealthy_nodes()


# --------------------------------------------------------------------------- work folders (item 4)


def workdir_of(lines: list[str]) -> Path:
    [line] = [ln for ln in lines if ln.startswith("tmp=")]
    return Path(line.removeprefix("tmp="))


def aged(path: Path, hours: float) -> None:
    """Make ``path`` look ``hours`` old (what the sweep reads), relative to now."""
    then = time.time() - hours * 3600
    os.utime(path, (then, then))


async def test_work_folders_are_named_by_lockstep_removed_at_success_and_release_kept_on_failure_then_swept(
    ops: SlurmBroker
) -> None:
    tag = uuid.uuid4().hex[:8]
    base = Path("/tmp")  # TMPDIR is unset on the local cluster's nodes: asserted from the job's own view below
    legacy = base / f"lockstep-9{int(tag, 16) % 10**6}-n0"  # Slurm-id named, from an older cluster
    expired = base / f"lockstep-jexpired{tag}-a1-n0"
    fresh = base / f"lockstep-jfresh{tag}-a1-n0"
    for d in (legacy, expired, fresh):
        d.mkdir()
    for d in (expired, fresh):
        (d / FAILED_MARK).touch()
    aged(legacy, 48)
    aged(expired / FAILED_MARK, 48)  # older than keep_failed_workdirs_h (24 h by default)
    aged(fresh / FAILED_MARK, 1)
    made = [legacy, expired, fresh]
    try:
        # A failed attempt: its folder stays, marked; its start swept the expired and legacy ones.
        job = await ops.submit(command='echo "tmp=$TMPDIR"; exit 3')
        await ops.place(job)
        job = await ops.poll_until(job.id, (JobState.failed, JobState.succeeded), "the failing job ended")
        [rec] = await ops.svc.job_allocations(job.id)
        failed_dir = workdir_of(out_lines(await ops.slurm.job_log(rec)))
        assert failed_dir == base / f"lockstep-{job.id}-a1-n0", failed_dir
        made.append(failed_dir)
        await eventually(lambda: _value((failed_dir / FAILED_MARK).exists()), bool, "the failed folder marked")
        assert not legacy.exists() and not expired.exists() and fresh.exists()

        # A succeeded attempt: removed once it ended.
        job = await ops.submit(command='echo "tmp=$TMPDIR"')
        await ops.place(job)
        job = await ops.poll_until(job.id, (JobState.failed, JobState.succeeded), "the job ended")
        assert job.state is JobState.succeeded, job.reason
        [rec] = await ops.svc.job_allocations(job.id)
        done_dir = workdir_of(out_lines(await ops.slurm.job_log(rec)))
        assert done_dir.name == f"lockstep-{job.id}-a1-n0"
        await eventually(lambda: _value(done_dir.exists()), lambda e: not e, "the succeeded folder removed")

        # A released attempt (cancelled while it ran): removed at release.
        job = await ops.submit(command='echo "tmp=$TMPDIR"; sleep 300')
        await ops.place(job)
        job = await ops.poll_until(job.id, (JobState.running,), "the long job running")
        [rec] = await ops.svc.job_allocations(job.id)
        lines = await eventually(lambda: _lines(ops, rec), lambda ls: any(ln.startswith("tmp=") for ln in ls),
                                 "the long job's first line")
        run_dir = workdir_of(lines)
        assert run_dir.is_dir()
        await ops.svc.cancel(job.id)
        await eventually(lambda: _value(run_dir.exists()), lambda e: not e, "the released folder removed")
        assert failed_dir.exists()  # a failure is kept for its hours
    finally:
        for d in made:  # the kept failed folder too: this test's, not an operator's
            shutil.rmtree(d, ignore_errors=True)


async def _lines(b: SlurmBroker, rec: object) -> list[str]:
    return out_lines(await b.slurm.job_log(rec))  # type: ignore[arg-type]


def test_keep_failed_workdirs_h_refuses_nan_and_negative_naming_the_key() -> None:
    for bad in ("nan", "-1", "inf"):
        with pytest.raises(ValueError, match="keep_failed_workdirs_h"):
            SlurmConfig(keep_failed_workdirs_h=bad)  # type: ignore[arg-type]
    assert SlurmConfig().keep_failed_workdirs_h == 24.0
