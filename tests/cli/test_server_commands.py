"""`lockstep server status|stop|logs` and the background broker's life: two commands at once start one broker;
new settings restart it; with nothing to follow it exits by itself after `local.idle_exit_s`. Real processes,
a catalog-only store (nothing is launched); waits are bounded, nothing is timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.cli import localbroker

ROOT = Path(__file__).resolve().parents[2]


def lockstep(tmp: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    full.update(PYTHONPATH=str(ROOT), LOCKSTEP_BROKER_HOME=str(tmp / "brokers"), **(env or {}))
    return subprocess.run([sys.executable, "-m", "broker", "--db", str(tmp / "s.db"), *args], capture_output=True,
                          text=True, timeout=180, cwd=tmp, env=full)


def status(tmp: Path) -> dict:
    r = lockstep(tmp, "server", "status", "--json")
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def test_two_commands_at_once_start_one_broker_and_stop_ends_it(tmp_path: Path) -> None:
    assert status(tmp_path)["running"] is False
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: lockstep(tmp_path, "jobs", "--json"), range(2)))
    assert all(r.returncode == 0 and json.loads(r.stdout) == [] for r in runs), [r.stderr for r in runs]
    up = status(tmp_path)
    assert up["running"] and up["url"].startswith("http://127.0.0.1:") and up["current_settings"]
    state = tmp_path / "brokers" / Path(up["log"]).parent.name / "state.json"
    assert oct(state.stat().st_mode & 0o777) == "0o600"  # the token is in it
    assert "token" not in up and json.loads(state.read_text())["token"] not in json.dumps(up)
    assert lockstep(tmp_path, "jobs").returncode == 0 and status(tmp_path)["pid"] == up["pid"]  # reused
    logs = lockstep(tmp_path, "server", "logs", "-n", "200")
    assert "background broker serving on" in logs.stdout
    stop = lockstep(tmp_path, "server", "stop", "--json")
    assert stop.returncode == 0 and json.loads(stop.stdout) == {"stopped": True}
    assert status(tmp_path)["running"] is False
    assert json.loads(lockstep(tmp_path, "server", "stop", "--json").stdout) == {"stopped": False}


def test_new_settings_restart_it_and_an_idle_one_exits_by_itself(tmp_path: Path) -> None:
    assert lockstep(tmp_path, "jobs").returncode == 0
    first = status(tmp_path)["pid"]
    # Other settings for the same store: the next job command restarts the broker with them.
    idle = {"LOCKSTEP_LOCAL__IDLE_EXIT_S": "1"}
    r = lockstep(tmp_path, "jobs", env=idle)
    assert r.returncode == 0 and "settings changed" in r.stderr, r.stderr
    [broker] = [p for p in (tmp_path / "brokers").iterdir() if p.is_dir() and p.name != "inputs"]
    second = json.loads((broker / "state.json").read_text())["pid"]
    assert second != first
    # No job unfinished, nobody asking: it stops itself (the next job command would start it again).
    deadline = time.monotonic() + 60
    while localbroker.is_running(broker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not localbroker.is_running(broker), "the idle broker is still running"
    assert "no unfinished job: stopping" in (broker / "broker.log").read_text()
