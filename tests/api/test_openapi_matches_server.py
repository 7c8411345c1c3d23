"""The document and the server agree where issue 23 found them apart: each case is checked against the
published schema (jsonschema) and against the model the server validates with."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from broker.api.openapi import build_openapi
from broker.models import CURSOR_PATTERN, SPEC_DURATION_PATTERN, JobSpec, TenantCreate, Workload, parse_duration
from broker.store import open_store

DOC = build_openapi()


def _doc_ok(name: str, value: Any) -> bool:
    """``value`` against the document's schema ``name`` (its refs resolved within the document)."""
    schema = {"components": DOC["components"], "$ref": f"#/components/schemas/{name}"}
    try:
        jsonschema.Draft202012Validator(schema).validate(value)
    except jsonschema.ValidationError:
        return False
    return True


WORKLOADS = [
    ({"reference_gpu_hours": 10}, True),
    ({"params_b": 7, "tokens_b": 100}, True),
    ({"hours": 3}, True),
    ({"reference_gpu_hours": 10, "params_b": 7}, True),  # params_b alone is fine beside a GPU-hour size
    ({"hours": 3, "params_b": 7}, False),
    ({"params_b": 7}, False),
    ({}, False),
    ({"reference_gpu_hours": None, "hours": None}, False),
]


@pytest.mark.parametrize(("workload", "ok"), WORKLOADS)
def test_the_workloads_one_of_rule_is_the_servers(workload: dict[str, Any], ok: bool) -> None:
    assert _doc_ok("Workload-Input", workload) is ok
    try:
        Workload.model_validate(workload)
        server = True
    except ValidationError:
        server = False
    assert server is ok


@pytest.mark.parametrize("value", [5, 5.0, 0, 1_000_000])
def test_max_gpus_takes_what_json_schema_calls_an_integer(value: float) -> None:
    assert _doc_ok("TenantCreate", {"name": "acme", "max_gpus": value})
    assert TenantCreate.model_validate({"name": "acme", "max_gpus": value}).max_gpus == int(value)


@pytest.mark.parametrize("value", [True, "5", 5.5, 1_000_001])
def test_max_gpus_refuses_what_is_not_one(value: Any) -> None:
    assert not _doc_ok("TenantCreate", {"name": "acme", "max_gpus": value})
    with pytest.raises(ValidationError):
        TenantCreate.model_validate({"name": "acme", "max_gpus": value})


@pytest.mark.parametrize("text", ["1s", "90m", "36h", "7d", "99w", "1.5h", "99999999.999999s"])
def test_every_documented_duration_is_one_a_spec_takes(text: str) -> None:
    import re

    assert re.fullmatch(SPEC_DURATION_PATTERN, text)
    assert parse_duration(text).total_seconds() >= 1
    JobSpec.model_validate({"name": "t", "gpus": 1, "max_duration": text, "workload": {"hours": 1},
                            "deadline_in": text})


@pytest.mark.parametrize("gpu", ["", "any GPU", "H100:8"])
def test_the_documented_gpu_names_leave_out_what_the_offers_filter_refuses(gpu: str) -> None:
    param = next(p for p in DOC["paths"]["/v1/offers"]["get"]["parameters"] if p["name"] == "gpu")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([gpu], param["schema"])


def test_any_cursor_of_the_pattern_is_a_place_in_the_list(tmp_path: Any) -> None:
    import re

    assert re.fullmatch(CURSOR_PATTERN, "0.a") and re.fullmatch(CURSOR_PATTERN, "99999999999999999.j-_x")
    with open_store(f"sqlite:///{tmp_path / 'c.db'}") as store:
        for cursor in ("0.a", "99999999999999999.j-_x", "1764590400000000.j1"):
            jobs, nxt = store.list_jobs(cursor=cursor)
            assert jobs == [] and nxt is None
