"""The OpenAPI 3.1 document, generated from ROUTES and the pydantic models they name.

Schemas come from ``models_json_schema`` with refs into components/schemas;
request bodies use each model's validation schema and responses its
serialization schema (pydantic names them apart when they differ).
"""

from __future__ import annotations

import re
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from broker.api.examples import NOT_READY, by_model, cancelled_job, error
from broker.api.handlers import ERROR_MODEL, HTML, NO_CONTENT, ROUTES, TEXT, Route
from broker.models import Role

REF = "#/components/schemas/{model}"
_PATH_PARAM = re.compile(r"{(\w+)}")
_ERROR_TEXT = {
    400: "Bad request: a parameter, header or the JSON itself is wrong (error.field names it)",
    401: "No token, or an invalid or revoked one",
    403: "The token's role may not call this operation",
    404: "No such resource (or it belongs to another tenant)",
    408: "The request body did not arrive within api.body_timeout_s; the connection is closed",
    409: "Conflict with the current state (idempotency key reused with another body, name taken...)",
    413: "Request body larger than the server accepts",
    422: "The body is valid JSON but not a valid document (error.field names the field)",
    429: "The tenant is over its request rate; retry after Retry-After seconds",
    500: "Anything else: the message is only \"internal error\" (the cause is in the server's log)",
    502: "A provider failed",
}
_ERROR_HEADERS = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "required": True}},
    429: {"Retry-After": {"schema": {"type": "string", "pattern": "^[0-9]+$"}, "required": True}},
}


def _model_of(tp: Any) -> type[BaseModel] | None:
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _collect(routes: tuple[Route, ...]) -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    wanted: list[tuple[type[BaseModel], JsonSchemaMode]] = [(ERROR_MODEL, "serialization")]

    def add(tp: Any, mode: JsonSchemaMode) -> None:
        if tp is None or tp is TEXT or tp is HTML:
            return
        for arg in typing.get_args(tp):
            add(arg, mode)
        model = _model_of(tp)
        if model is not None and (model, mode) not in wanted:
            wanted.append((model, mode))

    for r in routes:
        add(r.body, "validation")
        add(r.query, "validation")
        for tp in r.ok.values():
            add(tp, "serialization")
    return wanted


def _schema_for(tp: Any, mode: JsonSchemaMode, key_map: dict[Any, dict[str, Any]]) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if origin is list:
        return {"type": "array", "items": _schema_for(typing.get_args(tp)[0], mode, key_map)}
    if origin is dict:
        return {"type": "object"}
    model = _model_of(tp)
    assert model is not None, tp
    return key_map[(model, mode)]


