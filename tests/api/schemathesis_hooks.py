"""schemathesis hooks (SCHEMATHESIS_HOOKS) for test_schemathesis: the one exclusion from positive_data_acceptance.

A job spec's cross-field rules (JobSpec._shape) are not in the OpenAPI document (docs/api.md, "What the
document cannot say"), so a schema-valid spec may break one and rightly get a 422 naming it. Exactly those
refusals are dropped, by field and reason; any other refusal of schema-valid data still fails the run.
"""

from __future__ import annotations

import json
from typing import Any

import schemathesis

SPEC_PATHS = frozenset({"/v1/jobs", "/v1/quotes"})
CROSS_FIELD = (
    ("gpus_per_node", "must be a multiple of gpus_per_node"),  # gpus % gpus_per_node (default: gpus up to 8, else 8)
    ("deadline", "give deadline or deadline_in, not both"),
    ("workload", "needed with "),  # a deadline, deadline_in or max_total_usd without a workload
    ("secrets", " also in env"),  # a variable both plain and secret
    ("runtime", "built for"),  # the image's or the GPUs' stack against runtime
)


def _cross_field(body: Any) -> bool:
    err = body.get("error", {}) if isinstance(body, dict) else {}
    return any(err.get("field") == field and reason in str(err.get("message", "")) for field, reason in CROSS_FIELD)


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    if "positive_data_acceptance" not in getattr(failure, "checks", ()):
        return True
    if case.operation.method.upper() != "POST" or case.operation.path not in SPEC_PATHS:
        return True
    if response.status_code != 422:
        return True
    try:
        return not _cross_field(json.loads(response.content))
    except ValueError:
        return True
