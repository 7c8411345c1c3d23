"""slurmrestd's ``warnings`` are read (issue 28, item 8): v0.0.39+ ignores an unknown or mistyped field with a
warning and still submits, so a site whose slurmrestd drops ``tres_per_node`` would run the job without GPUs.

The answers are the recorded Slurm 23.11.1 ones (shared/data/slurm/slurm-23.11-v0.0.40, their ``meta`` as
recorded) served by the fake newer slurmrestd of tests/slurm/test_newer_api.py, with a warning in v0.0.40's
shape (``description``, ``source``) added to the submit answer.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pytest
from pydantic import SecretStr

from broker.errors import BadRequestError
from broker.models import JobSpec, Workload
from providers.base import LaunchRequest
from providers.slurm import SlurmProvider
from providers.slurm.config import SlurmConfig
from tests.slurm.test_newer_api import V40, NewSlurm, fake_jwt, new_slurm

__all__ = ["new_slurm"]  # the fixture, imported for pytest

DROPPED_TRES = {"description": 'Ignoring unknown field "tres_per_node" of type string',
                "source": "#/job/tres_per_node"}


def _recorded_meta(shared_data: Path) -> dict:
    return json.loads((shared_data / V40 / "V0040OpenapiJobInfoResp.json").read_text(encoding="utf-8"))["meta"]


async def _launch(p: SlurmProvider, job_id: str):
    offers = await p.offers()
    h100 = next(o for o in offers if o.max_nodes == 1 and o.locality.host == "n1000")
    spec = JobSpec(name="t", gpu=["H100"], gpus=8, gpus_per_node=8, workload=Workload(hours=0.5), command="true")
    return await p.launch(LaunchRequest(job_id=job_id, spec=spec, offer=h100, nodes=1, installation="inst-w"))


async def test_a_warning_about_tres_per_node_fails_the_launch_with_its_text_and_cancels_the_job(
        new_slurm: tuple[NewSlurm, str], shared_data: Path, caplog: pytest.LogCaptureFixture) -> None:
    server, url = new_slurm
    server.meta = _recorded_meta(shared_data)
    assert server.meta["slurm"]["version"]["major"] == "23"
    server.submit_warnings = [DROPPED_TRES]
    cfg = SlurmConfig(enabled=True, url=url, token=SecretStr(fake_jwt(time.time() + 3600)))
    async with SlurmProvider(cfg, installation="inst-w") as p:
        with caplog.at_level(logging.WARNING, logger="providers.slurm.client"):
            with pytest.raises(BadRequestError) as err:
                await _launch(p, "job-warned")
    assert 'Ignoring unknown field "tres_per_node"' in str(err.value) and err.value.code == "slurm_warning"
    assert len(server.submitted) == 1  # submitted once, not retried
    [job] = [j for j in server.jobs if j["name"] == server.submitted[0]["job"]["name"]]
    assert job["job_state"] == ["CANCELLED"]  # the job slurmrestd altered does not run
    assert any("tres_per_node" in r.getMessage() for r in caplog.records)


async def test_every_answers_warnings_are_logged_and_others_do_not_fail_the_launch(
        new_slurm: tuple[NewSlurm, str], shared_data: Path, caplog: pytest.LogCaptureFixture) -> None:
    server, url = new_slurm
    server.meta = _recorded_meta(shared_data)
    server.warnings = [{"description": "slurmdbd is slow to answer", "source": "accounting_storage"}]
    server.submit_warnings = [{"description": 'Ignoring unknown field "mail_type"', "source": "#/job/mail_type"}]
    cfg = SlurmConfig(enabled=True, url=url, token=SecretStr(fake_jwt(time.time() + 3600)))
    async with SlurmProvider(cfg, installation="inst-w") as p:
        with caplog.at_level(logging.WARNING, logger="providers.slurm.client"):
            alloc = await _launch(p, "job-fine")
    assert alloc.resource_ids
    logged = [r.getMessage() for r in caplog.records]
    assert any("slurmdbd is slow to answer" in m and "GET " in m for m in logged)  # a read's warning
    assert any('"mail_type"' in m and "submit" in m for m in logged)  # the submit's, which it did not fail
