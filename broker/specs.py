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
from broker.models import FILES_MAX_BYTES, FILES_MAX_COUNT, FieldError, JobSpec
from broker.yamlload import DuplicateKeyError, StrictLoader

MAX_SPEC_BYTES = 1_048_576
# Far deeper than any spec needs (the deepest real field is data.location, 2 levels), far shallower
# than what makes a recursive parser or validator overflow its stack.
MAX_DEPTH = 32
# SafeLoader that refuses a key written twice (libyaml's loader words its errors less helpfully: "did not find
# expected…")
_Loader = StrictLoader


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


# Never shipped from a workdir: version control, caches, environments.
WORKDIR_SKIP = frozenset({".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "node_modules", ".mypy_cache",
                          ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints"})


def pack_workdir(root: Path) -> dict[str, str]:
    """A local directory's text files as a spec's ``files`` (relative path → text); errors name the file."""
    if not root.is_dir():
        raise SpecError("workdir", f"{root}: not a directory")
    files: dict[str, str] = {}
    total = 0
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(part in WORKDIR_SKIP for part in rel.parts) or not path.is_file():
            continue
        if path.is_symlink() and not path.resolve().is_relative_to(root.resolve()):
            raise SpecError("workdir", f"{rel}: a link that leaves the directory")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise SpecError("workdir", f"{rel}: not a text file (binary inputs go in data.uri)") from None
        except OSError as exc:
            raise SpecError("workdir", f"{rel}: cannot read ({type(exc).__name__})") from None
        total += len(text.encode("utf-8"))
        if total > FILES_MAX_BYTES or len(files) >= FILES_MAX_COUNT:
            raise SpecError("workdir", f"{root} holds more than {FILES_MAX_BYTES // 1024} KiB or "
                                       f"{FILES_MAX_COUNT} files (put larger inputs in data.uri)")
        files[rel.as_posix()] = text
    return files


def parse_spec(data: Any, base_dir: Path | None = None) -> JobSpec:
    """Validate already-parsed data (a dict) as a JobSpec.

    ``workdir`` (a local directory, relative to ``base_dir``: the spec file's folder) is packed into
    ``files`` here, on the client; a spec that arrives without a ``base_dir`` (over HTTP) cannot name one.
    """
    if not isinstance(data, dict):
        raise SpecError("", f"a job spec is a mapping of fields, got {type(data).__name__}")
    if "workdir" in data:
        if base_dir is None:
            raise SpecError("workdir", "a directory on the client's machine: the CLI packs it into files; "
                                       "over the API send files")
        data = dict(data)
        workdir = data.pop("workdir")
        if not isinstance(workdir, str):
            raise SpecError("workdir", "a directory path")
        packed = pack_workdir(base_dir / Path(workdir).expanduser())
        given = data.get("files") or {}
        if isinstance(given, dict):
            packed.update(given)  # files written in the spec win over the directory's
        data["files"] = packed
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


def parse_spec_text(text: str, source: str = "job spec", base_dir: Path | None = None) -> JobSpec:
    """YAML is a superset of JSON, so one parser reads both."""
    try:
        _check_depth(text)
        data = yaml.load(text, Loader=_Loader)
    except DuplicateKeyError as exc:  # PyYAML would keep the last one without a word
        raise SpecError(exc.key, f"{source}: written twice, at lines {exc.first_line} and {exc.again_line}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "cannot be parsed"
        raise SpecError("", f"{source}: malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise SpecError("", f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    return parse_spec(data, base_dir)


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
    return parse_spec_text(text, source=str(p), base_dir=p.parent)
