"""Reading job specs (YAML or JSON) into a validated JobSpec, with errors a person can act on.

Every failure is a :class:`SpecError` naming the field (dotted path) and the
reason, e.g. ``gpus_per_node: gpus (12) must be a multiple of gpus_per_node (8)``;
a spec with several mistakes gets all of them at once, each with its field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from broker.errors import SpecError
from broker.models import FieldError, JobSpec

MAX_SPEC_BYTES = 1_048_576
# Far deeper than any spec needs (the deepest real field is data.location, 2 levels), far shallower
# than what makes a recursive parser or validator overflow its stack.
MAX_DEPTH = 32
_Loader = yaml.SafeLoader  # (libyaml's loader words its errors less helpfully: "did not find expected…")


def _one(err: Any, root: str = "") -> tuple[str, str]:
    """(field, reason) of one pydantic error."""
    loc = [str(p) for p in err.get("loc", ()) if p != "__root__"]
    msg = err.get("msg", "invalid")
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):  # a model validator naming the field it is about
        loc.append(cause.field)
        msg = cause.reason
    elif err.get("type") == "extra_forbidden":
        msg = "unknown field"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    return ".".join(loc) or root, msg


def first_error(exc: ValidationError, root: str = "") -> SpecError:
    """The first pydantic error as (field, reason)."""
    return SpecError(*_one(exc.errors(include_url=False)[0], root))


def spec_error(exc: ValidationError, root: str = "") -> SpecError:
    """Every pydantic error, each as (field, reason), in one SpecError."""
    errors: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        one = _one(err, root)
        if one not in errors:
            errors.append(one)
    return SpecError(*errors[0], errors=errors)


def parse_spec(data: Any) -> JobSpec:
    """Validate already-parsed data (a dict) as a JobSpec."""
    if not isinstance(data, dict):
        raise SpecError("", f"a job spec is a mapping of fields, got {type(data).__name__}")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error(exc) from None
    except RecursionError:  # data built in code, deeper than any reader here lets through
        raise SpecError("", f"nested deeper than {MAX_DEPTH} levels") from None


def _check_depth(text: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH from the event stream (iterative), before the
    recursive composer meets it: 50,000 '[' would otherwise be a RecursionError."""
    # Per open collection: [is a mapping, the key being read (mappings only), next scalar is a key,
    # the collection is itself a mapping key]
    stack: list[list[Any]] = []
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionStartEvent):
            as_key = bool(stack) and stack[-1][0] and stack[-1][2]
            if as_key:
                stack[-1][1:3] = ["?", False]
            if len(stack) >= MAX_DEPTH:
                field = ".".join(f[1] for f in stack if f[0] and f[1] not in ("", "?"))
                raise SpecError(".".join(field.split(".")[:3]), f"nested deeper than {MAX_DEPTH} levels")
            stack.append([isinstance(event, yaml.MappingStartEvent), "", True, as_key])
        elif isinstance(event, yaml.CollectionEndEvent):
            if not stack.pop()[3] and stack and stack[-1][0]:
                stack[-1][2] = True
        elif isinstance(event, yaml.ScalarEvent | yaml.AliasEvent) and stack and stack[-1][0]:
            if stack[-1][2]:
                stack[-1][1:3] = [str(getattr(event, "value", "?"))[:40], False]
            else:
                stack[-1][2] = True


def parse_spec_text(text: str, source: str = "job spec") -> JobSpec:
    """YAML is a superset of JSON, so one parser reads both."""
    try:
        _check_depth(text)
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise SpecError("", f"{source}: malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise SpecError("", f"{source}: nested deeper than {MAX_DEPTH} levels") from None
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
