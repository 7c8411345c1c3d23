"""One error map: each class's HTTP status, API code and exit code, read the same by the API, the CLI and
the client (which turns a server's answer back into the class)."""

from __future__ import annotations

import pytest

from broker.api.errors import from_lockstep
from broker.cli import main
from broker.cli.app import Command
from broker.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAIL,
    EXIT_INFEASIBLE,
    CapacityError,
    ConflictError,
    LockstepError,
    NoFeasibleOption,
    NotFoundError,
    ProviderError,
    SpecError,
    StoreError,
    TransientError,
    error_from_api,
)
from tests.cli.test_cli import root_with

# (error, HTTP status, API code, message a client reads, field, CLI exit code): the contract of README and docs/api.md.
CASES = [
    (SpecError("gpus", "must be positive"), 422, "invalid_spec", "must be positive", "gpus", EXIT_BAD_INPUT),
    (SpecError("", "a mapping, please"), 422, "invalid_spec", "a mapping, please", "body", EXIT_BAD_INPUT),
    (NotFoundError("job j1 not found"), 404, "not_found", "job j1 not found", None, EXIT_BAD_INPUT),
    (ConflictError("tenant acme already exists"), 409, "conflict", "tenant acme already exists", None,
     EXIT_BAD_INPUT),
    (NoFeasibleOption("no feasible option for x", {"gpu_model": 3}), 422, "infeasible", "no feasible option for x",
     None, EXIT_INFEASIBLE),
    (CapacityError("aws", "no capacity", "InsufficientInstanceCapacity"), 502, "provider_error",
     "aws: no capacity [InsufficientInstanceCapacity]", None, EXIT_FAIL),
    (TransientError("vast", "HTTP 503"), 502, "provider_error", "vast: HTTP 503", None, EXIT_FAIL),
    (StoreError("not job fields: colour"), 500, "internal", "internal error", None, EXIT_FAIL),
    (LockstepError("something else"), 500, "internal", "internal error", None, EXIT_FAIL),
]


@pytest.mark.parametrize(("exc", "status", "code", "message", "field", "exit_code"), CASES)
def test_the_api_shows_what_the_class_says(exc: LockstepError, status: int, code: str, message: str,
                                           field: str | None, exit_code: int) -> None:
    err = from_lockstep(exc)
    assert (err.status, err.code, err.message, err.field) == (status, code, message, field)
    assert (exc.http_status, exc.api_code, exc.exit_code) == (status, code, exit_code)


@pytest.mark.parametrize(("exc", "status", "code", "message", "field", "exit_code"), CASES)
def test_the_cli_exits_with_the_class_code_and_one_line(exc: LockstepError, status: int, code: str, message: str,
                                                        field: str | None, exit_code: int,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    _RAISE[:] = [exc]
    with pytest.raises(SystemExit) as done:
        main(["boom"], root_with(Command("boom", "tests.broker.test_errors:_boom", "Raise.")))
    assert done.value.code == exit_code
    err = capsys.readouterr().err
    assert err == f"lockstep: {exc}\n"


_RAISE: list[LockstepError] = []


def _boom() -> None:
    """Raise."""
    raise _RAISE[0]


@pytest.mark.parametrize("exc", [c[0] for c in CASES if c[1] < 500])
def test_a_server_answer_comes_back_as_the_same_class(exc: LockstepError) -> None:
    err = from_lockstep(exc)
    back = error_from_api(err.code, err.message, err.field)
    assert type(back) is type(exc)
    assert back.exit_code == exc.exit_code
    if isinstance(exc, SpecError):
        assert isinstance(back, SpecError) and back.field == err.field and back.reason == exc.reason


def test_server_failures_and_http_refusals_map_to_no_domain_class() -> None:
    for code in ("internal", "provider_error", "unauthorized", "rate_limited", "bad_json", "bad_parameter"):
        assert error_from_api(code, "x", None) is None
    assert issubclass(CapacityError, ProviderError)
