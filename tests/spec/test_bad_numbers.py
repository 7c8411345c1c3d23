"""Issue 15 items 1-2: numbers that are not finite, that overflow, and nesting that recurses are bad input.

Each case named in the issue, on every path a spec takes: ``parse_spec``, the real `python -m broker`
process (exit 2, one line naming the field), and the HTTP API on SQLite and PostgreSQL (422 naming the
field; a stored job's JSON is valid JSON to the database that holds it).
"""

from __future__ import annotations

import math
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from broker.errors import SpecError
from broker.models import DataSpec, JobSpec, TenantCreate, TenantPatch, Workload
from broker.specs import MAX_DEPTH, parse_spec, parse_spec_text
from tests.spec.conftest import Server, run_process, sqlite_json_valid, strict_json

BASE: dict[str, Any] = {"name": "t", "gpu": "H100", "gpus": 8, "workload": {"hours": 2}}
USER_MODELS: dict[str, type[BaseModel]] = {"": JobSpec, "data": DataSpec, "workload": Workload}


def _is_float(annotation: Any) -> bool:
    if annotation is float:
        return True
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _is_float(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_is_float(a) for a in typing.get_args(annotation))
    return False


def float_fields() -> list[str]:
    """Every float field of every model a user writes, as a dotted path (found, not listed by hand)."""
    out = []
    for prefix, model in USER_MODELS.items():
        for name, info in model.model_fields.items():
            if _is_float(info.annotation):
                out.append(f"{prefix}.{name}" if prefix else name)
    return out


def with_value(path: str, value: Any) -> dict[str, Any]:
    data = {**BASE, "workload": dict(BASE["workload"]), "data": {}}
    head, _, leaf = path.rpartition(".")
    (data[head] if head else data)[leaf] = value
    return data


def test_every_user_float_field_is_found() -> None:
    fields = float_fields()
    # The fields issue 15 saw accept infinity, and the rest of the floats: all of them are checked below.
    assert {"workload.hours", "disk_gb", "max_usd_per_hour", "min_gpu_memory_gb", "data.size_gb"} <= set(fields)
    assert len(fields) >= 15


@pytest.mark.parametrize("path", float_fields())
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e308, "1e999"], ids=["inf", "-inf", "nan",
                                                                                     "1e308", "1e999"])
def test_non_finite_and_huge_floats_are_bad_input_naming_the_field(path: str, value: Any) -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec(with_value(path, value))
    assert path in [f for f, _ in exc.value.errors], exc.value.errors


@pytest.mark.parametrize("model", [TenantCreate, TenantPatch])
def test_api_request_floats_are_finite(model: type[BaseModel]) -> None:
    for value in (math.inf, math.nan):
        with pytest.raises(ValidationError) as exc:
            model.model_validate({"name": "t", "monthly_budget_usd": value} if model is TenantCreate
                                 else {"monthly_budget_usd": value})
        assert exc.value.errors()[0]["loc"] == ("monthly_budget_usd",)


