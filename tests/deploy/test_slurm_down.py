"""deploy/slurm/down.sh ends every process its cluster started, and nothing of any other cluster.

Runs against a SECOND local cluster started here with its own state dir, ports and name (never the shared
one in deploy/slurm/.state): a 2-node job runs a marked command on both nodes, one node's slurmd is killed
with SIGKILL (its slurmstepd and the command survive it, as on a real node whose daemon crashed), then
down.sh must leave nothing of that cluster running, while a look-alike step of another cluster and the
shared cluster's daemons keep running.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, missing

SLURM = ROOT / "deploy" / "slurm"
SHARED_RUN = SLURM / ".state" / "run"


def _free_block(n: int) -> int:
    """A base port with n consecutive free ports on loopback (slurmd ports must be consecutive)."""
    for base in range(27000 + os.getpid() % 2000 * 8, 65000, 97):
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port block")


def _procs() -> dict[int, tuple[str, str]]:
    """pid → (state, command line) of every process on the host."""
    out: dict[int, tuple[str, str]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        out[int(d.name)] = (stat.rsplit(") ", 1)[1].split()[0], cmd)
    return out


def _running(pid: int) -> bool:
    state = _procs().get(pid)
    return state is not None and state[0] != "Z"  # a zombie has ended: it only waits to be reaped


def _wait(cond, what: str, limit_s: float = 90.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


@pytest.fixture
def second_cluster() -> Iterator[dict[str, str]]:
    if not shutil.which("slurmctld") and not Path("/usr/sbin/slurmctld").exists():
        missing("Slurm is not installed (deploy/slurm/install.sh installs it)")
    # A short path: slurmstepd's spool sockets live under it and unix socket paths are limited to 108 bytes.
    state = tempfile.mkdtemp(prefix="lsd-", dir="/tmp")
    base = _free_block(8)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT" and not k.startswith("LOCKSTEP_SLURM")}
    env.update(LOCKSTEP_SLURM_STATE=state, LOCKSTEP_SLURM_CTLD_PORT=str(base),
               LOCKSTEP_SLURM_SLURMD_PORT=str(base + 1), LOCKSTEP_SLURM_REST_PORT=str(base + 7),
               LOCKSTEP_SLURM_CLUSTER=f"down{os.getpid()}", PATH=f"{env.get('PATH', '')}:/usr/sbin:/sbin")
    up = subprocess.run([str(SLURM / "up.sh")], env=env, capture_output=True, text=True, timeout=300)
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        yield env
    finally:
        # Whatever the test did, leave nothing of this cluster behind (the fixed script, then by hand).
        subprocess.run([str(SLURM / "down.sh"), "--purge"], env=env, capture_output=True, timeout=300)
        conf = f"{state}/etc/slurm.conf"
        for pid, (_, cmd) in _procs().items():
            if state in cmd or _environ(pid).get("SLURM_CONF") == conf:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(state, ignore_errors=True)


def test_down_ends_the_steps_of_a_node_whose_slurmd_was_killed(second_cluster: dict[str, str]) -> None:
    env = second_cluster
    state = Path(env["LOCKSTEP_SLURM_STATE"])
    conf = str(state / "etc" / "slurm.conf")
    marker = f"lockstep-down-{uuid.uuid4().hex[:10]}"
    job_env = {**env, "SLURM_CONF": conf}
    sub = subprocess.run(
        ["sbatch", "--parsable", "-N2", "-w", "gpu-node1,gpu-node2", "-p", "gpu", "-o", "/dev/null",
         "--wrap", f"srun bash -c 'exec -a {marker} sleep 900'"],
        env=job_env, capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr

    def marked() -> list[int]:
        return [pid for pid, (st, cmd) in _procs().items() if cmd.startswith(marker) and st != "Z"]

    _wait(lambda: len(marked()) == 2, "the job's command on both nodes")

    # Another cluster's step on this host, as down.sh sees one: a process named slurmstepd whose
    # SLURM_CONF is another state dir's, with a job id. It must survive.
    decoy_dir = Path(tempfile.mkdtemp(prefix="lsd-other-", dir="/tmp"))
    (decoy_dir / "slurmstepd").symlink_to(shutil.which("sleep") or "/bin/sleep")
    decoy = subprocess.Popen([str(decoy_dir / "slurmstepd"), "900"], cwd=decoy_dir,
                             env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "1",
                                  "SLURM_CONF": str(decoy_dir / "etc" / "slurm.conf")})
    shared = {}
    for pidfile in SHARED_RUN.glob("*.pid") if SHARED_RUN.is_dir() else []:
        pid = int(pidfile.read_text().strip() or 0)
        if pid and _running(pid):
            shared[pidfile.name] = pid
    try:
        # The node's daemon dies; its step daemon and the job's command keep running.
        node2 = int((state / "run" / "slurmd-gpu-node2.pid").read_text())
        os.kill(node2, signal.SIGKILL)
        _wait(lambda: not _running(node2), "slurmd of gpu-node2 to die", 30)
        assert len(marked()) == 2

        down = subprocess.run([str(SLURM / "down.sh")], env=env, capture_output=True, text=True, timeout=300)
        assert down.returncode == 0, down.stderr

        left = {pid: cmd for pid, (st, cmd) in _procs().items()
                if st != "Z" and (cmd.startswith(marker) or str(state) in cmd)}
        steps = [pid for pid, (st, cmd) in _procs().items() if st != "Z" and cmd.startswith("slurmstepd:")
                 and _environ(pid).get("SLURM_CONF") == conf]
        assert left == {} and steps == [], f"left running after down.sh: {left} {steps}\n{down.stderr}"
        assert decoy.poll() is None, "down.sh ended another cluster's process"
        for name, pid in shared.items():
            assert _running(pid), f"down.sh ended the shared cluster's {name}"
    finally:
        decoy.kill()
        decoy.wait()
        shutil.rmtree(decoy_dir, ignore_errors=True)


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)
