"""Interruption notices → checkpoints (issue 30): the wrapper, a real process, hears the market's notice.

AWS: the wrapper polls an instance-metadata stand-in on loopback (standins/ec2.py ``FakeImds``, IMDSv2) that
the test tells to issue ``spot/instance-action`` or a rebalance recommendation. Slurm: the signal the broker asks
Slurm for (``--signal``) reaches the wrapper, which takes it as the notice. Either way the command gets SIGTERM,
saves a checkpoint, and the status records the notice.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from standins.ec2 import FakeImds
from tests.runtime.harness import WRAPPER

# A workload that checkpoints on the notice: on TERM it writes what the notice file says into its checkpoint
# and exits 0; without one it ends by itself once ``done`` appears.
WORKLOAD = r'''
import json, os, signal, sys, time
ckpt = os.path.join(os.environ["LOCKSTEP_CHECKPOINT_DIR"], "ckpt-%s.json" % os.environ["LOCKSTEP_ATTEMPT"])
def on_term(signum, frame):
    signal.signal(signum, signal.SIG_IGN)  # the signal reaches the group and each process: once is enough
    notice = json.load(open(os.environ["LOCKSTEP_NOTICE_FILE"]))
    with open(ckpt + ".tmp", "w") as fh:
        json.dump({"step": 42, "notice": notice, "signal": os.environ["LOCKSTEP_NOTICE_SIGNAL"]}, fh)
    os.replace(ckpt + ".tmp", ckpt)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open("ready", "w").write("ready")
while not os.path.exists("done"):
    time.sleep(0.05)
'''


def manifest(tmp: Path, notice: dict[str, Any]) -> dict[str, Any]:
    (tmp / "work").mkdir(parents=True, exist_ok=True)
    (tmp / "work" / "workload.py").write_text(WORKLOAD)
    return {
        "command": f"exec {sys.executable} workload.py",
        "workdir": str(tmp / "work"),
        "env": {"LOCKSTEP_JOB_ID": "j1", "LOCKSTEP_ATTEMPT": "1", "LOCKSTEP_CHECKPOINT_DIR": str(tmp / "ckpt")},
        "checkpoint_dir": str(tmp / "ckpt"),
        "logs": {"file": str(tmp / "logs" / "rank-{rank}.log"), "status_dir": str(tmp / "status"),
                 "stdout": False, "interval_s": 0.2},
        "heartbeat_s": 0.2,
        "grace_s": 20,
        "notice": notice,
    }


async def start(tmp: Path, doc: dict[str, Any], env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    path = tmp / "manifest.json"
    path.write_text(json.dumps(doc))
    full = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKSTEP_", "SLURM_"))}
    full.update(env or {})
    proc = await asyncio.create_subprocess_exec(sys.executable, str(WRAPPER), str(path), env=full,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    await until(lambda: (tmp / "work" / "ready").exists(), "the workload never started")
    return proc


async def until(cond: Any, what: str, limit_s: float = 60) -> None:
    for _ in range(int(limit_s / 0.05)):
        if cond():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(what)


def status(tmp: Path) -> dict[str, Any]:
    return json.loads((tmp / "status" / "status-0.json").read_text())


async def test_aws_interruption_notice_reaches_the_command_which_checkpoints(tmp_path: Path) -> None:
    async with FakeImds() as imds:
        imds.nodes["i-1"] = "10.0.0.1"
        proc = await start(tmp_path, manifest(tmp_path, {"imds": True, "every_s": 0.1}),
                           {"LOCKSTEP_IMDS_URL": imds.base("i-1")})
        await until(lambda: imds.asked.get("spot/instance-action", 0) >= 2, "the wrapper never polled")
        assert not (tmp_path / "ckpt" / "ckpt-1.json").exists()  # 404: no notice, nothing delivered
        imds.interrupt("i-1", at="2026-12-06T12:02:00Z")
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert imds.refused == 0  # every metadata read carried an IMDSv2 token
    ckpt = json.loads((tmp_path / "ckpt" / "ckpt-1.json").read_text())
    assert ckpt["step"] == 42 and ckpt["signal"] == "SIGTERM"
    assert ckpt["notice"]["kind"] == "interruption" and ckpt["notice"]["action"] == "terminate"
    assert ckpt["notice"]["deadline"] == "2026-12-06T12:02:00Z"
    st = status(tmp_path)
    # It exited 0 on the notice, but its work is not done: recorded as stopped by a signal (the broker requeues).
    assert proc.returncode == 0 and st["exit_code"] == 0 and st["reason"] == "signal", err
    assert st["notice"]["kind"] == "interruption" and st["notice"]["source"] == "imds"
    beside = json.loads((tmp_path / "status" / "notice-0.json").read_text())
    assert beside["deadline"] == "2026-12-06T12:02:00Z"
    assert "notice from the market" in (tmp_path / "logs" / "rank-0.log").read_text()


async def test_no_notice_no_signal_and_the_status_says_none(tmp_path: Path) -> None:
    async with FakeImds() as imds:
        imds.nodes["i-1"] = "10.0.0.1"
        proc = await start(tmp_path, manifest(tmp_path, {"imds": True, "every_s": 0.1}),
                           {"LOCKSTEP_IMDS_URL": imds.base("i-1")})
        await until(lambda: imds.asked.get("events/recommendations/rebalance", 0) >= 3, "never polled")
        (tmp_path / "work" / "done").write_text("done")
        await asyncio.wait_for(proc.communicate(), 60)
    st = status(tmp_path)
    assert proc.returncode == 0 and st["reason"] == "exited" and "notice" not in st
    assert not (tmp_path / "ckpt" / "ckpt-1.json").exists()
    assert not (tmp_path / "work" / ".lockstep-notice.json").exists()


async def test_a_rebalance_recommendation_is_reported_not_delivered(tmp_path: Path) -> None:
    async with FakeImds() as imds:
        imds.nodes["i-1"] = "10.0.0.1"
        proc = await start(tmp_path, manifest(tmp_path, {"imds": True, "every_s": 0.1}),
                           {"LOCKSTEP_IMDS_URL": imds.base("i-1")})
        imds.recommend_rebalance("i-1")
        notice = tmp_path / "work" / ".lockstep-notice.json"
        await until(notice.exists, "the rebalance recommendation was not noted")
        beat = tmp_path / "status" / "heartbeat-0.json"
        await until(lambda: "rebalance" in (beat.read_text() if beat.exists() else ""), "not in the heartbeat")
        assert proc.returncode is None  # the command runs on: a recommendation is not an interruption
        (tmp_path / "work" / "done").write_text("done")
        await asyncio.wait_for(proc.communicate(), 60)
    st = status(tmp_path)
    assert st["reason"] == "exited" and st["notice"]["kind"] == "rebalance"
    assert not (tmp_path / "ckpt" / "ckpt-1.json").exists()


async def test_slurm_signal_is_the_notice_and_the_command_gets_sigterm(tmp_path: Path) -> None:
    proc = await start(tmp_path, manifest(tmp_path, {"trap": "SIGUSR1"}))
    proc.send_signal(signal.SIGUSR1)  # what `--signal=USR1@120` (or `scancel --signal=USR1`) does to the step
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    ckpt = json.loads((tmp_path / "ckpt" / "ckpt-1.json").read_text())
    assert ckpt["notice"]["source"] == "slurm" and ckpt["signal"] == "SIGTERM"
    st = status(tmp_path)
    assert st["reason"] == "signal" and st["notice"]["kind"] == "interruption", err
    assert int(signal.SIGUSR1) in st["wrapper"]["signals"]


async def test_the_delivered_signal_is_a_setting(tmp_path: Path) -> None:
    doc = manifest(tmp_path, {"trap": "SIGUSR1", "deliver": "SIGUSR2"})
    (tmp_path / "work" / "workload.py").write_text(WORKLOAD.replace("signal.SIGTERM", "signal.SIGUSR2"))
    proc = await start(tmp_path, doc)
    proc.send_signal(signal.SIGUSR1)
    await asyncio.wait_for(proc.communicate(), 60)
    assert json.loads((tmp_path / "ckpt" / "ckpt-1.json").read_text())["signal"] == "SIGUSR2"
