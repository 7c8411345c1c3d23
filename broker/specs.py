"""Reading job specs (YAML or JSON) into a validated JobSpec, with errors a person can act on.

Every failure is a :class:`SpecError` naming the field (dotted path) and the
reason, e.g. ``gpus_per_node: gpus (12) must be a multiple of gpus_per_node (8)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from broker.errors import SpecError
from broker.models import JobSpec

MAX_SPEC_BYTES = 1_048_576


def first_error(exc: ValidationError, root: str = "") -> SpecError:
    """The first pydantic error as (field, reason)."""
    err = exc.errors(include_url=False)[0]
    loc = [str(p) for p in err.get("loc", ()) if p != "__root__"]
    field = ".".join(loc) or root
    msg = err.get("msg", "invalid")
    if err.get("type") == "extra_forbidden":
        msg = "unknown field"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if not loc and "gpus_per_node" in msg:
        field = "gpus_per_node"
    elif not loc and "deadline" in msg:
        field = "deadline"
    return SpecError(field, msg)


def parse_spec(data: Any) -> JobSpec:
    """Validate already-parsed data (a dict) as a JobSpec."""
    if not isinstance(data, dict):
        raise SpecError("", f"a job spec is a mapping of fields, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise first_error(exc) from None


def parse_spec_text(text: str, source: str = "job spec") -> JobSpec:
    """YAML is a superset of JSON, so one parser reads both."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise SpecError("", f"{source}: malformed YAML{where}: {problem}") from None
    return parse_spec(data)


def load_spec(path: str | Path) -> JobSpec:
    p = Path(path)
    try:
        if p.stat().st_size > MAX_SPEC_BYTES:
            raise SpecError("", f"{p}: larger than {MAX_SPEC_BYTES} bytes")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("", f"{p}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise SpecError("", f"{p}: cannot read ({type(exc).__name__})") from None
    return parse_spec_text(text, source=str(p))
