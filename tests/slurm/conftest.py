"""The broker over the local Slurm cluster that the tests in this folder drive: one fixture, so each test file does
not set up (and clean up) its own copy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from providers.slurm.config import SlurmConfig
from tests.slurm.test_runtime import SlurmBroker


@pytest.fixture
async def broker(tmp_path: Path, slurm_config: SlurmConfig, slurm_installation: str) -> AsyncIterator[SlurmBroker]:
    b = SlurmBroker(tmp_path, slurm_config, slurm_installation)
    await b.svc.refresh()
    yield b
    for alloc in await b.slurm.owned():  # nothing of this test left on the shared cluster
        await b.slurm.release(alloc)
    await b.svc.aclose()
