"""The API contract: /openapi.json is a valid OpenAPI 3.1 document, public by default, with a docs page,
examples that match their schemas, and responses of the real server that match the document.

openapi-spec-validator judges the document (a deliberately broken copy must fail it); a
schema-driven client (schemathesis's Case API: requests built from the document's operations,
answers validated against the document's response schemas, status codes and headers) round-trips
the main operations against the real server on loopback.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from jsonschema import Draft202012Validator
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from openapi_spec_validator.validation.exceptions import OpenAPIValidationError

from broker.api.handlers import ROUTES
from broker.config import ApiConfig
from broker.models import Role
from broker.store import open_store
from tests.api.conftest import Api, _serve, _settings, spec


def _errors(doc: dict[str, Any]) -> list[str]:
    return [e.message for e in OpenAPIV31SpecValidator(doc).iter_errors()]


@pytest.fixture(scope="module")
def served(api: Api) -> dict[str, Any]:
    with api.client(None) as anon:  # no token: the document is public by default
        r = anon.get("/openapi.json")
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def test_served_document_is_valid_openapi_3_1(served: dict[str, Any]) -> None:
    assert served["openapi"].startswith("3.1")
    assert _errors(served) == []
    validate(served)  # the library's one-call form raises on any error
    # Every route of the table is in it, with its operation id.
    ops = {(m.upper(), p): op["operationId"] for p, item in served["paths"].items() for m, op in item.items()}
    assert ops == {(r.method, r.path): r.operation_id for r in ROUTES}


def _break_null_default(doc: dict[str, Any]) -> None:
    # The bug this document once had: an optional query parameter's schema says string but defaults to null.
    param = next(p for p in doc["paths"]["/v1/offers"]["get"]["parameters"] if p["name"] == "region")
    param["schema"]["default"] = None


def _break_missing_description(doc: dict[str, Any]) -> None:
    del doc["paths"]["/v1/jobs"]["post"]["responses"]["201"]["description"]  # required of every response


def _break_bad_ref_type(doc: dict[str, Any]) -> None:
    doc["paths"]["/v1/jobs"]["get"]["parameters"][0]["in"] = "body"  # not a parameter location in 3.x


def _break_info(doc: dict[str, Any]) -> None:
    del doc["info"]["title"]


@pytest.mark.parametrize("breaker", [_break_null_default, _break_missing_description, _break_bad_ref_type,
                                     _break_info])
def test_a_broken_copy_fails_validation(served: dict[str, Any], breaker: Any) -> None:
    broken = copy.deepcopy(served)
    breaker(broken)
    assert _errors(broken), breaker.__name__
    with pytest.raises(OpenAPIValidationError):
        validate(broken)


def _media(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, op in item.items():
            where = f"{method.upper()} {path}"
            body = op.get("requestBody")
            if body:
                yield f"{where} request", body["content"]["application/json"]
            for status, resp in op["responses"].items():
                for media_type, media in resp.get("content", {}).items():
                    yield f"{where} {status} {media_type}", media


def test_every_error_is_documented_with_an_example_that_matches_its_schema(served: dict[str, Any]) -> None:
    components = served["components"]
    checked = 0
    for where, media in _media(served):
        if "example" not in media:
            continue
        root = {"components": components, "allOf": [media["schema"]]}  # refs resolve into the document
        errors = [e.message for e in Draft202012Validator(root).iter_errors(media["example"])]
        assert errors == [], where
        checked += 1
    for path, item in served["paths"].items():
        for method, op in item.items():
            assert op.get("description"), (method, path)  # who may call it
            for status, resp in op["responses"].items():
                if int(status) >= 400 and path != "/readyz":  # its 503 is the readiness report
                    media = resp["content"]["application/json"]
                    assert "example" in media and media["example"]["error"]["code"], (method, path, status)
            if op.get("requestBody"):
                assert "example" in op["requestBody"]["content"]["application/json"], (method, path)
            if path != "/docs" and op.get("security") != []:
                assert {"401", "403", "429", "500"} <= set(op["responses"]), (method, path)
    assert checked > 100
    # The main operations' successful answers carry examples too.
    for path, method, status in (("/v1/jobs", "post", "201"), ("/v1/jobs/{job_id}", "get", "200"),
                                 ("/v1/jobs", "get", "200"), ("/v1/jobs/{job_id}", "delete", "200"),
                                 ("/v1/tokens", "post", "201"), ("/healthz", "get", "200")):
        assert "example" in served["paths"][path][method]["responses"][status]["content"]["application/json"]


def test_docs_page_is_served_from_the_installed_bundle(api: Api) -> None:
    with api.client(None) as anon:
        page = anon.get("/docs")
        assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
        assert "/openapi.json" in page.text
        assert not re.search(r"(src|href)=\"(https?:)?//", page.text)  # nothing from a CDN
        scripts = re.findall(r"(?:src|href)=\"(/docs/static/[^\"]+)\"", page.text)
        assert "/docs/static/swagger-ui-bundle.js" in scripts and "/docs/static/swagger-ui.css" in scripts
        for url in scripts:
            r = anon.get(url)
            assert r.status_code == 200 and len(r.content) > 100, url
        assert "SwaggerUIBundle" in anon.get("/docs/static/swagger-ui-bundle.js").text
        missing = anon.get("/docs/static/no-such-file.js")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


@pytest.fixture(scope="module")
def private_docs_api(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Api:
    db_url = f"sqlite:///{tmp_path_factory.mktemp('api-private-docs') / 'lockstep.db'}"
    with open_store(db_url) as store:
        _, admin = store.create_token("ops", Role.admin)
        _, alice = store.create_token("alpha", Role.user)
        _, scraper = store.create_token("ops", Role.metrics)
    settings = _settings(db_url, ApiConfig(public_docs=False))
    server, svc = _serve(settings, request)
    return Api(server.url, admin, alice, scraper, db_url, settings, svc)


def test_docs_need_a_token_when_configured(private_docs_api: Api) -> None:
    api = private_docs_api
    with api.client(None) as anon, api.client(api.alice) as alice, api.client(api.bob) as scraper:
        for path in ("/openapi.json", "/docs", "/docs/static/swagger-ui-bundle.js"):
            assert anon.get(path).status_code == 401, path
            assert alice.get(path).status_code == 200, path
            assert scraper.get(path).status_code == 403, path  # bob is the metrics token here
        doc = alice.get("/openapi.json").json()
        assert _errors(doc) == []
        assert "security" not in doc["paths"]["/openapi.json"]["get"]  # the global bearer requirement applies
        assert anon.get("/healthz").status_code == 200


# --------------------------------------------------------------------------- a schema-driven client


def test_schema_driven_client_round_trips_the_main_operations(api: Api, served: dict[str, Any]) -> None:
    """Requests built from the document's operations; every answer checked against the document
    (status code documented, body matching its schema, required headers present)."""
    schema = schemathesis.openapi.from_dict(served)
    auth = {"Authorization": f"Bearer {api.alice}"}

    def call(path: str, method: str, **parts: Any) -> Any:
        case = schema[path][method].Case(**parts)
        response = case.call(base_url=api.url, headers=auth)
        case.validate_response(response, headers=auth)
        return response

    quote = call("/v1/quotes", "POST", body=spec("contract-quote"), query={"top": 3})
    assert quote.status_code == 200 and 1 <= len(quote.json()["options"]) <= 3

    submitted = call("/v1/jobs", "POST", body=spec("contract-job"), headers={"Idempotency-Key": "contract-1"})
    assert submitted.status_code == 201
    job = submitted.json()
    again = call("/v1/jobs", "POST", body=spec("contract-job"), headers={"Idempotency-Key": "contract-1"})
    assert again.status_code == 200 and again.json()["id"] == job["id"]

    got = call("/v1/jobs/{job_id}", "GET", path_parameters={"job_id": job["id"]})
    assert got.json()["id"] == job["id"] and got.json()["state"] == "pending"

    listed = call("/v1/jobs", "GET", query={"limit": 1000, "state": ["pending"]})
    assert job["id"] in {j["id"] for j in listed.json()["jobs"]}

    cancelled = call("/v1/jobs/{job_id}", "DELETE", path_parameters={"job_id": job["id"]})
    assert cancelled.json()["state"] == "cancelled"

    # Errors are part of the contract too: each answer below is checked against its documented schema.
    assert call("/v1/jobs/{job_id}", "GET", path_parameters={"job_id": "j-none"}).status_code == 404
    bad = call("/v1/quotes", "POST", body=spec("contract-bad", gpus=12, gpus_per_node=8))
    assert bad.status_code == 422 and bad.json()["error"]["field"]
    assert call("/v1/tokens", "GET").status_code == 403  # a user token on an admin operation
    assert call("/v1/offers", "GET", query={"limit": 5, "gpu": ["H100"]}).status_code == 200

    # What the schema says is not a number or a date-time is refused as such, not read as 0 or 1970.
    for field, value in (("disk_gb", False), ("interruptible", 1), ("deadline", 0)):
        wrong = call("/v1/quotes", "POST", body=spec("contract-types", **{field: value}))
        assert wrong.status_code == 422 and wrong.json()["error"]["field"] == field, (field, wrong.text)
    hours = call("/v1/quotes", "POST", body=spec("contract-types", workload={"hours": True}))
    assert hours.status_code == 422 and hours.json()["error"]["field"] == "workload.hours"