def _drop_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A query parameter is absent rather than null: keep the non-null branch of Optional[X], and no
    ``default: null`` (a default must match the schema it sits in)."""
    variants = schema.get("anyOf")
    if variants:
        rest = [v for v in variants if v.get("type") != "null"]
        if len(rest) == 1:
            out = {k: v for k, v in schema.items() if k != "anyOf"}
            out.update(rest[0])
            schema = out
    if "default" in schema and schema["default"] is None:
        schema = {k: v for k, v in schema.items() if k != "default"}
    return schema


def _query_params(model: type[BaseModel], defs: dict[str, Any]) -> list[dict[str, Any]]:
    name = model.__name__
    props = defs[name]["properties"]
    required = set(defs[name].get("required", []))
    out = []
    for pname, schema in props.items():
        schema = _drop_null(schema)
        bare = {k: v for k, v in schema.items() if k not in ("title", "description")}
        param: dict[str, Any] = {"name": pname, "in": "query", "required": pname in required, "schema": bare}
        if "description" in schema:
            param["description"] = schema["description"]
        if schema.get("type") == "array":
            param["style"], param["explode"] = "form", True
        out.append(param)
    return out


def _error(status: int) -> dict[str, Any]:
    resp: dict[str, Any] = {
        "description": _ERROR_TEXT.get(status, "Error"),
        "content": {"application/json": {"schema": {"$ref": REF.format(model=ERROR_MODEL.__name__)},
                                         "example": error(status)}},
    }
    if status in _ERROR_HEADERS:
        resp["headers"] = _ERROR_HEADERS[status]
    return resp


def _error_statuses(r: Route, path_params: list[str]) -> list[int]:
    codes = set(r.errors)
    if not r.public:
        codes |= {401, 403, 429, 500}  # 403: a role the route does not allow (a metrics token, a user on admin's)
    if r.body is not None:
        codes |= {400, 408, 413, 422}
    if r.query is not None or r.headers:
        codes.add(400)
    if path_params:
        codes.add(404)
    return sorted(codes)


def _example(tp: Any, status: int = 200) -> Any:
    if tp is not None and typing.get_origin(tp) is list:
        inner = _example(typing.get_args(tp)[0])
        return None if inner is None else [inner]
    model = _model_of(tp)
    return None if model is None else by_model().get(model)


def _who(r: Route, public_docs: bool) -> str:
    if r.public or (r.docs and public_docs):
        return "Anyone: no token needed."
    names = [role.value for role in Role if role in r.roles]
    return "Tokens with the role " + " or ".join(names) + "."


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lockstep")
    except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        return "0.1.0"


def build_openapi(routes: tuple[Route, ...] = ROUTES, version: str | None = None, *,
                  public_docs: bool = True) -> dict[str, Any]:
    key_map, top = models_json_schema(_collect(routes), ref_template=REF)
    defs: dict[str, Any] = top.get("$defs", {})
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        path_params = _PATH_PARAM.findall(r.path)
        params: list[dict[str, Any]] = [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
            for p in path_params
        ]
        params += list(r.headers)
        if r.query is not None:
            params += _query_params(r.query, defs)
        responses: dict[str, Any] = {}
        for status, tp in r.ok.items():
            if tp is NO_CONTENT:
                responses[str(status)] = {"description": "Done"}
            elif tp is TEXT:
                responses[str(status)] = {"description": "OK", "content": {"text/plain": {
                    "schema": {"type": "string"},
                    "example": "# TYPE lockstep_jobs gauge\nlockstep_jobs{state=\"running\"} 3.0\n"}}}
            elif tp is HTML:
                responses[str(status)] = {"description": "OK", "content": {"text/html": {"schema": {"type": "string"}}}}
            else:
                media: dict[str, Any] = {"schema": _schema_for(tp, "serialization", key_map)}
                example = NOT_READY if status == 503 else _example(tp)
                if r.handler.__name__ == "cancel_job":
                    example = cancelled_job()
                if example is not None:
                    media["example"] = example
                responses[str(status)] = {"description": "Not ready" if status >= 500 else "OK",
                                          "content": {"application/json": media}}
        for status in _error_statuses(r, path_params):
            responses[str(status)] = _error(status)
        op: dict[str, Any] = {"operationId": r.operation_id, "summary": r.summary, "tags": [r.tag],
                              "description": _who(r, public_docs), "responses": responses}
        if params:
            op["parameters"] = params
        if r.body is not None:
            body: dict[str, Any] = {"schema": _schema_for(r.body, "validation", key_map)}
            example = _example(r.body)
            if example is not None:
                body["example"] = example
            op["requestBody"] = {"required": True, "content": {"application/json": body}}
        if r.public or (r.docs and public_docs):
            op["security"] = []
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "Lockstep API", "version": version or _package_version(),
                 "description": "GPU marketplace broker and job router. Every route but /healthz, "
                                "/readyz (and, unless api.public_docs is false, /openapi.json and /docs) "
                                "needs a bearer token, whose role (user, admin, metrics) says which "
                                "operations it may call; errors are "
                                "{\"error\": {\"code\", \"message\", \"field\"}}."},
        "paths": paths,
        "components": {
            "schemas": defs,
            "securitySchemes": {"bearer": {
                "type": "http", "scheme": "bearer",
                "description": "A token from `lockstep tokens create` or POST /v1/tokens"}},
        },
        "security": [{"bearer": []}],
    }
