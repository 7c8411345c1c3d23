"""schemathesis drives the real server from its own /openapi.json: no 5xx, no response off the schema.

It runs as `st run` in a subprocess (its own HTTP client, not ours) with every
check, ``positive_data_acceptance`` included (issue 23: a client generated from
the document never gets a 4xx for a schema-valid request), but ``use_after_free``:
DELETE on a job cancels it, and the cancelled job stays readable (200, state
cancelled), as documented. One exclusion, in tests/api/schemathesis_hooks.py: a
job spec's cross-field rules, which the document cannot state (docs/api.md), are
dropped from positive_data_acceptance by field and reason, and nothing else.
The document's examples seed its example and coverage phases. The server's own
request counter proves the run made at least 1,000 requests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.api import create_app
from broker.api.keys import METRICS
from broker.config import ApiConfig
from broker.models import Role
from broker.service import Lockstep
from broker.store import open_store
from tests.api.conftest import Api, ServerThread, _settings

MIN_REQUESTS = 1000
ROOT = Path(__file__).resolve().parents[2]


def _requests_by_status(api: Api) -> dict[str, float]:
    assert api.app is not None
    out: dict[str, float] = {}
    for metric in api.app[METRICS].http_requests.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                out[sample.labels["status"]] = out.get(sample.labels["status"], 0) + sample.value
    return out


@pytest.fixture
def fuzz_api_pg(request: pytest.FixtureRequest) -> Api:
    """The fuzz server on PostgreSQL: what the store cannot hold (a NUL in a path or query value) is a 400 there
    too, never a 500 (issue 23)."""
    make: Callable[[], str] = request.getfixturevalue("pg_database")
    db_url = make()
    with open_store(db_url) as store:
        _, admin = store.create_token("ops", Role.admin, "schemathesis")
        _, alice = store.create_token("alpha", Role.user)
    settings = _settings(db_url, ApiConfig(rate_per_s=100_000, burst=100_000, max_body_bytes=256 * 1024,
                                           bad_token_rate_per_s=100_000, bad_token_burst=100_000,
                                           log_follow_max_s=1.0))
    svc = Lockstep(settings, only_providers=["catalog"])
    server = ServerThread(create_app(svc, start_loops=False))
    server.start()
    request.addfinalizer(server.stop)
    return Api(server.url, admin, alice, "", db_url, settings, svc, app=server.app)


def test_schemathesis_finds_no_server_errors_or_schema_violations(fuzz_api: Api, fuzz_api_pg: Api,
                                                                  tmp_path: Path) -> None:
    """Both stores' servers at once, each fuzzed by its own ``st run``: they overlap for the suite's time only
    (each server is its own and counts its own requests)."""
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    runs: dict[str, tuple[Api, float, subprocess.Popen[str]]] = {}
    for store, api in (("sqlite", fuzz_api), ("postgres", fuzz_api_pg)):
        with api.client(api.admin) as admin:
            doc = admin.get("/openapi.json")
        assert doc.status_code == 200
        schema_file = tmp_path / f"openapi-{store}.json"
        schema_file.write_text(json.dumps(doc.json()))
        cmd = [
            sys.executable, "-m", "schemathesis.cli", "run", str(schema_file), "--url", api.url,
            "-H", f"Authorization: Bearer {api.admin}",
            "--checks", "all", "--exclude-checks", "use_after_free",
            "--max-examples", "20", "--seed", "20261129", "--no-shrink", "--workers", "1",
            "--suppress-health-check", "all", "--request-timeout", "30",
        ]
        # The hooks drop exactly the refusals of JobSpec's cross-field rules, which the document cannot state.
        cwd = tmp_path / store
        cwd.mkdir()
        before = sum(_requests_by_status(api).values())
        runs[store] = api, before, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                                    cwd=cwd, env=env)
    try:
        for store, (api, before, proc) in runs.items():
            stdout, stderr = proc.communicate(timeout=600)
            report = f"[{store}]\n" + stdout[-6000:] + stderr[-2000:]
            assert api.admin not in stdout + stderr  # schemathesis masks it; so must we
            assert proc.returncode == 0, report

            statuses = _requests_by_status(api)
            made = sum(statuses.values()) - before
            assert made >= MIN_REQUESTS, f"only {made} requests\n{report}"
            assert not [s for s in statuses if s.startswith("5") and s != "503"], (store, statuses)
    finally:
        for _, _, proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
