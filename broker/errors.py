"""One exception hierarchy for all of Lockstep, and the one place that says how each error reaches a user.

Every class carries its faces: ``http_status`` and ``api_code`` for the HTTP API (the
``{"error": {"code", "message", "field"}}`` body), ``exit_code`` for the CLI. The API,
the CLI and the client (which turns a server's answer back into these classes) read
them; nobody keeps a table of their own.

    class                     HTTP  API code        exit
    LockstepError             500   internal        1     anything else we raise on purpose
    ├── SpecError             422   invalid_spec    2     bad user input: a field and a reason
    ├── NotFoundError         404   not_found       2
    ├── ConflictError         409   conflict        2
    ├── NoFeasibleOption      422   infeasible      3     nothing can run the job
    ├── StoreError            500   internal        1
    └── ProviderError         502   provider_error  1     a market said no; subclasses tell the router
        ├── CapacityError                                 no capacity here now: try the next offer
        ├── QuotaError                                    account limit: try another provider
        ├── ProviderAuthError                             credentials refused: do not retry
        ├── TransientError                                throttled / 5xx / timeout: retry with backoff
        └── BadRequestError                               the request itself is wrong: do not retry

A tenant's caps (budget, GPUs) are not an error: the router leaves the job pending with
the reason in its events, so no class stands for them.

Messages never carry secrets: adapters build them from status codes and the
provider's own error codes, never from request headers. A 500 shows a client
"internal error" only (:attr:`LockstepError.public_message`).
"""

from __future__ import annotations

from typing import ClassVar

# CLI exit codes (README): success, a provider or server failed, bad input, no feasible option.
EXIT_OK, EXIT_FAIL, EXIT_BAD_INPUT, EXIT_INFEASIBLE = 0, 1, 2, 3

_BY_API_CODE: dict[str, type[LockstepError]] = {}


class LockstepError(Exception):
    """Base of every error Lockstep raises on purpose."""

    http_status: ClassVar[int] = 500
    api_code: ClassVar[str] = "internal"
    exit_code: ClassVar[int] = EXIT_FAIL

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # A client error class that names its own code is what a server's answer with that code stands for.
        if "api_code" in cls.__dict__ and cls.http_status < 500:
            _BY_API_CODE[cls.api_code] = cls

    @property
    def public_message(self) -> str:
        """The message an API client may read; a 500's text stays in the server's log."""
        return "internal error" if self.http_status == 500 else str(self)

    @property
    def api_field(self) -> str | None:
        """The offending field for the API's error body, when the error knows one."""
        return None

    @classmethod
    def from_api(cls, message: str, field: str | None) -> LockstepError:
        """This error rebuilt from a server's error body (see :func:`error_from_api`)."""
        return cls(message)


class SpecError(LockstepError):
    """Bad input: names the field and the reason; ``errors`` has every (field, reason) when there are several."""

    http_status = 422
    api_code = "invalid_spec"
    exit_code = EXIT_BAD_INPUT

    def __init__(self, field: str, reason: str, errors: list[tuple[str, str]] | None = None) -> None:
        self.errors = errors or [(field, reason)]
        self.field = field
        self.reason = reason
        text = "; ".join(f"{f}: {r}" if f else r for f, r in self.errors)
        # One error: the reason alone (the body's "field" names it). Several: every one names its field,
        # the first too, or a reader cannot tell which field the first reason is about.
        self.detail = reason if len(self.errors) == 1 else text
        super().__init__(text)

    @property
    def public_message(self) -> str:
        return self.detail or str(self)

    @property
    def api_field(self) -> str | None:
        return self.field or "body"

    @classmethod
    def from_api(cls, message: str, field: str | None) -> SpecError:
        if field and message.startswith(f"{field}: "):  # several errors, each already naming its field
            return cls(field, message[len(field) + 2:])
        return cls(field or "", message)


class NotFoundError(LockstepError):
    http_status = 404
    api_code = "not_found"
    exit_code = EXIT_BAD_INPUT


class ConflictError(LockstepError):
    http_status = 409
    api_code = "conflict"
    exit_code = EXIT_BAD_INPUT


class NoFeasibleOption(LockstepError):
    http_status = 422
    api_code = "infeasible"
    exit_code = EXIT_INFEASIBLE

    def __init__(self, message: str, reasons: dict[str, int] | None = None) -> None:
        self.reasons = reasons or {}
        super().__init__(message)


class StoreError(LockstepError):
    pass


class ProviderError(LockstepError):
    """A provider call failed. ``retryable`` tells generic code whether to retry."""

    http_status = 502
    api_code = "provider_error"
    retryable = False

    def __init__(self, provider: str, message: str, code: str = "") -> None:
        self.provider = provider
        self.code = code
        super().__init__(f"{provider}: {message}" + (f" [{code}]" if code else ""))


class CapacityError(ProviderError):
    """This offer cannot be had now (no capacity, ask gone, price too low): try the next one."""


class QuotaError(ProviderError):
    """An account limit was hit: other offers of this provider will fail too."""


class ProviderAuthError(ProviderError):
    """Credentials missing or refused: retrying will not help."""


class TransientError(ProviderError):
    """Throttling, 5xx, timeouts: retry with bounded exponential backoff and jitter."""

    retryable = True


class BadRequestError(ProviderError):
    """The provider rejected the request as malformed or unsupported."""


REFUSALS: tuple[type[ProviderError], ...] = (CapacityError, QuotaError, ProviderAuthError, BadRequestError)
"""The provider errors that mean the market said no: a call that raised one of them changed nothing there. Any
other error (a timeout, a 5xx, a lost answer) may have come after the market acted."""


def error_from_api(code: str, message: str, field: str | None) -> LockstepError | None:
    """The domain error a server's error body stands for, by its code; None when no class has it
    (the request failed in the HTTP layer: auth, rate limit, a malformed request, a server error)."""
    cls = _BY_API_CODE.get(code)
    return None if cls is None else cls.from_api(message, field)
