"""`lockstep config check FILE` where LOCKSTEP_DB is set (issue 29): the file's own database URL is checked too,
since the file will run somewhere the variable is not set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def check(cfg: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSTEP_")}
    return subprocess.run([sys.executable, "-m", "broker", "config", "check", str(cfg)], capture_output=True,
                          text=True, timeout=120, env={**clean, **env}, cwd=ROOT)


def test_the_files_db_url_is_checked_under_an_overriding_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("db_url: postgres://lockstep@db.internal/lockstep\n")
    env = {"LOCKSTEP_DB": f"sqlite:///{tmp_path / 'laptop.db'}"}
    r = check(cfg, env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stdout.strip() == (f"{cfg}:1: db_url: the scheme 'postgres://' is not SQLAlchemy's: write "
                                "postgresql+psycopg://USER@HOST/DB (the file's own value; LOCKSTEP_DB overrides "
                                "it here only)")
    cfg.write_text("db_url: postgresql+psycopg://lockstep@db.internal/lockstep\n")
    ok = check(cfg, env)
    assert ok.returncode == 0 and ok.stdout.startswith(f"{cfg}: ok"), ok.stdout + ok.stderr
