"""Examples for the OpenAPI document, built from the models themselves so they cannot drift from them.

Request bodies, the responses of the job, tenant, token and operations routes, and one error
per status. tests/api/test_openapi.py validates every example against the schema next to it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from typing import Any

from pydantic import BaseModel

from broker.api.schemas import (
    DrainRequest,
    DrainResult,
    ErrorBody,
    ErrorDetail,
    Health,
    JobPage,
    ResumeResult,
    TokenCreated,
)
from broker.models import (
    Job,
    JobDetail,
    JobEvent,
    JobSpec,
    JobState,
    Role,
    Tenant,
    TenantCreate,
    TenantPatch,
    TokenCreate,
    TokenInfo,
    Webhook,
    WebhookCreate,
)

_AT = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
_SPEC = {"name": "mistral-7b-sft", "gpu": ["A100", "H100"], "gpus": 8, "gpus_per_node": 8,
         "min_gpu_memory_gb": 40, "workload": {"params_b": 7, "tokens_b": 5},
         "markets": ["on_demand", "spot"], "interruptible": True, "checkpoint_minutes": 20,
         "command": "torchrun --nproc-per-node 8 sft.py"}

# One error per status: what the server answers (code, message, field) in that case.
ERRORS: dict[int, ErrorDetail] = {
    400: ErrorDetail(code="bad_parameter", message="Input should be a valid integer", field="limit"),
    401: ErrorDetail(code="unauthorized", message="a bearer token is required (Authorization: Bearer <token>)"),
    403: ErrorDetail(code="forbidden", message="this endpoint needs an admin token"),
    404: ErrorDetail(code="not_found", message="no job j0123456789abcdef"),
    408: ErrorDetail(code="request_timeout", message="the request body did not arrive within 30 s", field="body"),
    409: ErrorDetail(code="conflict", message="idempotency key run-1 was used with another body"),
    413: ErrorDetail(code="payload_too_large",
                     message="request body too large: 2000000 bytes declared, at most 1048576", field="body"),
    422: ErrorDetail(code="invalid_spec", message="gpus (12) must be a multiple of gpus_per_node (8)",
                     field="gpus_per_node"),
    429: ErrorDetail(code="rate_limited", message="tenant acme is over its request rate"),
    500: ErrorDetail(code="internal", message="internal error"),
    502: ErrorDetail(code="provider_error", message="slurm: the drain was refused (HTTP 403)"),
}


def error(status: int) -> dict[str, Any]:
    detail = ERRORS.get(status, ErrorDetail(code="http_error", message="error"))
    return ErrorBody(error=detail).model_dump(mode="json")


def _job(state: JobState = JobState.pending) -> Job:
    spec = JobSpec.model_validate(_SPEC)
    events = [JobEvent(job_id="j0123456789abcdef", at=_AT, to_state=JobState.pending, reason="submitted")]
    if state is not JobState.pending:
        events.append(JobEvent(job_id="j0123456789abcdef", at=_AT, from_state=JobState.pending, to_state=state,
                               reason="cancelled by acme"))
    return Job(id="j0123456789abcdef", tenant="acme", spec=spec, state=state, created_at=_AT, updated_at=_AT,
               events=events)


@cache
def by_model() -> dict[type[BaseModel], Any]:
    """An example document for each model that has one (request or response)."""
    job = _job()
    tenant = Tenant(name="acme", monthly_budget_usd=20000, max_gpus=64, created_at=_AT)
    token = TokenInfo(id="tok_0123456789abcdef", tenant="acme", role=Role.user, created_at=_AT, label="ci")
    out: dict[type[BaseModel], BaseModel] = {
        Job: job,
        JobDetail: JobDetail(**dict(job), allocations=[]),
        JobPage: JobPage(jobs=[job], next_cursor=None),
        Tenant: tenant,
        TenantCreate: TenantCreate(name="acme", monthly_budget_usd=20000, max_gpus=64),
        TenantPatch: TenantPatch(max_gpus=128),
        TokenCreate: TokenCreate(tenant="acme", role=Role.user, label="ci"),
        TokenInfo: token,
        TokenCreated: TokenCreated(**dict(token), token="lst_example-shown-once"),
        DrainRequest: DrainRequest(reason="double-bit ECC errors"),
        DrainResult: DrainResult(provider="slurm", node="gpu-node-07", healthy=False,
                                 reason="double-bit ECC errors", drained=True),
        ResumeResult: ResumeResult(provider="slurm", node="gpu-node-07", healthy=True, resumed=True),
        Health: Health(status="ok"),
        WebhookCreate: WebhookCreate(url="https://hooks.example.com/lockstep", kinds=["job.*", "budget.*"],
                                     secret="whsec-example-0123456789"),
        Webhook: Webhook(id="wh_0123456789abcdef", tenant="acme", url="https://hooks.example.com/lockstep",
                         kinds=["job.*", "budget.*"], created_at=_AT),
    }
    docs: dict[type[BaseModel], Any] = {model: doc.model_dump(mode="json") for model, doc in out.items()}
    docs[JobSpec] = dict(_SPEC)  # a request as a person writes it, not the normalised model
    return docs


def cancelled_job() -> dict[str, Any]:
    return _job(JobState.cancelled).model_dump(mode="json")


NOT_READY = Health(status="not ready", store=True, providers={"aws": False}, reason="no provider healthy and no "
                   "catalog").model_dump(mode="json")
