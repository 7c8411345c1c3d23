"""A job whose every feasible option is a snapshot price: accepted with a warning naming what to configure
(``broker.snapshot_only_jobs: warn``, the default) or refused (``refuse``), through the API and the CLI.

The servers here have the bundled catalog only: every offer is a snapshot row of the AWS and Vast markets,
and neither market is configured. Quotes show each option's price source and age.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker.config import ApiConfig, BrokerConfig, Settings
from broker.models import Role
from broker.store import open_store
from tests.api.conftest import EXAMPLES, Api, _serve, spec
from tests.api.test_cli import lockstep

JOB = str(EXAMPLES / "single-node-8gpu.yaml")


@pytest.fixture(scope="session")
def refusing_api(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Api:
    """A catalog-only server with ``broker.snapshot_only_jobs: refuse``."""
    db_url = f"sqlite:///{tmp_path_factory.mktemp('api-refuse') / 'lockstep.db'}"
    with open_store(db_url) as store:
        _, admin = store.create_token("ops", Role.admin)
        _, alice = store.create_token("alpha", Role.user)
    settings = Settings(db_url=db_url, api=ApiConfig(rate_per_s=1000, burst=1000),
                        broker=BrokerConfig(snapshot_only_jobs="refuse"))
    server, svc = _serve(settings, request)
    return Api(server.url, admin, alice, "", db_url, settings, svc)


def _says_what_to_configure(text: str) -> None:
    assert "aws.enabled: true" in text and "vast.enabled: true" in text and "vast.api_key" in text


def test_the_api_accepts_a_snapshot_only_job_with_a_warning(api: Api) -> None:
    with api.client(api.alice) as c:
        r = c.post("/v1/jobs", json=spec("snapshot-only"))
        assert r.status_code == 201, r.text
        job = r.json()
        got = c.get(f"/v1/jobs/{job['id']}").json()
    warning = job["decision"]["warning"]
    assert warning.startswith("warning: every option that fits is a snapshot price (aws, vast)")
    _says_what_to_configure(warning)
    assert job["reason"] == warning and job["state"] == "pending"
    assert got["events"][0]["reason"] == warning  # kept with the job, not only in the answer


def test_a_job_nothing_fits_gets_no_snapshot_warning(api: Api) -> None:
    """A job nothing fits at all is accepted as before, with no snapshot warning: the placement loop says why
    it waits. (A job with a live option is covered in tests/broker/test_snapshot_submit.py.)"""
    with api.client(api.alice) as c:
        r = c.post("/v1/jobs", json=spec("fits-nothing", gpu=["H100"], gpus=8, max_usd_per_hour=0.01))
    assert r.status_code == 201 and r.json()["decision"] == {} and r.json()["reason"] == ""


def test_the_cli_prints_the_warning_through_the_server(api: Api) -> None:
    sub = lockstep("--server", api.url, "submit", "--json", JOB, token=api.bob)
    assert sub.returncode == 0, sub.stderr
    job = json.loads(sub.stdout)  # stdout stays the job's JSON
    assert sub.stderr.strip() == job["decision"]["warning"]
    _says_what_to_configure(sub.stderr)


def test_the_cli_without_a_server_warns_too(tmp_path: Path) -> None:
    sub = lockstep("--db", str(tmp_path / "l.db"), "submit", "--no-place", JOB)
    assert sub.returncode == 0, sub.stderr
    assert "warning: every option that fits is a snapshot price" in sub.stderr
    assert sub.stdout.strip().splitlines()[-1].startswith("j")  # the job's id, last, for scripts


def test_the_api_refuses_a_snapshot_only_job_when_told_to(refusing_api: Api) -> None:
    with refusing_api.client(refusing_api.alice) as c:
        r = c.post("/v1/jobs", json=spec("snapshot-only"))
        listed = c.get("/v1/jobs").json()
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "infeasible" and "rows of the bundled price snapshot (aws, vast)" in err["message"]
    _says_what_to_configure(err["message"])
    assert listed["jobs"] == []  # nothing was stored


def test_the_cli_refuses_with_exit_3_and_one_line(tmp_path: Path) -> None:
    config = tmp_path / "lockstep.yaml"
    config.write_text("broker:\n  snapshot_only_jobs: refuse\n")
    sub = lockstep("--config", str(config), "--db", str(tmp_path / "l.db"), "submit", JOB)
    assert sub.returncode == 3, (sub.stdout, sub.stderr)
    assert len(sub.stderr.strip().splitlines()) == 1 and sub.stdout == ""
    _says_what_to_configure(sub.stderr)


def test_quote_json_and_table_show_each_options_price_source(api: Api) -> None:
    q = lockstep("--server", api.url, "quote", "--json", JOB, token=api.alice)
    assert q.returncode == 0, q.stderr
    quote = json.loads(q.stdout)
    assert quote["options"]
    for o in quote["options"]:
        assert o["source"] == "snapshot" and o["source_label"] == f"snapshot {o['observed_at'][:10]}"
        assert o["age_s"] > 0
    assert set(quote["feasible_sources"]) <= {"aws", "vast"}
    table = lockstep("--server", api.url, "quote", JOB, token=api.alice)
    assert "price from" in table.stdout and "snapshot 2026-" in table.stdout
    assert "prices from the bundled snapshot only" in table.stdout
    offers = lockstep("--server", api.url, "offers", "--gpu", "H100", "--limit", "5", token=api.alice)
    assert offers.returncode == 0 and "price from" in offers.stdout and "snapshot 2026-" in offers.stdout