@pytest.mark.parametrize("text", ["999999999d", "99999999999999999d", "9" * 60 + "w", "3661d"], ids=str.__len__)
def test_overflowing_durations_are_bad_input(text: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec({**BASE, "deadline_in": text})
    assert exc.value.field == "deadline_in" and "longer than 3660 days" in exc.value.reason


@pytest.mark.parametrize(("value", "words"), [
    ("10000-01-01T00:00:00Z", "valid datetime"),
    ("9999-12-31T23:59:59-23:59", "between the years 1970 and 9000"),
    ("0001-01-01T00:00:00+14:00", "between the years 1970 and 9000"),
    (1e20, "datetime"),
])
def test_dates_that_overflow_are_bad_input(value: Any, words: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec({**BASE, "deadline": value})
    assert exc.value.field == "deadline" and words in exc.value.reason


@pytest.mark.parametrize(("path", "value"), [
    ("gpus", 10**30), ("gpus", 2**63), ("workload.steps", 10**400), ("gpus_per_node", 10**20),
])
def test_huge_integers_are_bad_input(path: str, value: int) -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec(with_value(path, value))
    assert exc.value.field == path


@pytest.mark.parametrize(("path", "value", "words"), [
    ("name", "a\x00b", "use 1-63 letters"),
    ("command", "echo \x00", "NUL"),
    ("image", "x\ud800", "unicode string"),
    ("labels.team", "\x00", "NUL"),
    ("data.location", "aws:\ud83d", "unicode string"),
])
def test_text_a_database_refuses_is_bad_input(path: str, value: str, words: str) -> None:
    if path.startswith("labels."):
        data = {**BASE, "labels": {path.split(".", 1)[1]: value}}
    else:
        data = with_value(path, value)
    with pytest.raises(SpecError) as exc:
        parse_spec(data)
    assert exc.value.field == path and words in exc.value.reason


def test_deep_nesting_is_bad_input_naming_the_field() -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec_text("name: " + "[" * 50_000)
    assert exc.value.field == "name" and f"nested deeper than {MAX_DEPTH} levels" in exc.value.reason
    with pytest.raises(SpecError) as exc:
        parse_spec_text("name: t\ndata: {location: " + "{a: " * 100)
    assert exc.value.field.startswith("data.location")  # the path down to where it gets too deep
    # Built in code rather than read: the validator's own recursion is caught too.
    deep: Any = "x"
    for _ in range(50_000):
        deep = [deep]
    with pytest.raises(SpecError):
        parse_spec({**BASE, "labels": deep})


def test_all_errors_at_once_each_naming_its_field() -> None:
    with pytest.raises(SpecError) as exc:
        parse_spec_text("name: t\ngpu: H100\ngpus: -1\nworkload: {hours: .inf}\ndeadline_in: 999999999d\n"
                        "disk_gb: .nan\ncolour: red\n")
    fields = [f for f, _ in exc.value.errors]
    assert fields == ["gpus", "workload.hours", "deadline_in", "disk_gb", "colour"]
    assert str(exc.value).count(": ") >= 5 and exc.value.field == "gpus"


# --------------------------------------------------------------------------- the real process


@pytest.mark.parametrize(("text", "needle"), [
    ("name: t\ngpu: H100\ngpus: 8\nworkload: {hours: .inf}\n", "workload.hours: Input should be a finite number"),
    ("name: t\ngpu: H100\ngpus: 8\nworkload: {hours: 1}\ndeadline_in: 999999999d\n", "deadline_in: '999999999d'"),
    ("name: t\ngpu: H100\ngpus: 8\nworkload: {hours: 1}\ndeadline_in: 99999999999999999d\n", "deadline_in: "),
    ("name: " + "[" * 50_000 + "\n", "name: nested deeper than"),
    ("name: t\ngpu: H100\ngpus: -8\nworkload: {hours: .inf}\ndisk_gb: 1e999\n",
     "gpus: Input should be greater than 0; workload.hours: Input should be a finite number; disk_gb: "),
])
def test_cli_exit_2_one_line_naming_the_field(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "job.yaml"
    f.write_text(text)
    for command in ("submit", "quote"):
        r = run_process(command, str(f), db=str(tmp_path / "cli.db"))
        assert r.code == 2, (command, r.err)
        lines = r.err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.err, r.err


def test_cli_stores_extreme_but_valid_numbers_as_valid_json(tmp_path: Path) -> None:
    db = str(tmp_path / "cli.db")
    f = tmp_path / "job.yaml"
    f.write_text("name: extreme\ngpu: H100:8\nworkload: {params_b: 1000000, tokens_b: 1000000000}\n"
                 "data: {size_gb: 1000000000}\nmax_total_usd: 1e12\ndisk_gb: 1e7\ndeadline_in: 3660d\n")
    r = run_process("submit", str(f), "--no-place", "--json", db=db)
    assert r.code == 0, r.err
    job = strict_json(r.out)
    assert sqlite_json_valid(db, job["id"])
    listed = run_process("jobs", "--json", db=db)
    assert listed.code == 0 and strict_json(listed.out)[0]["id"] == job["id"]


# --------------------------------------------------------------------------- HTTP, both backends


@pytest.mark.parametrize(("body", "field"), [
    (b'{"name": "t", "gpu": "H100", "gpus": 8, "workload": {"hours": 1e999}}', "workload.hours"),
    (b'{"name": "t", "gpu": "H100", "gpus": 8, "workload": {"hours": 1}, "deadline_in": "999999999d"}',
     "deadline_in"),
    (b'{"name": "t", "gpu": "H100", "gpus": 8, "workload": {"hours": 1}, "data": {"size_gb": -1e999}}',
     "data.size_gb"),
    (b'{"name": "t", "gpu": "H100", "gpus": 8, "workload": {"hours": 1}, "labels": {"a": "\\u0000"}}',
     "labels.a"),
    (b'{"name": "t", "gpu": "H100", "gpus": 8, "workload": {"hours": 1}, "command": "\\ud800"}', "command"),
])
def test_api_422_naming_the_field(server: Server, body: bytes, field: str) -> None:
    with server.client() as c:
        for path in ("/v1/jobs", "/v1/quotes"):
            r = c.post(path, content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 422, (server.backend, path, r.text)
            assert r.json()["error"]["field"] == field


def test_api_several_errors_in_one_answer(server: Server) -> None:
    body = {"name": "t", "gpu": "H100", "gpus": 0, "workload": {"hours": 1}, "disk_gb": -5, "colour": "red"}
    with server.client() as c:
        err = c.post("/v1/jobs", json=body).json()["error"]
    assert err["field"] == "gpus"
    assert "disk_gb: " in err["message"] and "colour: unknown field" in err["message"]


def test_api_deep_nesting_is_4xx_naming_the_body(server: Server) -> None:
    body = b'{"name": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    with server.client() as c:
        r = c.post("/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert 400 <= r.status_code < 500 and r.json()["error"]["field"] in ("body", "name"), r.text


def test_api_stores_extreme_valid_specs_the_database_accepts(server: Server) -> None:
    body = {"name": "extreme", "gpu": "B300:8", "workload": {"params_b": 1e6, "tokens_b": 1e9, "steps": 10**12},
            "data": {"size_gb": 1e9, "egress_usd_per_gb": 1000}, "max_total_usd": 1e12, "checkpoint_minutes": 1e6,
            "deadline": "9000-12-31T23:59:59Z", "labels": {"k" * 64: "ü" * 256}}
    with server.client() as c:
        r = c.post("/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        back = c.get(f"/v1/jobs/{r.json()['id']}")
        assert back.status_code == 200
        assert strict_json(back.text)["spec"]["gpu"] == ["B300"]
        listed = c.get("/v1/jobs")
        assert listed.status_code == 200 and strict_json(listed.text)["jobs"]
    if server.backend == "sqlite":
        assert sqlite_json_valid(server.db_url.removeprefix("sqlite:///"), r.json()["id"])


def test_a_spec_model_with_a_number_field_the_number_check_skips_is_refused_at_definition() -> None:
    """The number check (``SpecModel._numbers_are_numbers``) runs on the fields it names: a new number field not
    among them would take ``true`` as 1, so defining such a model fails, naming the field."""
    from broker.models import SpecModel

    with pytest.raises(TypeError, match="add budget_gpus to _NUMBER_FIELDS"):
        types.new_class("Extra", (SpecModel,), exec_body=lambda ns: ns.update(
            {"__annotations__": {"budget_gpus": int}, "budget_gpus": 1, "__module__": __name__}))
