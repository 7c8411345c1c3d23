"""Shared test configuration.

Real parts only: the local Slurm cluster (deploy/slurm), moto's server, the
local Vast-API server and PostgreSQL, each started once per session by the
plugins below. Outside CI a missing part skips its tests with the reason; in
CI (CI=true) it fails them, so a broken set-up cannot pass as green.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.plugins.store",
    "tests.plugins.slurm",
    "tests.plugins.moto",
    "tests.plugins.vast",
    "tests.plugins.clock",
    "tests.plugins.localbroker",
]

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(reason: str) -> None:
    """Skip outside CI, fail inside it: CI must exercise every real part."""
    if IN_CI:
        pytest.fail(f"required in CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, the real data sets (not copied into the repo: their licences forbid it)."""
    if not SHARED_DATA.is_dir():
        missing(f"{SHARED_DATA} is absent (a checkout without ../shared); these tests read real data from it")
    return SHARED_DATA


@pytest.fixture
def invoke(tmp_path: Path) -> Callable[..., tuple[int, str, str]]:
    """The CLI in this process on a fresh SQLite store: `invoke(*args)` → (exit code, stdout, stderr)."""
    from typer.testing import CliRunner  # here, not at the top: most tests never drive the CLI

    from broker.cli import app

    runner = CliRunner()
    db = str(tmp_path / "lockstep.db")
    # A clean environment: nothing from the developer's shell may enable a provider.
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("LOCKSTEP_")}

    def run(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(app, ["--db", db, *args], env=env)
        return result.exit_code, result.stdout, result.stderr

    return run
