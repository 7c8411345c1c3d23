"""``lockstep serve --workers N``: worker processes sharing one port (SO_REUSEPORT) and one PostgreSQL
store; refused on SQLite with the reason."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from broker.models import Role
from broker.store import open_store

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"name": "w", "gpu": "H100", "gpus": 8, "workload": {"hours": 1}}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    env.update(LOCKSTEP_LOG_LEVEL="WARNING", LOCKSTEP_CATALOG__ENABLED="true", PYTHONPATH=str(ROOT))
    return env


@pytest.mark.postgres
def test_two_workers_both_answer_on_one_port(pg_database: Callable[[], str]) -> None:
    url = pg_database()
    with open_store(url) as store:
        _, token = store.create_token("acme", Role.user, "test_workers")
    proc = subprocess.Popen([sys.executable, "-m", "broker", "--db", url, "serve", "--port", "0", "--workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("lockstep: serving on "), line + (proc.stderr.read() if proc.poll() is not None
                                                                 and proc.stderr else "")
        base = line.split()[-1]
        seen: dict[str, str] = {}  # worker → a job it accepted
        for _ in range(200):  # every request on a new connection: the kernel picks a listener for each
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
                r = c.post("/v1/jobs", json=SPEC)
            assert r.status_code == 201, r.text
            seen.setdefault(r.headers["Lockstep-Worker"], r.json()["id"])
            if len(seen) == 2:
                break
        assert sorted(seen) == ["1", "2"]
        # One store: each worker reads the job the other accepted (one connection: one worker).
        for _ in range(2):
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
                worker = c.get("/healthz").headers["Lockstep-Worker"]
                other = next(job for w, job in seen.items() if w != worker)
                got = c.get(f"/v1/jobs/{other}")
            assert got.headers["Lockstep-Worker"] == worker
            assert got.status_code == 200 and got.json()["id"] == other
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_more_than_one_worker_is_refused_on_sqlite(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "broker", "--db", str(tmp_path / "l.db"), "serve", "--workers", "2"],
                         capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=60)
    assert out.returncode == 2
    assert "more than one worker needs PostgreSQL" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
