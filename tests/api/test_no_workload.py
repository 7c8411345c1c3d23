"""The shortest spec (issue 29.1): `name` + `gpu: H100:8`, no workload, quotes by $/h locally and through the API."""

from __future__ import annotations

import json
from pathlib import Path

from broker.models import NO_WORKLOAD_NOTE
from tests.api.conftest import Api
from tests.api.test_cli import lockstep

SHORTEST = {"name": "x", "gpu": "H100:8"}


def _check_per_hour(q: dict) -> None:
    assert q["options"], "the catalog sells 8 × H100"
    assert NO_WORKLOAD_NOTE in q["notes"]
    assert all(o["expected_hours"] is None for o in q["options"])
    prices = [o["usd_per_hour"] for o in q["options"]]
    assert prices == sorted(prices), "ranked by the shape's $/h"
    assert all(o["nodes"] * o["gpus_per_node"] == 8 for o in q["options"])


def test_the_shortest_spec_quotes_through_the_api(api: Api) -> None:
    with api.client(api.alice) as alice:
        r = alice.post("/v1/quotes", json=SHORTEST)
    assert r.status_code == 200, r.text
    _check_per_hour(r.json())


def test_a_deadline_without_a_workload_is_422_naming_both(api: Api) -> None:
    with api.client(api.alice) as alice:
        for deadline in ({"deadline_in": "48h"}, {"deadline": "2027-01-01T00:00:00Z"}):
            for path in ("/v1/quotes", "/v1/jobs"):
                r = alice.post(path, json={**SHORTEST, **deadline})
                assert r.status_code == 422, (path, r.text)
                err = r.json()["error"]
                assert err["field"] == "workload" and next(iter(deadline)) in err["message"], err


def test_the_shortest_spec_quotes_locally(tmp_path: Path) -> None:
    job = tmp_path / "x.yaml"
    job.write_text("name: x\ngpu: H100:8\n")
    db = str(tmp_path / "local.db")
    as_json = lockstep("--db", db, "quote", "--provider", "catalog", "--json", str(job))
    assert as_json.returncode == 0, as_json.stderr
    _check_per_hour(json.loads(as_json.stdout))
    table = lockstep("--db", db, "quote", "--provider", "catalog", str(job))
    assert table.returncode == 0, table.stderr
    assert NO_WORKLOAD_NOTE in table.stdout and "—" in table.stdout


def test_a_deadline_without_a_workload_exits_2_naming_both(tmp_path: Path) -> None:
    job = tmp_path / "x.yaml"
    job.write_text("name: x\ngpu: H100:8\ndeadline_in: 48h\n")
    r = lockstep("--db", str(tmp_path / "local.db"), "quote", "--provider", "catalog", str(job))
    assert r.returncode == 2, (r.stdout, r.stderr)
    line = r.stderr.strip()
    assert "workload" in line and "deadline_in" in line and len(line.splitlines()) == 1, line
